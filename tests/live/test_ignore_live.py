"""Live BPF: a connection user space gave up on (no plugin claims its bytes) is no longer copied by
the kernel, and the next connection on the same fd is copied again.

The kernel's syscall exits consult ``ignored[]`` only once user space has given up on some
connection (``settings[SET_GAVE_UP]``): this checks that the give-up reaches them.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from otel_ebpf.config import load_config
from otel_ebpf.containers import ContainerResolver
from otel_ebpf.pipeline.events import ConnData, Event
from otel_ebpf.protocol import Direction

pytestmark = pytest.mark.bpf

# reads whatever each connection sends until the client closes it, one connection after the other
SERVER = """
import socket
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    conn.makefile("rb").read()
    conn.close()
"""

# another process than the probe's: the probe's own connections are never traced (they would be
# its exports); waits for a line on stdin after each "sent"
CLIENT = """
import socket, sys
port = int(sys.argv[1])
first = socket.create_connection(("127.0.0.1", port))
first.sendall(b"\\x00opaque-1")
print("sent", flush=True)
sys.stdin.readline()
first.sendall(b"\\x00opaque-2")
first.close()
second = socket.create_connection(("127.0.0.1", port))
second.sendall(b"\\x00opaque-3")
print("sent", flush=True)
sys.stdin.readline()
"""


def _received(probe, payload: bytes, seen: list[ConnData], timeout: float = 5.0) -> ConnData:  # noqa: ANN001
    """Poll until the server's read of ``payload`` arrives; what else arrives goes to ``seen``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events: list[Event] = probe.poll(100)
        seen += [e for e in events if isinstance(e, ConnData) and e.direction is Direction.INGRESS]
        for event in seen:
            if event.data == payload:
                return event
    raise AssertionError(f"the server's read of {payload!r} never arrived: {seen}")


def test_a_connection_given_up_on_is_no_longer_copied() -> None:
    from otel_ebpf.probes.socket import SocketProbe  # loads bcc: only when the test runs

    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    client = None
    try:
        port = int(server.stdout.readline())
        config = load_config({"pid": [server.pid]}, {})
        probe = SocketProbe(config.capture, config.targets, ContainerResolver("/"))
        probe.start()
        try:
            client = subprocess.Popen(
                [sys.executable, "-c", CLIENT, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            seen: list[ConnData] = []
            assert client.stdout.readline() == "sent\n"
            first = _received(probe, b"\x00opaque-1", seen)
            probe.ignore_connection(first.key)

            client.stdin.write("go\n")
            client.stdin.flush()
            assert client.stdout.readline() == "sent\n"
            second = _received(probe, b"\x00opaque-3", seen)
            client.stdin.write("done\n")
            client.stdin.flush()
            assert client.wait(timeout=10) == 0
        finally:
            probe.close()
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        server.kill()
        server.wait()
    assert second.key != first.key  # the same fd, most likely, but a new connection
    assert [e.data for e in seen if e.key == first.key] == [b"\x00opaque-1"]
    assert b"\x00opaque-2" not in [e.data for e in seen]
