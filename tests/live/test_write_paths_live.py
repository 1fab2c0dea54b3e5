"""Every way a traced server writes its response is copied whole, and the writes no socket takes
leave nothing behind: between a response and the next read, the server's thread writes a file and
a pipe and has a send refused (``EAGAIN`` on a full socket pair), so its last syscall is a write
no socket took when the next request is read. Responses go out by ``send``
(``sendto``), ``write``, ``sendmsg`` of two segments and ``writev`` of two, in turn; each request
must give one SERVER span with its own path and its response's whole body. In every socket mode:
by default a write is copied in ``sock_send_length`` from what its enter remembered and a read in
``sock_recv_length`` from the saved registers, with traceparent injection or fd-tracking by the
syscalls' exits."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path

import pytest

from tests.live.file_agent import SOCKET_MODES, serve_one_connection, whole_server_spans

pytestmark = pytest.mark.bpf

REQUESTS = 16

# The server: prints its port, and once told the agent is attached (a line on stdin: tracking fds,
# the agent sees only accepts it saw start) serves one keep-alive connection. Per request: the
# response (its body as long as the request's number says) by one of four calls, then, before the
# next read, a log line to /dev/null, a byte through a pipe and a send refused by a full
# non-blocking socket pair, in an order that changes.
SERVER = r"""
import os, socket, sys
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
sys.stdin.readline()
log = os.open(os.devnull, os.O_WRONLY)
pipe_r, pipe_w = os.pipe()
full, _peer = socket.socketpair()
full.setblocking(False)
try:
    while True:
        full.send(b"x" * 65536)
except BlockingIOError:
    pass
conn, _ = listener.accept()
while (request := conn.recv(4096)):
    assert request.endswith(b"\r\n\r\n"), request
    n = int(request.split(b" ")[1].rsplit(b"/", 1)[1])
    body = b"b" * (10 + n)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    way = n % 4
    if way == 0:
        conn.send(head + body)
    elif way == 1:
        os.write(conn.fileno(), head + body)
    elif way == 2:
        conn.sendmsg([head, body])
    else:
        os.writev(conn.fileno(), [head, body])
    # before the next read: a write no socket takes, last of the three in turn
    for kind in ((0, 1, 2), (1, 2, 0), (2, 0, 1))[n % 3]:
        if kind == 0:
            os.write(log, b"served one\n")
        elif kind == 1:
            os.write(pipe_w, b"x")
            os.read(pipe_r, 1)
        else:
            try:
                full.send(b"refused")
                sys.exit("the full socket pair took a send")
            except BlockingIOError:
                pass
"""


def _exchange(sock: socket.socket, n: int) -> None:
    sock.sendall(f"GET /items/{n} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    expected = 10 + n
    received = b""
    while not (b"\r\n\r\n" in received and len(received.split(b"\r\n\r\n", 1)[1]) == expected):
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200 OK\r\n"), received


@pytest.mark.parametrize("mode", SOCKET_MODES)
def test_every_write_call_is_copied_and_non_socket_writes_leave_nothing(tmp_path: Path, mode: str) -> None:
    serve_one_connection(tmp_path, SERVER, SOCKET_MODES[mode], _exchange, REQUESTS)
    spans = whole_server_spans(tmp_path / "out")
    seen = Counter(
        (a["url.path"], a["http.response.status_code"], a.get("http.response.body.size"))
        for a in (s["attributes"] for s in spans)
    )
    assert seen == Counter((f"/items/{n}", 200, 10 + n) for n in range(REQUESTS)), spans
