"""Live BPF: the OTLP backend is down. Capture goes on, the file exporter gets every span, and the
OTLP drops are counted in the agent's self-metrics. Runs with the largest payload cap (32 KiB).
With a spool, an agent killed while the backend is down leaves its spans on disk, and the next
agent sends them once the backend is back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from otel_ebpf.exporters.spool import HEADER_SIZE, decode_header
from tests.conftest import AGENT, REPO
from tests.live.test_http_live import WORKLOAD, _wait_for_file
from tests.otlp_receiver import (
    OTLPReceiver,
    flatten_spans,
    latest_total,
    load_file_metrics,
    load_file_spans,
)

pytestmark = pytest.mark.bpf
REQUESTS = 20


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def test_backend_down_capture_continues_and_drops_are_counted(tmp_path: Path) -> None:
    server = subprocess.Popen([*WORKLOAD, "serve", str(tmp_path / "port")])
    try:
        port = int(_wait_for_file(tmp_path / "port", server))
        ready = tmp_path / "ready"
        agent = subprocess.Popen(
            [
                *AGENT,
                "run",
                "--port",
                str(port),
                "--exporter",
                "otlp",
                "--otlp-endpoint",
                f"http://127.0.0.1:{_closed_port()}",
                "--exporter",
                "file",
                "--output",
                str(tmp_path / "out"),
                "--ready-file",
                str(ready),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "OTEL_EXPORTER_OTLP_TIMEOUT": "300",
                "OTEL_BSP_SCHEDULE_DELAY": "200",
                "OTEL_EBPF_PAYLOAD_CAP": "32768",
            },
        )
        _wait_for_file(ready, agent)
        started = time.monotonic()
        for i in range(REQUESTS):
            subprocess.run(
                ["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/items/{i}"], check=True, timeout=30
            )
        subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/large"], check=True, timeout=30)
        assert time.monotonic() - started < 20  # the dead backend did not slow the traced programs
        agent.send_signal(signal.SIGINT)
        stderr = agent.communicate(timeout=60)[1]
    finally:
        server.kill()
        server.wait()
    assert agent.returncode == 0, stderr

    spans = load_file_spans(tmp_path / "out")
    assert len([s for s in spans if s["kind"] == "SERVER"]) == REQUESTS + 1
    assert len([s for s in spans if s["kind"] == "CLIENT"]) == REQUESTS + 1
    large = next(s for s in spans if s["kind"] == "SERVER" and s["name"] == "GET /large")
    assert large["attributes"]["http.response.body.size"] == 200_000

    metrics = load_file_metrics(tmp_path / "out")
    assert latest_total(metrics, "otel_ebpf.spans.exported", exporter="file") == len(spans)
    assert latest_total(metrics, "otel_ebpf.spans.exported", exporter="otlp") == 0
    assert latest_total(metrics, "otel_ebpf.spans.dropped", exporter="otlp") == len(spans)
    assert latest_total(metrics, "otel_ebpf.events.lost") == 0


def _spooled_spans(directory: Path) -> list[dict]:
    """The spans in a spool's segments, read as the agent wrote them (it holds the spool's lock)."""
    requests = []
    for segment in sorted(directory.glob("*.seg")):
        data = segment.read_bytes()
        offset = 0
        while (fields := decode_header(data[offset : offset + HEADER_SIZE])) is not None:
            body = data[offset + HEADER_SIZE : offset + HEADER_SIZE + fields[0]]
            if len(body) < fields[0]:
                break  # being written
            requests.append(ExportTraceServiceRequest.FromString(body))
            offset += HEADER_SIZE + fields[0]
    return flatten_spans(requests)


def test_spans_spooled_by_a_killed_agent_are_sent_by_the_next_one(tmp_path: Path) -> None:
    server = subprocess.Popen([*WORKLOAD, "serve", str(tmp_path / "port")])
    receiver = OTLPReceiver()
    receiver.start()
    receiver.stop()  # the backend is down; its port is kept for the restart
    spool = tmp_path / "spool"
    env = {
        **os.environ,
        "OTEL_EBPF_OTLP_SPOOL_DIR": str(spool),
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_EBPF_OTLP_RETRY_INITIAL": "0.2",
        "OTEL_EBPF_OTLP_RETRY_MAX": "1",
    }
    agents: list[subprocess.Popen] = []

    def start_agent(name: str) -> subprocess.Popen:
        ready = tmp_path / f"ready-{name}"
        agent = subprocess.Popen(
            [
                *AGENT,
                "run",
                "--port",
                str(port),
                "--exporter",
                "otlp",
                "--otlp-endpoint",
                receiver.grpc_endpoint,
                "--ready-file",
                str(ready),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        agents.append(agent)
        _wait_for_file(ready, agent)
        return agent

    try:
        port = int(_wait_for_file(tmp_path / "port", server))
        first = start_agent("first")
        for i in range(REQUESTS):
            subprocess.run(
                ["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/items/{i}"], check=True, timeout=30
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len([s for s in _spooled_spans(spool / "traces") if s["kind"] == "SERVER"]) == REQUESTS:
                break
            time.sleep(0.2)
        spooled = _spooled_spans(spool / "traces")
        assert len([s for s in spooled if s["kind"] == "SERVER"]) == REQUESTS
        first.send_signal(signal.SIGKILL)  # no orderly stop: the spool is all that is left
        # A killed agent is gone once the kernel has torn down its probes, a grace period each: on
        # a loaded machine that took over 30 s once.
        first.wait(120)

        receiver.start()
        second = start_agent("second")
        assert receiver.wait_for(lambda r: len(r.spans()) >= len(spooled), timeout=60), len(receiver.spans())
        second.send_signal(signal.SIGINT)
        stderr = second.communicate(timeout=60)[1]
        assert second.returncode == 0, stderr
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        server.kill()
        server.wait()
        receiver.stop()
    received = receiver.spans()
    assert [s["span_id"] for s in received[: len(spooled)]] == [s["span_id"] for s in spooled]  # first, in order
    paths = [s["attributes"]["url.path"] for s in received if s["kind"] == "SERVER"]
    assert paths == [f"/items/{i}" for i in range(REQUESTS)]
