"""OTLP JSON Lines files, byte-compatible with the OpenTelemetry Collector's ``file`` exporter.

Each export appends one line: an ``ExportTraceServiceRequest`` (``traces.jsonl``) or
``ExportMetricsServiceRequest`` (``metrics.jsonl``) in the OTLP/JSON encoding — protobuf JSON with
lowerCamelCase field names, enums as integers, 64-bit integers as strings, and (unlike plain
protobuf JSON, which uses base64 for bytes) trace and span ids as lowercase hex, as the OTLP
specification requires. Any tool that reads the Collector's files (``otlpjsonfile`` receiver,
``jq``) reads these, and :func:`from_json_line` reads them back into protobuf messages.

Spans, exported for every request the agent sees, are written by :mod:`.otlp_json` straight from
the SDK objects (a few µs a span instead of ~150 through protobuf); metrics, exported every few
seconds, go through protobuf messages and :func:`to_json_line`. Both yield the same document.

Lines are written unbuffered per export so a reader can ``tail -f`` them; files are opened for
append, so a restarted agent adds to what an earlier run wrote. A write that fails (a full disk)
never leaves part of a line behind (:class:`~.appendfile.AppendOnlyFile` cuts the file back to its
last whole line); the batch is lost and counted by the sink, the failure is logged once until a
write succeeds again, and writing resumes cleanly when space returns.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ebpf.exporters.appendfile import AppendOnlyFile
from otel_ebpf.exporters.errors import ExporterSetupError
from otel_ebpf.exporters.otlp_json import SpanJsonEncoder

_logger = logging.getLogger(__name__)

TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.jsonl"

# OTLP/JSON fields holding trace/span ids (spans, links, exemplars, log records, profiles).
_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})

M = TypeVar("M", bound=Message)


def _convert_ids(node: Any, convert: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: convert(value) if key in _ID_FIELDS and isinstance(value, str) else _convert_ids(value, convert)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_convert_ids(item, convert) for item in node]
    return node


def _base64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_base64(value: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    except ValueError:
        raise ValueError(f"id {value!r} is not hex") from None


def to_json_line(message: Message) -> str:
    """``message`` as one line of OTLP/JSON, formatted as the Collector writes it (no newline)."""
    document = json_format.MessageToDict(message, use_integers_for_enums=True)
    return json.dumps(_convert_ids(document, _base64_to_hex), separators=(",", ":"), ensure_ascii=False)


def from_json_line(line: str, message: M) -> M:
    """Parse one OTLP/JSON line (hex ids) into ``message``; returns it. Raises ``ValueError``."""
    try:
        document = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    try:
        json_format.ParseDict(_convert_ids(document, _hex_to_base64), message)
    except json_format.ParseError as exc:
        raise ValueError(str(exc)) from None
    return message


class _JsonLinesFile:
    """An append-only file of whole JSON lines, safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._failing = False  # log a write failure once, not once per batch
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = AppendOnlyFile(path)
        except OSError as exc:
            raise ExporterSetupError(f"file exporter cannot write {path}: {exc.strerror or exc}") from None

    def write(self, line: str) -> bool:
        with self._lock:
            if self._file.closed:
                _logger.warning("file exporter: %s is closed, batch dropped", self.path)
                return False
            try:
                self._file.append((line + "\n").encode())
            except OSError as exc:
                if not self._failing:
                    self._failing = True
                    _logger.error(
                        "file exporter: cannot write %s: %s; batches are dropped and counted until a write succeeds",
                        self.path,
                        exc.strerror or exc,
                    )
                return False
            if self._failing:
                self._failing = False
                _logger.warning("file exporter: writing %s again", self.path)
        return True

    def close(self) -> None:
        with self._lock:
            self._file.close()


class FileSpanExporter(SpanExporter):
    """Appends each batch to ``<output_dir>/traces.jsonl`` as one ``ExportTraceServiceRequest``."""

    def __init__(self, output_dir: Path) -> None:
        self._out = _JsonLinesFile(Path(output_dir) / TRACES_FILE)
        self._encoder = SpanJsonEncoder()

    @property
    def path(self) -> Path:
        return self._out.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._out.write(self._encoder.encode(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._out.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export is flushed as it is written


class FileMetricExporter(MetricExporter):
    """Appends each collection to ``<output_dir>/metrics.jsonl`` as one ``ExportMetricsServiceRequest``."""

    def __init__(
        self, output_dir: Path, preferred_temporality: dict[type, AggregationTemporality] | None = None
    ) -> None:
        super().__init__(preferred_temporality=preferred_temporality)
        self._out = _JsonLinesFile(Path(output_dir) / METRICS_FILE)

    @property
    def path(self) -> Path:
        return self._out.path

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        ok = self._out.write(to_json_line(encode_metrics(metrics_data)))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._out.close()


LOGS_FILE = "logs.jsonl"


class FileLogExporter(LogRecordExporter):
    """Appends each batch to ``<output_dir>/logs.jsonl`` as one ``ExportLogsServiceRequest``."""

    def __init__(self, output_dir: Path) -> None:
        self._out = _JsonLinesFile(Path(output_dir) / LOGS_FILE)

    @property
    def path(self) -> Path:
        return self._out.path

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        ok = self._out.write(to_json_line(encode_logs(batch)))
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        self._out.close()
