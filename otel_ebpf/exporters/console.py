"""Human-readable output for a terminal: one line per span, one line per metric point.

Meant for trying the agent out and for debugging, not for machines (use the file exporter for
that). A span line reads ``service  KIND  name  STATUS  12.345 ms  key=value ...`` with the span's
attributes in the order the protocol set them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

_MAX_VALUE_CHARS = 120
_DISTRIBUTIONS = (HistogramDataPoint, ExponentialHistogramDataPoint)


def _service(resource: Resource | None) -> str:
    return str((resource.attributes if resource else {}).get("service.name", "unknown_service"))


def _value(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[: _MAX_VALUE_CHARS - 1] + "…"
    return repr(text) if not text or any(ch.isspace() for ch in text) else text


def _attributes(attributes: Mapping[str, Any] | None, separator: str = " ") -> str:
    return separator.join(f"{key}={_value(value)}" for key, value in (attributes or {}).items())


def format_span(span: ReadableSpan) -> str:
    status = span.status.status_code.name
    if span.status.status_code is StatusCode.ERROR and span.status.description:
        status += f"({span.status.description})"
    duration_ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    fields = [_service(span.resource), span.kind.name, span.name, status, f"{duration_ms:.3f} ms"]
    if span.attributes:
        fields.append(_attributes(span.attributes))
    return "  ".join(fields)


def format_metrics(data: MetricsData) -> list[str]:
    lines = []
    for resource_metrics in data.resource_metrics:
        service = _service(resource_metrics.resource)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                unit = f" {metric.unit}" if metric.unit else ""
                for point in metric.data.data_points:
                    name = f"{metric.name}{{{_attributes(point.attributes, ',')}}}"
                    if isinstance(point, _DISTRIBUTIONS):
                        value = f"count={point.count} sum={point.sum:g}{unit} min={point.min:g} max={point.max:g}"
                    else:
                        value = f"{point.value:g}{unit}"
                    lines.append(f"{service}  {name}  {value}")
    return lines


class _Console:
    """One stream shared by the span and metric exporters; whole blocks are written under a lock so
    lines from the two never interleave."""

    _lock = threading.Lock()

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def write(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        stream = self._stream or sys.stdout  # resolved late so redirected stdout is honoured
        with self._lock:
            stream.write("\n".join(lines) + "\n")
            stream.flush()


class ConsoleSpanExporter(SpanExporter):
    def __init__(self, stream: TextIO | None = None) -> None:
        self._out = _Console(stream)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._out.write([format_span(span) for span in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release: the stream belongs to the caller."""


class ConsoleMetricExporter(MetricExporter):
    def __init__(
        self, stream: TextIO | None = None, preferred_temporality: dict[type, AggregationTemporality] | None = None
    ) -> None:
        super().__init__(preferred_temporality=preferred_temporality)
        self._out = _Console(stream)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self._out.write(format_metrics(metrics_data))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Nothing to release: the stream belongs to the caller."""
