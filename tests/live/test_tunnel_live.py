"""Live BPF: after a CONNECT is answered 2xx, or a request with ``101 Switching Protocols``, the
connection is a tunnel, not HTTP/1, for the kernel's counts (bpf/http1_summary.h) and for the
user-space parser alike.

A proxy-like server answers a plain GET, then a CONNECT with 200, then keeps answering the
requests sent *through* the tunnel (as a CONNECT to port 80 of a web server would carry). Only the
GET and the CONNECT are requests of this connection: the tunnelled ones must be neither spans nor
counts in ``http.server.request.duration``. Likewise on a second connection upgraded to a WebSocket
(the kernel waits for the client's first bytes after a 101, which are HTTP/2's preface on an h2c
upgrade; these are not).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.live.file_agent import start_file_agent
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

TUNNELLED = 3
SERVER = r"""
import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    reader = conn.makefile("rb")
    while line := reader.readline():
        while reader.readline() not in (b"\r\n", b""):
            pass
        if line.startswith(b"CONNECT "):
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        elif line.startswith(b"GET /chat "):
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    conn.close()
"""


def _exchange(sock: socket.socket, request: bytes, response_length: int) -> bytes:
    sock.sendall(request)
    got = b""
    while len(got) < response_length:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {got!r}"
        got += chunk
    return got


@pytest.fixture(scope="module")
def tunnel(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("tunnel")
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        agent = start_file_agent(tmp, server.pid, "export:\n  metric_interval_s: 1\n")
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        established = b"HTTP/1.1 200 Connection established\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            assert _exchange(sock, b"GET /plain HTTP/1.1\r\nHost: h\r\n\r\n", len(ok)) == ok
            connect = b"CONNECT example.com:80 HTTP/1.1\r\nHost: example.com:80\r\nContent-Length: 5\r\n\r\n"
            assert _exchange(sock, connect, len(established)) == established
            for i in range(TUNNELLED):
                inside = b"GET /inside/%d HTTP/1.1\r\nHost: example.com\r\n\r\n" % i
                assert _exchange(sock, inside, len(ok)) == ok
        switched = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            upgrade = b"GET /chat HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
            assert _exchange(sock, upgrade, len(switched)) == switched
            for i in range(TUNNELLED):
                inside = b"GET /inside/%d HTTP/1.1\r\nHost: h\r\n\r\n" % i
                assert _exchange(sock, inside, len(ok)) == ok
        time.sleep(2.5)  # a metric interval and the kernel's once-a-second report
        agent.send_signal(signal.SIGINT)
        stderr = agent.communicate(timeout=60)[1]
        assert agent.returncode == 0, stderr
        return {"spans": load_file_spans(tmp / "out"), "metrics": load_file_metrics(tmp / "out")}
    finally:
        server.kill()
        server.wait()


def test_tunnelled_requests_are_not_spans(tunnel: dict) -> None:
    server = [s for s in tunnel["spans"] if s["kind"] == "SERVER"]
    got = Counter(
        (s["attributes"]["http.request.method"], s["attributes"]["http.response.status_code"]) for s in server
    )
    assert got == Counter({("GET", 200): 1, ("CONNECT", 200): 1, ("GET", 101): 1})


def test_the_kernel_does_not_count_tunnelled_requests(tunnel: dict) -> None:
    name = "http.server.request.duration"
    assert latest_total(tunnel["metrics"], name, **{"http.request.method": "GET"}) == 2  # /plain, /chat
    assert latest_total(tunnel["metrics"], name, **{"http.request.method": "CONNECT"}) == 1
