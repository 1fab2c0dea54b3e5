"""The kernel's exact HTTP/1 counts (``http_red`` in ``bpf/http1_summary.h``), read once per interval.

The kernel keeps running totals per series and CPU; each read sums the CPUs and reports what grew
since the previous read as :class:`~otel_ebpf.pipeline.events.HttpRequestCounts` events, so that recordings
carry them and replay reproduces the metrics. Series of processes that exited are read one last
time and then deleted from the kernel table, which keeps it within its cap.
"""

from __future__ import annotations

from typing import Any

from ..pipeline.events import HttpRequestCounts
from ..protocol import Role
from .addresses import endpoint

# bpf/http1_summary.h, known_method(): code -> method
METHODS = ("_OTHER", "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE")
_ROLES = {1: Role.CLIENT, 2: Role.SERVER}

_U64 = (1 << 64) - 1
_Totals = tuple[int, int, tuple[int, ...]]  # count, sum_ns, buckets


class HttpRedReader:
    def __init__(self, table: Any) -> None:
        """``table``: BCC's view of ``http_red``."""
        self._table = table
        self._totals: dict[bytes, _Totals] = {}
        self._exited: set[int] = set()

    def process_exited(self, pid: int) -> None:
        """Its series are read once more at the next :meth:`read`, then dropped."""
        self._exited.add(pid)

    def read(self, stamp_ns: int) -> list[HttpRequestCounts]:
        """What grew since the last read, stamped ``stamp_ns``: the time of the newest event the
        probe has delivered, not the clock's, so that in the pipeline's reorder window the counts
        release no event ahead of its time (trace assembly and profile links go in step)."""
        now = stamp_ns
        reports: list[HttpRequestCounts] = []
        finished = []
        for key, per_cpu in self._table.items():
            raw_key = bytes(key)
            count = sum(v.count for v in per_cpu)
            sum_ns = sum(v.sum_ns for v in per_cpu)
            # a request whose duration moved it to another bucket on another CPU leaves one CPU's
            # count below zero (wrapped): the sum modulo 2^64 is right
            buckets = tuple(sum(v.buckets[i] for v in per_cpu) & _U64 for i in range(len(per_cpu[0].buckets)))
            before_count, before_sum, before_buckets = self._totals.get(raw_key, (0, 0, (0,) * len(buckets)))
            if count != before_count or sum_ns != before_sum:
                moved = reported_moves(buckets, before_buckets)
                minimum = min((v.min_ns for v in per_cpu if v.min_ns), default=0)
                maximum = max(v.max_ns for v in per_cpu)
                reports.append(
                    self._report(now, key, count - before_count, sum_ns - before_sum, moved, minimum, maximum)
                )
                self._totals[raw_key] = (count, sum_ns, tuple(map(sum, zip(before_buckets, moved, strict=True))))
            if key.tgid in self._exited:
                finished.append(key)
        for key in finished:
            del self._table[key]
            self._totals.pop(bytes(key), None)
        self._exited.clear()
        return reports

    @staticmethod
    def _report(
        now: int, key: Any, count: int, sum_ns: int, buckets: tuple[int, ...], minimum: int, maximum: int
    ) -> HttpRequestCounts:
        role = _ROLES.get(key.role, Role.SERVER)
        address = ""
        if role is Role.CLIENT and key.family:
            address = endpoint(key.family, bytes(key.server_addr), key.server_port).address
        method = METHODS[key.method] if key.method < len(METHODS) else "_OTHER"
        return HttpRequestCounts(
            now,
            key.tgid,
            role,
            method,
            key.status,
            f"1.{key.minor}",
            bool(key.tls),
            address,
            key.server_port,
            count,
            sum_ns,
            buckets,
            minimum,
            maximum,
        )


def reported_moves(current: tuple[int, ...], reported: tuple[int, ...]) -> tuple[int, ...]:
    """Bucket counts to report, given the kernel's totals and those reported so far: never below
    zero, summing to the growth of the count.

    A response that goes on moves its request to a later bucket: between two reads one bucket can
    lose a request that another gains. A delta histogram cannot say so (its counts are unsigned),
    so the move waits, its gain held back against the loss, until new requests fill the bucket it
    left; counts are exact meanwhile, and the buckets once the move is reported."""
    deltas = [now - before for now, before in zip(current, reported, strict=True)]
    owed = -sum(d for d in deltas if d < 0)
    moves = [max(d, 0) for d in deltas]
    for i in reversed(range(len(moves))):  # the gains of moves are in the later buckets
        held = min(owed, moves[i])
        moves[i] -= held
        owed -= held
    return tuple(moves)
