"""Built-in protocol plugins (installed as ``otel_ebpf.protocols``), one package per protocol."""
