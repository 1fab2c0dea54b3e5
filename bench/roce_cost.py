"""Cost of the RoCEv2 classifier (``bpf/roce.c``) per packet, from the kernel's own BPF statistics.

A veth pair (tests/live/veth_pair.py) with the probe attached to its root-namespace end, as
``roce.interfaces`` would; a raw socket sends known frames out of that end, so each passes the
egress classifier once (ingress runs the same code). With ``kernel.bpf_stats_enabled`` on for the
run, ``run_time_ns / run_cnt`` of the egress program is its time per packet (the statistics' own
two clock reads included), measured per 10,000 packets: reported are the fastest chunk (on a
shared machine, other programs only ever add time) and the median. Streams:

- ``udp (not RoCE)``: UDP/IPv4 to port 53, the check for the RoCE port fails;
- ``tcp (not RoCE)``: TCP/IPv4 segments, the check for UDP fails;
- ``roce send (in order)``: RC SEND_ONLY to one queue pair, PSNs in order: both tables updated;
- ``roce ack``: RC ACKNOWLEDGE with an AETH, read with a second load, its PSN looked up among the
  timed requests (not found here: the cost of a miss);
- ``roce send (AckReq)``: SEND_ONLY asking for an ACK, each with a new PSN: timed, one more
  (LRU) table update, the table full after the first 64 Ki.

Target: <= 200 ns per non-RoCE packet. Usage: ``python bench/roce_cost.py [--quick] [--packets N]`` (root).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from otel_ebpf.config import RoceConfig  # noqa: E402
from otel_ebpf.probes.roce import RoceProbe  # noqa: E402
from otel_ebpf.selfmetrics import SelfMetrics  # noqa: E402
from tests.live.veth_pair import VethPair, veth_pair  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from results import write_result  # noqa: E402

BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
CHUNK = 10_000  # packets per measurement
BTH_PSN = 14 + 20 + 8 + 8  # offset of the PSN's low 3 bytes: Ethernet, IPv4, UDP, BTH up to it


def _frames(pair: VethPair) -> dict[str, Callable[[int], bytes]]:
    """Stream name -> the frame to send as its ``i``-th packet."""
    from scapy.all import IP, TCP, UDP, Ether, Raw  # a test extra
    from scapy.contrib.roce import AETH, BTH, opcode

    ether = Ether(src=pair.mac(pair.outer), dst=pair.mac(pair.inner))
    ip = IP(src=pair.outer_ipv4, dst=pair.inner_ipv4)
    udp = bytes(ether / ip / UDP(sport=40000, dport=53) / Raw(bytes(64)))
    tcp = bytes(ether / ip / TCP(sport=40000, dport=80, flags="A") / Raw(bytes(64)))
    send = bytes(
        ether / ip / UDP(sport=49152, dport=4791) / BTH(opcode=opcode("RC", "SEND_ONLY")[0], dqpn=7) / Raw(bytes(64))
    )
    timed = bytes(
        ether
        / ip
        / UDP(sport=49152, dport=4791)
        / BTH(opcode=opcode("RC", "SEND_ONLY")[0], dqpn=9, ackreq=1)
        / Raw(bytes(64))
    )
    ack = bytes(
        ether
        / ip
        / UDP(sport=49152, dport=4791)
        / BTH(opcode=opcode("RC", "ACKNOWLEDGE")[0], dqpn=8)
        / AETH(syndrome=0x1F)
    )

    def with_psn(frame: bytes, psn: int) -> bytes:
        return frame[: BTH_PSN + 1] + struct.pack(">I", psn & 0xFFFFFF)[1:] + frame[BTH_PSN + 4 :]

    return {
        "udp (not RoCE)": lambda _: udp,
        "tcp (not RoCE)": lambda _: tcp,
        "roce send (in order)": lambda i: with_psn(send, i),
        "roce ack": lambda i: with_psn(ack, i),
        "roce send (AckReq)": lambda i: with_psn(timed, i),
    }


def _stats(fd: int) -> tuple[int, int]:
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines())
    return int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=200_000, help="packets per stream")
    parser.add_argument("--quick", action="store_true", help="20,000 packets per stream (checks that it works)")
    args = parser.parse_args()
    if args.quick:
        args.packets = 2 * CHUNK
    before = BPF_STATS.read_text()
    figures: dict[str, dict[str, float]] = {}
    with veth_pair("rcb", 252) as pair:
        probe = RoceProbe(RoceConfig(interfaces=(pair.outer,)), SelfMetrics(), {}, frozenset())
        probe.start()
        egress = probe.program_fds()["roce_egress"]
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        raw.bind((pair.outer, 0))
        try:
            BPF_STATS.write_text("1")
            for name, frame in _frames(pair).items():
                chunks = []  # ns per packet of each CHUNK packets: the fastest is the least disturbed
                sent = 0
                for _ in range(args.packets // CHUNK):
                    time_ns, runs = _stats(egress)
                    for _ in range(CHUNK):
                        raw.send(frame(sent))
                        sent += 1
                    time_ns, runs = (now - then for now, then in zip(_stats(egress), (time_ns, runs), strict=True))
                    chunks.append(time_ns / runs)
                figures[name] = {"fastest_ns": round(min(chunks), 1), "median_ns": round(statistics.median(chunks), 1)}
                print(
                    f"{name:24} {min(chunks):7.1f} ns/packet fastest, {statistics.median(chunks):7.1f} median",
                    flush=True,
                )
        finally:
            BPF_STATS.write_text(before)
            raw.close()
            probe.close()
    write_result("roce_cost", None, figures)


if __name__ == "__main__":
    main()
