"""Span sampling after the fact: errors and slow requests always kept, the rest at a ratio.

Decided when an exchange completes, so its outcome is known. The decision for the plain ones
reads the random part of the trace id (its low 56 bits, random by W3C Trace Context level 2), so
every span of a trace, on every process of the node, is kept or dropped together. Only spans are
sampled: metrics are recorded for every exchange. Pure: no clock, no randomness of its own.
"""

from __future__ import annotations

_RANDOM_BITS = 56


class SpanSampler:
    def __init__(self, ratio: float = 1.0, keep_slower_than_ns: int = 1_000_000_000) -> None:
        self._threshold = round(min(max(ratio, 0.0), 1.0) * (1 << _RANDOM_BITS))
        self._slow_ns = keep_slower_than_ns

    @property
    def keeps_everything(self) -> bool:
        return self._threshold >= 1 << _RANDOM_BITS

    def keep(self, trace_id: int, is_error: bool, duration_ns: int) -> bool:
        return (
            self.keeps_everything
            or is_error
            or duration_ns >= self._slow_ns
            or trace_id & ((1 << _RANDOM_BITS) - 1) < self._threshold
        )
