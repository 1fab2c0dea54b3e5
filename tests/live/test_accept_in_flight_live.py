"""A server blocked in ``accept`` when the agent attaches (a Java acceptor thread, a plain blocking
server) has the connection that call returns traced, every request on it a SERVER span with its
peer. Tracking fds (the mode for kernels before 6.3), the accept's enter was not seen; the exit
alone now takes the new fd for a server connection, whose tuple user space reads from /proc
(before, no request of that connection was ever seen)."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.otlp_receiver import load_file_spans

pytestmark = pytest.mark.bpf

REQUESTS = 5

# Prints its port, then blocks in accept(); answers each request of the one keep-alive connection;
# once the client has closed it, keeps it open (the agent reads its tuple from /proc) until a line
# on stdin says the agent has stopped.
SERVER = r"""
import socket, sys
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
reader = conn.makefile("rb")
while (line := reader.readline()):
    while reader.readline() not in (b"\r\n", b""):
        pass
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
sys.stdin.readline()
"""


# accept and accept4's numbers, as /proc/PID/syscall names the call a thread sleeps in
ACCEPT_SYSCALLS = {"x86_64": ("43", "288"), "aarch64": ("202", "242")}


def _in_accept(pid: int, timeout: float = 10) -> None:
    """Wait until the server's thread sleeps in accept (its syscall, per /proc)."""
    accepts = ACCEPT_SYSCALLS[platform.machine()]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
        if fields and fields[0] in accepts:
            return
        time.sleep(0.05)
    raise AssertionError(f"the server is not in accept: {Path(f'/proc/{pid}/syscall').read_text()!r}")


@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_a_connection_accepted_by_a_call_older_than_the_agent_is_traced(tmp_path: Path, socket_mode: str) -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        port = int(server.stdout.readline())
        _in_accept(server.pid)
        agent = start_file_agent(tmp_path, server.pid, f"capture:\n  socket_mode: {socket_mode}\n")
        sock = socket.create_connection(("127.0.0.1", port))
        with sock, sock.makefile("rb") as reader:  # the socket's fd closes with both
            client_port = sock.getsockname()[1]
            for n in range(REQUESTS):
                sock.sendall(f"GET /items/{n} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                assert reader.readline().split()[1] == b"200"
                while reader.readline() != b"\r\n":
                    pass
                assert reader.read(2) == b"ok"
        stop_file_agent(agent)
        server.stdin.write("done\n")
        server.stdin.flush()
        assert server.wait(timeout=30) == 0
    finally:
        kill_all(agent, server)

    spans = [s for s in load_file_spans(tmp_path / "out") if s["kind"] == "SERVER"]
    assert sorted(s["attributes"]["url.path"] for s in spans) == [f"/items/{n}" for n in range(REQUESTS)], spans
    for span in spans:
        assert span["attributes"]["network.peer.port"] == client_port, span
        assert span["attributes"]["server.port"] == port, span
