"""Live BPF: an agent pushed past what it may handle sheds whole exchanges, counts each one, and keeps
the HTTP metrics exact (bpf/http1_summary.h, otel_ebpf/budget.py).

A small ring buffer and a tiny CPU budget make a few thousand requests per second an overload on
any machine. Every request the client made must then be exactly one of: a complete span, or a
count in ``otel_ebpf.spans.shed``; the duration histograms must count every request; and no
request that got its 200 may show up as a failed span.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

CONNECTIONS = 4
REQUESTS_PER_CONNECTION = 2500


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert proc.poll() is None, f"exited early ({proc.returncode})"
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear within {timeout}s")


def _client(port: int, statuses: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(REQUESTS_PER_CONNECTION):
        conn.request("GET", f"/users/{i}")
        response = conn.getresponse()
        response.read()
        statuses.append(response.status)
    conn.close()


@pytest.fixture(scope="module")
def overload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("overload")
    server = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "http_service.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline().rsplit(":", 1)[1])
        config = tmp / "agent.yaml"
        config.write_text("capture:\n  ring_buffer_kb: 64\n  cpu_budget: 0.02\nexport:\n  metric_interval_s: 1\n")
        ready = tmp / "ready"
        agent = subprocess.Popen(
            [
                *AGENT,
                "run",
                "--config",
                str(config),
                "--pid",
                str(server.pid),
                "--exporter",
                "file",
                "--output",
                str(tmp / "out"),
                "--ready-file",
                str(ready),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for(ready, agent)
        statuses: list[int] = []
        clients = [threading.Thread(target=_client, args=(port, statuses)) for _ in range(CONNECTIONS)]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        time.sleep(1.5)  # a metric interval and the kernel's once-a-second report
        stopped = time.monotonic()
        agent.send_signal(signal.SIGINT)
        stderr = agent.communicate(timeout=60)[1]
        exit_s = time.monotonic() - stopped
        assert agent.returncode == 0, stderr
        return {
            "statuses": statuses,
            "spans": load_file_spans(tmp / "out"),
            "metrics": load_file_metrics(tmp / "out"),
            "exit_s": exit_s,
            "server_pid": server.pid,
        }
    finally:
        server.kill()
        server.wait()


def test_every_request_is_a_span_or_counted_as_shed(overload: dict) -> None:
    requests = len(overload["statuses"])
    assert requests == CONNECTIONS * REQUESTS_PER_CONNECTION
    assert set(overload["statuses"]) == {200}
    spans = [s for s in overload["spans"] if s["kind"] == "SERVER"]
    shed = latest_total(overload["metrics"], "otel_ebpf.spans.shed")
    assert shed > 0, "the agent was not overloaded: the test proves nothing"
    assert len(spans) + shed == requests


def test_no_request_that_got_its_response_is_a_failed_span(overload: dict) -> None:
    failed = [s for s in overload["spans"] if s["status_code"] == "ERROR"]
    assert failed == []
    assert all(s["attributes"]["http.response.status_code"] == 200 for s in overload["spans"])


def test_duration_histogram_counts_every_request(overload: dict) -> None:
    points = overload["metrics"]["http.server.request.duration"]
    assert {p["resource"]["process.pid"] for p in points} == {overload["server_pid"]}
    assert latest_total(overload["metrics"], "http.server.request.duration") == len(overload["statuses"])
    assert all(p["attributes"]["http.response.status_code"] == 200 for p in points)


def test_the_agent_stops_within_seconds(overload: dict) -> None:
    assert overload["exit_s"] < 5.0
