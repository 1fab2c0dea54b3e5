"""Live BPF: bytes and packets of traced TCP connections (``capture.tcp_flows``, bpf/tcp_flows.c),
per process, direction and cgroup, on loopback, over IPv4 and IPv6 (whose loopback sends packets
over 64 KiB with a hop-by-hop jumbo option: BIG TCP).

A server, which moves itself into a cgroup v2 child the test creates before it opens a socket,
accepts one connection and waits before its first read, so that the client's UP bytes have all
arrived before the agent can learn from a syscall whose socket it is (they are kept for it from
the handshake on); then it sends DOWN bytes back. The client, in the test's own cgroup, sends UP
and reads DOWN. Both are traced. Each end of the loopback connection counts its own packets: the
client's transmit and the server's receive are the same packets, once each, apart from the
handshake's, which the kernel handles on the server's listening socket (nobody's).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_ebpf.cgroups import cgroup2_mount
from otel_ebpf.probes.cgroup_link import CGROUP_INET_EGRESS, CGROUP_INET_INGRESS
from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.otlp_receiver import latest_total, load_file_metrics

pytestmark = pytest.mark.bpf

UP = 50_000  # fits the server's receive window while it does not read: nothing to retransmit
DOWN = 1 << 20
# Per address family: the loopback address, the headers of a packet (IP: IPv4 20 bytes, IPv6 40;
# TCP 20, and up to 40 of options: 12 of timestamps on data, 20 on a SYN), the loopback MSS (the
# MTU less the headers of a data segment).
FAMILIES = {
    "ipv4": {"address": "127.0.0.1", "ip": 20, "headers": (40, 80), "mss": 65536 - 52},
    "ipv6": {"address": "::1", "ip": 40, "headers": (60, 100), "mss": 65536 - 72},
}

# the kernel's own count for a socket, from struct tcp_info: payload bytes retransmitted
# (tcpi_bytes_retrans)
TCP_INFO = r"""
def tcp_info(s):
    return {"bytes_retrans": struct.unpack_from("<Q", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232), 208)[0]}
"""

SERVER = (
    r"""
import json, os, socket, struct, sys, time
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))  # before any socket: a socket stays in the cgroup it was made in
up, down = int(sys.argv[2]), int(sys.argv[3])
"""
    + TCP_INFO
    + r"""
address = sys.argv[4]
listener = socket.create_server((address, 0), family=socket.AF_INET6 if ":" in address else socket.AF_INET)
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
time.sleep(0.5)  # the client's bytes arrive meanwhile
got = 0
while got < up:
    got += len(conn.recv(1 << 16))
conn.sendall(b"y" * down)
conn.shutdown(socket.SHUT_WR)
assert conn.recv(1) == b""
info = tcp_info(conn)
conn.close()
print(json.dumps(info), flush=True)
time.sleep(3600)
"""
)

CLIENT = (
    r"""
import json, socket, struct, sys, time
port, up, down = map(int, sys.argv[1:4])
"""
    + TCP_INFO
    + r"""
sys.stdin.readline()  # the agent is attached
s = socket.create_connection((sys.argv[4], port))
s.sendall(b"x" * up)
s.shutdown(socket.SHUT_WR)
got = 0
while chunk := s.recv(1 << 16):
    got += len(chunk)
