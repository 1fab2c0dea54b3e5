"""OTLP export of every signal (spans, metric points, log records, profile samples), one design.

:class:`OTLPExporter` encodes a batch of one signal's items into its ``Export*ServiceRequest``
(spans written directly by :mod:`.otlp_proto`, the other signals through the OpenTelemetry
encoders, or :mod:`otel_ebpf.profiles.otlp`) and hands the bytes to that
signal's :class:`~.delivery.Delivery`, which queues, retries and counts them. The four signals
differ only in the :class:`Signal` row below: encoder and unit.

Every option is passed explicitly from :class:`~otel_ebpf.config.OTLPConfig`, so what the agent
sends follows its resolved configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricsData

from otel_ebpf.config import OTLPConfig
from otel_ebpf.exporters.batches import BatchQueue, MemoryQueue
from otel_ebpf.exporters.delivery import Account, Delivery
from otel_ebpf.exporters.otlp_proto import SpanProtoEncoder
from otel_ebpf.exporters.retry import Backoff
from otel_ebpf.exporters.spool import Spool
from otel_ebpf.exporters.transport import build_transport
from otel_ebpf.selfmetrics import SelfMetrics

_logger = logging.getLogger(__name__)

T = TypeVar("T")
ENCODE_FAILED = "encode_failed"


Encoder = Callable[[Sequence[T]], bytes]  # a batch -> its serialized Export*ServiceRequest


@dataclass(frozen=True)
class Signal(Generic[T]):
    name: str  # traces | metrics | logs | profiles (the endpoint and spool directory)
    new_encoder: Callable[[], Encoder[T]]  # one per exporter: an encoder may keep caches
    count: Callable[[Sequence[T]], int]  # items in a batch, in the unit losses are counted in


def _serialized(encode: Callable[[Sequence[T]], Message]) -> Callable[[], Encoder[T]]:
    """An encoder factory from one of the encoders that build protobuf messages."""
    return lambda: lambda batch: encode(batch).SerializeToString()


def _metric_points(batch: Sequence[MetricsData]) -> int:
    return sum(
        len(metric.data.data_points)
        for data in batch
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    )


def _encode_metrics(batch: Sequence[MetricsData]) -> Message:
    if len(batch) != 1:
        raise ValueError("metric batches hold one collection")
    return encode_metrics(batch[0])


def _encode_profiles(batch: Sequence[Any]) -> Message:
    from otel_ebpf.profiles import otlp  # noqa: PLC0415 — profiles import this package: import it late

    return otlp.encode(batch)


TRACES: Signal[Any] = Signal("traces", lambda: SpanProtoEncoder().encode, len)
METRICS: Signal[MetricsData] = Signal("metrics", _serialized(_encode_metrics), _metric_points)
LOGS: Signal[Any] = Signal("logs", _serialized(encode_logs), len)
PROFILES: Signal[Any] = Signal(
    "profiles", _serialized(_encode_profiles), lambda batch: sum(len(p.samples) for p in batch)
)


class OTLPExporter(Generic[T]):
    """Encodes batches of one signal and hands them to its delivery (which accounts for them)."""

    def __init__(self, signal: Signal[T], delivery: Delivery, account: Account) -> None:
        self.signal = signal
        self._encode = signal.new_encoder()
        self.delivery = delivery
        self._account = account

    def export(self, batch: Sequence[T]) -> None:
        """Queue ``batch``; never waits for the backend. A batch that cannot be encoded is counted
        as lost (``encode_failed``) and logged."""
        count = self.signal.count(batch)
        try:
            body = self._encode(batch)
        except Exception as exc:  # noqa: BLE001 -- a bad value loses its batch, never the exporter
            _logger.warning("OTLP %s: batch of %d cannot be encoded (%s); dropped", self.signal.name, count, exc)
            self._account(ENCODE_FAILED, count)
            return
        self.delivery.submit(body, count)

    def force_flush(self, timeout_s: float) -> bool:
        return self.delivery.flush(timeout_s)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self.delivery.close(timeout_s)


def build_queue(config: OTLPConfig, signal: str, selfmetrics: SelfMetrics) -> BatchQueue:
    """``otlp.spool_dir/<signal>`` when a spool is configured, else a queue in memory."""
    if config.spool_dir is None:
        return MemoryQueue(config.queue_max_batches, config.queue_max_bytes)

    def corrupt(records: int) -> None:
        selfmetrics.add("otel_ebpf.export.spool.corrupt", records, {"signal": signal})

    return Spool(config.spool_dir / signal, config.spool_max_bytes, corrupt)


def otlp_exporter(config: OTLPConfig, signal: Signal[T], account: Account, selfmetrics: SelfMetrics) -> OTLPExporter[T]:
    """The OTLP exporter of ``signal``; ``account(outcome, items)`` hears of every item once.

    Raises :class:`~otel_ebpf.exporters.errors.ExporterSetupError` when the spool cannot be used.
    """
    queue = build_queue(config, signal.name, selfmetrics)  # first: it is what can fail
    delivery = Delivery(
        signal.name,
        build_transport(config, signal.name),
        queue,
        Backoff(config.retry_initial_s, config.retry_max_s),
        account,
        selfmetrics,
        timeout_s=config.timeout_s,
        max_elapsed_s=config.retry_max_elapsed_s,
    )
    return OTLPExporter(signal, delivery, account)
