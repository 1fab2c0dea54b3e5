"""The SDK's OTLP exporters (gRPC or HTTP/protobuf), built from :class:`~otel_ebpf.config.OTLPConfig`.

Every option is passed explicitly, so what the agent sends follows its resolved configuration (the
SDK would otherwise read ``OTEL_EXPORTER_OTLP_*`` itself, with the Python SDK's own reading of
``OTEL_EXPORTER_OTLP_TIMEOUT`` in seconds where the specification says milliseconds). TLS
certificate variables (``OTEL_EXPORTER_OTLP_CERTIFICATE`` and friends) are still read by the SDK.

The SDK exporters retry transient failures with exponential backoff, but never beyond their
``timeout``: one batch sent to a dead backend costs at most ``otlp.timeout_s``.
"""

from __future__ import annotations

import grpc
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from otel_ebpf.config import OTLPConfig


def _grpc_options(config: OTLPConfig) -> dict:
    compression = grpc.Compression.Gzip if config.compression == "gzip" else grpc.Compression.NoCompression
    return {
        "insecure": config.insecure,
        "headers": dict(config.headers),
        "timeout": config.timeout_s,
        "compression": compression,
    }


def _http_options(config: OTLPConfig) -> dict:
    compression = HttpCompression.Gzip if config.compression == "gzip" else HttpCompression.NoCompression
    return {"headers": dict(config.headers), "timeout": config.timeout_s, "compression": compression}


def otlp_span_exporter(config: OTLPConfig) -> SpanExporter:
    endpoint = config.signal_endpoint("traces")
    if config.protocol == "grpc":
        return GrpcSpanExporter(endpoint=endpoint, **_grpc_options(config))
    return HttpSpanExporter(endpoint=endpoint, **_http_options(config))


def otlp_metric_exporter(
    config: OTLPConfig, preferred_temporality: dict[type, AggregationTemporality]
) -> MetricExporter:
    endpoint = config.signal_endpoint("metrics")
    if config.protocol == "grpc":
        return GrpcMetricExporter(
            endpoint=endpoint, preferred_temporality=preferred_temporality, **_grpc_options(config)
        )
    return HttpMetricExporter(endpoint=endpoint, preferred_temporality=preferred_temporality, **_http_options(config))


def otlp_log_exporter(config: OTLPConfig) -> LogRecordExporter:
    """Log records (GPU leak reports) to ``<endpoint>`` (gRPC) or ``<endpoint>/v1/logs`` (HTTP)."""
    endpoint = config.signal_endpoint("logs")
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter  # noqa: PLC0415 — only the chosen transport's exporter loads

        return GrpcLogExporter(endpoint=endpoint, **_grpc_options(config))
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter  # noqa: PLC0415

    return HttpLogExporter(endpoint=endpoint, **_http_options(config))
