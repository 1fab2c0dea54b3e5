"""Exchanges become OpenTelemetry spans and metric points, one resource per observed process.

Span ids are derived from the exchange's identity (connection, position on it, start time), not
drawn at random, so that replaying a recording produces the very same spans (DESIGN.md,
principle 6). Metrics are recorded through ``opentelemetry-sdk`` meters, one ``MeterProvider`` per
observed process (the SDK ties a provider to one resource), collected together on a timer.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, Status, TraceFlags

from . import __version__
from .events import ConnKey, ProcessInfo
from .protocol import (
    ConnectionInfo,
    Exchange,
    InstrumentKind,
    InstrumentSpec,
    Protocol,
    SpanKind,
    StatusCode,
)
from .selfmetrics import SelfMetrics

_KINDS = {
    SpanKind.SERVER: trace.SpanKind.SERVER,
    SpanKind.CLIENT: trace.SpanKind.CLIENT,
    SpanKind.PRODUCER: trace.SpanKind.PRODUCER,
    SpanKind.CONSUMER: trace.SpanKind.CONSUMER,
    SpanKind.INTERNAL: trace.SpanKind.INTERNAL,
}
_STATUS = {
    StatusCode.UNSET: trace.StatusCode.UNSET,
    StatusCode.OK: trace.StatusCode.OK,
    StatusCode.ERROR: trace.StatusCode.ERROR,
}
SDK_ATTRIBUTES = {
    "telemetry.sdk.name": "otel-ebpf",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.version": __version__,
}
OVERFLOW_PID = -1


def parse_resource_attributes(text: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` syntax: ``k=v,k2=v2`` with percent-encoded values."""
    from urllib.parse import unquote

    attributes: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    return attributes


