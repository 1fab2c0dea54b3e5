"""Where log records (GPU leak reports) leave the agent: the same exporters as spans and metrics.

:func:`build_log_sink` makes one SDK ``LogRecordExporter`` per configured exporter — OTLP
(gRPC/HTTP, ``otlp.logs_endpoint`` or the endpoint's ``/v1/logs``), ``logs.jsonl`` beside the
other files, the console — each behind its own bounded queue and worker thread
(:class:`~otel_ebpf.exporters.sink._ExportWorker`), so a dead backend neither blocks the agent nor
grows its memory. Every record is counted once per exporter: ``otel_ebpf.logs.exported`` or
``otel_ebpf.logs.dropped{reason}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter, LogRecordExporter, LogRecordExportResult

from otel_ebpf.config import AgentConfig
from otel_ebpf.exporters.file import FileLogExporter
from otel_ebpf.exporters.otlp import otlp_log_exporter
from otel_ebpf.exporters.sink import EXPORTED, Account, _ExportWorker
from otel_ebpf.selfmetrics import SelfMetrics

_logger = logging.getLogger(__name__)

MAX_QUEUE_RECORDS = 2048
MAX_BATCH = 512


def _account(selfmetrics: SelfMetrics, exporter: str) -> Account:
    def account(outcome: str, count: int) -> None:
        if outcome == EXPORTED:
            selfmetrics.add("otel_ebpf.logs.exported", count, {"exporter": exporter})
        else:
            selfmetrics.add("otel_ebpf.logs.dropped", count, {"reason": outcome, "exporter": exporter})

    return account


class LogSink:
    """Fans log records out to exporters without blocking the caller (see the module doc)."""

    def __init__(
        self, selfmetrics: SelfMetrics, exporters: Mapping[str, LogRecordExporter], interval_s: float = 1.0
    ) -> None:
        self._exporters = dict(exporters)

        def export_with(exporter: LogRecordExporter):  # noqa: ANN202 — a closure per exporter
            return lambda batch: exporter.export(batch) is LogRecordExportResult.SUCCESS

        self._workers = {
            name: _ExportWorker(
                f"logs-{name}",
                export_with(exporter),
                _account(selfmetrics, name),
                capacity=MAX_QUEUE_RECORDS,
                max_batch=MAX_BATCH,
                interval_s=interval_s,
            )
            for name, exporter in self._exporters.items()
        }

    def export(self, records: Sequence[ReadableLogRecord]) -> None:
        if records:
            for worker in self._workers.values():
                worker.put(records)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued (within ``timeout_s``), count the rest, close the exporters."""
        deadline = time.monotonic() + timeout_s
        for worker in self._workers.values():
            worker.flush(max(0.0, deadline - time.monotonic()))
            worker.stop()
        for worker in self._workers.values():
            worker.join(max(0.0, deadline - time.monotonic()))
            worker.drop_queued()
            worker.give_up()
        for name, exporter in self._exporters.items():
            try:
                exporter.shutdown()
            except Exception:  # one exporter failing to close must not keep the others open
                _logger.exception("log exporter %s failed to shut down", name)


def build_log_sink(config: AgentConfig, selfmetrics: SelfMetrics) -> LogSink:
    """Log exporters for ``config.exporters`` (none when ``export.disabled``)."""
    exporters: dict[str, LogRecordExporter] = {}
    if not config.export.disabled:
        for name in config.exporters:
            if name == "file":
                exporters[name] = FileLogExporter(config.file.output_dir)
            elif name == "otlp":
                exporters[name] = otlp_log_exporter(config.otlp)
            elif name == "console":
                exporters[name] = ConsoleLogRecordExporter()
    return LogSink(selfmetrics, exporters, config.export.interval_s)
