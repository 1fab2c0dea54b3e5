"""Live BPF: TCP health (bpf/tcp_health.c) of a traced client and server on the two ends of a veth
pair, with loss injected on the link by a TC classifier.

The client, in the pair's network namespace, runs at the same time a bulk transfer to a port whose
data segments the server's end drops every DROP_EVERY-th as they arrive (lost on the way: dropped
at the sender's own egress they would fail the send, and go again as new data, not as a
retransmission), and one to a port left alone; then a connect to a port bound but not listening
(refused: a reset received) and a connection it aborts (SO_LINGER 0: a reset sent). Each is its
own series (the server port tells them apart) of the client's resource. The server, in the root
namespace, is traced too (``--pid`` for each): its series are keyed by its own port and the
client's address.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from otel_ebpf.probes.tc import TcAttachment
from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.live.veth_pair import veth_pair
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

DROP_EVERY = 20
BULK = 4 << 20

SERVER = r"""
import ctypes, socket, struct, sys, threading, time
def drain(conn, reply=b"k"):
    try:
        while conn.recv(1 << 16):
            pass
        conn.sendall(reply)
    except OSError:
        pass  # the aborted connection
    conn.close()
def serve(listener, reply):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn, reply), daemon=True).start()
def filtered(listener):
    # A socket filter that drops every packet: the client's data and its retransmissions are
    # dropped by this socket (SKB_DROP_REASON_SOCKET_FILTER) until it is taken off.
    conn, _ = listener.accept()
    drop_all = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))  # BPF_RET | BPF_K, 0
    conn.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HL", 1, ctypes.addressof(drop_all)))
    conn.sendall(b"f")  # filtering now: the client may send
    time.sleep(1.5)
    # the socket's own count of what it dropped: SO_MEMINFO's SK_MEMINFO_DROPS
    dropped = struct.unpack("9I", conn.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 36))[8]
    conn.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
    drain(conn)
    print(dropped, flush=True)
SO_ATTACH_FILTER, SO_DETACH_FILTER, SO_MEMINFO = 26, 27, 55
HTTP_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk"
lossy, clean, aborted, dropping = (socket.create_server((sys.argv[1], 0)) for _ in range(4))
closed = socket.socket()
closed.bind((sys.argv[1], 0))  # bound, never listening: a SYN to it is answered with a reset
# the bulk transfers are HTTP uploads, so that their exchanges' spans say what they suffered
for listener, reply in ((lossy, HTTP_OK), (clean, HTTP_OK), (aborted, b"k")):
    threading.Thread(target=serve, args=(listener, reply), daemon=True).start()
