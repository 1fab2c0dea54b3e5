"""Real HTTP/1.1 peers for the live BPF tests, run as separate processes.

``serve PORT_FILE``: a threaded ``http.server`` (HTTP/1.1 keep-alive) with routes covering the
cases the agent must handle; writes its port to PORT_FILE.
``client PORT``: opens a keep-alive connection and makes one request on it, prints ``ready``, waits
for a line on stdin (the agent attaches meanwhile: that connection predates it), then runs the
scenario below and prints one JSON line per request it made after the wait:
``{"method", "path", "status"}``.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import BinaryIO

KEEPALIVE_REQUESTS = 200
EARLY_REQUESTS = 3  # on a connection opened before the agent started
LARGE_BODY = 200_000  # far past the 4 KiB capture cap
DOWNLOAD_BODY = 1 << 20  # /download: one chunk, its terminator in the same write
UPLOAD_BODY = 50_000
# /stream: a write per chunk, the last with the terminator, as Node.js's res.write and res.end send
# them; a client reads several chunks at a time, the size lines between past the capture cap
STREAM_CHUNK, STREAM_CHUNKS = 8192, 60
SIGNED_QUERY = 6_000  # a URL as long as a signed download link's


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.startswith("/items/"):
            self._send(200, json.dumps({"item": path.rsplit("/", 1)[1]}).encode())
        elif path.startswith("/sleep/"):  # /sleep/<ms>: a request of known minimum duration
            time.sleep(int(path.rsplit("/", 1)[1]) / 1000)
            self._send(200, b"{}")
        elif path == "/boom":
            self._send(500, b'{"error": "boom"}')
        elif path == "/large":
            self._send(200, b"x" * LARGE_BODY, "application/octet-stream")
        elif path == "/chunked":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Checksum")
            self.end_headers()
            for part in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nX-Checksum: 42\r\n\r\n")
        elif path == "/download":  # as Node.js sends a large body: the reader's last read holds
            self.send_response(200)  # the end of the data and the terminator, past the capture cap
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n" % DOWNLOAD_BODY + b"d" * DOWNLOAD_BODY + b"\r\n0\r\n\r\n")
        elif path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"%x\r\n%s\r\n" % (STREAM_CHUNK, b"s" * STREAM_CHUNK)
            for _ in range(STREAM_CHUNKS - 1):
                self.wfile.write(chunk)
            time.sleep(0.05)  # the reader is drained: its last read is this write, past the cap
            self.wfile.write(chunk + b"0\r\n\r\n")
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._send(200, json.dumps({"received": len(body)}).encode())


def serve(port_file: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file, "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


def _report(method: str, path: str, status: int) -> None:
    print(json.dumps({"method": method, "path": path, "status": status}), flush=True)


def _read_response(stream: BinaryIO) -> int:
    """Read one Content-Length response from a raw socket file; return its status."""
    status = int(stream.readline().split()[1])
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    stream.read(length)
    return status


def client(port: int) -> None:
    early = http.client.HTTPConnection("127.0.0.1", port)
    early.request("GET", "/items/before-agent")
    early.getresponse().read()
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(EARLY_REQUESTS):
        early.request("GET", f"/items/early-{i}")
        response = early.getresponse()
        response.read()
        _report("GET", f"/items/early-{i}", response.status)
    early.close()

    conn = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(KEEPALIVE_REQUESTS):
        conn.request("GET", f"/items/{i}")
        response = conn.getresponse()
        response.read()
        _report("GET", f"/items/{i}", response.status)
    for method, path, body in (
        ("GET", "/chunked", None),
        ("GET", "/large", None),
        ("POST", "/upload", b"u" * UPLOAD_BODY),
        ("GET", "/missing", None),
        ("GET", "/boom", None),
        ("GET", f"/items/signed?sig={'s' * SIGNED_QUERY}", None),  # a request line past the capture cap
    ):
        conn.request(method, path, body=body)
        response = conn.getresponse()
        response.read()
        _report(method, path.split("?", 1)[0], response.status)
    conn.close()

    # Pipelining: three requests in one write, then the three responses.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        paths = [f"/items/pipelined-{i}" for i in range(3)]
        sock.sendall(b"".join(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % p.encode() for p in paths))
        stream = sock.makefile("rb")
        for path in paths:
            _report("GET", path, _read_response(stream))

    # A vectored reader (recvmsg into a small buffer and a large one, as Envoy reads): the last
    # read of /stream, its last chunk and the terminator, ends past the cap in the second buffer.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        small, large = bytearray(100), bytearray(32768)
        received = bytearray()
        while not received.endswith(b"\r\n0\r\n\r\n"):
            n = sock.recvmsg_into([small, large])[0]
            if not n:
                raise ConnectionError("the server closed /stream early")
            received += small[: min(n, len(small))] + large[: max(n - len(small), 0)]
        _report("GET", "/stream", int(received.split(b" ", 2)[1]))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(int(sys.argv[2]))
