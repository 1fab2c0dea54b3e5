"""What the agent wrote, as plain values the rules read: profiles, metric points, log records, spans.

:func:`read_directory` is the only function here that touches files: it reads the file exporter's
OTLP JSON Lines (``profiles.jsonl``, ``metrics.jsonl``, ``logs.jsonl``, ``traces.jsonl``, see
:mod:`otel_ebpf.exporters.file`) into an :class:`Evidence`. Everything else — and every rule — is
a pure function of an :class:`Evidence`, so tests build one by hand as easily as from a recording.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_ebpf.exporters.file import LOGS_FILE, METRICS_FILE, TRACES_FILE, from_json_line
from otel_ebpf.profiles import otlp as profiles_otlp
from otel_ebpf.profiles.model import Profile

PROFILES_FILE = "profiles.jsonl"

Attributes = Mapping[str, Any]


@dataclass(frozen=True)
class MetricPoint:
    """One data point. Sums and gauges have ``value``; histograms ``count``, ``sum``, ``bounds``
    and ``bucket_counts``. Cumulative points (what the agent exports) count from ``start_ns``."""

    name: str
    resource: Attributes
    attributes: Attributes
    start_ns: int
    time_ns: int
    value: float | None = None
    count: int = 0
    sum: float = 0.0
    bounds: tuple[float, ...] = ()
    bucket_counts: tuple[int, ...] = ()


@dataclass(frozen=True)
class LogEntry:
    resource: Attributes
    event_name: str
    body: str
    attributes: Attributes
    time_ns: int


@dataclass(frozen=True)
class SpanEntry:
    resource: Attributes
    name: str
    kind: str  # "SERVER", "CLIENT", ...
    start_ns: int
    end_ns: int
    attributes: Attributes


@dataclass
class Evidence:
    profiles: list[Profile] = field(default_factory=list)
    metrics: list[MetricPoint] = field(default_factory=list)
    logs: list[LogEntry] = field(default_factory=list)
    spans: list[SpanEntry] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # the files read, for the report

    def profiles_of(self, sample_type: str) -> list[Profile]:
        """The profiles whose (single) sample type is ``sample_type`` (``waits``, ``launches``, ...)."""
        return [p for p in self.profiles if p.sample_types and p.sample_types[0].type == sample_type]

    def points(self, name: str) -> list[MetricPoint]:
        return [p for p in self.metrics if p.name == name]


class EvidenceError(ValueError):
    """A file of the directory is not what the file exporter writes."""


def process_key(resource: Attributes) -> tuple[str, int]:
    """What tells processes apart in the evidence: (service name, pid)."""
    return str(resource.get("service.name", "unknown_service")), int(resource.get("process.pid", 0) or 0)


def process_label(resource: Attributes) -> str:
    service, pid = process_key(resource)
    return f"{service} (pid {pid})" if pid else service


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: profiles_otlp.plain_value(kv.value) for kv in pairs}


def metric_points(request: ExportMetricsServiceRequest) -> Iterator[MetricPoint]:
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind in ("sum", "gauge"):
                    for point in getattr(metric, kind).data_points:
                        value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                        yield MetricPoint(
                            metric.name,
                            resource,
                            _attributes(point.attributes),
                            point.start_time_unix_nano,
                            point.time_unix_nano,
                            value=value,
                        )
                elif kind == "histogram":
                    for h in metric.histogram.data_points:
                        yield MetricPoint(
                            metric.name,
                            resource,
                            _attributes(h.attributes),
                            h.start_time_unix_nano,
                            h.time_unix_nano,
                            count=h.count,
                            sum=h.sum,
                            bounds=tuple(h.explicit_bounds),
                            bucket_counts=tuple(h.bucket_counts),
                        )


def log_entries(request: ExportLogsServiceRequest) -> Iterator[LogEntry]:
    for resource_logs in request.resource_logs:
        resource = _attributes(resource_logs.resource.attributes)
        for scope in resource_logs.scope_logs:
            for record in scope.log_records:
                yield LogEntry(
                    resource,
                    record.event_name,
                    str(profiles_otlp.plain_value(record.body) or ""),
                    _attributes(record.attributes),
                    record.time_unix_nano,
                )


def span_entries(request: ExportTraceServiceRequest) -> Iterator[SpanEntry]:
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                yield SpanEntry(
                    resource,
                    span.name,
                    Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                    span.start_time_unix_nano,
                    span.end_time_unix_nano,
                    _attributes(span.attributes),
                )


M = TypeVar("M", bound=Message)
T = TypeVar("T")


def _read(path: Path, message: type[M], decode: Callable[[M], Iterable[T]], sources: list[str]) -> list[T]:
    """What ``decode`` makes of every line of ``path`` (none when the file is missing)."""
    if not path.exists():
        return []
    sources.append(str(path))
    out: list[T] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    request = from_json_line(line, message())
                except ValueError as exc:
                    raise EvidenceError(f"{path}:{number}: {exc}") from None
                out.extend(decode(request))
    return out


def read_directory(directory: Path) -> Evidence:
    """Everything the file exporter wrote in ``directory``; a missing file is simply no evidence.
    Raises :class:`EvidenceError` for a line that is not OTLP/JSON, ``OSError`` for an unreadable file."""
    if not directory.is_dir():
        raise EvidenceError(f"{directory} is not a directory")
    sources: list[str] = []
    return Evidence(
        profiles=_read(directory / PROFILES_FILE, ExportProfilesServiceRequest, profiles_otlp.decode, sources),
        metrics=_read(directory / METRICS_FILE, ExportMetricsServiceRequest, metric_points, sources),
        logs=_read(directory / LOGS_FILE, ExportLogsServiceRequest, log_entries, sources),
        spans=_read(directory / TRACES_FILE, ExportTraceServiceRequest, span_entries, sources),
        sources=sources,
    )
