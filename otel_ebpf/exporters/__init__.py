"""Where telemetry leaves the agent.

The agent writes every span and metric batch into one :class:`TelemetrySink` (built from the
configuration by :func:`build_sink`), which fans them out to the configured exporters: OTLP
gRPC/HTTP (:mod:`.otlp`), OTLP JSON Lines files (:mod:`.file`), the console (:mod:`.console`) and,
for metrics only, Prometheus's ``/metrics`` (:mod:`.prometheus`).
All of them are ordinary OpenTelemetry SDK ``SpanExporter`` / ``MetricExporter`` implementations.
"""

from otel_ebpf.exporters.errors import ExporterSetupError
from otel_ebpf.exporters.sink import TelemetrySink, build_sink

__all__ = ["ExporterSetupError", "TelemetrySink", "build_sink"]
