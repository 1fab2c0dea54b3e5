"""The kernel's TCP health counts (``tcp_series`` and ``tcp_drops`` in ``bpf/tcp_health.c``,
``tcp_flows`` in ``bpf/tcp_flows.c``), read once per interval, and the attachment of the flow
programs.

Each read sums the CPUs and reports what grew since the previous read as
:class:`~otel_ebpf.pipeline.events.TcpHealthCounts` events (a series' dropped packets, by reason, and its
bytes and packets, by cgroup, with it), so that recordings carry them and replay reproduces the
metrics. Series of processes that exited are read one last time and then deleted from the kernel
tables, which keeps them within their caps; as their sockets can outlive them (closed, still
sending their last segments or FIN), a series of such a process that comes back is reported and
deleted again at each read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..pipeline.events import TcpFlow, TcpHealthCounts
from ..protocol import Role
from ..tcp_metrics import RTT_BOUNDARIES_S
from .addresses import endpoint
from .cgroup_link import CGROUP_INET_EGRESS, CGROUP_INET_INGRESS, link_cgroup

TCP_EVENTS = Path("/sys/kernel/tracing/events/tcp")
KFREE_SKB = Path("/sys/kernel/tracing/events/skb/kfree_skb/format")
# bpf/tcp_health.c's tracepoints; each must name the socket (skaddr)
TRACEPOINTS = ("tcp_retransmit_skb", "tcp_send_reset", "tcp_receive_reset", "tcp_destroy_sock")
# where the RTT is sampled at each segment received: reads that name no socket (fd tracking)
RTT_TRACEPOINT = "tcp_probe"
MAX_TCP_SERIES = 4096  # (process, role, peer, server port) series the kernel aggregates
# tcp_stats[] slots: kernel.drops reasons
STAT_NAMES = ("tcp_series_full", "tcp_owners_full", "tcp_drops_full", "tcp_flows_full")
# bpf/tcp_flows.c: the cgroup programs and their hooks, and the one that remembers accepted sockets
FLOW_PROGRAMS = (("tcp_flow_ingress", CGROUP_INET_INGRESS), ("tcp_flow_egress", CGROUP_INET_EGRESS))
FLOW_ACCEPTED = ("tcp_flow_accepted", b"sock", b"inet_sock_set_state")
_FLOW_COUNTERS = ("bytes_sent", "bytes_received", "packets_sent", "packets_received")
_ROLES = {1: Role.CLIENT, 2: Role.SERVER}
_COUNTERS = ("retransmissions", "resets_sent", "resets_received", "rtt_count", "rtt_sum_us")
RTT_BUCKETS = len(RTT_BOUNDARIES_S) + 1

# counters (as _COUNTERS), then the RTT buckets
_Totals = tuple[int, ...]


def missing_tracepoints(rtt_per_segment: bool, events: Path = TCP_EVENTS) -> list[str]:
    """What this kernel lacks of the tracepoints TCP health attaches to (``name``, or
    ``name.skaddr`` where the tracepoint does not name the socket): none, or it runs without.
    ``rtt_per_segment``: the RTT is sampled at each segment received (:data:`RTT_TRACEPOINT`)."""
    missing = []
    for name in (*TRACEPOINTS, *([RTT_TRACEPOINT] if rtt_per_segment else [])):
        try:
            fields = (events / name / "format").read_text()
        except OSError:
            missing.append(name)
            continue
        if " skaddr;" not in fields:
            missing.append(f"{name}.skaddr")
    return missing


def retransmit_reports_failures(events: Path = TCP_EVENTS) -> bool:
    """Whether ``tcp:tcp_retransmit_skb`` also fires for attempts that failed, with their error
    (``err``; kernels since mid-2025): those resent nothing (the segment was still queued in the
    host, or no memory), and the kernel's own count (``tcpi_total_retrans``) leaves them out."""
    try:
        return " err;" in (events / "tcp_retransmit_skb" / "format").read_text()
    except OSError:
        return False


