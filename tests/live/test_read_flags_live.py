"""Reads whose bytes are not the stream's next ones in the buffer are not copied: a traced HTTP/1
server that sniffs each request with ``MSG_PEEK`` (as nginx peeks a byte to tell TLS from HTTP)
and throws a prefix away with ``MSG_TRUNC`` (TCP discards those bytes and writes nothing to the
buffer, which still holds the previous request) yields one span per request, each with its own
method and path: no peeked byte copied twice, no stale buffer copied as data. In every socket
mode: the kernel sees the flags in ``sock_recv_length`` when it copies reads there, at the
syscall's entry otherwise."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path

import pytest

from tests.live.file_agent import SOCKET_MODES, serve_one_connection, whole_server_spans

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


def _exchange(sock: socket.socket, n: int) -> None:
    prefix = PREFIX if n % 2 else b""
    sock.sendall(prefix + f"GET /items/{n} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    received = b""
    while len(received) < len(RESPONSE):
        chunk = sock.recv(len(RESPONSE) - len(received))
        assert chunk, "the server closed the connection"
        received += chunk
    assert received == RESPONSE


@pytest.mark.parametrize("mode", SOCKET_MODES)
def test_peeked_and_discarded_bytes_are_not_copied(tmp_path: Path, mode: str) -> None:
    serve_one_connection(tmp_path, SERVER, SOCKET_MODES[mode], _exchange, REQUESTS)
    spans = whole_server_spans(tmp_path / "out")
    seen = Counter(
        (a["http.request.method"], a["url.path"], a["http.response.status_code"])
        for a in (s["attributes"] for s in spans)
    )
    assert seen == Counter(("GET", f"/items/{n}", 200) for n in range(REQUESTS)), spans