assert got == down
info = tcp_info(s)
s.close()
print(json.dumps(info), flush=True)
time.sleep(3600)
"""
)


def _cgroup_of(pid: int) -> str:
    """A process's cgroup v2 path (the ``0::`` line of /proc/<pid>/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"process {pid} is in no cgroup v2")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def flows(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    family = FAMILIES[request.param]
    tmp = tmp_path_factory.mktemp("tcp_flows")
    name = f"otel-ebpf-flows-{os.getpid()}-{request.param}"
    child = cgroup2_mount() / name
    child.mkdir()
    server = client = agent = None
    try:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(child), str(UP), str(DOWN), family["address"]],
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(server.stdout.readline())
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(port), str(UP), str(DOWN), family["address"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        config = "capture:\n  tcp_flows: true\nexport:\n  metric_interval_s: 1\n"
        agent = start_file_agent(tmp, [client.pid, server.pid], config)
        client.stdin.write("go\n")
        client.stdin.flush()
        kernel = {"client": json.loads(client.stdout.readline()), "server": json.loads(server.stdout.readline())}
        time.sleep(2.5)  # the kernel's once-a-second read, then a metric interval
        stop_file_agent(agent)
        return {
            **family,
            "metrics": load_file_metrics(tmp / "out"),
            "port": port,
            "kernel": kernel,
            "pids": {"client": client.pid, "server": server.pid},
            "cgroups": {"client": _cgroup_of(client.pid), "server": f"/{name}"},
        }
    finally:
        kill_all(agent, client, server)
        child.rmdir()


def _moved(flows: dict, side: str, direction: str) -> tuple[float, float]:
    """(bytes, packets) of ``side``'s series of the connection, one way."""
    where = {
        "server.port": flows["port"],
        "network.peer.address": flows["address"],
        "network.transport": "tcp",
        "network.io.direction": direction,
        "otel_ebpf.cgroup.path": flows["cgroups"][side],
    }
    totals = []
    for name in ("otel_ebpf.tcp.io", "otel_ebpf.tcp.packet.count"):
        of_side = [p for p in flows["metrics"].get(name, []) if p["resource"]["process.pid"] == flows["pids"][side]]
        totals.append(latest_total({name: of_side}, name, **where))
    return totals[0], totals[1]


def test_only_the_traced_processes_have_flows_each_in_its_own_cgroup(flows: dict) -> None:
    for name in ("otel_ebpf.tcp.io", "otel_ebpf.tcp.packet.count"):
        points = flows["metrics"].get(name, [])
        assert points, f"no {name} exported"
        by_pid = {(p["resource"]["process.pid"], p["attributes"].get("otel_ebpf.cgroup.path")) for p in points}
        assert by_pid == {(flows["pids"][side], flows["cgroups"][side]) for side in ("client", "server")}
        assert {p["unit"] for p in points} == {"By" if name.endswith(".io") else "{packet}"}
    assert flows["cgroups"]["client"] != flows["cgroups"]["server"]


@pytest.mark.parametrize(
    ("side", "direction", "payload"),
    [("client", "transmit", UP), ("server", "receive", UP), ("server", "transmit", DOWN), ("client", "receive", DOWN)],
)
def test_bytes_are_the_payload_and_its_headers(flows: dict, side: str, direction: str, payload: int) -> None:
    """Every packet adds its IP and TCP headers; retransmitted payload (none, on a quiet loopback)
    is on the wire again. The server's UP bytes came before its first read: kept from the
    handshake, then moved to its series."""
    moved, packets = _moved(flows, side, direction)
    sender = side if direction == "transmit" else ("server" if side == "client" else "client")
    retransmitted = flows["kernel"][sender]["bytes_retrans"]
    assert packets > 0
    least, most = flows["headers"]
    assert payload + least * packets <= moved <= payload + retransmitted + most * packets, (
        moved,
        packets,
        retransmitted,
    )


@pytest.mark.parametrize(("side", "payload"), [("client", UP), ("server", DOWN)])
def test_packet_counts_are_plausible(flows: dict, side: str, payload: int) -> None:
    """A side sends its payload in segments of at most the loopback MSS and at least the smallest
    one (536 bytes), and otherwise only the handshake's, the close's and ACKs of what it received.
    (tcp_info's own segment counts are no reference: a server socket's fell short of what its
    peer received, by a factor of five, with no BPF program loaded.)"""
    _, sent = _moved(flows, side, "transmit")
    _, received = _moved(flows, side, "receive")
    assert -(-payload // flows["mss"]) < sent <= -(-payload // 536) + received + 3, (sent, received)


def test_each_end_counts_its_own_packets_once(flows: dict) -> None:
    """Loopback: what the client sent is what the server received, each on its own socket and
    neither twice, byte for byte, but for the handshake's packets to and from the listener: the
    SYN (TCP options: MSS, SACK permitted, timestamps, window scale: 20 bytes) and the last ACK
    (timestamps: 12) one way, the SYN-ACK (20) the other, with Linux's default TCP settings. A
    header counted wrong on either side (a BIG TCP packet's jumbo option) shows here."""
    ip = flows["ip"]
    syn, ack = ip + 20 + 20, ip + 20 + 12
    for sender, receiver, packets, handshake in (("client", "server", 2, syn + ack), ("server", "client", -1, -syn)):
        sent_bytes, sent = _moved(flows, sender, "transmit")
        received_bytes, received = _moved(flows, receiver, "receive")
        assert (sent - received, sent_bytes - received_bytes) == (packets, handshake), (sender, sent, received)


def test_the_flow_table_overflow_counter_is_exported(flows: dict) -> None:
    reasons = {p["attributes"].get("reason") for p in flows["metrics"].get("otel_ebpf.kernel.drops", [])}
    assert "tcp_flows_full" in reasons
    assert latest_total(flows["metrics"], "otel_ebpf.kernel.drops", reason="tcp_flows_full") == 0


def _attached(cgroup_dir: Path, attach_type: int) -> int:
    """How many programs the cgroup itself has for ``attach_type`` (``BPF_PROG_QUERY``, x86-64)."""
    attr = ctypes.create_string_buffer(64)  # target_fd, attach_type, query_flags, attach_flags, prog_ids, prog_cnt
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr[0:8] = fd.to_bytes(4, "little") + attach_type.to_bytes(4, "little")
        assert ctypes.CDLL(None, use_errno=True).syscall(321, 16, attr, 64) == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    return int.from_bytes(attr[24:28], "little")


def test_a_killed_agent_leaves_no_program_on_the_cgroup(tmp_path: Path) -> None:
    """The flow programs hang on BPF links, which the kernel drops with the agent's last file
    descriptor: SIGKILL, no clean-up, and the root cgroup has what it had before."""
    root = cgroup2_mount()
    hooks = (CGROUP_INET_INGRESS, CGROUP_INET_EGRESS)
    before = [_attached(root, hook) for hook in hooks]
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        agent = start_file_agent(tmp_path, sleeper.pid, "capture:\n  tcp_flows: true\n")
        try:
            assert [_attached(root, hook) for hook in hooks] == [n + 1 for n in before]
        finally:
            agent.kill()
            agent.wait()
    finally:
        sleeper.kill()
        sleeper.wait()
    deadline = time.monotonic() + 10
    while [_attached(root, hook) for hook in hooks] != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [_attached(root, hook) for hook in hooks] == before
