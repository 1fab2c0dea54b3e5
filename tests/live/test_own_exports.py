"""Live BPF: a collector on the node receives the agent's own OTLP/HTTP exports. Its side of those
connections must not be traced, or every export would produce spans to export."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO
from tests.live.test_http_live import WORKLOAD, _wait_for_file
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
REQUESTS = 5


@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_collector_side_of_the_agents_exports_is_not_traced(tmp_path: Path, socket_mode: str) -> None:
    server = subprocess.Popen([*WORKLOAD, "serve", str(tmp_path / "port")])
    try:
        port = int(_wait_for_file(tmp_path / "port", server))
        with OTLPReceiver() as receiver:
            receiver_port = int(receiver.http_endpoint.rsplit(":", 1)[1].split("/")[0])
            ready = tmp_path / "ready"
            # Both ports traced: the workload's and the receiver's, which lives in this (traced) process.
            agent = subprocess.Popen(
                [
                    *AGENT,
                    "run",
                    "--port",
                    str(port),
                    "--port",
                    str(receiver_port),
                    "--exporter",
                    "otlp",
                    "--otlp-protocol",
                    "http/protobuf",
                    "--otlp-endpoint",
                    receiver.http_endpoint,
                    "--ready-file",
                    str(ready),
                ],
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_EBPF_SOCKET_MODE": socket_mode},
            )
            _wait_for_file(ready, agent)
            for i in range(REQUESTS):
                subprocess.run(
                    ["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/items/{i}"], check=True, timeout=30
                )
                # each batch is exported before the next request: the receiver is busy meanwhile
                assert receiver.wait_for(lambda r, n=i: len(r.spans()) >= 2 * (n + 1), timeout=10)
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=60)[1]
            spans = receiver.spans()
    finally:
        server.kill()
        server.wait()
    assert agent.returncode == 0, stderr
    assert sorted(s["name"] for s in spans) == ["GET /items/{id}"] * (2 * REQUESTS)