def process_resource_attributes(info: ProcessInfo, host_name: str) -> dict[str, object]:
    """Resource of an observed process; its own OTel variables win over what the agent infers."""
    executable_name = os.path.basename(info.executable) or info.command_line.split(" ", 1)[0]
    own = parse_resource_attributes(info.environment.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    service_name = (
        info.environment.get("OTEL_SERVICE_NAME") or own.get("service.name") or executable_name or "unknown"
    )
    attributes: dict[str, object] = {
        "host.name": host_name,
        "process.pid": info.pid,
        "process.executable.name": executable_name,
        "process.executable.path": info.executable,
        "process.command_line": info.command_line,
        "service.instance.id": f"{host_name}/{info.pid}",
    }
    attributes.update(own)
    attributes["service.name"] = service_name
    return attributes


@dataclass
class _ProcessTelemetry:
    resource: Resource
    meters: MeterProvider
    reader: InMemoryMetricReader
    instruments: dict[str, object]
    exited: bool = False


def _identity_digest(salt: bytes, key: ConnKey, seq: int, start_ns: int, size: int) -> int:
    h = hashlib.blake2b(salt, digest_size=size)
    h.update(b"%d/%d/%d/%d/%d" % (*key, seq, start_ns))
    return int.from_bytes(h.digest(), "big") or 1


class Telemetry:
    """Turns exchanges into spans (handed to ``export_spans``) and metric points (recorded)."""

    def __init__(
        self,
        protocols: Sequence[Protocol],
        host_name: str,
        extra_resource_attributes: Mapping[str, str],
        selfmetrics: SelfMetrics,
        max_processes: int = 1024,
    ) -> None:
        self._instrument_specs: dict[str, InstrumentSpec] = {
            spec.name: spec for protocol in protocols for spec in protocol.instruments
        }
        self._scopes = {p.name: InstrumentationScope(f"otel_ebpf.protocols.{p.name}", __version__) for p in protocols}
        self._host_name = host_name
        self._extra = dict(extra_resource_attributes)
        self._selfmetrics = selfmetrics
        self._max_processes = max_processes
        self._processes: dict[int, _ProcessTelemetry] = {}
        self._pending_spans: list[ReadableSpan] = []

    # ---- processes -------------------------------------------------------------------------------

    def process_info(self, info: ProcessInfo) -> None:
        previous = self._processes.get(info.pid)
        if previous is None and len(self._processes) >= self._max_processes:
            self._selfmetrics.add("otel_ebpf.resources.overflow")
            return
        if previous is not None:
            previous.meters.shutdown()  # a new image (exec): its own resource from now on
        attributes = {**self._extra, **process_resource_attributes(info, self._host_name), **SDK_ATTRIBUTES}
        self._processes[info.pid] = self._new_process(Resource(attributes))

    def process_exit(self, pid: int) -> None:
        """Keep the process until its last metrics were collected, then forget it."""
        process = self._processes.get(pid)
        if process is not None:
            process.exited = True

    def _new_process(self, resource: Resource) -> _ProcessTelemetry:
        reader = InMemoryMetricReader()
        return _ProcessTelemetry(resource, MeterProvider(resource=resource, metric_readers=[reader]), reader, {})

    def _process(self, pid: int) -> _ProcessTelemetry:
        process = self._processes.get(pid)
        if process is None:
            # No identity event (lost, or past max_processes): fold into one overflow resource.
            process = self._processes.get(OVERFLOW_PID)
            if process is None:
                attributes = {**self._extra, "service.name": "unknown_process", "host.name": self._host_name}
                process = self._new_process(Resource({**attributes, **SDK_ATTRIBUTES}))
                self._processes[OVERFLOW_PID] = process
        return process

    # ---- exchanges -------------------------------------------------------------------------------

    def exchange(self, protocol: str, key: ConnKey, seq: int, exchange: Exchange, conn: ConnectionInfo) -> None:
        """Record one completed exchange, ``seq``-th on connection ``key``."""
        process = self._process(key[0])
        description = exchange.span(conn)
        trace_id = _identity_digest(b"trace", key, seq, description.start_ns, 16)
        span_id = _identity_digest(b"span", key, seq, description.start_ns, 8)
        context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        self._pending_spans.append(
            ReadableSpan(
                name=description.name,
                context=context,
                parent=None,
                resource=process.resource,
                attributes=dict(description.attributes),
                kind=_KINDS[description.kind],
                status=Status(_STATUS[description.status], description.status_description),
                start_time=description.start_ns,
                end_time=description.end_ns,
                instrumentation_scope=self._scopes.get(protocol),
            )
        )
        meter = None
        for point in exchange.metric_points(conn):
            instrument = process.instruments.get(point.instrument)
            if instrument is None:
                meter = meter or process.meters.get_meter(f"otel_ebpf.protocols.{protocol}", __version__)
                instrument = self._create_instrument(meter, point.instrument)
                process.instruments[point.instrument] = instrument
            if isinstance(instrument, Histogram):
                instrument.record(point.value, point.attributes)
            else:
                instrument.add(point.value, point.attributes)

    def _create_instrument(self, meter, name: str) -> object:
        spec = self._instrument_specs[name]
        if spec.kind is InstrumentKind.HISTOGRAM:
            return meter.create_histogram(
                spec.name, spec.unit, spec.description,
                explicit_bucket_boundaries_advisory=list(spec.boundaries) if spec.boundaries else None,
            )
        if spec.kind is InstrumentKind.COUNTER:
            return meter.create_counter(spec.name, spec.unit, spec.description)
        return meter.create_up_down_counter(spec.name, spec.unit, spec.description)

    def take_spans(self) -> list[ReadableSpan]:
        spans, self._pending_spans = self._pending_spans, []
        return spans

    def collect_metrics(self, extra: Iterable[MetricsData] = ()) -> MetricsData:
        """Cumulative metrics of every process (plus ``extra``); forgets processes that exited."""
        resource_metrics = []
        for pid, process in list(self._processes.items()):
            data = process.reader.get_metrics_data()
            if data is not None:
                resource_metrics.extend(data.resource_metrics)
            if process.exited:
                process.meters.shutdown()
                del self._processes[pid]
        for data in extra:
            resource_metrics.extend(data.resource_metrics)
        return MetricsData(resource_metrics=resource_metrics)

    def shutdown(self) -> None:
        for process in self._processes.values():
            process.meters.shutdown()
        self._processes.clear()
