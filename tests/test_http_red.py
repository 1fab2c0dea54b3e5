"""The kernel's HTTP/1 bucket totals turned into reports a delta histogram can carry."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from otel_ebpf.probes.http_red import reported_moves


def test_growth_is_reported_as_it_is() -> None:
    assert reported_moves((3, 1, 0), (1, 1, 0)) == (2, 0, 0)


def test_a_move_to_a_later_bucket_waits_for_the_bucket_it_left_to_refill() -> None:
    # one request went from bucket 0 to bucket 2 (a response that went on), nothing new
    assert reported_moves((0, 0, 1), (1, 0, 0)) == (0, 0, 0)
    # two new requests in bucket 0 since: one of them pays for the move, which is now reported
    assert reported_moves((2, 0, 1), (1, 0, 0)) == (1, 0, 1)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=15))
def test_reports_are_never_negative_and_add_up_to_the_new_requests(pairs: list[tuple[int, int]]) -> None:
    reported = tuple(b for _, b in pairs)
    current = tuple(a for a, _ in pairs)
    grown = sum(current) - sum(reported)
    moves = reported_moves(current, reported)
    assert all(m >= 0 for m in moves)
    if grown >= 0:
        assert sum(moves) == grown
