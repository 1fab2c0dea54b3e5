"""Live BPF: HTTP/2 and gRPC peers (grpcio with stubs generated at test time, hypercorn, httpx,
curl), the agent attached, a real OTLP receiver; spans and metrics compared call by call with what
the clients say they did. The peers are those the HTTP/2 recordings come from
(``tests/protocols/h2_peers.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.live.test_http_live import _latest_points, _wait_for_file
from tests.live.test_traces_live import Scenario, _assert_chains
from tests.otlp_receiver import OTLPReceiver, latest_total

pytestmark = pytest.mark.bpf
PEERS_DIR = REPO / "tests" / "protocols"
PEERS = [sys.executable, str(PEERS_DIR / "h2_peers.py")]
SOCKET_MODES = pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
SERVICE = "otelebpf.test.Echo"

sys.path.insert(0, str(PEERS_DIR))
import h2_peers  # noqa: E402 -- the peers live next to the recordings they made

Span = dict[str, Any]


class Peers(Scenario):
    """The peers of one test, with the agent and the receiver of the trace tests' scenarios."""

    def __init__(self, tmp: Path, receiver: OTLPReceiver, socket_mode: str) -> None:
        super().__init__(tmp, receiver, socket_mode)
        self.stubs = tmp / "stubs"
        h2_peers.generate_stubs(self.stubs)  # grpcio-tools, now, into tmp_path

    def server(self, kind: str) -> tuple[int, int]:
        """``grpc`` or ``h2``: the server's (pid, port)."""
        port_file = self.tmp / f"{kind}.port"
        args = ["serve-grpc", str(port_file), str(self.stubs)] if kind == "grpc" else ["serve-h2", str(port_file)]
        proc = self.spawn([*PEERS, *args])
        return proc.pid, int(_wait_for_file(port_file, proc))

    def client(self, *args: str) -> subprocess.Popen:
        """A client waiting for ``go`` (so that its pid can be traced first)."""
        proc = self.spawn([*PEERS, *args, "--wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        return proc

    def held(self, *argv: str) -> subprocess.Popen:
        """``argv`` (curl) exec'd by a shell that first waits for ``go``: its pid is known (and
        traced) before it runs."""
        return self.spawn(["sh", "-c", 'read go && exec "$@"', "sh", *argv], stdin=subprocess.PIPE, text=True)

    def grpc_client(self, port: int, scenario: str, *flags: str) -> subprocess.Popen:
        return self.client("grpc-client", str(port), str(self.stubs), scenario, *flags)

    @staticmethod
    def go(client: subprocess.Popen) -> list[dict]:
        out, _ = client.communicate("go\n", timeout=60)
        assert client.returncode == 0, out
        return [json.loads(line) for line in (out or "").splitlines()]


def _by(spans: list[Span], pid: int, kind: str) -> list[Span]:
    return sorted(
        (s for s in spans if s["resource"]["process.pid"] == pid and s["kind"] == kind), key=lambda s: s["start_ns"]
    )


def _call_key(span: Span) -> tuple:
    a = span["attributes"]
    return (
        a["rpc.method"],
        a.get("rpc.grpc.status_code"),
        a.get("otel_ebpf.rpc.request.message_count"),
        a.get("otel_ebpf.rpc.response.message_count"),
    )


STATUS_CODES = {"OK": 0, "NOT_FOUND": 5}


# grpcio (gRPC C-core) writes a call with one sendmsg of many iovecs (each HPACK literal its own):
# the probe gathers up to 320 of them into as few events as the cap allows and reports the rest as
# a gap, so the plugin knows what it missed.


@SOCKET_MODES
def test_grpc_calls(tmp_path: Path, socket_mode: str) -> None:
    """Unary OK and NOT_FOUND, server-streaming of 10, client-streaming, bidi; then 100 unary calls
    on one channel: one SERVER and one CLIENT span each, with the conventions' attributes."""
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, socket_mode) as run:
        server, port = run.server("grpc")
        first, many = run.grpc_client(port, "everything"), run.grpc_client(port, "many")
        run.start_agent(server, first.pid, many.pid)
        calls = run.go(first)
        calls_many = run.go(many)
        spans, metrics = run.stop_agent(2 * (len(calls) + len(calls_many)))

    assert [c["code"] for c in calls] == ["OK", "NOT_FOUND", "OK", "OK", "OK"] and len(calls_many) == 100
    for pid, kind, made in (
        (server, "SERVER", calls + calls_many),
        (first.pid, "CLIENT", calls),
        (many.pid, "CLIENT", calls_many),
    ):
        got = _by(spans, pid, kind)
        expected = Counter((c["method"], STATUS_CODES[c["code"]], c["requests"], c["responses"]) for c in made)
        assert Counter(_call_key(s) for s in got) == expected, f"{kind} of {pid}"
        for span in got:
            a = span["attributes"]
            assert span["name"] == f"{SERVICE}/{a['rpc.method']}"
            assert (a["rpc.system"], a["rpc.service"], a["network.protocol.version"]) == ("grpc", SERVICE, "2")
            assert a["server.port"] == port
    assert len(spans) == 2 * 105
    errors = {
        (s["kind"], s["attributes"]["rpc.grpc.status_code"], s["status_code"], s["status_message"])
        for s in spans
        if s["attributes"]["rpc.grpc.status_code"]
    }
    # NOT_FOUND is the caller's error only
    assert errors == {("SERVER", 5, "UNSET", ""), ("CLIENT", 5, "ERROR", h2_peers.NOT_FOUND_MESSAGE)}
    assert sum(point["count"] for point in _latest_points(metrics["rpc.server.duration"])) == 105
    assert latest_total(metrics, "otel_ebpf.messages.partial") == 0


def test_grpc_calls_after_large_messages_keep_their_status(tmp_path: Path) -> None:
    """Unary calls of 100 KB each way, then small ones, on one channel. The client reads a
    response with ``recvmsg`` into 64 KiB segments, its trailers last: copied 8 caps a segment,
    the rest of each segment was a gap that hid the trailers' frame, and with the HPACK entry its
    first trailers made, 18 of 20 client spans had no ``rpc.grpc.status_code``. A segment of an
    HTTP/2 connection is now copied up to 16 caps, a whole one of C-core's."""
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, "tracepoints") as run:
        server, port = run.server("grpc")
        client = run.grpc_client(port, "many_large")
        run.start_agent(server, client.pid)
        calls = run.go(client)
        spans, metrics = run.stop_agent(2 * len(calls))
    assert len(calls) == h2_peers.LARGE_CALLS + 5 and {c["code"] for c in calls} == {"OK"}
    for pid, kind in ((server, "SERVER"), (client.pid, "CLIENT")):
        got = _by(spans, pid, kind)
        assert [(s["attributes"]["rpc.method"], s["attributes"].get("rpc.grpc.status_code")) for s in got] == [
            ("Unary", 0)
        ] * len(calls), kind
    assert latest_total(metrics, "otel_ebpf.messages.partial") == 0
    assert latest_total(metrics, "otel_ebpf.events.lost") == 0


