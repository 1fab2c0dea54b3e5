"""Reads whose bytes are not the stream's next ones in the buffer are not copied: a traced HTTP/1
server that sniffs each request with ``MSG_PEEK`` (as nginx peeks a byte to tell TLS from HTTP)
and throws a prefix away with ``MSG_TRUNC`` (TCP discards those bytes and writes nothing to the
buffer, which still holds the previous request) yields one span per request, each with its own
method and path: no peeked byte copied twice, no stale buffer copied as data. In every socket
mode: the kernel sees the flags in ``sock_recv_length`` when it copies reads there, at the
syscall's entry otherwise."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

REQUESTS = 12
PREFIX = b"#" * 32  # what the server discards before every other request
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

# The server: prints its port, and once told the agent is attached (a line on stdin: tracking fds,
# the agent sees only accepts it saw start) serves one keep-alive connection; before each read it
# peeks one byte, then sixteen; a '#' starts a prefix it discards with MSG_TRUNC into the buffer
# that holds the last request.
SERVER = rf"""
import socket, sys
prefix, response = {len(PREFIX)}, {RESPONSE!r}
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
sys.stdin.readline()
conn, _ = listener.accept()
buf = bytearray(4096)
while (first := conn.recv(1, socket.MSG_PEEK)):
    conn.recv(16, socket.MSG_PEEK)
    if first == b"#":
        assert conn.recv_into(buf, prefix, socket.MSG_TRUNC) == prefix
        continue
    n = conn.recv_into(buf)
    assert bytes(buf[:n]).endswith(b"\r\n\r\n"), bytes(buf[:n])
    conn.sendall(response)
"""

MODES = {
    "read-in-sock": "capture:\n  socket_mode: tracepoints\n",
    "fd-tracking": "capture:\n  socket_mode: fd-tracking\n",
    "syscall-exits": "capture:\n  socket_mode: tracepoints\ntrace:\n  inject_traceparent: true\n",
}


def _exchange(sock: socket.socket, n: int) -> None:
    prefix = PREFIX if n % 2 else b""
    sock.sendall(prefix + f"GET /items/{n} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    received = b""
    while len(received) < len(RESPONSE):
        chunk = sock.recv(len(RESPONSE) - len(received))
        assert chunk, "the server closed the connection"
        received += chunk
    assert received == RESPONSE


@pytest.mark.parametrize("mode", MODES)
def test_peeked_and_discarded_bytes_are_not_copied(tmp_path: Path, mode: str) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    agent = None
    try:
        port = int(server.stdout.readline())
        agent = start_file_agent(tmp_path, server.pid, MODES[mode])
        server.stdin.write("go\n")
        server.stdin.flush()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for n in range(REQUESTS):
                _exchange(sock, n)
        assert server.wait(timeout=30) == 0
        stop_file_agent(agent)
    finally:
        kill_all(agent, server)

    out = tmp_path / "out"
    spans = [s for s in load_file_spans(out) if s["kind"] == "SERVER"]
    seen = Counter(
        (a["http.request.method"], a["url.path"], a["http.response.status_code"])
        for a in (s["attributes"] for s in spans)
    )
    assert seen == Counter(("GET", f"/items/{n}", 200) for n in range(REQUESTS)), spans
    for span in spans:
        assert span["status_code"] == "UNSET", span
        assert "otel_ebpf.capture.gap" not in span["attributes"], span
    assert latest_total(load_file_metrics(out), "otel_ebpf.parse.errors") == 0
