"""NCCL operations as spans, under the request their thread was serving.

A collective issued while its thread serves exactly one incoming request (the trace assembler's
``server_span_at``: an inference server doing a tensor-parallel all-reduce for a request) is
part of that request's work, so it becomes an INTERNAL child span of the request's SERVER span:
``nccl AllReduce`` from the call's entry to its return (the enqueue; NCCL runs the transfer on the
GPU afterwards), with the same attributes as the metrics. Outside a request nothing is emitted —
the metrics and profiles already count it, and a root span per collective would only be noise.

Span ids derive from the call's identity (pid, tid, entry time, operation), so a replay of the
same calls yields the same spans (docs/architecture.md, "Deterministic after the ring buffer").
"""

from __future__ import annotations

import hashlib

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from ..protocol import Attributes, AttributeValue
from .calls import NCCL_DATATYPES, GpuCall, Kind, Library, error_name
from .views import SCOPE

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def span_id_of(call: GpuCall) -> int:
    digest = hashlib.blake2b(f"{call.pid}/{call.tid}/{call.ts_ns}/{call.op}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def collective_span(
    call: GpuCall, parent: tuple[int, int], resource: Attributes, rank: tuple[int, int] | None = None
) -> ReadableSpan | None:
    """The span of an NCCL collective or group call made under ``parent`` (trace id, span id);
    None for other calls. ``rank``: (rank, communicator size) when the communicator is known."""
    spec = call.spec
    if spec.library is not Library.NCCL or spec.kind not in (Kind.COLLECTIVE, Kind.GROUP):
        return None
    operation = spec.symbol.removeprefix("nccl")
    attributes: dict[str, AttributeValue] = {"nccl.operation": operation, "thread.id": call.tid}
    if spec.kind is Kind.COLLECTIVE:
        name, size = NCCL_DATATYPES.get(call.arg(spec.dtype_arg, signed32=True), ("unknown", 0))
        attributes["nccl.datatype"] = name
        attributes["nccl.operation.size"] = call.arg(spec.size_arg) * size
    if rank is not None:
        attributes["nccl.rank"], attributes["nccl.comm.size"] = rank
    status = Status(StatusCode.UNSET)
    if not call.ok:
        error_type = attributes["error.type"] = error_name(Library.NCCL, call.ret)
        status = Status(StatusCode.ERROR, error_type)
    trace_id, parent_id = parent
    return ReadableSpan(
        name=f"nccl {operation}",
        context=SpanContext(trace_id, span_id_of(call), False, _SAMPLED),
        parent=SpanContext(trace_id, parent_id, False, _SAMPLED),
        resource=Resource(dict(resource)),
        attributes=attributes,
        kind=trace.SpanKind.INTERNAL,
        status=status,
        start_time=call.ts_ns,
        end_time=call.ts_ns + call.duration_ns,
        instrumentation_scope=SCOPE,
    )
