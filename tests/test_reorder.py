"""EventReorderer (a sorted list) against the heap it replaced: same events out, in the same order,
at the same calls, with the same late and overflow counts."""

from __future__ import annotations

import heapq
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf.pipeline.events import Event, KernelLoss
from otel_ebpf.pipeline.reorder import EventReorderer
from otel_ebpf.selfmetrics import SelfMetrics


class HeapReorderer:
    """The previous implementation, kept as the reference: a heap of (timestamp, arrival, event)."""

    def __init__(self, selfmetrics: SelfMetrics, window_ns: int, max_held: int) -> None:
        self._metrics = selfmetrics
        self._window_ns = window_ns
        self._max_held = max_held
        self.heap: list[tuple[int, int, Event]] = []
        self._arrivals = 0
        self._newest_ns = 0
        self._released_ns = 0

    def push(self, events: list[Event]) -> list[Event]:
        late = 0
        for event in events:
            ts = event.timestamp_ns
            if ts < self._released_ns:
                late += 1
            elif ts > self._newest_ns:
                self._newest_ns = ts
            self._arrivals += 1
            heapq.heappush(self.heap, (ts, self._arrivals, event))
        if late:
            self._metrics.add("otel_ebpf.events.late", late)
        ready = self.release_before(self._newest_ns - self._window_ns)
        if len(self.heap) > self._max_held:
            overflow = len(self.heap) - self._max_held
            ready += self.release_before(limit=overflow)
            self._metrics.add("otel_ebpf.events.reorder_overflow", overflow)
        return ready

    def release_before(self, horizon_ns: float = math.inf, limit: int | None = None) -> list[Event]:
        ready: list[Event] = []
        limit = len(self.heap) if limit is None else limit
        while self.heap and len(ready) < limit and self.heap[0][0] <= horizon_ns:
            ts, _, event = heapq.heappop(self.heap)
            ready.append(event)
            self._released_ns = max(self._released_ns, ts)
        return ready


# One step: a batch pushed (timestamps as offsets from a clock that moves forward, some of them
# behind it, as the ring buffer delivers them), or a release up to a horizon (traffic paused).
_batch = st.lists(st.tuples(st.integers(0, 50), st.integers(-40, 5)), max_size=30)
_step = st.one_of(
    st.tuples(st.just("push"), _batch),
    st.tuples(st.just("release"), st.one_of(st.none(), st.integers(-20, 200))),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_step, max_size=25),
    window_ns=st.integers(0, 60),
    max_held=st.integers(1, 40),
)
def test_same_releases_as_the_heap(steps: list, window_ns: int, max_held: int) -> None:
    sorted_metrics, heap_metrics = SelfMetrics(), SelfMetrics()
    reorderer = EventReorderer(sorted_metrics, window_ns, max_held)
    reference = HeapReorderer(heap_metrics, window_ns, max_held)
    clock = 0
    serial = 0  # each event is its own object with its own count, so a swap of equal stamps shows
    for kind, arg in steps:
        if kind == "push":
            batch: list[Event] = []
            for advance, offset in arg:
                clock += advance
                serial += 1
                batch.append(KernelLoss(max(0, clock + offset), serial))
            assert reorderer.push(batch) == reference.push(batch)
        else:
            horizon = math.inf if arg is None else clock - 100 + arg
            assert reorderer.release_before(horizon) == reference.release_before(horizon)
        assert len(reorderer) == len(reference.heap)
    assert reorderer.release_before() == reference.release_before()
    for name in ("otel_ebpf.events.late", "otel_ebpf.events.reorder_overflow"):
        assert sorted_metrics.total(name) == heap_metrics.total(name)


def test_nearly_ordered_arrivals_come_out_sorted_and_capped() -> None:
    """A worked case: late arrivals slot in, the cap releases the oldest at once."""
    metrics = SelfMetrics()
    reorderer = EventReorderer(metrics, window_ns=10, max_held=3)
    events = [KernelLoss(ts, ts) for ts in (5, 3, 4, 20, 1)]
    assert reorderer.push(events[:3]) == []  # held: 3, 4, 5
    assert reorderer.push(events[3:]) == [events[4], events[1], events[2], events[0]]  # window passes 10
    assert len(reorderer) == 1
    assert metrics.total("otel_ebpf.events.late") == 0
    assert metrics.total("otel_ebpf.events.reorder_overflow") == 0
    assert reorderer.push([KernelLoss(2, 99)]) != []  # late: behind what was released, yet handled
    assert metrics.total("otel_ebpf.events.late") == 1
