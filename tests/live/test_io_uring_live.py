"""A traced server whose socket reads and sends are io_uring's makes no read- or write-family
syscall for them, so the agent cannot copy their bytes: it must say so, in its log and in
``otel_ebpf.kernel.drops{reason=socket_io_outside_syscalls}`` (one per read and per send), and
make no span of bytes it never saw. The server is C with raw io_uring syscalls
(``io_uring_server.c``, built here with gcc), served one keep-alive connection. A response that
``splice`` moves from a pipe to the socket is counted the same way, and the request it answered is
counted as answered unseen, not reported as failed."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.live.file_agent import SOCKET_MODES, serve_one_connection
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

SOURCE = Path(__file__).with_name("io_uring_server.c")
REQUESTS = 8
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

# Reads each request with recv, and answers through a pipe: the response is written to it, then
# spliced from it to the socket (the send happens inside splice).
SPLICE_SERVER = r"""
import os, socket, sys
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
sys.stdin.readline()
pipe_r, pipe_w = os.pipe()
conn, _ = listener.accept()
response = %r
while conn.recv(4096):
    os.write(pipe_w, response)
    assert os.splice(pipe_r, conn.fileno(), len(response)) == len(response)
""" % (RESPONSE,)


def _exchange(sock: socket.socket, n: int) -> None:
    sock.sendall(f"GET /items/{n} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    received = b""
    while len(received) < len(RESPONSE):
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        received += chunk
    assert received == RESPONSE


def _outside_syscalls(out: Path) -> float:
    return latest_total(load_file_metrics(out), "otel_ebpf.kernel.drops", reason="socket_io_outside_syscalls")


def test_io_uring_socket_io_is_counted_and_told(tmp_path: Path) -> None:
    binary = tmp_path / "io_uring_server"
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", "-o", str(binary), str(SOURCE)], check=True)
    stderr = serve_one_connection(tmp_path, [str(binary)], SOCKET_MODES["copy-in-sock"], _exchange, REQUESTS)
    out = tmp_path / "out"
    counted = _outside_syscalls(out)
    # every read, and every send but perhaps the first: a send is counted once the thread has the
    # slot a traced syscall's enter makes (its accept's, its first log write's)
    assert 2 * REQUESTS - 1 <= counted <= 2 * REQUESTS, counted
    told = [line for line in stderr.splitlines() if "through io_uring or splice" in line]
    assert len(told) == 1 and "(io_uring_server)" in told[0], stderr
    assert not [s for s in load_file_spans(out) if s["kind"] == "SERVER"]


def test_a_spliced_send_is_counted_and_its_requests_are_not_failed(tmp_path: Path) -> None:
    """The requests are read with recv, the responses spliced: at the close, the requests that
    saw no response are counted as answered unseen, in the spans shed and the kernel's drops, not
    reported as failed spans or counted as errors in the duration histogram."""
    serve_one_connection(tmp_path, SPLICE_SERVER, SOCKET_MODES["copy-in-sock"], _exchange, REQUESTS)
    out = tmp_path / "out"
    # the thread's pipe write made its slot before each splice
    assert _outside_syscalls(out) == REQUESTS
    assert [s for s in load_file_spans(out) if s["kind"] == "SERVER"] == []
    metrics = load_file_metrics(out)
    assert latest_total(metrics, "otel_ebpf.spans.shed", reason="response_unseen") == REQUESTS
    assert latest_total(metrics, "http.server.request.duration") == 0
    # the kernel keeps 4 requests waiting per connection; past those, it counts them as not measured
    unseen = latest_total(metrics, "otel_ebpf.kernel.drops", reason="http_responses_unseen")
    assert unseen + latest_total(metrics, "otel_ebpf.kernel.drops", reason="http_pipeline_full") == REQUESTS
    assert unseen > 0
