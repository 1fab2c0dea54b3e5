"""The trace assembler's answer to "which request was this thread serving at that time?" (span
links of CPU samples and NCCL calls), and the pipeline horizon up to which that answer is final."""

from __future__ import annotations

from otel_ebpf.pipeline import Pipeline
from otel_ebpf.pipeline.assembly import SERVED_PER_THREAD, SERVED_THREADS, TraceAssembler, request_ids
from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import ConnData, ConnOpen
from otel_ebpf.pipeline.reorder import EventReorderer
from otel_ebpf.pipeline.telemetry import Telemetry
from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, RequestStart, Role, load_protocols
from otel_ebpf.selfmetrics import SelfMetrics

SERVER = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8000), Endpoint("127.0.0.1", 40000))
CLIENT = ConnectionInfo(Role.CLIENT, Endpoint("127.0.0.1", 41000), Endpoint("127.0.0.1", 9000))
PID, TID = 100, 101


def _serve(assembler: TraceAssembler, fd: int, start_ns: int, end_ns: int | None, tid: int = TID) -> tuple:
    """One incoming request on connection fd, completed at end_ns (None: still in flight)."""
    key = (PID, fd, 0)
    assembler.start(key, SERVER, RequestStart(Direction.INGRESS, start_ns), tid=tid)
    if end_ns is not None:
        assembler.finish(key, SERVER, start_ns, tid=tid, end_ns=end_ns)
    return request_ids(key, start_ns, 0)


def test_one_request_on_the_thread_gives_its_span() -> None:
    assembler = TraceAssembler(SelfMetrics())
    assert assembler.server_span_at(PID, TID, 1_200) is None
    ids = _serve(assembler, 5, 1_000, None)
    assert assembler.server_span_at(PID, TID, 1_200) == ids
    assert assembler.server_span_at(PID, TID, 900) is None  # before it started
    assert assembler.server_span_at(PID, TID + 1, 1_200) is None  # another thread of the process
    assert assembler.server_span_at(PID + 1, TID, 1_200) is None
    # an outgoing call made while serving does not change what the thread serves
    assembler.start((PID, 6, 0), CLIENT, RequestStart(Direction.EGRESS, 1_500), tid=TID)
    assert assembler.server_span_at(PID, TID, 1_600) == ids


def test_a_completed_request_still_links_what_happened_during_it() -> None:
    assembler = TraceAssembler(SelfMetrics())
    first = _serve(assembler, 5, 1_000, 2_000)
    second = _serve(assembler, 5, 3_000, 4_000)
    assert assembler.server_span_at(PID, TID, 1_500) == first
    assert assembler.server_span_at(PID, TID, 2_000) == first  # its last byte
    assert assembler.server_span_at(PID, TID, 2_500) is None  # between the two: idle
    assert assembler.server_span_at(PID, TID, 3_500) == second
    assert assembler.server_span_at(PID, TID, 4_500) is None


def test_several_requests_on_one_thread_give_no_link() -> None:
    assembler = TraceAssembler(SelfMetrics())
    _serve(assembler, 5, 1_000, None)
    _serve(assembler, 7, 1_200, None)
    assert assembler.server_span_at(PID, TID, 1_300) is None  # an event loop: no guess
    assert assembler.server_span_at(PID, TID, 1_100) is not None  # only the first had started
    assembler2 = TraceAssembler(SelfMetrics())
    _serve(assembler2, 5, 1_000, 2_000)
    _serve(assembler2, 7, 1_500, None)  # overlaps the completed one
    assert assembler2.server_span_at(PID, TID, 1_700) is None


def test_what_is_remembered_is_bounded_per_thread_and_in_threads() -> None:
    assembler = TraceAssembler(SelfMetrics())
    for n in range(SERVED_PER_THREAD + 1):
        _serve(assembler, 5, 1_000 * (n + 1), 1_000 * (n + 1) + 500)
    assert assembler.server_span_at(PID, TID, 1_200) is None  # the oldest is forgotten
    assert assembler.server_span_at(PID, TID, 2_200) is not None
    for tid in range(1, SERVED_THREADS + 1):
        _serve(assembler, 5, 10**6 + tid, 10**6 + tid + 1, tid=10_000 + tid)
    assert assembler.server_span_at(PID, TID, 2_200) is None  # least recent thread forgotten
    assert assembler.server_span_at(PID, 10_000 + SERVED_THREADS, 10**6 + SERVED_THREADS) is not None


def test_the_pipeline_horizon_waits_for_events_held_for_reordering() -> None:
    """A call stamped just after a request's first bytes must not be linked while those bytes are
    still held in the reorder window — and, linked later, finds the request even once it is done."""
    metrics = SelfMetrics()
    protocols = load_protocols()
    window = 50_000_000
    pipeline = Pipeline(
        ConnectionTracker(protocols, metrics, 64),
        Telemetry(protocols, "host", {}, metrics, 16),
        metrics,
        reorderer=EventReorderer(metrics, window_ns=window),
    )
    local, peer = Endpoint("127.0.0.1", 8000), Endpoint("127.0.0.1", 40000)
    t0 = 10**18
    opened = ConnOpen(t0, PID, 5, 0, Role.SERVER, local, peer)
    head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    request = ConnData(t0 + 1_000, PID, TID, 5, 0, Direction.INGRESS, len(head), head)
    call_ns = t0 + 2_000  # what the thread did while serving it
    pipeline.handle([opened, request])
    assert pipeline.horizon_ns < call_ns  # the request is still held: too early to link
    pipeline.advance(t0 + 1_500)
    assert pipeline.horizon_ns < call_ns
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    response = ConnData(t0 + 3 * window, PID, TID, 5, 0, Direction.EGRESS, len(ok), ok)
    pipeline.handle([response])
    pipeline.advance(t0 + 4 * window)
    assert pipeline.horizon_ns >= call_ns
    span = pipeline.assembler.server_span_at(PID, TID, call_ns)
    assert span is not None  # the request completed meanwhile: still linked
    assert pipeline.assembler.server_span_at(PID, TID, t0 + 4 * window) is None
