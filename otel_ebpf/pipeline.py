"""The user-space pipeline: a pure function of the event stream (DESIGN.md, principle 6).

Live capture and replay both feed :class:`Pipeline` the same typed events; it tracks connections,
runs protocol plugins, and hands spans and metrics to :mod:`otel_ebpf.telemetry`.
"""

from __future__ import annotations

from collections.abc import Iterable

from .connections import Completed, ConnectionTracker
from .events import ConnClose, ConnData, ConnOpen, Event, KernelLoss, ProcessExit, ProcessInfo
from .selfmetrics import SelfMetrics
from .telemetry import Telemetry


class Pipeline:
    def __init__(
        self,
        tracker: ConnectionTracker,
        telemetry: Telemetry,
        selfmetrics: SelfMetrics,
    ) -> None:
        self.tracker = tracker
        self.telemetry = telemetry
        self._metrics = selfmetrics
        self.last_timestamp_ns = 0

    def handle(self, events: Iterable[Event]) -> None:
        received = 0
        for event in events:
            received += 1
            if event.timestamp_ns > self.last_timestamp_ns:
                self.last_timestamp_ns = event.timestamp_ns
            if isinstance(event, ConnData):
                self._report(self.tracker.data(event))
            elif isinstance(event, ConnOpen):
                self._report(self.tracker.open(event))
            elif isinstance(event, ConnClose):
                self._report(self.tracker.close(event))
            elif isinstance(event, ProcessInfo):
                self.telemetry.process_info(event)
            elif isinstance(event, ProcessExit):
                self._report(self.tracker.close_process(event.pid, event.timestamp_ns))
                self.telemetry.process_exit(event.pid)
            elif isinstance(event, KernelLoss):
                self._metrics.add("otel_ebpf.events.lost", event.events)
        self._metrics.add("otel_ebpf.events.received", received)

    def flush(self) -> None:
        """Report every pending exchange (the agent is stopping)."""
        self._report(self.tracker.flush_all(self.last_timestamp_ns))

    def _report(self, completed: list[Completed]) -> None:
        for conn, exchange in completed:
            conn.exchanges += 1
            self.telemetry.exchange(conn.protocol.name, conn.key, conn.exchanges, exchange, conn.info())

