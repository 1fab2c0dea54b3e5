"""``otel-ebpf advise``: ranked findings, with their evidence and a change to try, from what the
agent wrote (docs/advise.md)."""
