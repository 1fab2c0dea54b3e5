"""Live BPF: the OTLP backend is down. Capture goes on, the file exporter gets every span, and the
OTLP drops are counted in the agent's self-metrics. Runs with the largest payload cap (32 KiB)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO
from tests.live.test_http_live import WORKLOAD, _wait_for_file
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

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
