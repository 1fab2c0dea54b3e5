"""Span sampling: errors and slow requests always kept, the rest by the trace id's random part."""

from __future__ import annotations

from otel_ebpf.sampling import SpanSampler

MS = 1_000_000
RANDOM = (1 << 56) - 1


def test_by_default_every_span_is_kept() -> None:
    sampler = SpanSampler()
    assert all(sampler.keep(trace_id, False, MS) for trace_id in (0, RANDOM, 1 << 127))


def test_the_ratio_reads_the_random_part_of_the_trace_id() -> None:
    sampler = SpanSampler(0.25)
    kept = [trace_id for trace_id in range(0, 1 << 56, 1 << 48) if sampler.keep(trace_id | (7 << 100), False, MS)]
    assert len(kept) == 64  # a quarter of 256 evenly spread ids, whatever the high bits say
    assert sampler.keep(RANDOM // 4 - 1, False, MS) and not sampler.keep(RANDOM // 4 + 1, False, MS)


def test_errors_and_slow_requests_are_always_kept() -> None:
    sampler = SpanSampler(0.001, keep_slower_than_ns=500 * MS)
    unlucky = RANDOM
    assert not sampler.keep(unlucky, False, 499 * MS)
    assert sampler.keep(unlucky, True, MS)
    assert sampler.keep(unlucky, False, 500 * MS)
