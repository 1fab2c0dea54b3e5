"""The user-space pipeline: a pure function of the event stream.

Live capture and replay both feed :class:`Pipeline` the same typed events; it puts them back in
timestamp order, tracks connections, runs protocol plugins, gives every request its trace context
when it starts (:mod:`otel_ebpf.pipeline.assembly`) and hands spans and metrics to
:mod:`otel_ebpf.pipeline.telemetry` as exchanges complete. Its place in the data flow, and why it stays
pure: docs/architecture.md, "Sockets: from a syscall to a span" and "Deterministic after the ring
buffer".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..protocol import AttributeValue, RequestStart
from ..selfmetrics import SelfMetrics
from .assembly import TraceAssembler
from .connections import ConnectionTracker, Outcome
from .events import (
    EXITED,
    ConnClose,
    ConnData,
    ConnOpen,
    Event,
    HttpRequestCounts,
    KernelLoss,
    KernelTrace,
    ProcessExit,
    ProcessInfo,
    TcpHealthCounts,
)
from .reorder import EventReorderer
from .telemetry import Telemetry

# On the spans of a connection between hosts: the same on both ends, so a backend joins the
# client's span with the server's across nodes without any header (docs/kubernetes.md).
CLIENT_ISN = "otel_ebpf.tcp.client_isn"
SERVER_ISN = "otel_ebpf.tcp.server_isn"
# On the span of an exchange during which its socket retransmitted (docs/network.md).
RETRANSMISSIONS = "otel_ebpf.tcp.retransmissions"


class Pipeline:
    def __init__(
        self,
        tracker: ConnectionTracker,
        telemetry: Telemetry,
        selfmetrics: SelfMetrics,
        assembler: TraceAssembler | None = None,
        reorderer: EventReorderer | None = None,
    ) -> None:
        """``assembler`` and ``reorderer`` default to the agent's default settings."""
        self.tracker = tracker
        self.telemetry = telemetry
        self.assembler = TraceAssembler(selfmetrics) if assembler is None else assembler
        self.reorderer = EventReorderer(selfmetrics) if reorderer is None else reorderer
        self._metrics = selfmetrics
        self.last_timestamp_ns = 0
        self._advanced_ns = 0  # the latest horizon given to advance()

    def handle(self, events: Iterable[Event]) -> None:
        """Events as they arrived; those that the reorder window releases are processed."""
        events = list(events)
        self._metrics.add("otel_ebpf.events.received", len(events))
        self._process(self.reorderer.push(events))

    def advance(self, horizon_ns: int) -> None:
        """No event stamped before ``horizon_ns`` can still arrive: process what is held."""
        self._process(self.reorderer.release_before(horizon_ns))
        self._advanced_ns = max(self._advanced_ns, horizon_ns)

    @property
    def horizon_ns(self) -> int:
        """Event time up to which every event has been processed (events still held for
        reordering are later): trace assembly's state at any time before it is final, so records
        from other rings stamped before it (CPU samples, NCCL calls) can be linked to requests."""
        return max(self.last_timestamp_ns, self._advanced_ns)

    def flush(self) -> None:
        """Process everything held (the agent is stopping). Messages held only because the capture
        hid their end are reported as they stand; requests still waiting for a response are in
        flight, not failed: they are counted, not reported as spans with an error."""
        self._process(self.reorderer.release_before())
        self._report(self.tracker.finish_held())
        unanswered = sum(
            1 for _, item, _ in self.tracker.flush_all(self.last_timestamp_ns) if not isinstance(item, RequestStart)
        )
        if unanswered:
            self._metrics.add("otel_ebpf.spans.shed", unanswered, {"reason": "in_flight_at_stop"})

    def _process(self, events: list[Event]) -> None:
        for event in events:
            if event.timestamp_ns > self.last_timestamp_ns:
                self.last_timestamp_ns = event.timestamp_ns
            if isinstance(event, ConnData):
                self._report(self.tracker.data(event))
            elif isinstance(event, KernelTrace):
                self.assembler.kernel_decided(event)
            elif isinstance(event, ConnOpen):
                self.tracker.open(event)
            elif isinstance(event, ConnClose):
                self._report(self.tracker.close(event))
            elif isinstance(event, ProcessInfo):
                self.telemetry.process_info(event)
            elif isinstance(event, ProcessExit):
                self._report(self.tracker.close_process(event.pid, event.timestamp_ns), EXITED)
                self.telemetry.process_exit(event.pid, event.timestamp_ns)
            elif isinstance(event, HttpRequestCounts):
                self.telemetry.http_counts(event)
            elif isinstance(event, TcpHealthCounts):
                self.telemetry.tcp_health(event)
            elif isinstance(event, KernelLoss):
                self._metrics.add("otel_ebpf.events.lost", event.events)
        if events:
            self.assembler.expire(self.last_timestamp_ns)

    def _report(self, outcomes: list[Outcome], label: Mapping[str, bool] | None = None) -> None:
        """``label``: attributes for every span (those of a process's exchanges cut by its exit)."""
        assembler = self.assembler
        for conn, item, tid in outcomes:
            info = conn.info()
            if isinstance(item, RequestStart):
                assembler.start(conn.key, info, item, tid)
                continue
            if not item.emits_span:  # control traffic (RTPS HEARTBEAT/ACKNACK/GAP): metric points only
                self.telemetry.metric_points(
                    conn.claimed().protocol.name, conn.key[0], item, info, self.last_timestamp_ns
                )
                continue
            conn.exchanges += 1
            description = item.span(info)
            extra: Mapping[str, AttributeValue] | None = label
            if info.isns is not None:
                extra = {**(label or {}), CLIENT_ISN: info.isns[0], SERVER_ISN: info.isns[1]}
            if conn.retransmission_marks:
                retransmitted = conn.retransmissions_between(description.start_ns, description.end_ns)
                if retransmitted:
                    extra = {**(extra or {}), RETRANSMISSIONS: retransmitted}
            if extra:
                description = replace(description, attributes={**description.attributes, **extra})
            context = assembler.finish(
                conn.key, info, description.start_ns, tid, item.message_start, description.end_ns
            )
            self.telemetry.exchange(conn.claimed().protocol.name, conn.key[0], item, description, info, context)
