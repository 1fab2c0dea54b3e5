"""Live BPF: RoCEv2 counted on the wire by the TC classifier (docs/roce.md).

A veth pair joins the root namespace (where the agent watches one end, ``roce.interfaces``) to a
test namespace. Frames built by scapy's own RoCE layers (``scapy.contrib.roce``, an encoder
independent of ours) cross it in both directions: requests of every kind with a PSN gap and
retransmissions, ACKs, NAKs with known codes, CNPs, ECN-CE marks, over IPv4 and IPv6; and UDP and
TCP that is not RoCE, which must count nothing. What the file exporter wrote must match exactly.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.config import RoceConfig
from otel_ebpf.probes.roce import IDLE_EVICT_S, RoceProbe
from otel_ebpf.rocev2 import FlowCounts, OpcodeCounts
from otel_ebpf.selfmetrics import SelfMetrics
from tests.live.file_agent import start_file_agent
from tests.live.veth_pair import VethPair, veth_pair
from tests.otlp_receiver import load_file_metrics

pytestmark = pytest.mark.bpf

scapy_all = pytest.importorskip("scapy.all")
roce = pytest.importorskip("scapy.contrib.roce")
Ether, IP, IPv6, UDP, TCP, Raw = (
    scapy_all.Ether,
    scapy_all.IP,
    scapy_all.IPv6,
    scapy_all.UDP,
    scapy_all.TCP,
    scapy_all.Raw,
)
BTH, AETH = roce.BTH, roce.AETH

ECN_CE = 3
RC = {
    name: roce.opcode("RC", name)[0]
    for name in ("SEND_ONLY", "RDMA_WRITE_ONLY", "RDMA_READ_REQUEST", "RDMA_READ_RESPONSE_ONLY", "ACKNOWLEDGE")
}
REQUESTER_QP, RESPONDER_QP, OUT_QP, V6_QP, ACKED_QP = 0x11, 0x22, 0x44, 0x55, 0x66


class Frames:
    """Frames between two ends, and the counts the agent must report for them."""

    def __init__(self, src_mac: str, dst_mac: str) -> None:
        self.src_mac, self.dst_mac = src_mac, dst_mac
        self.frames: list[Any] = []
        self.packets: Counter[tuple] = Counter()  # (source, destination, qp, opcode name)
        self.bytes: Counter[tuple] = Counter()

    def roce(
        self, src: str, dst: str, name: str, qp: int, psn: int, tos: int = 0, after_bth: Any = None, ackreq: int = 0
    ) -> None:
        ip = IPv6(src=src, dst=dst, tc=tos) if ":" in src else IP(src=src, dst=dst, tos=tos)
        bth = BTH(opcode=RC[name], dqpn=qp, psn=psn, ackreq=ackreq) if name != "CNP" else roce.cnp(qp)
        frame = Ether(src=self.src_mac, dst=self.dst_mac) / ip / UDP(sport=49152, dport=4791) / bth
        if after_bth is not None:
            frame = frame / after_bth
        self.frames.append(frame)
        key = (src, dst, qp, "CNP" if name == "CNP" else f"RC_{name}")
        self.packets[key] += 1
        self.bytes[key] += len(bytes(frame))

    def other(self, frame: Any) -> None:
        """Traffic that is not RoCEv2: counted nowhere."""
        self.frames.append(Ether(src=self.src_mac, dst=self.dst_mac) / frame)


def _incoming(pair: VethPair) -> Frames:
    """From the namespace to the watched end (its ingress)."""
    out = Frames(pair.mac(pair.inner), pair.mac(pair.outer))
    src, dst = pair.inner_ipv4, pair.outer_ipv4
    reth = Raw(bytes(16))  # virtual address, R_Key, DMA length: not parsed
    # requester -> QP 0x11: PSNs 100.., a READ (its responses take PSNs: no gap after it), a gap
    # (113 where 111 was due), then Go-back-N from 112: 112 and 113 again (duplicates), 114 new.
    # 102 and 104 ask for an ACK (timed, as the READ is), answered by _outgoing(); so does 113, but
    # it is sent again: its ACK is not timed (which copy does it answer?)
    for psn in (100, 101, 102):
        ecn = ECN_CE if psn == 101 else 0
        out.roce(src, dst, "SEND_ONLY", REQUESTER_QP, psn, ecn, Raw(b"x" * 32), ackreq=psn == 102)
    for psn in (103, 104):
        out.roce(src, dst, "RDMA_WRITE_ONLY", REQUESTER_QP, psn, after_bth=reth / Raw(b"y" * 64), ackreq=psn == 104)
    out.roce(src, dst, "RDMA_READ_REQUEST", REQUESTER_QP, 105, after_bth=reth)
    for psn in (110, 113, 112, 113, 114):
        out.roce(src, dst, "SEND_ONLY", REQUESTER_QP, psn, tos=ECN_CE if psn == 114 else 0, ackreq=psn == 113)
    # responder -> QP 0x22: ACKs, READ responses (their AETH is an ACK too), NAKs, an RNR NAK, CNPs
    for psn in (200, 201, 202, 203):
        out.roce(src, dst, "ACKNOWLEDGE", RESPONDER_QP, psn, after_bth=AETH(syndrome=0x1F, msn=psn))
    for psn in (204, 205):
        out.roce(src, dst, "RDMA_READ_RESPONSE_ONLY", RESPONDER_QP, psn, after_bth=AETH(syndrome=0x00) / Raw(b"z" * 48))
    for syndrome in (0x60, 0x60, 0x62, 0x23):  # NAK PSN sequence error x2, remote access error, RNR NAK
        out.roce(src, dst, "ACKNOWLEDGE", RESPONDER_QP, 206, after_bth=AETH(syndrome=syndrome))
    for _ in range(3):
        out.roce(src, dst, "CNP", RESPONDER_QP, 0)
    # IPv6, one of two CE-marked
    for psn, tos in ((7, ECN_CE), (8, 0)):
        out.roce(pair.inner_ipv6, pair.outer_ipv6, "SEND_ONLY", V6_QP, psn, tos=tos)
    # not RoCE: other UDP ports (one whose source port is 4791), TCP to 4791, plain IPv6 UDP
    body = Raw(bytes(BTH(opcode=RC["SEND_ONLY"], dqpn=0x99, psn=1)))
    for _ in range(5):
        out.other(IP(src=src, dst=dst) / UDP(sport=40000, dport=4792) / body)
        out.other(IP(src=src, dst=dst) / UDP(sport=4791, dport=5000) / body)
        out.other(IP(src=src, dst=dst) / TCP(sport=40001, dport=4791, flags="S"))
        out.other(IPv6(src=pair.inner_ipv6, dst=pair.outer_ipv6) / UDP(sport=40000, dport=4790) / body)
    return out


def _outgoing(pair: VethPair) -> Frames:
    """From the watched end into the namespace (its egress), after _incoming(): the answers to its
    timed requests (ACKs of 102 and 104, the READ response of 105) and to untimed ones (113, sent
    twice; 114)."""
    out = Frames(pair.mac(pair.outer), pair.mac(pair.inner))
    src, dst = pair.outer_ipv4, pair.inner_ipv4
    for psn in (1, 2):
        out.roce(src, dst, "SEND_ONLY", OUT_QP, psn)
    for psn in (102, 104, 113, 114):
        out.roce(src, dst, "ACKNOWLEDGE", ACKED_QP, psn, after_bth=AETH(syndrome=0x1F))
    out.roce(src, dst, "RDMA_READ_RESPONSE_ONLY", ACKED_QP, 105, after_bth=AETH(syndrome=0x00) / Raw(b"r" * 16))
    return out


@pytest.fixture
def pair() -> Iterator[VethPair]:
    with veth_pair("rce", 254) as created:
        yield created


def _final(metrics: dict[str, list[dict[str, Any]]], name: str) -> dict[tuple, Any]:
    """Each series' last value, keyed by its attributes (sorted items)."""
    latest: dict[tuple, dict[str, Any]] = {}
    for point in metrics.get(name, []):
        series = tuple(sorted(point["attributes"].items()))
        if series not in latest or point["time_ns"] >= latest[series]["time_ns"]:
            latest[series] = point
    return {series: point["value"] for series, point in latest.items()}


