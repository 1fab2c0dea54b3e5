"""otel-ebpf: zero-code OpenTelemetry collector built on eBPF."""

__version__ = "0.1.0"
