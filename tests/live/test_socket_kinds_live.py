"""Only TCP, MPTCP and UDP sockets become connections: a traced process that pings over a raw ICMP
socket (as ``ping`` does when run by root) and talks over a unix socket pair, then makes an HTTP
request over TCP and one over multipath TCP (``IPPROTO_MPTCP``, as Go's listeners use since
1.24), has two connections tracked, each with its span, and no TCP health series but the TCP
connection's. Before, any inet socket but UDP was taken for a TCP stream: the ICMP packets went
to user space as a connection's bytes no plugin could claim, and the raw socket was handed to
TCP health, which read a round-trip time at ``tcp_sock``'s offset from a smaller object."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

PINGS = 3

# Waits for a line on stdin (the agent is attached); pings 127.0.0.1 over a raw socket (each echo
# and its reply come back to it on loopback); sends a line through a unix socket pair; then GETs
# /after-ping from the port in argv[1] over TCP and /over-mptcp over MPTCP, and prints the statuses.
CLIENT = r"""
import http.client, socket, struct, sys
port, pings = int(sys.argv[1]), int(sys.argv[2])
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

left, right = socket.socketpair()
left.sendall(b"GET /over-unix HTTP/1.1\r\n\r\n")
right.recv(1024)

connection = http.client.HTTPConnection("127.0.0.1", port)
connection.request("GET", "/after-ping")
tcp_status = connection.getresponse().status

mptcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
mptcp.connect(("127.0.0.1", port))
mptcp.sendall(b"GET /over-mptcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
response = b""
while chunk := mptcp.recv(4096):
    response += chunk
print(tcp_status, response.split()[1].decode(), flush=True)
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


def test_raw_and_unix_sockets_are_not_connections(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(server.server_address[1]), str(PINGS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    agent = None
    try:
        agent = start_file_agent(tmp_path, client.pid, "capture:\n  socket_mode: tracepoints\n  tcp_health: true\n")
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline().split() == ["200", "200"]
        assert client.wait(timeout=30) == 0
        stop_file_agent(agent)
    finally:
        kill_all(agent, client)
        server.shutdown()

    out = tmp_path / "out"
    spans = load_file_spans(out)
    paths = sorted((s["kind"], s["attributes"]["url.full"].rsplit("/", 1)[-1]) for s in spans)
    assert paths == [("CLIENT", "after-ping"), ("CLIENT", "over-mptcp")], spans
    metrics = load_file_metrics(out)
    assert latest_total(metrics, "otel_ebpf.connections.opened") == 2
    assert latest_total(metrics, "otel_ebpf.connections.unknown_protocol") == 0
    rtt_ports = {p["attributes"].get("server.port") for p in metrics.get("otel_ebpf.tcp.rtt", [])}
    assert rtt_ports <= {server.server_address[1]}, rtt_ports
