"""Live BPF: the two halves of a connection between hosts carry the TCP handshake's initial sequence
numbers, the same on both ends, so a backend can join them without any header (issue 15, item 4).

Two hosts are stood for by the root network namespace and one the test creates, joined by a veth
pair: the server listens on the root end, the client runs in the namespace. The ISNs the spans must
carry are read independently, off the wire: a packet socket on the veth sees the SYN and SYN-ACK.
A connection on loopback (the same host: trace assembly joins it) carries none.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.live.test_tls_live import _start_agent, _stop
from tests.live.veth_pair import VethPair, veth_pair
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf

CLIENT_ISN, SERVER_ISN = "otel_ebpf.tcp.client_isn", "otel_ebpf.tcp.server_isn"
CALLS = 3
ETH_P_ALL = 0x0003
SYN, ACK = 0x02, 0x10

PEERS = [sys.executable, "-m", "tests.live.keepalive_peers"]


@pytest.fixture
def other_host() -> Iterator[VethPair]:
    with veth_pair("oeisn", 251) as pair:
        yield pair


Connection = tuple[str, int, str, int]  # client address and port, server address and port


class HandshakeCapture:
    """The sequence numbers of the SYNs and SYN-ACKs to ``ports`` that cross ``interface``, IPv4, by
    connection: ``handshakes[connection]`` is (the SYN's, the SYN-ACK's; None till it is seen)."""

    def __init__(self, interface: str, *ports: int) -> None:
        self.ports = ports
        self.handshakes: dict[Connection, tuple[int, int | None]] = {}
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._sock.bind((interface, 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame = self._sock.recv(65535)
            except TimeoutError:
                continue
            if len(frame) < 14 + 20 + 20 or frame[12:14] != b"\x08\x00" or frame[14 + 9] != socket.IPPROTO_TCP:
                continue
            source, destination = socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
            tcp = 14 + (frame[14] & 0x0F) * 4
            sport, dport, seq = struct.unpack_from("!HHI", frame, tcp)
            flags = frame[tcp + 13]
            if flags & (SYN | ACK) == SYN and dport in self.ports:
                self.handshakes[(source, sport, destination, dport)] = (seq, None)
            elif (
                flags & (SYN | ACK) == SYN | ACK
                and (connection := (destination, dport, source, sport)) in self.handshakes
            ):
                self.handshakes[connection] = (self.handshakes[connection][0], seq)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def _serve(address: str) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(
        [*PEERS, "serve", address, "--wait"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return server, int(server.stdout.readline().split()[1])


def _client(port: int, address: str, namespace: str | None) -> subprocess.Popen:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    client = subprocess.Popen(
        [*prefix, *PEERS, "client", address, str(port), "/joined", str(CALLS), "--wait"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    client.stdout.readline()  # its pid
    assert client.stdout.readline() == "ready\n"
    return client


def _go(process: subprocess.Popen, reply: str | None = "done\n") -> None:
    process.stdin.write("go\n")
    process.stdin.flush()
    if reply is not None:
        assert process.stdout.readline() == reply


@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_both_halves_of_a_connection_between_hosts_carry_its_isns(
    other_host: VethPair, tmp_path: Path, socket_mode: str
) -> None:
    server, port = _serve(other_host.outer_ipv4)
    local_server, local_port = _serve("127.0.0.1")
    remote = _client(port, other_host.outer_ipv4, other_host.namespace)
    local = _client(local_port, "127.0.0.1", None)
    pids = [str(p.pid) for p in (server, local_server, remote, local)]
    agent = None
    try:
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, socket_mode, *(f for pid in pids for f in ("--pid", pid)))
            _go(server, None)
            _go(local_server, None)
            capture = HandshakeCapture(other_host.outer, port)
            try:
                _go(remote)
            finally:
                capture.close()
            _go(local)
            receiver.wait_for(lambda r: len(r.spans()) >= 4 * CALLS, timeout=15)
            _stop(agent)
            agent = None
            spans = receiver.spans()
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        for process in (server, local_server, remote, local):
            process.kill()
            process.wait()

    [isns] = capture.handshakes.values()  # the client's keep-alive connection
    assert None not in isns, "the handshake was not seen"
    addresses = (other_host.outer_ipv4, other_host.inner_ipv4)
    between_hosts = [s for s in spans if s["attributes"]["network.peer.address"] in addresses]
    on_loopback = [s for s in spans if s["attributes"]["network.peer.address"] == "127.0.0.1"]
    assert sorted(s["kind"] for s in between_hosts) == ["CLIENT"] * CALLS + ["SERVER"] * CALLS
    assert len(on_loopback) == 2 * CALLS
    for span in between_hosts:
        attributes = span["attributes"]
        assert (attributes.get(CLIENT_ISN), attributes.get(SERVER_ISN)) == isns, (
            span["kind"],
            attributes,
        )
    assert not any(CLIENT_ISN in s["attributes"] or SERVER_ISN in s["attributes"] for s in on_loopback)