threading.Thread(target=filtered, args=(dropping,), daemon=True).start()
print(*(s.getsockname()[1] for s in (lossy, clean, closed, aborted, dropping)), flush=True)
threading.Event().wait()
"""

CLIENT = r"""
import json, socket, struct, sys, threading
server, lossy, clean, closed, aborted, dropping, size = sys.argv[1], *map(int, sys.argv[2:])
sys.stdin.readline()  # the agent is attached
with socket.create_connection((server, dropping), timeout=60) as s:
    assert s.recv(1) == b"f"
    s.sendall(b"x" * 1000)
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b"k"
retransmitted = {}
def bulk(port):
    with socket.create_connection((server, port), timeout=60) as s:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: health\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        s.shutdown(socket.SHUT_WR)
        response = b""
        while not response.endswith(b"k"):
            response += s.recv(64)
        # the kernel's own count for this connection: struct tcp_info's tcpi_total_retrans
        retransmitted[port] = struct.unpack_from("<I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 100)[0]
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
print(json.dumps(retransmitted), flush=True)
print("done", flush=True)
threading.Event().wait()
"""

# Drops every DROP_EVERY-th IPv4 TCP segment with payload whose destination port is DPORT (one
# count for all CPUs: loss the test can rely on, not an exact pattern).
DROPPER = r"""
#include <uapi/linux/pkt_cls.h>
BPF_ARRAY(seen, u64, 1);

int drop_nth(struct __sk_buff *skb) {
    u8 ip[20];
    u8 tcp[14];
    u16 ethertype;
    if (bpf_skb_load_bytes(skb, 12, &ethertype, 2) || ethertype != __constant_htons(0x0800) ||
        bpf_skb_load_bytes(skb, 14, ip, 20) || ip[9] != 6)
        return TC_ACT_OK;
    u32 ihl = (ip[0] & 0xf) * 4;
    u32 total = (ip[2] << 8) | ip[3];
    if (ihl < 20 || ihl > 60 || bpf_skb_load_bytes(skb, 14 + ihl, tcp, 14))
        return TC_ACT_OK;
    u32 dport = (tcp[2] << 8) | tcp[3];
    u32 doff = (tcp[12] >> 4) * 4;
    if (dport != DPORT || total <= ihl + doff)
        return TC_ACT_OK;
    u32 zero = 0;
    u64 *n = seen.lookup(&zero);
    if (!n)
        return TC_ACT_OK;
    u64 count = __sync_fetch_and_add(n, 1) + 1;
    return count % DROP_EVERY == 0 ? TC_ACT_SHOT : TC_ACT_OK;
}
"""


@contextmanager
def dropping_every_nth(interface: str, dport: int, every: int) -> Iterator[None]:
    """The classifier on ``interface``'s ingress while the block runs."""
    from bcc import BPF

    bpf = BPF(text=DROPPER.encode(), cflags=[f"-DDPORT={dport}", f"-DDROP_EVERY={every}"])
    tc = TcAttachment()
    try:
        tc.attach(interface, {"ingress": bpf.load_func(b"drop_nth", BPF.SCHED_CLS)})
        yield
    finally:
        tc.detach()
        bpf.cleanup()


@pytest.fixture(scope="module")
def health(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("tcp_health")
    with veth_pair("otcp", 233) as pair:
        server = subprocess.Popen([sys.executable, "-c", SERVER, pair.outer_ipv4], stdout=subprocess.PIPE, text=True)
        client = None
        agent = None
        try:
            lossy, clean, closed, aborted, dropping = map(int, server.stdout.readline().split())
            arguments = [pair.outer_ipv4, *map(str, (lossy, clean, closed, aborted, dropping, BULK))]
            client = subprocess.Popen(
                ["ip", "netns", "exec", pair.namespace, sys.executable, "-c", CLIENT, *arguments],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            with dropping_every_nth(pair.outer, lossy, DROP_EVERY):
                agent = start_file_agent(tmp, [client.pid, server.pid], "export:\n  metric_interval_s: 1\n")
                client.stdin.write("go\n")
                client.stdin.flush()
                retransmitted = {int(port): n for port, n in json.loads(client.stdout.readline()).items()}
                assert client.stdout.readline().strip() == "done"
                filter_dropped = int(server.stdout.readline())
            time.sleep(2.5)  # the kernel's once-a-second read, then a metric interval
            stop_file_agent(agent)
            return {
                "metrics": load_file_metrics(tmp / "out"),
                "spans": load_file_spans(tmp / "out"),
                "ports": {"lossy": lossy, "clean": clean, "closed": closed, "aborted": aborted, "dropping": dropping},
                "filter_dropped": filter_dropped,
                "retransmitted": retransmitted,
                "client": (client.pid, pair.inner_ipv4),
                "server": (server.pid, pair.outer_ipv4),
            }
        finally:
            kill_all(agent, client, server)


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


def test_retransmissions_are_counted_for_the_connections_that_retransmitted(health: dict) -> None:
    """Per connection, against the kernel's own count (``tcpi_total_retrans``, in segments: a
    retransmitted GSO packet is one event here and several segments there). The clean connection
    retransmits nothing on a quiet machine; on a loaded one a tail-loss probe or a late ACK may make
    it retransmit once or twice, and then the agent must count that too."""
    for name in ("lossy", "clean"):
        port = health["ports"][name]
        counted = _total(health, "otel_ebpf.tcp.retransmissions", port, **{"network.peer.port": port})
        kernel = health["retransmitted"][port]
        assert (counted > 0) == (kernel > 0) and counted <= kernel, (name, counted, kernel)
    assert health["retransmitted"][health["ports"]["lossy"]] > 0, "the link dropped nothing: the test proves nothing"


def test_the_span_of_an_exchange_that_retransmitted_says_how_many_times(health: dict) -> None:
    """The lossy upload's CLIENT span carries the retransmissions its socket made while it was in
    flight: all of that connection's (it is its only exchange), up to the end of the response,
    so at most the series' count; the clean upload's span and both SERVER spans (the server sends
    one small response, which the link leaves alone) carry none, unless the clean connection did
    retransmit on a loaded machine, and then exactly as its series counted."""
    clients = {s["attributes"]["network.peer.port"]: s["attributes"] for s in health["spans"] if s["kind"] == "CLIENT"}
    # the server's span of each upload: the one with the same connection (its ISNs)
    servers = {
        s["attributes"]["otel_ebpf.tcp.client_isn"]: s["attributes"] for s in health["spans"] if s["kind"] == "SERVER"
    }
    assert len(clients) == len(servers) == 2
    for name in ("lossy", "clean"):
        port = health["ports"][name]
        counted = _total(health, "otel_ebpf.tcp.retransmissions", port, **{"network.peer.port": port})
        on_span = clients[port].get("otel_ebpf.tcp.retransmissions", 0)
        assert 0 < on_span <= counted if name == "lossy" else on_span <= counted, (name, on_span, counted)
        assert "otel_ebpf.tcp.retransmissions" not in servers[clients[port]["otel_ebpf.tcp.client_isn"]]


def test_a_refused_connect_receives_a_reset(health: dict) -> None:
    closed = health["ports"]["closed"]
    assert _total(health, "otel_ebpf.tcp.resets", closed, **{"network.io.direction": "receive"}) == 1
    assert _total(health, "otel_ebpf.tcp.resets", closed, **{"network.io.direction": "transmit"}) == 0


def test_an_aborted_connection_sends_a_reset(health: dict) -> None:
    aborted = health["ports"]["aborted"]
    assert _total(health, "otel_ebpf.tcp.resets", aborted, **{"network.io.direction": "transmit"}) == 1
    for port in (health["ports"]["lossy"], health["ports"]["clean"]):
        assert _total(health, "otel_ebpf.tcp.resets", port) == 0


@pytest.mark.parametrize("side", ["client", "server"])
def test_rtt_is_sampled_and_plausible_on_the_veth(health: dict, side: str) -> None:
    (points,) = _points(health, "otel_ebpf.tcp.rtt", side).values()
    points = [p for p in points if p["attributes"].get("server.port") == health["ports"]["clean"]]
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
    for port in (health["ports"]["lossy"], health["ports"]["clean"]):
        assert _total(health, "otel_ebpf.tcp.retransmissions", port, "server") == 0


def test_packets_a_socket_dropped_are_counted_with_the_kernels_reason(health: dict) -> None:
    """The server's socket filter dropped the client's data and its retransmissions (and the
    client's ACKs: the server then sends its "f" again, which the client drops as TCP_OLD_DATA).
    SOCKET_FILTER drops are counted on the server's series of that port and no other, at most as
    many as the socket itself counted (SK_MEMINFO_DROPS; it also counts drops the kernel reports
    with another reason). The other reasons that show up on a loaded veth (NOT_SPECIFIED at a
    close, TC_INGRESS where the classifier dropped a packet the client's socket still owned) are
    real drops too, not asserted on."""
    dropping = health["ports"]["dropping"]
    assert health["filter_dropped"] > 0, "the socket dropped nothing: the test proves nothing"
    by_socket_filter = {
        (p["resource"]["process.pid"], p["attributes"]["server.port"])
        for p in health["metrics"].get("otel_ebpf.tcp.drops", [])
        if p["attributes"]["otel_ebpf.tcp.drop_reason"] == "SOCKET_FILTER"
    }
    assert by_socket_filter == {(health["server"][0], dropping)}
    counted = _total(
        health, "otel_ebpf.tcp.drops", dropping, "server", **{"otel_ebpf.tcp.drop_reason": "SOCKET_FILTER"}
    )
    assert 0 < counted <= health["filter_dropped"]


def test_the_kernel_tables_overflow_counters_are_exported(health: dict) -> None:
    reasons = {p["attributes"].get("reason") for p in health["metrics"].get("otel_ebpf.kernel.drops", [])}
    assert {"tcp_owners_full", "tcp_series_full", "tcp_drops_full"} <= reasons
    for reason in ("tcp_owners_full", "tcp_series_full", "tcp_drops_full"):
        assert latest_total(health["metrics"], "otel_ebpf.kernel.drops", reason=reason) == 0
