"""RoCEv2 on the wire (``bpf/roce.c``): TC classifiers on the interfaces of ``roce.interfaces``,
whose kernel tables are read once per metrics interval into ``otel_ebpf.roce.*`` (docs/roce.md).

The kernel keeps running totals; each read reports what grew since the previous one. A series that
has not grown for :data:`IDLE_EVICT_S` is deleted from the kernel table (its queue pair is gone, or
quiet), which keeps room for new ones; a full table's misses are counted as kernel drops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import RoceConfig
from ..protocol import InstrumentKind
from ..rocev2 import SYNDROMES, Flow, FlowCounts, OpcodeCounts, RoceMetrics, address
from ..selfmetrics import SelfMetrics
from .loading import close_program, load_program
from .tables import CumulativeTable
from .tc import TcAttachment

IDLE_EVICT_S = 300.0
OPS_PER_QP = 8  # roce_ops entries per roce_qps entry: the opcodes a queue pair's flow typically shows
PENDING_PER_QP = 16  # roce_pending entries (requests awaiting their ACK, LRU) per roce_qps entry
SERIES_PER_QP = 32  # user-space series per queue-pair flow (packets and bytes by opcode, ACK/NAK codes, ...)
_DROP_REASONS = ("roce_opcode_table_full", "roce_qp_table_full")  # bpf/roce.c, DROP_*


class RoceProbe:
    """Loads ``bpf/roce.c``, attaches it to each interface of ``config.interfaces`` (ingress and
    egress) and reports its counts as metric sources do (:meth:`collect_metrics`)."""

    def __init__(
        self,
        config: RoceConfig,
        selfmetrics: SelfMetrics,
        resource: Mapping[str, Any],
        delta: frozenset[InstrumentKind],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._selfmetrics = selfmetrics
        self._delta = delta
        self._clock = clock
        self.metrics = RoceMetrics(resource, config.max_qp_pairs * SERIES_PER_QP)
        self._bpf: Any = None
        self._tc: TcAttachment | None = None
        self._interfaces: dict[int, str] = {}

    def start(self) -> None:
        """Compile, load and attach; ``TcError`` or ``RuntimeError`` saying what failed."""
        self._tc = TcAttachment()
        self._interfaces = {self._tc.ifindex(name): name for name in self._config.interfaces}
        qps = self._config.max_qp_pairs
        self._bpf = load_program(
            ["roce.c"],
            "RoCEv2 classifier (bpf/roce.c)",
            defines={"MAX_QPS": qps, "MAX_OPS": qps * OPS_PER_QP, "MAX_PENDING": qps * PENDING_PER_QP},
        )
        from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

        try:
            programs = {hook: self._bpf.load_func(f"roce_{hook}", BPF.SCHED_CLS) for hook in ("ingress", "egress")}
        except Exception as exc:  # BCC raises bare Exception with the verifier's verdict
            raise RuntimeError(f"the kernel refused the RoCEv2 classifier (bpf/roce.c): {exc}") from exc
        for name in self._interfaces.values():
            self._tc.attach(name, programs)
        self._ops = CumulativeTable(self._bpf["roce_ops"], _opcode_totals, self._clock, IDLE_EVICT_S)
        self._qps = CumulativeTable(self._bpf["roce_qps"], _flow_totals, self._clock, IDLE_EVICT_S)

    def program_fds(self) -> dict[str, int]:
        """The loaded classifiers' file descriptors by function name (their run-time statistics
        are in ``/proc/self/fdinfo/<fd>`` while ``kernel.bpf_stats_enabled`` is on)."""
        return {name.decode(): fn.fd for name, fn in self._bpf.funcs.items()}  # BCC keys them by bytes

    def read(self) -> list[OpcodeCounts | FlowCounts]:
        """What the kernel counted since the last read."""
        counts: list[OpcodeCounts | FlowCounts] = []
        for key, _, (packets, size) in self._ops.read():
            counts.append(OpcodeCounts(self._flow(key.qp), key.opcode, packets, size))
        syndromes = len(SYNDROMES)
        for key, stats, (_, gaps, duplicates, ecn_ce, *rest) in self._qps.read():
            counts.append(
                FlowCounts(
                    self._flow(key),
                    gaps,
                    duplicates,
                    ecn_ce,
                    tuple(rest[:syndromes]),
                    tuple(rest[syndromes:-1]),
                    rest[-1],
                    stats.ack_latency_min_ns,
                    stats.ack_latency_max_ns,
                )
            )
        return counts

    def collect_metrics(self, now_ns: int) -> list:
        """The node's RoCE series, with what grew since the last call (a metric source of the agent)."""
        self.metrics.record(self.read(), now_ns)
        # idle: their queue pairs are gone, or an opcode is no longer used
        self.metrics.forget(
            [self._flow(key) for key in self._qps.evicted],
            [(self._flow(key.qp), key.opcode) for key in self._ops.evicted],
        )
        drops = self._bpf["roce_drops"]
        for slot, reason in enumerate(_DROP_REASONS):
            self._selfmetrics.set("otel_ebpf.kernel.drops", sum(drops[slot]), {"reason": reason})
        self._selfmetrics.add("otel_ebpf.metrics.overflow", self.metrics.take_overflowed())
        collected = self.metrics.collect(now_ns, self._delta)
        return [collected] if collected is not None else []

    def close(self) -> None:
        """Take the classifiers off (and the clsact qdiscs this probe added), then free the program."""
        if self._tc is not None:
            self._tc.detach()
            self._tc = None
        if self._bpf is not None:
            close_program(self._bpf)
            self._bpf = None

    def _flow(self, key: Any) -> Flow:
        return Flow(
            self._interfaces.get(key.ifindex, str(key.ifindex)),
            bool(key.egress),
            address(bytes(key.saddr)),
            address(bytes(key.daddr)),
            key.dest_qp,
        )


def _opcode_totals(per_cpu: Any) -> tuple[int, ...]:
    return sum(v.packets for v in per_cpu), sum(v.bytes for v in per_cpu)


def _flow_totals(stats: Any) -> tuple[int, ...]:
    """Packets, counts, syndromes, latency buckets and the latency sum: in this order."""
    return (
        stats.packets,
        stats.psn_gaps,
        stats.psn_duplicates,
        stats.ecn_ce,
        *stats.aeth,
        *stats.ack_latency,
        stats.ack_latency_sum_ns,
    )
