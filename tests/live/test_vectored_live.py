"""Vectored writes (sendmsg with many iovecs, as grpcio and nginx write) captured as byte runs:
the probe gathers a call's segments into as few events as the payload cap allows, so a request
written as dozens of small segments costs user space a record or two, not one per segment; a
segment past the cap ends its event with its uncopied rest, and the stream stays in step. On
HTTP/2, where one call carries the frames of many streams, a call is copied past the cap."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

REQUESTS = 20
HEADERS = 40  # one iovec each: with the request line and the blank line, 42 segments per request
BODY = 10_000  # the body request's one large segment, past the 4 KiB cap

# The client: waits for a line on stdin (the agent is attached), then on one keep-alive connection
# sends REQUESTS GETs, each one sendmsg of HEADERS + 2 segments, then a POST whose body is a
# segment of its own between small ones, then a last GET; prints the statuses it read.
CLIENT = r"""
import socket, sys
port, requests, headers, body = map(int, sys.argv[1:5])
sys.stdin.readline()
sock = socket.create_connection(("127.0.0.1", port))
reader = sock.makefile("rb")

def exchange(segments):
    assert sock.sendmsg(segments) == sum(map(len, segments))
    status = reader.readline().split()[1].decode()
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    reader.read(length)
    return status

def get(path):
    return [f"GET {path} HTTP/1.1\r\n".encode(), b"Host: 127.0.0.1\r\n",
            *(f"X-Segment-{i}: value-{i}\r\n".encode() for i in range(headers)), b"\r\n"]

statuses = [exchange(get(f"/items/{n}")) for n in range(requests)]
statuses.append(exchange([b"POST /upload HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n",
                          f"Content-Length: {body}\r\n".encode(), b"\r\n", b"b" * body]))
statuses.append(exchange(get("/last")))
sock.close()
print(" ".join(statuses), flush=True)
"""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(b"ok")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(b"stored")

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """No access log: the server runs in pytest's process, whose stderr the test reports."""


def _traced(tmp: Path, client: subprocess.Popen, pids: int | list[int], config_yaml: str) -> list[str]:
    """An agent attached to ``pids`` while ``client`` makes its requests (it waits for a line on
    stdin): the statuses it printed, once it and the agent are done."""
    agent = start_file_agent(tmp, pids, config_yaml)
    try:
        client.stdin.write("go\n")
        client.stdin.flush()
        statuses = client.stdout.readline().split()
        assert client.wait(timeout=60) == 0
        stop_file_agent(agent)
    finally:
        kill_all(agent)
    return statuses