def _flow(pair: VethPair, direction: str, src: str, dst: str, qp: int, **more: Any) -> tuple:
    attributes = {
        "network.interface.name": pair.outer,
        "network.io.direction": direction,
        "source.address": src,
        "destination.address": dst,
        "roce.dest_qp": qp,
        **more,
    }
    return tuple(sorted(attributes.items()))


def test_roce_counts_on_the_wire(tmp_path: Path, pair: VethPair) -> None:
    target = subprocess.Popen(["sleep", "600"])
    agent = None
    try:
        agent = start_file_agent(
            tmp_path, target.pid, f"roce:\n  interfaces: [{pair.outer}]\nexport:\n  metric_interval_s: 1\n"
        )
        incoming, outgoing = _incoming(pair), _outgoing(pair)
        scapy_all.wrpcap(str(tmp_path / "incoming.pcap"), incoming.frames)
        pair.send_from_inside(tmp_path / "incoming.pcap")
        scapy_all.sendp(outgoing.frames, iface=pair.outer, verbose=False)
        agent.send_signal(signal.SIGINT)
        stderr = agent.communicate(timeout=60)[1]
        assert agent.returncode == 0, stderr
        # the classifiers and the clsact qdisc the agent added are gone
        qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", pair.outer], capture_output=True, text=True).stdout
        assert "clsact" not in qdiscs
    finally:
        target.kill()
        target.wait()
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()

    metrics = load_file_metrics(tmp_path / "out")
    expected_packets, expected_bytes = {}, {}
    for frames, direction in ((incoming, "receive"), (outgoing, "transmit")):
        for (src, dst, qp, name), count in frames.packets.items():
            series = _flow(pair, direction, src, dst, qp, **{"roce.opcode": name})
            expected_packets[series] = count
            expected_bytes[series] = frames.bytes[(src, dst, qp, name)]
    assert _final(metrics, "otel_ebpf.roce.packets") == expected_packets
    assert _final(metrics, "otel_ebpf.roce.bytes") == expected_bytes

    requester = _flow(pair, "receive", pair.inner_ipv4, pair.outer_ipv4, REQUESTER_QP)
    responder = _flow(pair, "receive", pair.inner_ipv4, pair.outer_ipv4, RESPONDER_QP)
    over_ipv6 = _flow(pair, "receive", pair.inner_ipv6, pair.outer_ipv6, V6_QP)
    assert _final(metrics, "otel_ebpf.roce.psn.gaps") == {requester: 1}
    assert _final(metrics, "otel_ebpf.roce.psn.duplicates") == {requester: 2}
    assert _final(metrics, "otel_ebpf.roce.ecn.ce") == {requester: 2, over_ipv6: 1}
    acked = _flow(pair, "transmit", pair.outer_ipv4, pair.inner_ipv4, ACKED_QP)
    assert _final(metrics, "otel_ebpf.roce.acks") == {responder: 6, acked: 5}
    assert _final(metrics, "otel_ebpf.roce.naks") == {
        _flow(pair, "receive", pair.inner_ipv4, pair.outer_ipv4, RESPONDER_QP, **{"roce.nak.code": code}): count
        for code, count in (("psn_sequence_error", 2), ("remote_access_error", 1), ("rnr", 1))
    }
    [latency] = [
        p
        for p in metrics["otel_ebpf.roce.ack.latency"]
        if p["time_ns"] == max(q["time_ns"] for q in metrics["otel_ebpf.roce.ack.latency"])
    ]
    assert tuple(sorted(latency["attributes"].items())) == acked
    assert latency["count"] == 3  # 102, 104 and the READ; not 113 (retransmitted), nor 114 (asked for no ACK)
    assert 0 < latency["min"] <= latency["max"] < 60
    assert latency["min"] * 3 <= latency["sum"] <= latency["max"] * 3
    resources = {tuple(sorted(p["resource"].items())) for p in metrics["otel_ebpf.roce.packets"]}
    assert len(resources) == 1
    resource = dict(next(iter(resources)))
    assert resource["host.name"] == os.uname().nodename
    assert "process.pid" not in resource