def test_concurrent_grpc_calls_keep_their_method(tmp_path: Path) -> None:
    """Bursts of 64 calls in flight on one channel: C-core writes each burst in one sendmsg of more
    iovec segments than a syscall's exit gathers. The rest go to segments_more; when they were a
    gap, the client's HPACK table lost the entry its calls' ``:path`` refers to, and every later
    call on the channel was ``_OTHER``. The server reads a burst with ``recvmsg`` into segments
    that can be larger than the capture cap: they are copied a cap at a time, as one buffer is."""
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, "tracepoints") as run:
        server, port = run.server("grpc")
        client = run.grpc_client(port, "concurrent")
        run.start_agent(client.pid, server)
        calls = run.go(client)
        spans, _ = run.stop_agent(2 * len(calls))

    assert len(calls) == h2_peers.BURSTS * h2_peers.CONCURRENT and {c["code"] for c in calls} == {"OK"}
    assert Counter(s["name"] for s in _by(spans, client.pid, "CLIENT")) == {f"{SERVICE}/Unary": len(calls)}
    assert Counter(s["name"] for s in _by(spans, server, "SERVER")) == {f"{SERVICE}/Unary": len(calls)}


@SOCKET_MODES
def test_http2_hypercorn_httpx_and_curl(tmp_path: Path, socket_mode: str) -> None:
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, socket_mode) as run:
        server, port = run.server("h2")
        httpx_client = run.client("httpx-client", str(port))
        curl = run.held("curl", "-s", "-o", "/dev/null", "--http2-prior-knowledge", f"http://127.0.0.1:{port}/items/42")
        run.start_agent(server, httpx_client.pid, curl.pid)
        requests = run.go(httpx_client)
        assert run.go(curl) == []
        spans, _ = run.stop_agent(6)

    assert [(r["method"], r["path"], r["status"], r["version"]) for r in requests] == [
        ("GET", "/items/1", 200, "HTTP/2"),
        ("POST", "/upload", 201, "HTTP/2"),
    ]
    server_spans = _by(spans, server, "SERVER")
    assert [(s["name"], s["attributes"]["http.response.status_code"]) for s in server_spans] == [
        ("GET /items/{id}", 200),
        ("POST /upload", 201),
        ("GET /items/{id}", 200),
    ]
    assert all(s["attributes"]["network.protocol.version"] == "2" for s in spans)
    assert server_spans[1]["attributes"]["http.request.body.size"] == 3000
    httpx_spans = _by(spans, httpx_client.pid, "CLIENT")
    assert [s["attributes"]["url.full"] for s in httpx_spans] == [
        f"http://127.0.0.1:{port}/items/1",
        f"http://127.0.0.1:{port}/upload",
    ]
    curl = [s for s in spans if s["resource"]["process.executable.name"] == "curl"]
    assert [(s["kind"], s["attributes"]["url.full"]) for s in curl] == [("CLIENT", f"http://127.0.0.1:{port}/items/42")]
    assert len(spans) == 6