@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_many_segments_make_few_events(tmp_path: Path, socket_mode: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(server.server_address[1]), str(REQUESTS), str(HEADERS), str(BODY)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        statuses = _traced(tmp_path, client, client.pid, f"capture:\n  socket_mode: {socket_mode}\n")
    finally:
        kill_all(client)
        server.shutdown()
    assert statuses == ["200"] * (REQUESTS + 2)

    out = tmp_path / "out"
    spans = sorted((s for s in load_file_spans(out) if s["kind"] == "CLIENT"), key=lambda s: s["start_ns"])
    paths = [s["attributes"]["url.full"].split("/", 3)[3] for s in spans]
    assert paths == [f"items/{n}" for n in range(REQUESTS)] + ["upload", "last"], json.dumps(spans[:2])
    for span in spans:
        a = span["attributes"]
        assert a["http.response.status_code"] == 200 and span["status_code"] == "UNSET"
        assert "otel_ebpf.capture.gap" not in a
    assert spans[-2]["attributes"]["http.request.body.size"] == BODY
    # Per request: the gathered request, the response read, and little else; one event per
    # segment would be HEADERS + 2 per request alone.
    assert latest_total(load_file_metrics(out), "otel_ebpf.events.received") < (REQUESTS + 2) * 6


def _path(span: dict) -> str:
    """A span's request path: the server's ``url.path``, the client's out of its ``url.full``."""
    attributes = span["attributes"]
    return attributes.get("url.path") or "/" + attributes["url.full"].split("/", 3)[3]


H2_BURST = str(Path(__file__).with_name("h2_burst.js"))  # Node.js HTTP/2 peers
BURSTS, BURST = 10, 32  # 32 streams a call: 128 segments in the server's writev, ~6 KB a read


def test_a_busy_http2_connection_is_copied_past_the_cap(tmp_path: Path) -> None:
    """Node.js's ``http2`` on both ends, bursts of 32 concurrent requests on one h2c connection:
    each burst's responses leave in one ``writev`` of 128 segments and arrive in one read of more
    than the 4 KiB cap. Every call is a span on both sides, with nothing hidden by a gap (with 64
    segments and one cap per read, a third of the server's and some of the client's were lost)."""
    port_file = tmp_path / "port"
    server = subprocess.Popen(["node", H2_BURST, "serve", str(port_file)])
    client = None
    try:
        port = _wait_for_file(port_file, server, timeout=30)
        client = subprocess.Popen(
            ["node", H2_BURST, "burst", port, str(BURSTS), str(BURST)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        statuses = _traced(tmp_path, client, [server.pid, client.pid], "{}\n")
    finally:
        kill_all(client, server)
    assert statuses == ["200"] * (BURSTS * BURST)

    out = tmp_path / "out"
    spans = load_file_spans(out)
    paths = [f"/items/{n}" for n in range(BURSTS * BURST)]
    assert Counter((s["kind"], _path(s)) for s in spans) == Counter(
        [("SERVER", p) for p in paths] + [("CLIENT", p) for p in paths]
    )
    for span in spans:  # each body whole: no frame of it hidden
        body = json.dumps({"path": _path(span), "padding": "p" * 120}, separators=(",", ":"))
        assert span["attributes"].get("http.response.body.size") == len(body), span
        assert "otel_ebpf.capture.gap" not in span["attributes"], span
    metrics = load_file_metrics(out)
    assert latest_total(metrics, "otel_ebpf.payload.not_captured") == 0
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0


DOWNLOAD, DOWNLOADS = 5 << 20, 3  # past what the default 4 MiB ring holds, copied 16 caps a read


def test_large_http2_downloads_lose_no_event(tmp_path: Path) -> None:
    """curl downloads 5 MiB from Node.js over h2c three times, each followed by a small request
    (a curl each, h2c prior knowledge). Copied 8 caps a read (now 16), the downloads filled the ring faster
    than it was read (70-118 events lost on an idle 2-CPU host, and with them most spans of both
    sides). While user space is far behind, the kernel copies an HTTP/2 call up to the cap only,
    the rest a gap (bpf/http1_summary.h, http_observe): no event is lost and every request is a
    span on both sides, the downloads' bodies unsized (the gaps hid their frames)."""
    port_file = tmp_path / "port"
    server = subprocess.Popen(["node", H2_BURST, "serve", str(port_file)])
    agent = None
    try:
        port = _wait_for_file(port_file, server, timeout=30)
        agent = start_file_agent(tmp_path, [], "{}\n", args=("--port", port))
        paths = [path for i in range(DOWNLOADS) for path in (f"/bytes/{DOWNLOAD}", f"/items/{i}")]
        for path in paths:
            url = f"http://127.0.0.1:{port}{path}"
            subprocess.run(["curl", "-sf", "--http2-prior-knowledge", "-o", "/dev/null", url], check=True, timeout=60)
        stop_file_agent(agent)
    finally:
        kill_all(agent, server)
    out = tmp_path / "out"
    spans = load_file_spans(out)
    assert Counter((s["kind"], _path(s), s["attributes"]["http.response.status_code"]) for s in spans) == Counter(
        [(kind, path, 200) for path in paths for kind in ("SERVER", "CLIENT")]
    )
    assert latest_total(load_file_metrics(out), "otel_ebpf.events.lost") == 0


UPLOAD = 400  # a burst of 32 POSTs is ~14 KB of frames: the later requests' lie past the cap


def test_an_http2_server_reading_into_large_segments_sees_every_call(tmp_path: Path) -> None:
    """A server that reads as gRPC's C-core does, with ``recvmsg`` into 64 KiB segments (the
    segment first, or after a small one), a burst of 32 POSTs at a time from Node.js on one h2c
    connection: each read holds a burst, the later requests' HEADERS far past the 4 KiB cap into
    a segment. Every call is a SERVER span with its path and its body's size (when a segment was
    copied up to the cap only, 230 of 320 spans lacked it, with 96 KB not captured)."""
    port_file = tmp_path / "port"
    peers = Path(__file__).parents[1] / "protocols" / "h2_peers.py"
    server = subprocess.Popen([sys.executable, str(peers), "serve-h2-recvmsg", str(port_file)])
    client = None
    try:
        port = _wait_for_file(port_file, server, timeout=30)
        client = subprocess.Popen(
            ["node", H2_BURST, "burst", port, str(BURSTS), str(BURST), str(UPLOAD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        statuses = _traced(tmp_path, client, server.pid, "{}\n")
    finally:
        kill_all(client, server)
    assert statuses == ["200"] * (BURSTS * BURST)

    out = tmp_path / "out"
    spans = [s for s in load_file_spans(out) if s["kind"] == "SERVER"]
    assert Counter(_path(s) for s in spans) == Counter(f"/items/{n}" for n in range(BURSTS * BURST))
    for span in spans:
        assert span["attributes"]["http.request.method"] == "POST", span
        assert span["attributes"].get("http.request.body.size") == UPLOAD, span
        assert "otel_ebpf.capture.gap" not in span["attributes"], span
    metrics = load_file_metrics(out)
    assert latest_total(metrics, "otel_ebpf.payload.not_captured") == 0
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0