def test_a_full_table_counts_its_misses_idle_flows_leave_and_a_clsact_not_ours_stays(pair: VethPair) -> None:
    """In process, on a clock of its own: a QP table of one flow, a second flow missed (counted),
    then both idle past IDLE_EVICT_S and deleted from the kernel, which makes room for a third, and
    their series are forgotten in user space."""
    subprocess.run(["tc", "qdisc", "add", "dev", pair.outer, "clsact"], check=True)
    now = 0.0
    selfmetrics = SelfMetrics()
    config = RoceConfig(interfaces=(pair.outer,), max_qp_pairs=1)
    probe = RoceProbe(config, selfmetrics, {}, frozenset(), clock=lambda: now)

    def send(*qps: int) -> None:
        frames = Frames(pair.mac(pair.outer), pair.mac(pair.inner))
        for qp in qps:
            frames.roce(pair.outer_ipv4, pair.inner_ipv4, "SEND_ONLY", qp, 1)
        scapy_all.sendp(frames.frames, iface=pair.outer, verbose=False)

    def flows(counts: list) -> dict[str, set[int]]:
        return {
            kind.__name__: {c.flow.dest_qp for c in counts if isinstance(c, kind)}
            for kind in (OpcodeCounts, FlowCounts)
        }

    try:
        probe.start()
        send(1, 2)
        [collected] = probe.collect_metrics(1)
        assert {
            p.attributes["roce.dest_qp"] for m in collected.scope_metrics[0].metrics for p in m.data.data_points
        } == {
            1,
            2,  # the opcode table has room for 8 series
        }
        assert selfmetrics.snapshot()["otel_ebpf.kernel.drops"] == 1  # the QP table's miss
        now = IDLE_EVICT_S
        assert probe.collect_metrics(2) == []  # nothing grew: both tables' entries go, and their series
        send(3)
        assert flows(probe.read()) == {"OpcodeCounts": {3}, "FlowCounts": {3}}
    finally:
        probe.close()
    assert "clsact" in subprocess.run(["tc", "qdisc", "show", "dev", pair.outer], capture_output=True, text=True).stdout
    for hook in ("ingress", "egress"):
        shown = subprocess.run(["tc", "filter", "show", "dev", pair.outer, hook], capture_output=True, text=True)
        assert shown.stdout.strip() == ""
