"""Live BPF: TCP health (bpf/tcp_health.c) of a traced client, over a veth pair between two
network namespaces, with loss injected on the link by a TC classifier.

The client runs, at the same time, a bulk transfer to a port whose data segments the link drops
every DROP_EVERY-th, and one to a port it leaves alone; then a connect to a closed port (refused:
a reset received) and a connection it aborts (SO_LINGER 0: a reset sent). Each is its own series
(the server port tells them apart) of the client's resource. The server is traced too (``--pid``
for each): its series are keyed by its own port and the client's address.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.live.file_agent import start_file_agent
from tests.live.veth import dropping_every_nth, veth_link
from tests.otlp_receiver import latest_total, load_file_metrics

pytestmark = pytest.mark.bpf

LOSSY, CLEAN, CLOSED, ABORTED = 5001, 5002, 5003, 5004
DROP_EVERY = 20
BULK = 4 << 20

SERVER = r"""
import socket, sys, threading
def serve(port):
    listener = socket.create_server((sys.argv[1], port))
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()
def drain(conn):
    try:
        while conn.recv(1 << 16):
            pass
        conn.sendall(b"k")
    except OSError:
        pass  # the aborted connection
    conn.close()
for port in sys.argv[2:]:
    threading.Thread(target=serve, args=(int(port),), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""

CLIENT = r"""
import socket, struct, sys, threading
server, lossy, clean, closed, aborted, size = sys.argv[1], *map(int, sys.argv[2:])
sys.stdin.readline()  # the agent is attached
def bulk(port):
    with socket.create_connection((server, port), timeout=60) as s:
        s.sendall(b"x" * size)
        s.shutdown(socket.SHUT_WR)
        assert s.recv(1) == b"k"
transfers = [threading.Thread(target=bulk, args=(port,)) for port in (lossy, clean)]
for t in transfers:
    t.start()
for t in transfers:
    t.join()
try:
    socket.create_connection((server, closed), timeout=10)
except ConnectionRefusedError:
    pass
s = socket.create_connection((server, aborted), timeout=10)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
print("done", flush=True)
threading.Event().wait()
"""


@pytest.fixture(scope="module")
def health(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("tcp_health")
    with veth_link() as link, dropping_every_nth(link, LOSSY, DROP_EVERY, tmp / "bpffs"):
        server = subprocess.Popen(
            [
                *link.exec_in(link.server_ns),
                sys.executable,
                "-c",
                SERVER,
                link.server_addr,
                *map(str, (LOSSY, CLEAN, ABORTED)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        ports = (LOSSY, CLEAN, CLOSED, ABORTED, BULK)
        client = subprocess.Popen(
            [*link.exec_in(link.client_ns), sys.executable, "-c", CLIENT, link.server_addr, *map(str, ports)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        agent = None
        try:
            assert server.stdout.readline().strip() == "listening"
            agent = start_file_agent(tmp, [client.pid, server.pid], "export:\n  metric_interval_s: 1\n")
            client.stdin.write("go\n")
            client.stdin.flush()
            assert client.stdout.readline().strip() == "done"
            time.sleep(2.5)  # the kernel's once-a-second read, then a metric interval
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=60)[1]
            assert agent.returncode == 0, stderr
            return {
                "metrics": load_file_metrics(tmp / "out"),
                "client": (client.pid, link.client_addr),
                "server": (server.pid, link.server_addr),
            }
        finally:
            if agent is not None and agent.poll() is None:
                agent.kill()
                agent.wait()
            for process in (client, server):
                process.kill()
                process.wait()


def _points(health: dict, name: str, side: str) -> dict[str, list[dict]]:
    """The points of ``name`` of the client's or the server's process; no other process may have any."""
    points = health["metrics"].get(name, [])
    pids = {health[s][0]: s for s in ("client", "server")}
    assert {p["resource"]["process.pid"] for p in points} <= set(pids)
    return {name: [p for p in points if pids[p["resource"]["process.pid"]] == side]}


def _total(health: dict, name: str, port: int, side: str = "client", **attributes: object) -> float:
    """The total of ``side``'s series of ``port`` (whose peer is the other side)."""
    peer = health["server" if side == "client" else "client"][1]
    where = {"server.port": port, "network.peer.address": peer, **attributes}
    return latest_total(_points(health, name, side), name, **where)


def test_retransmissions_are_counted_for_the_lossy_connection_only(health: dict) -> None:
    assert _total(health, "otel_ebpf.tcp.retransmissions", LOSSY, **{"network.peer.port": LOSSY}) > 0
    assert _total(health, "otel_ebpf.tcp.retransmissions", CLEAN) == 0


def test_a_refused_connect_receives_a_reset(health: dict) -> None:
    assert _total(health, "otel_ebpf.tcp.resets", CLOSED, **{"network.io.direction": "receive"}) == 1
    assert _total(health, "otel_ebpf.tcp.resets", CLOSED, **{"network.io.direction": "transmit"}) == 0


def test_an_aborted_connection_sends_a_reset(health: dict) -> None:
    assert _total(health, "otel_ebpf.tcp.resets", ABORTED, **{"network.io.direction": "transmit"}) == 1
    for port in (LOSSY, CLEAN):
        assert _total(health, "otel_ebpf.tcp.resets", port) == 0


@pytest.mark.parametrize("side", ["client", "server"])
def test_rtt_is_sampled_and_plausible_on_the_veth(health: dict, side: str) -> None:
    (points,) = _points(health, "otel_ebpf.tcp.rtt", side).values()
    points = [p for p in points if p["attributes"].get("server.port") == CLEAN]
    assert points, f"no RTT histogram for the clean connection's {side}"
    latest = max(points, key=lambda p: p["time_ns"])
    peer = health["server" if side == "client" else "client"][1]
    assert latest["attributes"]["network.peer.address"] == peer
    # a server's peers' ports are ephemeral: no attribute of its series
    assert ("network.peer.port" in latest["attributes"]) == (side == "client")
    assert latest["unit"] == "s"
    assert latest["count"] > 0
    assert 0 < latest["min"] <= latest["max"] < 1.0
    assert sum(latest["bucket_counts"]) == latest["count"]


def test_the_server_retransmits_nothing(health: dict) -> None:
    # it sends one byte per connection and the link drops only what goes to it
    for port in (LOSSY, CLEAN):
        assert _total(health, "otel_ebpf.tcp.retransmissions", port, "server") == 0
