"""Live BPF: hostile bytes on loopback, then valid traffic, with the agent attached throughout.

``tests/live/hostile_peer.py`` throws random bytes and broken messages at an HTTP/1 server, a gRPC
server and a UDP port, and serves broken SSE to a chat-completions request of its own (HTTP/1,
HTTP/2 + gRPC, RTPS and the GenAI layer all get fed). Then real clients make valid calls. The agent
must live through the first part, count what it could not parse, and capture the second exactly:
one SERVER and one CLIENT span per valid call, whatever came before on the same servers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.live.test_http2_live import Peers, _by
from tests.otlp_receiver import OTLPReceiver, latest_total

pytestmark = pytest.mark.bpf

PYTHON_M = [sys.executable, "-m"]
VALID_CALLS = 20
RTPS_PORT = 7411  # a user-traffic port of RTPS domain 0; nobody needs to listen


def test_hostile_bytes_are_counted_and_valid_traffic_after_them_is_captured_exactly(tmp_path: Path) -> None:
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, "tracepoints") as run:
        grpc_server, grpc_port = run.server("grpc")
        http1 = run.spawn(
            [*PYTHON_M, "tests.live.keepalive_peers", "serve", "127.0.0.1"], cwd=REPO, stdout=-1, text=True
        )
        http1_port = int(http1.stdout.readline().split()[1])
        hostile = run.spawn(
            [*PYTHON_M, "tests.live.hostile_peer", str(http1_port), str(grpc_port), str(RTPS_PORT), "7"],
            cwd=REPO,
            stdin=-1,
            stdout=-1,
            text=True,
        )
        assert hostile.stdout.readline() == "ready\n"
        client = run.spawn(
            [*PYTHON_M, "tests.live.keepalive_peers", "client", "127.0.0.1", str(http1_port), "/valid"]
            + [str(VALID_CALLS), "--wait"],
            cwd=REPO,
            stdin=-1,
            stdout=-1,
            text=True,
        )
        client.stdout.readline()  # its pid
        assert client.stdout.readline() == "ready\n"
        grpc_client = run.grpc_client(grpc_port, "unary")
        run.start_agent(grpc_server, http1.pid, hostile.pid, client.pid, grpc_client.pid)

        out, _ = hostile.communicate("go\n", timeout=120)
        assert out.splitlines()[-1] == "done" and hostile.returncode == 0, out
        out, _ = client.communicate("go\n", timeout=60)
        assert out.splitlines()[-1] == "done", out
        calls = run.go(grpc_client)
        spans, metrics = run.stop_agent(2 * (VALID_CALLS + len(calls)))

    valid_http1 = [s for s in spans if s["attributes"].get("url.path") == "/valid"]
    assert len(valid_http1) == VALID_CALLS and len(_by(spans, http1.pid, "SERVER")) >= VALID_CALLS
    assert [s["resource"]["process.pid"] for s in valid_http1] == [http1.pid] * VALID_CALLS
    assert len(_by(spans, client.pid, "CLIENT")) == VALID_CALLS
    assert all(s["status_code"] == "UNSET" for s in valid_http1 + _by(spans, client.pid, "CLIENT"))
    assert [c["code"] for c in calls] == ["OK"] * len(calls)
    unary = [s for s in _by(spans, grpc_server, "SERVER") if s["attributes"].get("rpc.method") == "Unary"]
    assert len(unary) == len(calls) and len(_by(spans, grpc_client.pid, "CLIENT")) == len(calls)
    # what could not be parsed was counted, by protocol
    assert latest_total(metrics, "otel_ebpf.parse.errors", protocol="http1") > 0