def drop_reasons(format_path: Path = KFREE_SKB) -> dict[int, str] | None:
    """The names of the kernel's drop reasons (``enum skb_drop_reason``: ``{2: "NOT_SPECIFIED",
    ...}``) as ``skb:kfree_skb`` prints them, or ``None`` where that tracepoint names no reason or
    no receiving socket (``rx_sk``, Linux 6.8+): drops are then not counted."""
    try:
        text = format_path.read_text()
    except OSError:
        return None
    if " rx_sk;" not in text or " reason;" not in text:
        return None
    return {int(value): name for value, name in re.findall(r'\{\s*(\d+),\s*"(\w+)"\s*\}', text)}


def attach_flows(bpf: Any, cgroup_root: str) -> list[int]:
    """The flow programs of ``bpf`` (a socket probe built with ``-DTCP_FLOWS``) attached: the two
    cgroup programs linked to the cgroup v2 root at ``cgroup_root`` (every socket of the node is
    in its subtree), the accepted-socket program on its tracepoint. Returns the file descriptors
    that hold them there; closing them detaches them. Raises ``OSError`` when the kernel refuses."""
    from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc
    from bcc.libbcc import lib  # noqa: PLC0415

    held: list[int] = []
    try:
        for name, attach_type in FLOW_PROGRAMS:
            held.append(link_cgroup(bpf.load_func(name.encode(), BPF.CGROUP_SKB).fd, cgroup_root, attach_type))
        # By hand, not BPF.attach_tracepoint: BCC keeps one fd per tracepoint name, and socket_trace.c's
        # program holds this one's.
        name, category, event = FLOW_ACCEPTED
        fd = lib.bpf_attach_tracepoint(bpf.load_func(name.encode(), BPF.TRACEPOINT).fd, category, event)
        if fd < 0:
            raise OSError(-fd, f"cannot attach to {category.decode()}:{event.decode()}")
        held.append(fd)
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held


def summed(per_cpu: Sequence[Any]) -> _Totals:
    """One series' per-CPU values summed: the counters of ``_COUNTERS``, then the RTT buckets."""
    counters = tuple(sum(getattr(v, name) for v in per_cpu) for name in _COUNTERS)
    buckets = tuple(sum(v.rtt_buckets[i] for v in per_cpu) for i in range(len(per_cpu[0].rtt_buckets)))
    return counters + buckets


def peer_of(key: Any) -> tuple[Role, str]:
    """The role and the peer's address (``""`` when the kernel did not know it) of a series key."""
    role = _ROLES.get(key.role, Role.SERVER)
    if key.family not in (2, 10):
        return role, ""
    return role, endpoint(key.family, bytes(key.peer_addr), 0).address


# per series (its key's bytes): its key, and each part of it that grew (a drop reason, a cgroup's
# flow) with the growth
_GrownParts = dict[bytes, tuple[Any, list[tuple[Any, _Totals]]]]


def _parts(grown: _GrownParts, raw_key: bytes) -> list[tuple[Any, _Totals]]:
    return grown[raw_key][1] if raw_key in grown else []


