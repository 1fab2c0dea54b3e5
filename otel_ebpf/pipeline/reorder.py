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

import math
from bisect import bisect_right, insort
from collections.abc import Iterable

from ..selfmetrics import SelfMetrics
from .events import Event


def _timestamp(held: tuple[int, int, Event]) -> int:
    return held[0]


class EventReorderer:
    """A bounded, sorted list of events, released once ``window_ns`` of newer event time has been
    seen.

    Events arrive nearly in order (a ring buffer's records are out of order by microseconds), so
    most of them go at the end of the list with one comparison, and a release takes the oldest
    in one slice; a heap would pay a logarithmic sift in Python-called code for each push and pop.
    """

    def __init__(self, selfmetrics: SelfMetrics, window_ns: int = 50_000_000, max_held: int = 65536) -> None:
        self._metrics = selfmetrics
        self._window_ns = window_ns
        self._max_held = max_held
        # (timestamp, arrival, event), sorted; arrival breaks ties: equal timestamps keep their
        # arrival order, and events are never compared
        self._held: list[tuple[int, int, Event]] = []
        self._arrivals = 0
        self._newest_ns = 0
        self._released_ns = 0  # timestamp of the last event released

    def __len__(self) -> int:
        return len(self._held)

    def push(self, events: Iterable[Event]) -> list[Event]:
        """Take newly arrived events; return those now ready, in timestamp order."""
        held = self._held
        late = 0
        arrivals = self._arrivals
        newest = self._newest_ns
        for event in events:
            ts = event.timestamp_ns
            if ts < self._released_ns:
                late += 1
            arrivals += 1
            if ts >= newest:  # in order: the newest so far goes last
                newest = ts
                held.append((ts, arrivals, event))
            else:
                insort(held, (ts, arrivals, event))
        self._arrivals = arrivals
        self._newest_ns = newest
        if late:
            self._metrics.add("otel_ebpf.events.late", late)
        ready = self.release_before(self._newest_ns - self._window_ns)
        if len(held) > self._max_held:
            overflow = len(held) - self._max_held
            ready += self.release_before(limit=overflow)
            self._metrics.add("otel_ebpf.events.reorder_overflow", overflow)
        return ready

    def release_before(self, horizon_ns: float = math.inf, limit: int | None = None) -> list[Event]:
        """Up to ``limit`` events stamped at or before ``horizon_ns``, in order: by default all of
        them (the agent is stopping). A live agent also calls it when traffic pauses."""
        held = self._held
        count = bisect_right(held, horizon_ns, key=_timestamp)
        if limit is not None:
            count = min(count, limit)
        if count <= 0:
            return []
        ready = [event for _, _, event in held[:count]]
        self._released_ns = max(self._released_ns, held[count - 1][0])
        del held[:count]
        return ready
