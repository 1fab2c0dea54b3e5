"""Live BPF: W3C traceparent injection into traced processes' HTTP/1 requests (issue 15, item 3).

A traced http.client process and a traced proxy (a server that calls downstream on the thread that
read the request) call an untraced recorder on loopback, which prints every request head exactly as
it arrived. The ids in the header the recorder got must be the exported CLIENT span's; a request
that carries its own traceparent, and one whose head the kernel cannot see whole, arrive untouched
(the second counted with its reason); with injection off nothing changes on the wire.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.live.test_tls_live import _certificates, _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf

PEERS = [sys.executable, "-m", "tests.live.traceparent_peers"]
TRACEPARENT = re.compile(rb"traceparent: 00-([0-9a-f]{32})-([0-9a-f]{16})-01\r\n")
OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # the W3C specification's example
PAD = "x" * 1100  # a head longer than the kernel searches (1024 bytes)
REPEAT = 20


class Peer:
    """A peer process of tests/live/traceparent_peers.py, talked to by lines."""

    def __init__(self, *args: str, popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        self.process = popen([*PEERS, *args], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.first = self.readline()

    def readline(self) -> str:
        line = self.process.stdout.readline()
        assert line, f"{self.process.args} exited"
        return line.strip()

    def send(self, request: dict) -> str:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.readline()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def recorder() -> Iterator[Peer]:
    peer = Peer("recorder")
    yield peer
    peer.close()


def _head(recorder: Peer) -> bytes:
    return json.loads(recorder.readline())["head"].encode("latin-1")


def _sent(path: str, port: int, headers: dict[str, str] | None = None, host: str = "127.0.0.1") -> bytes:
    """The head http.client writes for GET ``path`` to ``host``:``port``."""
    fields = [
        f"Host: {host}:{port}",
        "Accept-Encoding: identity",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return f"GET {path} HTTP/1.1\r\n{''.join(f + chr(13) + chr(10) for f in fields)}\r\n".encode()


def _without_injected(head: bytes) -> tuple[bytes, tuple[str, str] | None]:
    """``head`` without the line the kernel inserts right after the request line, and its ids."""
    line_end = head.index(b"\r\n") + 2
    match = TRACEPARENT.match(head, line_end)
    if match is None:
        return head, None
    return head[:line_end] + head[match.end() :], (match[1].decode(), match[2].decode())


def _span(spans: list[dict], kind: str, pid: int, path: str) -> dict:
    found = [
        s
        for s in spans
        if s["kind"] == kind
        and s["resource"]["process.pid"] == pid
        and (s["attributes"].get("url.path") == path or s["attributes"].get("url.full", "").endswith(path))
    ]
    assert len(found) == 1, (kind, pid, path, spans)
    return found[0]


def _outcomes(metrics: dict[str, list[dict]]) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for point in metrics.get("otel_ebpf.traceparent.requests", []):
        outcome = point["attributes"]["outcome"]
        outcomes[outcome] = max(outcomes.get(outcome, 0), int(point["value"]))
    return outcomes


@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_injected_ids_are_the_exported_client_spans(tmp_path: Path, recorder: Peer, socket_mode: str) -> None:
    port = int(recorder.first)
    client = Peer("client", str(port))
    proxy = Peer("proxy", str(port))
    ca, cert, key = _certificates(tmp_path)
    tls_recorder = Peer("recorder", cert, key)
    tls_port = int(tls_recorder.first)
    tls_client = Peer("client", str(tls_port), ca)
    pids = [client.process.pid, proxy.process.pid, tls_client.process.pid]
    try:
        with OTLPReceiver() as receiver:
            targets = [f for pid in pids for f in ("--pid", str(pid))]
            agent = _start_agent(tmp_path, receiver, socket_mode, *targets, "--inject-traceparent")
            try:
                # a plain request: one traceparent, right after the request line, and nothing else changed
                assert client.send({"path": "/plain"}) == "200"
                plain, plain_ids = _without_injected(_head(recorder))
                assert plain == _sent("/plain", port) and plain_ids is not None
                # a request that carries its own: untouched
                assert client.send({"path": "/own", "headers": {"traceparent": OWN}}) == "200"
                assert _head(recorder) == _sent("/own", port, {"traceparent": OWN})
                # a head longer than the kernel searches, and one written in two pieces: untouched, counted
                assert client.send({"path": "/padded", "headers": {"X-Pad": PAD}}) == "200"
                assert _head(recorder) == _sent("/padded", port, {"X-Pad": PAD})
                # requests on a keep-alive connection with Nagle on: each gets its line, none stalls
                # (an insertion left in pieces waited 40 ms for a delayed ACK on every request)
                elapsed_ms = int(client.send({"repeat": REPEAT, "path": "/again"}))
                again = [_without_injected(_head(recorder)) for _ in range(REPEAT)]
                assert all(ids is not None for _, ids in again) and len({ids for _, ids in again}) == REPEAT
                assert elapsed_ms < REPEAT * 40 / 2, elapsed_ms
                split = ["GET /split HTTP/1.1\r\nHost: recorder\r\n", "\r\n"]
                assert client.send({"raw": split}) == "200"
                assert _head(recorder) == "".join(split).encode()
                # HTTPS: never
                assert tls_client.send({"path": "/tls"}) == "200"
                assert _head(tls_recorder) == _sent("/tls", tls_port)
                # a server request -> its call downstream: the call continues the request's trace
                for path, headers in (("/chain", {}), ("/chain-joined", {"traceparent": OWN})):
                    conn = http.client.HTTPConnection("127.0.0.1", int(proxy.first))
                    conn.request("GET", path, headers=headers)
                    assert conn.getresponse().status == 200
                    conn.close()
                chain = [_without_injected(_head(recorder)) for _ in range(2)]
                assert [head for head, _ in chain] == [_sent("/chain", port), _sent("/chain-joined", port)]
                assert receiver.wait_for(lambda r: len(r.spans()) >= 8 + REPEAT, timeout=30), receiver.spans()
            finally:
                _stop(agent)
            spans = receiver.spans()
            plain_span = _span(spans, "CLIENT", client.process.pid, "/plain")
            assert (plain_span["trace_id"], plain_span["span_id"]) == plain_ids
            assert plain_span["parent_span_id"] is None
            assert _span(spans, "CLIENT", tls_client.process.pid, "/tls")["attributes"]["url.full"].startswith("https:")
            for (_, ids), path in zip(chain, ("/chain", "/chain-joined"), strict=True):
                server = _span(spans, "SERVER", proxy.process.pid, path)
                call = _span(spans, "CLIENT", proxy.process.pid, path)
                assert ids == (call["trace_id"], call["span_id"])
                assert call["trace_id"] == server["trace_id"] and call["parent_span_id"] == server["span_id"]
            joined = _span(spans, "SERVER", proxy.process.pid, "/chain-joined")
            assert (joined["trace_id"], joined["parent_span_id"]) == (OWN[3:35], OWN[36:52])
            outcomes = _outcomes(receiver.metrics())
            assert outcomes["injected"] == 3 + REPEAT  # /plain, /again and the two calls downstream
            assert outcomes["already_present"] == 1
            assert outcomes["head_too_long"] == 1
            assert outcomes["head_split"] == 1
            assert outcomes["tls"] == outcomes["request_line"] == outcomes["kernel"] == outcomes["not_watched"] == 0
    finally:
        for peer in (client, proxy, tls_client, tls_recorder):
            peer.close()


def test_nothing_changes_with_injection_off(tmp_path: Path, recorder: Peer) -> None:
    port = int(recorder.first)
    client = Peer("client", str(port))
    try:
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, "tracepoints", "--pid", str(client.process.pid))
            try:
                assert client.send({"path": "/plain"}) == "200"
                assert _head(recorder) == _sent("/plain", port)
                assert receiver.wait_for(lambda r: len(r.spans()) >= 1, timeout=30)
            finally:
                _stop(agent)
            _span(receiver.spans(), "CLIENT", client.process.pid, "/plain")
            assert "otel_ebpf.traceparent.requests" not in receiver.metrics()
    finally:
        client.close()
