"""Reading a propagated trace context out of a request's header fields (W3C Trace Context, B3).

This reads the context that a caller already put on the wire: an instrumented program's, or the one
the kernel inserted (``trace.inject_traceparent``, bpf/inject_traceparent.c, which reads the same
header the same way on the server side). Invalid or partial headers count as
absent, as the specifications ask: a malformed ``traceparent`` must not make a request join a
trace that does not exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from opentelemetry.trace import TraceState

from ..protocol import Carrier

W3C = "w3c"
B3 = "b3"

# Request-correlation fields: an id a program forwards on the calls it makes for a request.
CORRELATION_FIELDS = ("x-request-id", "x-correlation-id")
# Field names worth looking at; a request rarely has any, so most carriers are rejected by one
# set lookup per field.
_FIELDS = frozenset(
    {
        "traceparent",
        "tracestate",
        "b3",
        "x-b3-traceid",
        "x-b3-spanid",
        "x-b3-sampled",
        "x-b3-flags",
        *CORRELATION_FIELDS,
    }
)
# version-traceid-parentid-flags; a version above 00 may append fields after a dash
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")
_B3_SINGLE = re.compile(r"([0-9a-f]{32}|[0-9a-f]{16})-([0-9a-f]{16})(?:-([01d]))?(?:-[0-9a-f]{16})?\Z")
_B3_ID = re.compile(r"(?:[0-9a-f]{32}|[0-9a-f]{16})\Z")
_B3_SPAN_ID = re.compile(r"[0-9a-f]{16}\Z")
_SAMPLED = 0x01


@dataclass(frozen=True, slots=True)
class PropagatedContext:
    """The caller's span, as a request's headers name it."""

    trace_id: int
    span_id: int
    sampled: bool
    trace_state: TraceState | None
    format: str  # W3C or B3


def read_carrier(carrier: Carrier) -> tuple[PropagatedContext | None, str | None]:
    """The context ``carrier`` propagates (W3C ``traceparent`` wins over ``b3``, which wins over
    the multi-header ``X-B3-*`` form), and its correlation id (``x-request-id``, else
    ``x-correlation-id``); either may be ``None``."""
    fields: dict[str, str] | None = None
    for name, value in carrier:
        if name in _FIELDS:
            if fields is None:
                fields = {}
            fields.setdefault(name, value.strip())
    if fields is None:
        return None, None
    correlation = next((fields[name] for name in CORRELATION_FIELDS if fields.get(name)), None)
    return _w3c(fields) or _b3_single(fields) or _b3_multi(fields), correlation


def _w3c(fields: dict[str, str]) -> PropagatedContext | None:
    value = fields.get("traceparent")
    if value is None:
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, extra = match.groups()
    if version == "ff" or (version == "00" and extra is not None):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    state = fields.get("tracestate")
    trace_state = TraceState.from_header([state]) if state else None
    return PropagatedContext(trace_id, span_id, bool(int(flags_hex, 16) & _SAMPLED), trace_state, W3C)


def _b3_single(fields: dict[str, str]) -> PropagatedContext | None:
    value = fields.get("b3")
    if value is None:
        return None
    match = _B3_SINGLE.match(value.lower())
    if match is None:
        return None  # includes the sampling-only forms ("0", "1", "d"), which name no span
    trace_hex, span_hex, sampling = match.groups()
    return _b3_context(trace_hex, span_hex, sampling != "0")


def _b3_multi(fields: dict[str, str]) -> PropagatedContext | None:
    trace_hex = fields.get("x-b3-traceid", "").lower()
    span_hex = fields.get("x-b3-spanid", "").lower()
    if not (_B3_ID.match(trace_hex) and _B3_SPAN_ID.match(span_hex)):
        return None
    sampled = fields.get("x-b3-flags") == "1" or fields.get("x-b3-sampled", "1").lower() not in ("0", "false")
    return _b3_context(trace_hex, span_hex, sampled)


def _b3_context(trace_hex: str, span_hex: str, sampled: bool) -> PropagatedContext | None:
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)  # 64-bit trace ids are left-padded
    if not trace_id or not span_id:
        return None
    return PropagatedContext(trace_id, span_id, sampled, None, B3)
