"""The trace assembler's answer to "which request is this thread serving?" (span links of samples)."""

from __future__ import annotations

from otel_ebpf.pipeline.assembly import TraceAssembler, request_ids
from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, RequestStart, Role
from otel_ebpf.selfmetrics import SelfMetrics

SERVER = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8000), Endpoint("127.0.0.1", 40000))
CLIENT = ConnectionInfo(Role.CLIENT, Endpoint("127.0.0.1", 41000), Endpoint("127.0.0.1", 9000))
PID, TID = 100, 101


def test_one_request_on_the_thread_gives_its_span() -> None:
    assembler = TraceAssembler(SelfMetrics())
    assert assembler.active_server_span(PID, TID) is None
    assembler.start((PID, 5, 0), SERVER, RequestStart(Direction.INGRESS, 1_000), tid=TID)
    trace_id, span_id = request_ids((PID, 5, 0), 1_000, 0)
    assert assembler.active_server_span(PID, TID) == (trace_id, span_id)
    assert assembler.active_server_span(PID, TID + 1) is None  # another thread of the process
    assert assembler.active_server_span(PID + 1, TID) is None
    # an outgoing call made while serving does not change what the thread serves
    assembler.start((PID, 6, 0), CLIENT, RequestStart(Direction.EGRESS, 1_500), tid=TID)
    assert assembler.active_server_span(PID, TID) == (trace_id, span_id)
    assembler.finish((PID, 5, 0), SERVER, 1_000, tid=TID)
    assert assembler.active_server_span(PID, TID) is None


def test_several_requests_on_one_thread_give_no_link() -> None:
    assembler = TraceAssembler(SelfMetrics())
    assembler.start((PID, 5, 0), SERVER, RequestStart(Direction.INGRESS, 1_000), tid=TID)
    assembler.start((PID, 7, 0), SERVER, RequestStart(Direction.INGRESS, 1_200), tid=TID)
    assert assembler.active_server_span(PID, TID) is None  # an event loop: no guess