class TcpHealthReader:
    def __init__(
        self,
        table: Any,
        drops: Any = None,
        reasons: dict[int, str] | None = None,
        flows: Any = None,
        cgroup_path: Callable[[int], str] | None = None,
    ) -> None:
        """``table``: BCC's view of ``tcp_series``; ``drops`` of ``tcp_drops`` (``None`` when the
        kernel does not count them), whose reasons ``reasons`` names; ``flows`` of ``tcp_flows``
        (``None`` with ``capture.tcp_flows`` off), whose cgroup ids ``cgroup_path`` names (by
        default, in decimal)."""
        self._table = table
        self._drops = drops
        self._reasons = reasons or {}
        self._flows = flows
        self._cgroup_path = cgroup_path or str
        self._totals: dict[bytes, _Totals] = {}
        self._part_totals: dict[bytes, _Totals] = {}  # tcp_drops' and tcp_flows' entries
        self._exited: dict[int, None] = {}  # oldest first, at most MAX_TCP_SERIES

    def process_exited(self, pid: int) -> None:
        """Its series are read once more at the next :meth:`read`, then dropped."""
        self._exited[pid] = None
        if len(self._exited) > MAX_TCP_SERIES:
            del self._exited[next(iter(self._exited))]

    def read(self, stamp_ns: int) -> list[TcpHealthCounts]:
        """What grew since the last read, stamped ``stamp_ns`` (see HttpRedReader.read)."""
        grown: dict[bytes, tuple[Any, _Totals, int, int]] = {}
        finished = []
        for key, per_cpu in self._table.items():
            raw_key = bytes(key)
            totals = summed(per_cpu)
            before = self._totals.get(raw_key, (0,) * len(totals))
            if totals != before:
                rtt_min = min((v.rtt_min_us for v in per_cpu if v.rtt_min_us), default=0)
                rtt_max = max(v.rtt_max_us for v in per_cpu)
                growth = tuple(now - then for now, then in zip(totals, before, strict=True))
                grown[raw_key] = (key, growth, rtt_min, rtt_max)
                self._totals[raw_key] = totals
            if key.tgid in self._exited:
                finished.append(key)
        drops = self._read_parts(self._drops, lambda per_cpu: (sum(per_cpu),))
        flows = self._read_parts(
            self._flows, lambda per_cpu: tuple(sum(getattr(v, n) for v in per_cpu) for n in _FLOW_COUNTERS)
        )
        reports = []
        for raw_key in sorted(grown.keys() | drops.keys() | flows.keys()):
            if raw_key in grown:
                key, growth, rtt_min, rtt_max = grown[raw_key]
            else:  # drops or flows only: nothing else of the series grew
                key = (drops.get(raw_key) or flows[raw_key])[0]
                growth, rtt_min, rtt_max = (0,) * (len(_COUNTERS) + RTT_BUCKETS), 0, 0
            reasons = self._reasons
            dropped = tuple(sorted((reasons.get(k.reason, str(k.reason)), n) for k, (n,) in _parts(drops, raw_key)))
            moved = tuple(sorted(TcpFlow(self._cgroup_path(k.cgroup), *n) for k, n in _parts(flows, raw_key)))
            reports.append(self._report(stamp_ns, key, growth, rtt_min, rtt_max, dropped, moved))
        for key in finished:
            del self._table[key]
            self._totals.pop(bytes(key), None)
        return reports

    def _read_parts(self, table: Any, measure: Callable[[Sequence[Any]], _Totals]) -> _GrownParts:
        """What grew in ``table`` (``tcp_drops`` or ``tcp_flows``: per-CPU values ``measure`` sums,
        keys that begin with their series'), grouped by series; entries of processes that exited
        are read this once more and deleted."""
        grown: _GrownParts = {}
        if table is None:
            return grown
        finished = []
        for key, per_cpu in table.items():
            raw_key = bytes(key)
            totals = measure(per_cpu)
            before = self._part_totals.get(raw_key, (0,) * len(totals))
            if totals != before:
                growth = tuple(now - then for now, then in zip(totals, before, strict=True))
                grown.setdefault(bytes(key.series), (key.series, []))[1].append((key, growth))
                self._part_totals[raw_key] = totals
            if key.series.tgid in self._exited:
                finished.append(key)
        for key in finished:
            del table[key]
            self._part_totals.pop(bytes(key), None)
        return grown

    @staticmethod
    def _report(
        now: int,
        key: Any,
        grown: _Totals,
        rtt_min: int,
        rtt_max: int,
        drops: tuple[tuple[str, int], ...],
        flows: tuple[TcpFlow, ...],
    ) -> TcpHealthCounts:
        role, peer = peer_of(key)
        retransmissions, resets_sent, resets_received, rtt_count, rtt_sum = grown[: len(_COUNTERS)]
        return TcpHealthCounts(
            now,
            key.tgid,
            role,
            peer,
            key.server_port,
            retransmissions,
            resets_sent,
            resets_received,
            rtt_count,
            rtt_sum,
            grown[len(_COUNTERS) :],
            rtt_min,
            rtt_max,
            drops,
            flows,
        )
