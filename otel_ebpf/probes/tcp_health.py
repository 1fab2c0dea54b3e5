"""The kernel's TCP health counts (``tcp_series`` and ``tcp_drops`` in ``bpf/tcp_health.c``), read
once per interval.

Each read sums the CPUs and reports what grew since the previous read as
:class:`~otel_ebpf.events.TcpHealthCounts` events (a series' dropped packets, by reason, with
it), so that recordings carry them and replay reproduces the metrics. Series of processes that
exited are read one last time and then deleted from the kernel table, which keeps it within its
cap; as their sockets can outlive them (closed, still sending their last segments or FIN), a
series of such a process that comes back is reported and deleted again at each read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..events import TcpHealthCounts
from ..protocol import Role
from ..tcp_metrics import RTT_BOUNDARIES_S
from .addresses import endpoint

TCP_EVENTS = Path("/sys/kernel/tracing/events/tcp")
KFREE_SKB = Path("/sys/kernel/tracing/events/skb/kfree_skb/format")
# bpf/tcp_health.c's tracepoints; each must name the socket (skaddr)
TRACEPOINTS = ("tcp_retransmit_skb", "tcp_send_reset", "tcp_receive_reset", "tcp_probe", "tcp_destroy_sock")
MAX_TCP_SERIES = 4096  # (process, role, peer, server port) series the kernel aggregates
STAT_NAMES = ("tcp_series_full", "tcp_owners_full", "tcp_drops_full")  # tcp_stats[] slots: kernel.drops reasons
_ROLES = {1: Role.CLIENT, 2: Role.SERVER}
_COUNTERS = ("retransmissions", "resets_sent", "resets_received", "rtt_count", "rtt_sum_us")
RTT_BUCKETS = len(RTT_BOUNDARIES_S) + 1

# counters (as _COUNTERS), then the RTT buckets
_Totals = tuple[int, ...]


def missing_tracepoints(events: Path = TCP_EVENTS) -> list[str]:
    """What this kernel lacks of the tracepoints TCP health attaches to (``name``, or
    ``name.skaddr`` where the tracepoint does not name the socket): none, or it runs without."""
    missing = []
    for name in TRACEPOINTS:
        try:
            fields = (events / name / "format").read_text()
        except OSError:
            missing.append(name)
            continue
        if " skaddr;" not in fields:
            missing.append(f"{name}.skaddr")
    return missing


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


class TcpHealthReader:
    def __init__(self, table: Any, drops: Any = None, reasons: dict[int, str] | None = None) -> None:
        """``table``: BCC's view of ``tcp_series``; ``drops`` of ``tcp_drops`` (``None`` when the
        kernel does not count them), whose reasons ``reasons`` names."""
        self._table = table
        self._drops = drops
        self._reasons = reasons or {}
        self._totals: dict[bytes, _Totals] = {}
        self._drop_totals: dict[bytes, int] = {}
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
        drops = self._read_drops()
        reports = []
        for raw_key in sorted(grown.keys() | drops.keys()):
            if raw_key in grown:
                key, growth, rtt_min, rtt_max = grown[raw_key]
            else:  # drops only: nothing else of the series grew
                key, growth, rtt_min, rtt_max = drops[raw_key][0], (0,) * (len(_COUNTERS) + RTT_BUCKETS), 0, 0
            dropped = tuple(sorted(drops[raw_key][1])) if raw_key in drops else ()
            reports.append(self._report(stamp_ns, key, growth, rtt_min, rtt_max, dropped))
        for key in finished:
            del self._table[key]
            self._totals.pop(bytes(key), None)
        return reports

    def _read_drops(self) -> dict[bytes, tuple[Any, list[tuple[str, int]]]]:
        """Per series (its key's bytes): its key and the (reason, packets) that grew."""
        drops: dict[bytes, tuple[Any, list[tuple[str, int]]]] = {}
        if self._drops is None:
            return drops
        finished = []
        for key, per_cpu in self._drops.items():
            raw_key = bytes(key)
            total = sum(per_cpu)
            before = self._drop_totals.get(raw_key, 0)
            if total != before:
                reason = self._reasons.get(key.reason, str(key.reason))
                drops.setdefault(bytes(key.series), (key.series, []))[1].append((reason, total - before))
                self._drop_totals[raw_key] = total
            if key.series.tgid in self._exited:
                finished.append(key)
        for key in finished:
            del self._drops[key]
            self._drop_totals.pop(bytes(key), None)
        return drops

    @staticmethod
    def _report(
        now: int, key: Any, grown: _Totals, rtt_min: int, rtt_max: int, drops: tuple[tuple[str, int], ...]
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
        )
