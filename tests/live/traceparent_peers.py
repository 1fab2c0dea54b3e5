"""Peers for the traceparent injection tests (tests/live/test_inject_live.py,
tests/live/test_cross_node_live.py). Run as ``python -m tests.live.traceparent_peers`` from the
repository; every peer talks HTTP/1.1, on loopback unless told otherwise: a server listens on
``--listen ADDRESS`` where given, a caller's ``[HOST:]PORT`` names HOST where given.

``recorder [--listen ADDRESS] [CERT KEY]``: prints its port, then for every request one JSON line
``{"head": ...}``: the request's head exactly as it arrived (latin-1), up to and with its blank line.
Answers ``200 ok``; keeps the connection open. With a certificate and key, over TLS.
``client [HOST:]PORT [CA]``: prints ``ready``, then per JSON line on stdin makes one request on a new
connection and prints its status: ``{"path": P, "headers": {...}}`` with http.client (HTTPS when a CA
is given), ``{"raw": [chunk, ...]}`` sent as one write per chunk, 50 ms apart, or
``{"repeat": N, "path": P}``: N requests on one connection, without TCP_NODELAY (Nagle on, as a
socket has it by default), printing the milliseconds they took.
``proxy [--listen ADDRESS] [HOST:]PORT``: prints its port; serves each request by calling the same
path on HOST:PORT (on the thread that read it), then answers ``200 ok``.
"""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Recorder(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            print(json.dumps({"head": head.decode("latin-1")}), flush=True)
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            self.wfile.flush()


class _TLSServer(socketserver.ThreadingTCPServer):
    context: ssl.SSLContext

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True), address


def recorder(listen: str, cert: str | None, key: str | None) -> None:
    server_class = socketserver.ThreadingTCPServer
    if cert is not None:
        server_class = _TLSServer
        _TLSServer.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        _TLSServer.context.load_cert_chain(cert, key)
    with server_class((listen, 0), _Recorder) as server:
        print(server.server_address[1], flush=True)
        server.serve_forever()


def client(host: str, port: int, ca: str | None) -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "repeat" in request:
            started = time.monotonic()
            with socket.create_connection((host, port)) as sock:
                for _ in range(request["repeat"]):
                    sock.sendall(f"GET {request['path']} HTTP/1.1\r\nHost: recorder\r\n\r\n".encode())
                    answer = b""
                    while not answer.endswith(b"ok"):
                        answer += sock.recv(4096)
            status = str(round((time.monotonic() - started) * 1000))
        elif "raw" in request:
            with socket.create_connection((host, port)) as sock:
                for chunk in request["raw"]:
                    sock.sendall(chunk.encode("latin-1"))
                    time.sleep(0.05)
                status = sock.makefile("rb").readline().split()[1].decode()
        else:
            conn = (
                http.client.HTTPSConnection(host, port, context=ssl.create_default_context(cafile=ca))
                if ca
                else http.client.HTTPConnection(host, port)
            )
            conn.request("GET", request["path"], headers=request.get("headers", {}))
            status = str(conn.getresponse().status)
            conn.close()
        print(status, flush=True)


def proxy(listen: str, host: str, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            conn = http.client.HTTPConnection(host, port)
            conn.request("GET", self.path)
            conn.getresponse().read()
            conn.close()
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 — keep output clean
            pass

    with ThreadingHTTPServer((listen, 0), Handler) as server:
        print(server.server_address[1], flush=True)
        server.serve_forever()


def _address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    listen = "127.0.0.1"
    if args[:1] == ["--listen"]:
        listen, *args = args[1:]
    if command == "recorder":
        recorder(listen, *(args or [None, None]))
    elif command == "client":
        client(*_address(args[0]), args[1] if len(args) > 1 else None)
    else:
        proxy(listen, *_address(args[0]))