def test_an_upgraded_h2c_connection_is_copied_past_the_cap(tmp_path: Path) -> None:
    """``curl --http2`` on plain HTTP upgrades its connection (``Upgrade: h2c``, ``101``), then
    POSTs 20 KB on it; hypercorn reads the upload in one call, far past the 4 KiB cap. The kernel
    takes the client preface after the 101 for HTTP/2, as on a connection opened with it, and
    copies the read a cap at a time: the SERVER span has the body's size (before, the kernel
    stopped looking at the 101, copied the cap only, and the size was lost to the gap)."""
    body = tmp_path / "body"
    body.write_bytes(b"u" * 20_000)
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, "tracepoints") as run:
        server, port = run.server("h2")
        base = f"http://127.0.0.1:{port}"
        # --next: a second request on the same (upgraded) connection, with its own options
        curl = run.held(
            "curl", "-s", "-o", "/dev/null", "--http2", f"{base}/items/1",
            "--next", "-s", "-o", "/dev/null", "--http2", "--data-binary", f"@{body}", f"{base}/upload",
        )  # fmt: skip
        run.start_agent(server, curl.pid)
        assert run.go(curl) == []
        spans, metrics = run.stop_agent(4)

    upload = [s for s in _by(spans, server, "SERVER") if s["name"] == "POST /upload"]
    assert len(upload) == 1 and upload[0]["attributes"]["network.protocol.version"] == "2"
    assert upload[0]["attributes"]["http.request.body.size"] == 20_000
    assert "otel_ebpf.capture.gap" not in upload[0]["attributes"]
    assert latest_total(metrics, "otel_ebpf.payload.not_captured") == 0


def test_a_declined_h2c_upgrade_joins_the_trace(tmp_path: Path) -> None:
    """``curl --http2`` on plain HTTP asks the gateway of a gateway -> service -> backend chain
    (Python's http.server, no h2c) to upgrade; the gateway answers in HTTP/1.1. curl's call and the
    five hops it causes are one trace, as any HTTP/1.1 request's are: the upgrade request starts
    when its head arrives. Before, it was announced with the answer, after the gateway's side and
    its calls, and the first request of every such connection (Java's HttpClient asks for h2c on
    each new one) split into two traces."""
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, "tracepoints") as run:
        hops, port = run.chain()
        url = f"http://127.0.0.1:{port}/work/0"
        curl = run.held("curl", "-s", "-o", "/dev/null", "--http2", "-H", "x-request-id: req-0", url)
        run.start_agent(curl.pid, *{pid for pid, _ in hops})
        assert run.go(curl) == []
        spans, _ = run.stop_agent(6)

    (trace,) = _assert_chains(spans, [(curl.pid, "CLIENT"), *hops], 1).values()
    assert {s["attributes"]["network.protocol.version"] for s in trace} == {"1.1"}


@SOCKET_MODES
def test_agent_attached_to_an_open_grpc_channel(tmp_path: Path, socket_mode: str) -> None:
    """The channel made a call before the agent started: its later calls are reported, what was
    compressed against header state from before is unknown (and counted), never guessed."""
    with OTLPReceiver() as receiver, Peers(tmp_path, receiver, socket_mode) as run:
        server, port = run.server("grpc")
        client = run.grpc_client(port, "unary", "--warm")
        run.start_agent(server, client.pid)
        calls = run.go(client)
        spans, metrics = run.stop_agent(2 * len(calls))

    assert [c["code"] for c in calls] == ["OK"] * 3
    for pid, kind in ((server, "SERVER"), (client.pid, "CLIENT")):
        got = _by(spans, pid, kind)
        assert len(got) == 3, f"{kind}: {[s['name'] for s in got]}"
        for span in got:
            a = span["attributes"]
            assert (span["name"], a["rpc.system"], a["rpc.method"]) == ("grpc", "grpc", "_OTHER")
            assert "rpc.service" not in a and "rpc.grpc.status_code" not in a  # indexed before the agent
            assert span["status_code"] == "UNSET"
            assert (a["otel_ebpf.rpc.request.message_count"], a["otel_ebpf.rpc.response.message_count"]) == (1, 1)
    assert len(spans) == 6
    # every request and response of both processes: fields compressed against the lost table
    assert latest_total(metrics, "otel_ebpf.messages.partial", protocol="http2") == 12
