"""Record real HTTP/1.x byte streams for the parser tests (a one-off script, not a test).

Runs a real ``http.server.ThreadingHTTPServer`` (HTTP/1.1, keep-alive) and real clients (``curl``,
``http.client``, ``urllib``, a raw socket for pipelining) on loopback, with a TCP tee proxy between
them that saves every chunk it relays, per direction, with its arrival time. Each scenario is one
client connection and becomes ``data/<name>.json``::

    {"name": ..., "description": ...,
     "chunks": [{"direction": "ingress", "t_ns": 0, "data": "<base64>"}, ...]}

Directions are seen from the server: ``ingress`` carries requests, ``egress`` responses; ``t_ns`` is
relative to the first chunk. Chunk boundaries are the proxy's ``recv`` boundaries, which is what a
capture of the server's syscalls would see too. Re-record with::

    .venv/bin/python tests/protocols/record_streams.py [scenario ...]

The tests assert on what the server is known to send, and name the chunks that carry the first
byte of each request and the last byte of each response by index: after re-recording, check those
indices (``EXPECTED`` in ``test_http1_recordings.py``) against the new chunk boundaries.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

DATA = Path(__file__).parent / "data"
CURL = "/usr/bin/curl"
LARGE_BODY = bytes(range(256)) * 800  # 204800 bytes: far past any capture cap
UPLOAD_BODY = b"u" * 3000
ETAG = '"v1"'


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Keep the recorder quiet."""

    def _send(self, status: int, body: bytes, *headers: tuple[str, str], head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head: bool) -> None:
        path = urlsplit(self.path).path
        if path.startswith("/users/"):
            self._send(200, json.dumps({"id": path.rsplit("/", 1)[-1]}).encode(), head=head)
        elif path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Checksum")
            self.end_headers()
            self.wfile.write(b"5;ext=1\r\nhello\r\n")
            self.wfile.flush()
            self.wfile.write(b'7\r\n, world\r\n1a;name="quoted"\r\n' + b"z" * 26 + b"\r\n")
            self.wfile.write(b"0\r\nX-Checksum: abc123\r\n\r\n")
        elif path == "/large":
            self._send(200, LARGE_BODY, head=head)
        elif path == "/empty":
            self.send_response(204)
            self.end_headers()
        elif path == "/cached":
            if self.headers.get("If-None-Match") == ETAG:
                self.send_response(304)
                self.send_header("ETag", ETAG)
                self.end_headers()
            else:
                self._send(200, b'{"cached": true}', ("ETag", ETAG), head=head)
        elif path == "/error":
            self._send(500, b'{"error": "boom"}', head=head)
        elif path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(3):
                self.wfile.write(b"line %d\n" % i)
                self.wfile.flush()
                time.sleep(0.01)
            self.close_connection = True
        else:
            self._send(404, b'{"error": "not found"}', head=head)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._send(201, json.dumps({"received": len(body)}).encode())


class TeeProxy:
    """Relays one client connection to the server and records both directions."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.chunks: list[tuple[str, int, bytes]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.upstream)
        pumps = [
            threading.Thread(target=self._pump, args=(client, server, "ingress")),
            threading.Thread(target=self._pump, args=(server, client, "egress")),
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        client.close()
        server.close()
        self._done.set()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            with self._lock:
                self.chunks.append((direction, time.monotonic_ns(), data))
            sink.sendall(data)

    def wait(self) -> list[tuple[str, int, bytes]]:
        if not self._done.wait(20):
            raise TimeoutError("the recorded connection did not close")
        self.listener.close()
        return self.chunks


def _curl(*args: str) -> Callable[[str], None]:
    def run(base: str) -> None:
        argv = [CURL, "-s", "-o", "/dev/null"]
        argv += [arg.replace("BASE", base) for arg in args]
        subprocess.run(argv, check=True, timeout=20, input=UPLOAD_BODY)

    return run


def _no_body(base: str) -> None:
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=10)
    for path, headers in [
        ("/empty", {}),
        ("/cached", {}),
        ("/cached", {"If-None-Match": ETAG}),
        ("/users/9", {}),
    ]:
        conn.request("GET", path, headers=headers)
        conn.getresponse().read()
    conn.close()


def _errors(base: str) -> None:
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=10)
    for path in ("/missing", "/error"):
        conn.request("GET", path)
        conn.getresponse().read()
    conn.close()


def _read_until_close(base: str) -> None:
    with urllib.request.urlopen(base + "/stream", timeout=10) as response:
        response.read()


def _pipelined(base: str) -> None:
    host = urlsplit(base).netloc
    requests = (
        f"GET /users/1 HTTP/1.1\r\nHost: {host}\r\n\r\n"
        f"HEAD /users/2 HTTP/1.1\r\nHost: {host}\r\n\r\n"
        f"POST /echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n\r\nhello"
        f"GET /chunked HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", int(host.rsplit(":", 1)[1]))) as sock:
        sock.sendall(requests)
        while sock.recv(65536):
            pass


SCENARIOS: dict[str, tuple[str, Callable[[str], None]]] = {
    "keepalive": (
        "curl: two GETs and a POST on one keep-alive connection",
        _curl(
            "BASE/users/123",
            "-o",
            "/dev/null",
            "BASE/users/456?page=2&token=abc",
            "--next",
            "-s",
            "-o",
            "/dev/null",
            "--data-binary",
            "name=value",
            "BASE/users",
        ),
    ),
    "chunked": (
        "curl: a chunked response with chunk extensions and a trailer, then another GET",
        _curl("BASE/chunked", "-o", "/dev/null", "BASE/users/1"),
    ),
    "large": ("curl: a 204800-byte response body", _curl("BASE/large")),
    "head": (
        "curl: HEAD (Content-Length but no body), then a GET on the same connection",
        _curl("-I", "BASE/users/7", "--next", "-s", "-o", "/dev/null", "BASE/users/8"),
    ),
    "no_body": ("http.client: 204, 200 with ETag, 304, then 200", _no_body),
    "continue": (
        "curl: POST with Expect: 100-continue (interim 100 response)",
        _curl("-H", "Expect: 100-continue", "--data-binary", "@-", "BASE/upload"),
    ),
    "errors": ("http.client: 404 then 500 on one connection", _errors),
    "until_close": (
        "urllib: a response without Content-Length, delimited by close",
        _read_until_close,
    ),
    "pipelined": (
        "raw socket: four pipelined requests (GET, HEAD, POST, GET chunked) in one write",
        _pipelined,
    ),
}


def record(name: str, description: str, client: Callable[[str], None], upstream: tuple[str, int]) -> None:
    proxy = TeeProxy(upstream)
    client(f"http://127.0.0.1:{proxy.port}")
    record_to(DATA / f"{name}.json", name, description, proxy.wait())


def record_to(path: Path, name: str, description: str, chunks: list[tuple[str, int, bytes]]) -> None:
    """Save what a :class:`TeeProxy` relayed, times relative to the first chunk."""
    t0 = chunks[0][1]
    document = {
        "name": name,
        "description": description,
        "chunks": [
            {"direction": direction, "t_ns": t - t0, "data": base64.b64encode(data).decode("ascii")}
            for direction, t, data in chunks
        ],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{name}: {len(chunks)} chunks, {sum(len(c[2]) for c in chunks)} bytes")


def main(names: list[str]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    DATA.mkdir(exist_ok=True)
    try:
        for name in names or list(SCENARIOS):
            description, client = SCENARIOS[name]
            record(name, description, client, ("127.0.0.1", server.server_port))
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
