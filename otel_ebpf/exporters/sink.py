"""The :class:`TelemetrySink`: the one object the agent writes spans and metrics into.

The agent's event loop must never wait for a backend, and a backend that is down must cost neither
memory nor the other exporters' data. So every exporter gets its own bounded queue and its own
worker thread:

- ``export_spans`` / ``export_metrics`` only append to each exporter's queue (under a lock, no I/O)
  and return. A full queue drops the incoming items and counts them
  (``otel_ebpf.spans.dropped{reason=queue_full}``, ``otel_ebpf.metrics.export.failed{reason=queue_full}``).
- A worker exports a batch when ``max_batch`` spans are waiting or ``interval_s`` has passed since
  its last export, whichever is first; a failed file or console export is counted
  (``reason=export_failed``). The OTLP exporter only encodes the batch and queues it for its
  :class:`~.delivery.Delivery`, which retries, keeps the order and counts every span itself.
- ``shutdown`` drains what it can within its timeout, counts the rest (``reason=shutdown``) and
  shuts the exporters down.

Every span handed in is eventually counted exactly once per exporter: exported or dropped.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import Any, Generic, TypeVar

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ebpf.config import AgentConfig
from otel_ebpf.exporters.console import ConsoleMetricExporter, ConsoleSpanExporter
from otel_ebpf.exporters.file import FileMetricExporter, FileSpanExporter
from otel_ebpf.exporters.otlp import METRICS, TRACES, OTLPExporter, otlp_exporter
from otel_ebpf.exporters.prometheus import PrometheusMetricExporter
from otel_ebpf.selfmetrics import SelfMetrics

_logger = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E", bound=MetricExporter)

# What became of items handed to a worker; everything but EXPORTED is a drop ``reason``.
EXPORTED = "exported"
QUEUE_FULL = "queue_full"
EXPORT_FAILED = "export_failed"
SHUTDOWN = "shutdown"

Account = Callable[[str, int], None]  # (outcome, number of items)

METRIC_QUEUE_BATCHES = 8  # metric collections are few and large: a short queue suffices


def temporality_preference(name: str) -> dict[type, AggregationTemporality]:
    """The presets of ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` (OTLP exporter spec):
    ``cumulative``, ``delta`` (counters and histograms delta) and ``lowmemory`` (synchronous
    counters and histograms delta)."""
    delta_kinds = {
        "cumulative": (),
        "delta": (Counter, ObservableCounter, Histogram),
        "lowmemory": (Counter, Histogram),
    }[name]
    kinds = (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge)
    return {
        kind: AggregationTemporality.DELTA if kind in delta_kinds else AggregationTemporality.CUMULATIVE
        for kind in kinds
    }


class _ExportWorker(Generic[T]):
    """One exporter's bounded queue and the daemon thread that drains it."""

    def __init__(
        self,
        name: str,
        export: Callable[[list[T]], bool | None],
        account: Account,
        *,
        capacity: int,
        max_batch: int,
        interval_s: float,
    ) -> None:
        self.name = name
        self._export = export
        self._account = account
        self._capacity = capacity
        self._max_batch = max_batch
        self._interval_s = interval_s
        self._items: deque[T] = deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._flushes = 0
        self._stopping = False
        self._gave_up = False
        self._warned_full = False
        self._last_export = float("-inf")
        self._thread = threading.Thread(target=self._run, name=f"otel-ebpf-export-{name}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._items) + self._in_flight

    def put(self, items: Sequence[T]) -> None:
        with self._cond:
            stopping = self._stopping
            accepted = 0 if stopping else min(len(items), self._capacity - len(self._items))
            if accepted:
                before = len(self._items)
                self._items.extend(islice(items, accepted))
                if before == 0 or before < self._max_batch <= len(self._items):
                    self._cond.notify_all()
        dropped = len(items) - accepted
        if dropped:
            if not (stopping or self._warned_full):
                self._warned_full = True
                _logger.warning("export queue of %s is full; dropping and counting what does not fit", self.name)
            self._account(SHUTDOWN if stopping else QUEUE_FULL, dropped)

    def _due(self) -> bool:
        return (
            self._stopping
            or self._flushes > 0
            or len(self._items) >= self._max_batch
            or time.monotonic() >= self._last_export + self._interval_s
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._items and self._due()):
                    if self._stopping and not self._items:
                        return
                    wait = self._last_export + self._interval_s - time.monotonic() if self._items else None
                    self._cond.wait(wait)
                batch = [self._items.popleft() for _ in range(min(len(self._items), self._max_batch))]
                self._in_flight = len(batch)
            try:
                ok = self._export(batch)
            except Exception:  # an exporter bug must not kill the worker
                _logger.exception("exporter %s raised", self.name)
                ok = False
            with self._cond:
                counted = not self._gave_up  # else give_up() already counted this batch
                self._in_flight = 0
                self._last_export = time.monotonic()
                self._cond.notify_all()
            if counted and ok is not None:  # None: handed on to a delivery, which counts it
                self._account(EXPORTED if ok else EXPORT_FAILED, len(batch))

    def flush(self, timeout_s: float) -> bool:
        """Export everything queued now; False if that did not finish within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flushes += 1
            self._cond.notify_all()
            try:
                while self._items or self._in_flight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._flushes -= 1

    def stop(self) -> None:
        """Refuse new items; the worker exports what is queued, then exits."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self, timeout_s: float) -> None:
        self._thread.join(max(0.0, timeout_s))

    def drop_queued(self) -> None:
        """Count whatever is still queued as dropped at shutdown and forget it."""
        with self._cond:
            left = len(self._items)
            self._items.clear()
        if left:
            self._account(SHUTDOWN, left)

    def give_up(self) -> None:
        """Count a batch still being exported as dropped at shutdown, so every span is accounted
        for when shutdown returns; the worker will not count it again when the export returns."""
        with self._cond:
            self._gave_up = True
            left = self._in_flight
        if left:
            self._account(SHUTDOWN, left)


def _span_account(selfmetrics: SelfMetrics, exporter: str) -> Account:
    def account(outcome: str, count: int) -> None:
        if outcome == EXPORTED:
            selfmetrics.add("otel_ebpf.spans.exported", count, {"exporter": exporter})
        else:
            selfmetrics.add("otel_ebpf.spans.dropped", count, {"reason": outcome, "exporter": exporter})

    return account


def _metric_account(selfmetrics: SelfMetrics, exporter: str) -> Account:
    def account(outcome: str, count: int) -> None:
        if outcome != EXPORTED:
            selfmetrics.add("otel_ebpf.metrics.export.failed", count, {"reason": outcome, "exporter": exporter})

    return account


def _point_account(selfmetrics: SelfMetrics, exporter: str) -> Account:
    """OTLP counts metric losses in points (a collection may be partly of no interest, never half lost)."""

    def account(outcome: str, count: int) -> None:
        if outcome != EXPORTED:
            selfmetrics.add("otel_ebpf.metrics.points.dropped", count, {"reason": outcome, "exporter": exporter})

    return account


class TelemetrySink:
    """Fans spans and metrics out to exporters without ever blocking the caller.

    ``span_exporters`` / ``metric_exporters`` map a short exporter name (the ``exporter`` attribute
    of the self-metrics) to an SDK exporter; the sink owns them and shuts them down.
    ``preferred_temporality`` is what the agent's metric reader should use, so the points it hands
    to :meth:`export_metrics` have the temporality the configuration asks for.
    """

    def __init__(
        self,
        selfmetrics: SelfMetrics,
        span_exporters: Mapping[str, SpanExporter | OTLPExporter],
        metric_exporters: Mapping[str, MetricExporter | OTLPExporter],
        *,
        max_queue_spans: int = 20000,
        max_batch: int = 512,
        interval_s: float = 1.0,
        preferred_temporality: dict[type, AggregationTemporality] | None = None,
    ) -> None:
        self.preferred_temporality = preferred_temporality or temporality_preference("cumulative")
        self._span_exporters = dict(span_exporters)
        self._metric_exporters = dict(metric_exporters)
        self._span_workers = {
            name: _ExportWorker(
                f"spans-{name}",
                _export_spans_with(exporter),
                _span_account(selfmetrics, name),
                capacity=max_queue_spans,
                max_batch=max_batch,
                interval_s=interval_s,
            )
            for name, exporter in self._span_exporters.items()
        }
        self._metric_workers = {
            name: _ExportWorker(
                f"metrics-{name}",
                _export_metrics_with(exporter),
                _metric_account(selfmetrics, name),
                capacity=METRIC_QUEUE_BATCHES,
                max_batch=1,
                interval_s=0.0,
            )
            for name, exporter in self._metric_exporters.items()
        }
        self._shut_down = False
        self._spans_shut_down = False

    @property
    def exporters(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self._span_exporters, *self._metric_exporters]))

    def metric_exporter(self, kind: type[E]) -> E | None:
        """The configured metric exporter of type ``kind``, if any (the HTTP server serves Prometheus's)."""
        return next((e for e in self._metric_exporters.values() if isinstance(e, kind)), None)

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Queue ``spans`` for every exporter; never blocks on I/O. Overflow is dropped and counted."""
        for worker in self._span_workers.values():
            worker.put(spans)

    def export_metrics(self, data: MetricsData) -> None:
        """Queue one metrics collection for every exporter; never blocks on I/O."""
        for worker in self._metric_workers.values():
            worker.put((data,))

    def pending_spans(self) -> dict[str, int]:
        """Spans queued or being exported, per exporter (each at most ``export.max_queue_spans``
        plus one batch in flight)."""
        return {name: worker.pending for name, worker in self._span_workers.items()}

    def force_flush(self, timeout_s: float) -> bool:
        """Export everything queued so far; True if all exporters finished within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        workers: list[_ExportWorker[Any]] = [*self._span_workers.values(), *self._metric_workers.values()]
        queued = all([worker.flush(deadline - time.monotonic()) for worker in workers])
        deliveries = [
            e for e in [*self._span_exporters.values(), *self._metric_exporters.values()] if isinstance(e, OTLPExporter)
        ]
        return all([queued, *[e.force_flush(max(0.0, deadline - time.monotonic())) for e in deliveries]])

    def shutdown(self, timeout_s: float) -> None:
        """Flush what is queued, then shut every exporter down; returns within ``timeout_s``.

        Four fifths of the time go to draining the queues. What is still queued then is counted as
        dropped (``reason=shutdown``) and the exporters are shut down, which also aborts an OTLP
        export waiting to retry; a batch whose export has not returned shortly after that is
        counted as dropped too, so the counters are complete when this returns. Idempotent.
        """
        if self._shut_down:
            return
        self._shut_down = True
        workers: list[_ExportWorker] = [*self._metric_workers.values()]
        exporters: list[tuple[str, SpanExporter | MetricExporter | OTLPExporter]] = [*self._metric_exporters.items()]
        if not self._spans_shut_down:
            self._spans_shut_down = True
            workers += self._span_workers.values()
            exporters += self._span_exporters.items()
        _shut_down(workers, exporters, timeout_s)

    def shutdown_spans(self, timeout_s: float) -> None:
        """Shut the span side down as :meth:`shutdown` does, leaving metrics open: self-metrics
        collected after this account for every span (exported, or lost with its reason)."""
        if not self._spans_shut_down:
            self._spans_shut_down = True
            _shut_down(list(self._span_workers.values()), list(self._span_exporters.items()), timeout_s)


def _shut_down(workers: Sequence[_ExportWorker], exporters: Sequence[tuple[str, Any]], timeout_s: float) -> None:
    start = time.monotonic()
    for worker in workers:
        worker.stop()
    for worker in workers:
        worker.join(start + 0.8 * timeout_s - time.monotonic())
    for worker in workers:
        worker.drop_queued()
    for name, exporter in exporters:
        left_s = max(0.0, start + 0.9 * timeout_s - time.monotonic())
        if isinstance(exporter, OTLPExporter):  # drains in its own time, spools or counts the rest
            _shutdown_quietly(name, functools.partial(exporter.shutdown, left_s))
        elif isinstance(exporter, MetricExporter):
            _shutdown_quietly(name, functools.partial(exporter.shutdown, timeout_millis=left_s * 1000))
        else:
            _shutdown_quietly(name, exporter.shutdown)
    for worker in workers:
        worker.join(start + 0.95 * timeout_s - time.monotonic())
    for worker in workers:
        worker.give_up()


def _export_spans_with(exporter: SpanExporter | OTLPExporter) -> Callable[[list[ReadableSpan]], bool | None]:
    if isinstance(exporter, OTLPExporter):
        return exporter.export

    def export(batch: list[ReadableSpan]) -> bool:
        return exporter.export(batch) is SpanExportResult.SUCCESS

    return export


def _export_metrics_with(exporter: MetricExporter | OTLPExporter) -> Callable[[list[MetricsData]], bool | None]:
    if isinstance(exporter, OTLPExporter):
        return exporter.export

    def export(batch: list[MetricsData]) -> bool:
        results = [exporter.export(data) for data in batch]
        return all(result is MetricExportResult.SUCCESS for result in results)

    return export


def _shutdown_quietly(name: str, shutdown: Callable[[], None]) -> None:
    try:
        shutdown()
    except Exception:  # one exporter failing to close must not keep the others open
        _logger.exception("exporter %s failed to shut down", name)


Exporters = tuple[SpanExporter | None, MetricExporter]  # None: the exporter takes no spans


def _file(config: AgentConfig, temporality: dict, selfmetrics: SelfMetrics) -> Exporters:
    return FileSpanExporter(config.file.output_dir), FileMetricExporter(config.file.output_dir, temporality)


def _console(config: AgentConfig, temporality: dict, selfmetrics: SelfMetrics) -> Exporters:
    return ConsoleSpanExporter(), ConsoleMetricExporter(preferred_temporality=temporality)


def _prometheus(config: AgentConfig, temporality: dict, selfmetrics: SelfMetrics) -> Exporters:
    return None, PrometheusMetricExporter(
        selfmetrics,
        max_series=config.prometheus.max_series,
        series_ttl_s=config.prometheus.series_ttl_s,
        preferred_temporality=temporality,
    )


_FACTORIES = {"file": _file, "console": _console, "prometheus": _prometheus}


def build_sink(config: AgentConfig, selfmetrics: SelfMetrics) -> TelemetrySink:
    """The sink for ``config.exporters`` (none when ``export.disabled`` / ``OTEL_SDK_DISABLED``).

    Raises :class:`~otel_ebpf.exporters.errors.ExporterSetupError` when an exporter cannot start.
    """
    temporality = temporality_preference(config.export.metric_temporality)
    span_exporters: dict[str, SpanExporter | OTLPExporter] = {}
    metric_exporters: dict[str, MetricExporter | OTLPExporter] = {}
    if config.export.disabled:
        _logger.info("OTEL_SDK_DISABLED is set: exporting nothing (self-metrics are still counted)")
    else:
        for name in config.exporters:
            if name == "otlp":
                span_exporters[name] = otlp_exporter(config.otlp, TRACES, _span_account(selfmetrics, name), selfmetrics)
                metric_exporters[name] = otlp_exporter(
                    config.otlp, METRICS, _point_account(selfmetrics, name), selfmetrics
                )
                continue
            span_exporter, metric_exporters[name] = _FACTORIES[name](config, temporality, selfmetrics)
            if span_exporter is not None:
                span_exporters[name] = span_exporter
    return TelemetrySink(
        selfmetrics,
        span_exporters,
        metric_exporters,
        max_queue_spans=config.export.max_queue_spans,
        max_batch=config.export.max_batch,
        interval_s=config.export.interval_s,
        preferred_temporality=temporality,
    )
