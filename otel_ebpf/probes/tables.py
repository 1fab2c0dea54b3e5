"""Kernel tables of running totals, read as what grew since the last read (bpf/roce.c's flows,
bpf/verbs_trace.c's work requests and completions)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class CumulativeTable:
    """Growth per key of a kernel table of running totals; keys idle too long are deleted (a
    count made between their last read and the delete is lost: after ``idle_evict_s`` idle)."""

    def __init__(
        self, table: Any, totals_of: Callable[[Any], tuple[int, ...]], clock: Callable[[], float], idle_evict_s: float
    ) -> None:
        self._table = table
        self._idle_evict_s = idle_evict_s
        self._totals_of = totals_of
        self._clock = clock
        self._seen: dict[bytes, tuple[tuple[int, ...], float]] = {}  # key -> totals, when they last grew
        self.evicted: list[Any] = []  # the keys the last read deleted

    def read(self) -> Iterator[tuple[Any, Any, tuple[int, ...]]]:
        """(key, value, growth) of each key whose totals grew."""
        now = self._clock()
        idle = []
        for key, value in self._table.items():
            raw = bytes(key)
            totals = self._totals_of(value)
            # a key first seen with nothing counted (a flow without ACKs or marks) still ages
            before, grew_at = self._seen.setdefault(raw, ((0,) * len(totals), now))
            if totals != before:
                yield key, value, tuple(t - b for t, b in zip(totals, before, strict=True))
                self._seen[raw] = (totals, now)
            elif now - grew_at >= self._idle_evict_s:
                idle.append(key)
        for key in idle:
            del self._table[key]
            self._seen.pop(bytes(key), None)
        self.evicted = idle
