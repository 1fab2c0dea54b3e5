"""Reading propagated trace contexts (W3C Trace Context, B3) from header fields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_ebpf.pipeline.propagation import B3, W3C, PropagatedContext, read_carrier


def extract(carrier: list[tuple[str, str]]) -> PropagatedContext | None:
    return read_carrier(carrier)[0]


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def test_traceparent_with_tracestate() -> None:
    found = extract([("host", "a"), ("traceparent", f"00-{TRACE}-{SPAN}-01"), ("tracestate", "vendor=x,other=y")])
    assert found is not None
    assert (found.trace_id, found.span_id, found.sampled, found.format) == (int(TRACE, 16), int(SPAN, 16), True, W3C)
    assert found.trace_state is not None and dict(found.trace_state) == {"vendor": "x", "other": "y"}


def test_traceparent_not_sampled_and_future_version() -> None:
    assert extract([("traceparent", f"00-{TRACE}-{SPAN}-00")]).sampled is False
    # a later version may append fields; version 00 may not
    assert extract([("traceparent", f"01-{TRACE}-{SPAN}-01-extra")]) is not None
    assert extract([("traceparent", f"00-{TRACE}-{SPAN}-01-extra")]) is None


@pytest.mark.parametrize(
    "value",
    [
        f"ff-{TRACE}-{SPAN}-01",  # forbidden version
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper-case hex
        f"00-{TRACE[:-1]}-{SPAN}-01",  # short trace id
        "garbage",
        "",
    ],
)
def test_invalid_traceparent_is_absent(value: str) -> None:
    assert extract([("traceparent", value)]) is None


def test_b3_single_and_multi() -> None:
    single = extract([("b3", f"{TRACE}-{SPAN}-1-{'1' * 16}")])
    assert (single.trace_id, single.span_id, single.sampled, single.format) == (int(TRACE, 16), int(SPAN, 16), True, B3)
    short = extract([("b3", f"{TRACE[16:]}-{SPAN}-0")])  # 64-bit trace ids are left-padded
    assert (short.trace_id, short.sampled) == (int(TRACE[16:], 16), False)
    assert extract([("b3", "1")]) is None  # sampling decision only: no span to join
    multi = extract([("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-sampled", "0")])
    assert (multi.trace_id, multi.span_id, multi.sampled) == (int(TRACE, 16), int(SPAN, 16), False)
    assert extract([("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-flags", "1")]).sampled
    assert extract([("x-b3-traceid", TRACE + "00"), ("x-b3-spanid", SPAN)]) is None
    assert extract([("x-b3-traceid", TRACE)]) is None


def test_w3c_wins_over_b3_and_the_first_field_counts() -> None:
    other = "1" * 32
    found = extract(
        [("b3", f"{other}-{SPAN}"), ("traceparent", f"00-{TRACE}-{SPAN}-01"), ("traceparent", f"00-{other}-{SPAN}-01")]
    )
    assert (found.trace_id, found.format) == (int(TRACE, 16), W3C)
    # an invalid traceparent falls back to b3
    assert extract([("traceparent", "bad"), ("b3", f"{other}-{SPAN}")]).trace_id == int(other, 16)


def test_correlation_ids() -> None:
    assert read_carrier([("x-correlation-id", "c"), ("x-request-id", "r")]) == (None, "r")
    assert read_carrier([("x-correlation-id", "c"), ("x-request-id", "")]) == (None, "c")
    context, correlation = read_carrier([("traceparent", f"00-{TRACE}-{SPAN}-01"), ("x-request-id", " r1 ")])
    assert (context.trace_id, correlation) == (int(TRACE, 16), "r1")
    assert read_carrier([("host", "a")]) == (None, None)


def test_no_context() -> None:
    assert extract([]) is None
    assert extract([("host", "a"), ("x-request-id", "r1")]) is None


@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                ["traceparent", "tracestate", "b3", "x-b3-traceid", "x-b3-spanid", "x-b3-sampled", "x-b3-flags", "host"]
            ),
            st.text(max_size=80),
        )
    )
)
def test_hostile_fields_never_raise(fields: list[tuple[str, str]]) -> None:
    found = extract(fields)
    if found is not None:
        assert 0 < found.trace_id < 1 << 128 and 0 < found.span_id < 1 << 64
