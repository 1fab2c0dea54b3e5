"""Putting events back in timestamp order before the pipeline sees them.

All CPUs share one ring buffer, and a record's place in it is the order in which probes reserved
space, not the order of the timestamps they carry: a write is stamped when it enters the kernel
but reserved when it leaves, so the read that received its bytes in another process, on another
CPU, can be reserved first. Trace assembly needs the causal order (an outgoing request before the
incoming request it becomes), so events are held for a short window of event time and released
sorted. An event that arrives after events later than it were released is handled anyway, out of
order, and counted.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from ..selfmetrics import SelfMetrics
from .events import Event


class EventReorderer:
    """A bounded heap of events, released once ``window_ns`` of newer event time has been seen."""

    def __init__(self, selfmetrics: SelfMetrics, window_ns: int = 50_000_000, max_held: int = 65536) -> None:
        self._metrics = selfmetrics
        self._window_ns = window_ns
        self._max_held = max_held
        self._heap: list[tuple[int, int, Event]] = []
        self._arrivals = 0  # tie-breaker: equal timestamps keep their arrival order
        self._newest_ns = 0
        self._released_ns = 0  # timestamp of the last event released

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, events: Iterable[Event]) -> list[Event]:
        """Take newly arrived events; return those now ready, in timestamp order."""
        heap = self._heap
        late = 0
        for event in events:
            ts = event.timestamp_ns
            if ts < self._released_ns:
                late += 1
            elif ts > self._newest_ns:
                self._newest_ns = ts
            self._arrivals += 1
            heapq.heappush(heap, (ts, self._arrivals, event))
        if late:
            self._metrics.add("otel_ebpf.events.late", late)
        ready = self.release_before(self._newest_ns - self._window_ns)
        if len(heap) > self._max_held:
            overflow = len(heap) - self._max_held
            ready += self.release_before(limit=overflow)
            self._metrics.add("otel_ebpf.events.reorder_overflow", overflow)
        return ready

    def release_before(self, horizon_ns: float = math.inf, limit: int | None = None) -> list[Event]:
        """Up to ``limit`` events stamped at or before ``horizon_ns``, in order: by default all of
        them (the agent is stopping). A live agent also calls it when traffic pauses."""
        heap = self._heap
        ready: list[Event] = []
        limit = len(heap) if limit is None else limit
        while heap and len(ready) < limit and heap[0][0] <= horizon_ns:
            ts, _, event = heapq.heappop(heap)
            ready.append(event)
            self._released_ns = max(self._released_ns, ts)
        return ready
