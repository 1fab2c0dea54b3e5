"""Errors the exporters raise at start-up (kept apart so every exporter module can import them)."""


class ExporterSetupError(RuntimeError):
    """An exporter cannot start (an output directory that cannot be written, say)."""
