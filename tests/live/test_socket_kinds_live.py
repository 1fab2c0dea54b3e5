"""Only TCP, MPTCP, UDP and unix stream sockets become connections: a traced process that pings
over a raw ICMP socket (as ``ping`` does when run by root), sends a SYN over a raw TCP socket (as
packet tools do) and an HTTP request line over a unix datagram socket pair (unix streams are
traced: ``test_unix_sockets_live.py``), then makes an HTTP request over TCP or over multipath TCP
(``IPPROTO_MPTCP``, as Go's listeners use since 1.24), has one connection tracked, with its span,
and no TCP health series but the TCP connection's. Before, any inet socket but UDP was taken for
a TCP stream: the ICMP packets and the raw TCP socket's went to user space as connections' bytes
no plugin could claim, and the raw sockets were handed to TCP health, which read a round-trip
time at ``tcp_sock``'s offset from a smaller object."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, release, start_file_agent, stop_file_agent
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

PINGS = 3

# Waits for a line on stdin (the agent is attached); pings 127.0.0.1 over a raw socket (each echo
# and its reply come back to it on loopback); sends a SYN over a raw TCP socket; sends a line
# through a unix datagram socket pair; then GETs /after-ping from the port in argv[1] over the protocol in
# argv[3] (IPPROTO_*), and prints the status.
CLIENT = r"""
import socket, struct, sys
port, pings, protocol = map(int, sys.argv[1:4])
sys.stdin.readline()

def checksum(data):
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF

raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
raw.settimeout(5)
for seq in range(pings):
    payload = b"otel-ebpf ping " * 4
    header = struct.pack("!BBHHH", 8, 0, 0, 0x1234, seq)
    raw.sendto(struct.pack("!BBHHH", 8, 0, checksum(header + payload), 0x1234, seq) + payload, ("127.0.0.1", 0))
    while raw.recv(2048)[20] != 0:  # past the IP header: the echo request itself, then its reply (type 0)
        pass
raw.close()

# A raw TCP socket: a bare SYN to port 9 (the kernel adds the IP header), then one packet read back
# (on loopback its own: a raw TCP socket receives every TCP packet the host receives).
raw_tcp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
raw_tcp.settimeout(5)
raw_tcp.sendto(struct.pack("!HHIIBBHHH", 40000, 9, 1, 0, 5 << 4, 0x02, 1024, 0, 0), ("127.0.0.1", 0))
raw_tcp.recv(2048)
raw_tcp.close()

left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
left.sendall(b"GET /over-unix HTTP/1.1\r\n\r\n")
right.recv(1024)

with socket.socket(socket.AF_INET, socket.SOCK_STREAM, protocol) as stream:
    stream.connect(("127.0.0.1", port))
    stream.sendall(b"GET /after-ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    response = b""
    while chunk := stream.recv(4096):
        response += chunk
print(response.split()[1].decode(), flush=True)
"""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        """No access log: the server runs in pytest's process, whose stderr the test reports."""


def _mptcp_unavailable() -> str | None:
    """Why this kernel cannot open a multipath TCP socket, or None when it can."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP).close()
    except OSError as error:
        return f"no MPTCP on this kernel (CONFIG_MPTCP, net.mptcp.enabled): {error}"
    return None


@pytest.mark.parametrize("protocol", ["tcp", "mptcp"])
def test_raw_and_unix_datagram_sockets_are_not_connections(tmp_path: Path, protocol: str) -> None:
    if protocol == "mptcp" and (reason := _mptcp_unavailable()):
        pytest.skip(reason)
    number = socket.IPPROTO_MPTCP if protocol == "mptcp" else socket.IPPROTO_TCP
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(server.server_address[1]), str(PINGS), str(number)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    agent = None
    try:
        agent = start_file_agent(tmp_path, client.pid, "capture:\n  socket_mode: tracepoints\n  tcp_health: true\n")
        assert release(client) == "200"
        assert client.wait(timeout=30) == 0
        stop_file_agent(agent)
    finally:
        kill_all(agent, client)
        server.shutdown()

    out = tmp_path / "out"
    spans = load_file_spans(out)
    assert [(s["kind"], s["attributes"]["url.full"].rsplit("/", 1)[-1]) for s in spans] == [("CLIENT", "after-ping")], (
        spans
    )
    metrics = load_file_metrics(out)
    assert latest_total(metrics, "otel_ebpf.connections.opened") == 1
    assert latest_total(metrics, "otel_ebpf.connections.unknown_protocol") == 0
    rtt_ports = {p["attributes"].get("server.port") for p in metrics.get("otel_ebpf.tcp.rtt", [])}
    assert rtt_ports <= {server.server_address[1]}, rtt_ports
