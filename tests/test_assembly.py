"""Trace assembly on hand-built and recorded event streams: exact trees, ids and counts.

The hand-built chain is what three observed processes on one node do for one request (gateway →
service → backend, each calling the next on the thread that serves it), with the real ``http1``
plugin parsing real bytes. Arrival order is then scrambled as the CPUs of a real node scramble it:
the assembled traces must not change.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.pipeline import Pipeline
from otel_ebpf.pipeline.assembly import TraceAssembler, request_ids
from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import Event, KernelTrace
from otel_ebpf.pipeline.metrics import DELTA_KINDS
from otel_ebpf.pipeline.reorder import EventReorderer
from otel_ebpf.pipeline.telemetry import Telemetry
from otel_ebpf.protocol import ConnectionInfo, Endpoint, RequestStart, Role, Transport
from otel_ebpf.recording import read_recording
from otel_ebpf.selfmetrics import SelfMetrics
from tests.test_pipeline import HOST, IN, MS, OUT, PROTOCOLS, at, data, get, info, ok, opened

GATEWAY, SERVICE, BACKEND = 100, 200, 300
LOADER = Endpoint("127.0.0.1", 40000)
GW = Endpoint("127.0.0.1", 8000)
GW_OUT = Endpoint("127.0.0.1", 41000)
SVC = Endpoint("127.0.0.1", 8001)
SVC_OUT = Endpoint("127.0.0.1", 42000)
BE = Endpoint("127.0.0.1", 8002)
WINDOW_MS = 50
TRACE_HEX, SPAN_HEX = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
RECORDED = Path(__file__).with_name("data") / "trace_chain_events.jsonl"


class Assembly:
    """A pipeline wired as the agent wires it, with a reorder window of ``WINDOW_MS``."""

    def __init__(
        self, instrumented_clients: str = "skip", max_inflight: int = 65536, inflight_timeout_ns: int = 300 * 10**9
    ) -> None:
        self.selfmetrics = SelfMetrics()
        self.telemetry = Telemetry(PROTOCOLS, HOST, {}, self.selfmetrics, 1024, DELTA_KINDS["cumulative"])
        self.assembler = TraceAssembler(self.selfmetrics, inflight_timeout_ns, max_inflight, instrumented_clients)
        self.pipeline = Pipeline(
            ConnectionTracker(PROTOCOLS, self.selfmetrics),
            self.telemetry,
            self.selfmetrics,
            self.assembler,
            EventReorderer(self.selfmetrics, WINDOW_MS * MS),
        )

    def run(self, events: list[Event], batch: int = 7) -> list[ReadableSpan]:
        for i in range(0, len(events), batch):
            self.pipeline.handle(events[i : i + batch])
        self.pipeline.flush()
        return self.telemetry.take_spans()

    def total(self, name: str) -> int:
        return self.selfmetrics.total(name)


def chain(
    base_ms: float, request_id: str, gateway_headers: bytes = b"", service_headers: bytes = b"", n: int = 0
) -> list[Event]:
    """The ``n``-th request through gateway → service → backend, each hop on a connection of its own
    (fds 5 + n served, 1005 + n called), in timestamp order."""
    loader, gw_out, svc_out = (Endpoint(e.address, e.port + n) for e in (LOADER, GW_OUT, SVC_OUT))
    rid = b"x-request-id: %s\r\n" % request_id.encode()
    path = "/work/" + request_id
    served, called = 5 + n, 1005 + n
    t = lambda step: base_ms + step  # noqa: E731
    return [
        opened(t(0), GATEWAY, served, 0, Role.SERVER, GW, loader),
        data(t(0), GATEWAY, served, IN, get(path, "gw", rid + gateway_headers), tid=101 + n),
        opened(t(1), GATEWAY, called, 0, Role.CLIENT, gw_out, SVC),
        data(t(1), GATEWAY, called, OUT, get(path, "svc", rid + service_headers), tid=101 + n),
        opened(t(2), SERVICE, served, 0, Role.SERVER, SVC, gw_out),
        data(t(2), SERVICE, served, IN, get(path, "svc", rid + service_headers), tid=201 + n),
        opened(t(3), SERVICE, called, 0, Role.CLIENT, svc_out, BE),
        data(t(3), SERVICE, called, OUT, get(path, "be", rid), tid=201 + n),
        opened(t(4), BACKEND, served, 0, Role.SERVER, BE, svc_out),
        data(t(4), BACKEND, served, IN, get(path, "be", rid), tid=301 + n),
        data(t(5), BACKEND, served, OUT, ok(b"be"), tid=301 + n),
        data(t(6), SERVICE, called, IN, ok(b"be"), tid=201 + n),
        data(t(7), SERVICE, served, OUT, ok(b"svc"), tid=201 + n),
        data(t(8), GATEWAY, called, IN, ok(b"svc"), tid=101 + n),
        data(t(9), GATEWAY, served, OUT, ok(b"gw"), tid=101 + n),
    ]


def named(spans: list[ReadableSpan]) -> dict[tuple[int, str], ReadableSpan]:
    """Spans by (pid, kind): one request's five spans."""
    table = {(s.resource.attributes["process.pid"], s.kind.name): s for s in spans}
    assert len(table) == len(spans)
    return table


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def assert_chain(spans: list[ReadableSpan]) -> None:
    """gateway SERVER → gateway CLIENT → service SERVER → service CLIENT → backend SERVER."""
    s = named(spans)
    order = [(GATEWAY, "SERVER"), (GATEWAY, "CLIENT"), (SERVICE, "SERVER"), (SERVICE, "CLIENT"), (BACKEND, "SERVER")]
    assert sorted(s) == sorted(order)
    for parent, child in zip(order, order[1:], strict=False):
        assert parent_id(s[child]) == s[parent].context.span_id, child
        assert s[child].context.trace_id == s[parent].context.trace_id
        assert not s[child].parent.is_remote


def test_three_hops_on_one_node_form_one_trace() -> None:
    run = Assembly()
    spans = run.run([info(GATEWAY), info(SERVICE), info(BACKEND), *chain(1, "r1")])
    assert len(spans) == 5
    assert_chain(spans)
    gateway = named(spans)[(GATEWAY, "SERVER")]
    assert gateway.parent is None
    # ids are those of the request's identity: replays give the same trace
    trace_id, span_id = request_ids((GATEWAY, 5, 0), at(1), 0)
    assert (gateway.context.trace_id, gateway.context.span_id) == (trace_id, span_id)
    # assembly changes neither names nor attributes; the correlation header is recorded
    assert {s.name for s in spans} == {"GET /work/r1"}
    assert all(s.attributes["http.request.header.x-request-id"] == ("r1",) for s in spans)
    assert run.total("otel_ebpf.trace.same_node_parents") == 2
    assert run.total("otel_ebpf.trace.ambiguous_parents") == 0
    assert run.assembler.inflight == 0


def scrambled(events: list[Event], seed: int, jitter_ms: float) -> list[Event]:
    """Arrival order as the shared ring buffer may give it: each event late by up to ``jitter_ms``,
    except that one process's events keep their order (they come from one CPU at a time, and a CPU
    hands its events over in order)."""
    rng = random.Random(seed)
    arrival: dict[int, float] = {}
    keys = []
    for event in events:
        key = max(arrival.get(event.pid, 0.0), event.timestamp_ns + rng.uniform(0, jitter_ms) * MS)
        arrival[event.pid] = key
        keys.append(key)
    return [event for _, _, event in sorted(zip(keys, range(len(events)), events, strict=True))]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([0.5, 3, 20, WINDOW_MS * 0.9]), st.integers(1, 40))
def test_arrival_order_within_the_window_does_not_change_the_traces(seed: int, jitter_ms: float, batch: int) -> None:
    events = [info(GATEWAY), info(SERVICE), info(BACKEND)]
    for i in range(4):  # four requests, overlapping in time, on their own connections
        events += chain(1 + i * 3, f"r{i}", n=i)

    def tree(spans: list[ReadableSpan]) -> list[tuple]:
        return sorted(
            (s.context.trace_id, s.context.span_id, parent_id(s), s.name, s.start_time, s.end_time) for s in spans
        )

    expected = tree(Assembly().run(events))
    run = Assembly()
    assert tree(run.run(scrambled(events, seed, jitter_ms), batch)) == expected
    assert len({t[0] for t in expected}) == 4
    assert run.total("otel_ebpf.events.late") == 0


def test_arrival_later_than_the_window_is_counted() -> None:
    events = [info(SERVICE), *[e for e in chain(1, "r1") if e.pid == SERVICE]]
    late = events.pop(4)  # the service's outgoing request, handed over after an event 300 ms newer
    events += [info(GATEWAY, ms=300), late]
    run = Assembly()
    run.run(events, batch=1)
    assert run.total("otel_ebpf.events.late") == 1


def test_a_declined_h2c_upgrade_request_is_in_the_chain() -> None:
    """The gateway asks the service for h2c on its call (as Java's HttpClient does on a new
    connection); the service answers in HTTP/1.1. The call, its serving and the service's own call
    to the backend are one chain: each request starts when its head arrives, not when the answer
    tells which protocol the connection speaks."""
    upgrade = b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAEAAEAAAAIAAAAA\r\nUpgrade: h2c\r\n"
    run = Assembly()
    spans = run.run([info(GATEWAY), info(SERVICE), info(BACKEND), *chain(1, "r1", service_headers=upgrade)])
    assert_chain(spans)
    assert {s.attributes["network.protocol.version"] for s in spans} == {"1.1"}
    assert run.total("otel_ebpf.trace.same_node_parents") == 2
    assert run.assembler.inflight == 0


def test_calls_over_one_unix_socket_pair_by_their_sockets_not_by_its_path() -> None:
    """A proxy calls an app on its unix socket over two connections at once; the app serves the
    second call first. Every connection to the socket shares its path: each served request is the
    child of the call whose socket is its peer. The spans say ``network.transport=unix`` and name
    the path as the proxy's peer; the app's peer, an unnamed socket, has no address."""
    app = "/run/app.sock"
    proxy_ends = [Endpoint("", 0, socket_id) for socket_id in (11, 12)]
    app_ends = [Endpoint(app, 0, socket_id) for socket_id in (21, 22)]
    unix = Transport.UNIX
    events = [
        info(GATEWAY),
        info(SERVICE),
        opened(1, GATEWAY, 10, 0, Role.CLIENT, proxy_ends[0], app_ends[0], unix),
        opened(1, GATEWAY, 11, 0, Role.CLIENT, proxy_ends[1], app_ends[1], unix),
        data(2, GATEWAY, 10, OUT, get("/a", "localhost"), tid=101),
        data(3, GATEWAY, 11, OUT, get("/b", "localhost"), tid=101),
        opened(4, SERVICE, 5, 0, Role.SERVER, app_ends[1], proxy_ends[1], unix),
        data(4, SERVICE, 5, IN, get("/b", "localhost"), tid=201),
        data(5, SERVICE, 5, OUT, ok(), tid=201),
        opened(6, SERVICE, 6, 0, Role.SERVER, app_ends[0], proxy_ends[0], unix),
        data(6, SERVICE, 6, IN, get("/a", "localhost"), tid=201),
        data(7, SERVICE, 6, OUT, ok(), tid=201),
        data(8, GATEWAY, 11, IN, ok(), tid=101),
        data(9, GATEWAY, 10, IN, ok(), tid=101),
    ]
    run = Assembly()
    spans = run.run(events)
    calls = {s.attributes["url.full"].rsplit("/", 1)[1]: s for s in spans if s.kind.name == "CLIENT"}
    served = {s.attributes["url.path"][1:]: s for s in spans if s.kind.name == "SERVER"}
    assert sorted(calls) == sorted(served) == ["a", "b"]
    for path, span in served.items():
        assert parent_id(span) == calls[path].context.span_id, path
        assert span.context.trace_id == calls[path].context.trace_id
    assert run.total("otel_ebpf.trace.same_node_parents") == 2
    for span in spans:
        assert span.attributes["network.transport"] == "unix"
        assert not {"network.peer.port", "client.address", "client.port"} & set(span.attributes)
    assert {s.attributes["network.peer.address"] for s in calls.values()} == {app}
    assert not any("network.peer.address" in s.attributes for s in served.values())


def test_incoming_traceparent_joins_the_callers_trace() -> None:
    header = b"traceparent: 00-%s-%s-01\r\ntracestate: vendor=x\r\n" % (TRACE_HEX.encode(), SPAN_HEX.encode())
    run = Assembly()
    spans = run.run([info(GATEWAY), info(SERVICE), info(BACKEND), *chain(1, "r1", gateway_headers=header)])
    assert_chain(spans)
    gateway = named(spans)[(GATEWAY, "SERVER")]
    assert gateway.parent.span_id == int(SPAN_HEX, 16) and gateway.parent.is_remote
    assert {s.context.trace_id for s in spans} == {int(TRACE_HEX, 16)}
    assert all(dict(s.context.trace_state) == {"vendor": "x"} for s in spans)
    assert run.total("otel_ebpf.trace.propagated") == 1


@pytest.mark.parametrize("mode", ["skip", "child"])
def test_outgoing_request_of_an_instrumented_program(mode: str) -> None:
    """The gateway's own OTel SDK injected traceparent into its call to the service."""
    header = b"traceparent: 00-%s-%s-01\r\n" % (TRACE_HEX.encode(), SPAN_HEX.encode())
    run = Assembly(instrumented_clients=mode)
    spans = run.run([info(GATEWAY), info(SERVICE), info(BACKEND), *chain(1, "r1", service_headers=header)])
    s = named(spans)
    service = s[(SERVICE, "SERVER")]
    if mode == "skip":
        assert (GATEWAY, "CLIENT") not in s
        assert service.parent.span_id == int(SPAN_HEX, 16)
    else:
        assert parent_id(s[(GATEWAY, "CLIENT")]) == int(SPAN_HEX, 16)
        assert service.parent.span_id == s[(GATEWAY, "CLIENT")].context.span_id
    assert service.context.trace_id == int(TRACE_HEX, 16)
    assert parent_id(s[(BACKEND, "SERVER")]) == s[(SERVICE, "CLIENT")].context.span_id
    # the gateway's own SERVER span knew nothing of the SDK's context: a trace of its own
    assert s[(GATEWAY, "SERVER")].context.trace_id != int(TRACE_HEX, 16)
    # the skipped span's metrics are still recorded
    gateway_metrics = [
        rm for rm in run.telemetry.collect_metrics(at(100)) if rm.resource.attributes["process.pid"] == GATEWAY
    ]
    names = {m.name for rm in gateway_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert "http.client.request.duration" in names


@pytest.mark.parametrize("mode", ["skip", "child"])
def test_a_proxy_passing_on_the_context_it_received_gets_its_client_span(mode: str) -> None:
    """The gateway is a proxy (nginx's default): it forwards the loader's traceparent unchanged.
    That header is no sign of an instrumented gateway; its call is its request's child."""
    header = b"traceparent: 00-%s-%s-01\r\n" % (TRACE_HEX.encode(), SPAN_HEX.encode())
    run = Assembly(instrumented_clients=mode)
    events = [info(GATEWAY), info(SERVICE), info(BACKEND), *chain(1, "r1", header, header)]
    spans = run.run(events)
    assert_chain(spans)
    assert named(spans)[(GATEWAY, "SERVER")].parent.span_id == int(SPAN_HEX, 16)
    assert {s.context.trace_id for s in spans} == {int(TRACE_HEX, 16)}
    assert run.total("otel_ebpf.trace.forwarded_contexts") == 1
    assert run.assembler.inflight == 0


def event_loop() -> list[Event]:
    """The service is an event loop (one thread, 201) serving two connections (fds 5 and 7)."""
    other = Endpoint("127.0.0.1", 41001)
    return [
        info(SERVICE),
        opened(1, SERVICE, 5, 0, Role.SERVER, SVC, GW_OUT),
        data(1, SERVICE, 5, IN, get("/work/a", "svc"), tid=201),
        opened(2, SERVICE, 7, 0, Role.SERVER, SVC, other),
        data(2, SERVICE, 7, IN, get("/work/b", "svc"), tid=201),
        opened(3, SERVICE, 6, 0, Role.CLIENT, SVC_OUT, BE),
        data(3, SERVICE, 6, OUT, get("/call/first", "be"), tid=201),
        data(4, SERVICE, 6, IN, ok(b"1"), tid=201),
        data(5, SERVICE, 5, OUT, ok(b"a"), tid=201),  # a answered: only b is in flight now
        data(6, SERVICE, 6, OUT, get("/call/second", "be"), tid=201),
        data(7, SERVICE, 6, IN, ok(b"2"), tid=201),
        data(8, SERVICE, 7, OUT, ok(b"b"), tid=201),
    ]


def test_event_loop_ambiguity_gives_no_parent_but_links_and_a_count() -> None:
    run = Assembly()
    spans = {s.name: s for s in run.run(event_loop())}
    first, second = spans["GET /call/first"], spans["GET /call/second"]
    a, b = spans["GET /work/a"], spans["GET /work/b"]
    assert first.parent is None
    assert first.context.trace_id not in (a.context.trace_id, b.context.trace_id)
    assert sorted(link.context.span_id for link in first.links) == sorted([a.context.span_id, b.context.span_id])
    assert all(link.attributes == {"otel_ebpf.link.reason": "ambiguous_parent"} for link in first.links)
    # once a is answered, only b is in flight on the thread: the second call is b's child
    assert parent_id(second) == b.context.span_id and second.context.trace_id == b.context.trace_id
    assert run.total("otel_ebpf.trace.ambiguous_parents") == 1


def test_forwarded_request_ids_link_calls_made_on_any_thread() -> None:
    """The event loop of the previous test, now forwarding ``x-request-id``; and a call written by
    another thread of the process (as gRPC's core does): the id names the parent."""
    other = Endpoint("127.0.0.1", 41001)
    rid = lambda r: b"x-request-id: %s\r\n" % r  # noqa: E731
    run = Assembly()
    spans = {
        s.name: s
        for s in run.run(
            [
                info(SERVICE),
                opened(1, SERVICE, 5, 0, Role.SERVER, SVC, GW_OUT),
                data(1, SERVICE, 5, IN, get("/work/a", "svc", rid(b"ra")), tid=201),
                opened(2, SERVICE, 7, 0, Role.SERVER, SVC, other),
                data(2, SERVICE, 7, IN, get("/work/b", "svc", rid(b"rb")), tid=201),
                opened(3, SERVICE, 6, 0, Role.CLIENT, SVC_OUT, BE),
                data(3, SERVICE, 6, OUT, get("/call/for-b", "be", rid(b"rb")), tid=201),
                data(4, SERVICE, 6, IN, ok(b"1"), tid=201),
                data(5, SERVICE, 6, OUT, get("/call/for-a", "be", rid(b"ra")), tid=999),  # another thread
                data(6, SERVICE, 6, IN, ok(b"2"), tid=999),
                data(7, SERVICE, 6, OUT, get("/call/unknown-id", "be", rid(b"rz")), tid=201),  # no such request
                data(8, SERVICE, 6, IN, ok(b"3"), tid=201),
                data(9, SERVICE, 5, OUT, ok(b"a"), tid=201),
                data(10, SERVICE, 7, OUT, ok(b"b"), tid=201),
            ]
        )
    }
    a, b = spans["GET /work/a"], spans["GET /work/b"]
    assert parent_id(spans["GET /call/for-b"]) == b.context.span_id
    assert parent_id(spans["GET /call/for-a"]) == a.context.span_id
    assert spans["GET /call/unknown-id"].parent is None  # two requests on its thread: ambiguous
    assert run.total("otel_ebpf.trace.correlated_parents") == 2
    assert run.total("otel_ebpf.trace.ambiguous_parents") == 1


def test_in_flight_state_is_bounded_and_evictions_keep_span_ids() -> None:
    selfmetrics = SelfMetrics()
    assembler = TraceAssembler(selfmetrics, inflight_timeout_ns=1000 * MS, max_inflight=2)
    conn = ConnectionInfo(Role.SERVER, SVC, GW_OUT)
    for pid in (1, 2, 3):
        assembler.start((pid, 5, 0), conn, RequestStart(IN, at(pid)), tid=pid)
    assert assembler.inflight == 2
    assert selfmetrics.total("otel_ebpf.trace.inflight_evicted") == 1
    # the evicted request completes later: same span id as announced (children point at it)
    evicted = assembler.finish((1, 5, 0), conn, at(1), tid=1)
    assert evicted.span_id == request_ids((1, 5, 0), at(1), 0)[1]
    assembler.expire(at(2) + 1000 * MS + 1)  # request 2 timed out, 3 did not
    assert assembler.inflight == 1
    assert selfmetrics.total("otel_ebpf.trace.inflight_evicted") == 2
    assert assembler.finish((3, 5, 0), conn, at(3), tid=3).span_id == request_ids((3, 5, 0), at(3), 0)[1]
    assert assembler.inflight == 0


def test_many_requests_leave_no_state_behind() -> None:
    run = Assembly()
    events = [info(GATEWAY), info(SERVICE), info(BACKEND)]
    for i in range(200):
        events += chain(1 + i * 2, f"r{i}", n=i)
    spans = run.run(events, batch=64)
    assert len(spans) == 1000
    assert len({s.context.trace_id for s in spans}) == 200
    assert run.assembler.inflight == 0
    assert len(run.pipeline.reorderer) == 0


def recorded_traces(events: list[Event]) -> list[list[ReadableSpan]]:
    spans = Assembly().run(events, batch=512)
    traces: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        traces.setdefault(span.context.trace_id, []).append(span)
    return list(traces.values())


def test_recorded_chain_replays_into_one_trace_per_request() -> None:
    """A live recording (16 requests, 8 at a time, through examples/trace_chain.py's three
    threaded servers); the events arrived in the order the ring buffer gave them."""
    with RECORDED.open() as stream:
        _, events = read_recording(stream)
        events = list(events)
    # arrived out of order
    assert any(b.timestamp_ns < a.timestamp_ns for a, b in zip(events, events[1:], strict=False))
    traces = recorded_traces(events)
    assert len(traces) == 16
    for spans in traces:
        kinds = sorted(s.kind.name for s in spans)
        assert kinds == ["CLIENT", "CLIENT", "SERVER", "SERVER", "SERVER"]
        assert len({s.attributes["http.request.header.x-request-id"] for s in spans}) == 1
        by_id = {s.context.span_id: s for s in spans}
        roots = [s for s in spans if s.parent is None]
        assert len(roots) == 1 and roots[0].kind.name == "SERVER"
        for span in spans:
            if span.parent is not None:
                parent = by_id[span.parent.span_id]
                same_process = parent.resource.attributes["process.pid"] == span.resource.attributes["process.pid"]
                # a CLIENT's parent is its process's SERVER; a SERVER's is another process's CLIENT
                assert (parent.kind.name, same_process) == (
                    ("SERVER", True) if span.kind.name == "CLIENT" else ("CLIENT", False)
                )
    # arrival order scrambled further, within the window: the same traces
    reshuffled = scrambled(events, seed=7, jitter_ms=10)
    assert sorted(sorted(s.context.span_id for s in t) for t in recorded_traces(reshuffled)) == sorted(
        sorted(s.context.span_id for s in t) for t in traces
    )


# ---- ids the kernel decided (traceparent injection) ---------------------------------------------

KERNEL_TRACE, KERNEL_SPAN = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
REMOTE = Endpoint("10.1.2.3", 8080)


def kernel_ids(ms: float, pid: int, fd: int, trace_id: int, span_id: int) -> KernelTrace:
    """What the kernel reports after the data event stamped ``at(ms)``: one nanosecond before it."""
    return KernelTrace(at(ms) - 1, pid, fd, 0, at(ms), trace_id, span_id, True)


def served_then_called(client_trace: int) -> list[Event]:
    """A gateway request whose call to another node the kernel gave a traceparent of
    ``client_trace``; the kernel's reports arrive after the bytes they are about, as they do."""
    return [
        info(GATEWAY),
        opened(0, GATEWAY, 5, 0, Role.SERVER, GW, LOADER),
        data(0, GATEWAY, 5, IN, get("/in", "gw"), tid=101),
        kernel_ids(0, GATEWAY, 5, KERNEL_TRACE, 0),
        opened(1, GATEWAY, 1005, 0, Role.CLIENT, GW_OUT, REMOTE),
        data(1, GATEWAY, 1005, OUT, get("/out", "remote"), tid=101),
        kernel_ids(1, GATEWAY, 1005, client_trace, KERNEL_SPAN),
        data(2, GATEWAY, 1005, IN, ok(b"r"), tid=101),
        data(3, GATEWAY, 5, OUT, ok(b"gw"), tid=101),
    ]


def test_the_kernels_ids_are_the_exported_ones() -> None:
    s = named(Assembly().run(served_then_called(KERNEL_TRACE)))
    server, client = s[(GATEWAY, "SERVER")], s[(GATEWAY, "CLIENT")]
    assert server.context.trace_id == KERNEL_TRACE and server.parent is None
    assert (client.context.trace_id, client.context.span_id) == (KERNEL_TRACE, KERNEL_SPAN)
    assert parent_id(client) == server.context.span_id


def test_a_call_in_another_trace_than_its_threads_request_is_a_root() -> None:
    """The kernel gave the call a trace the served request does not have (the kernel saw no request
    on that thread): the wire is what counts, so the span is a root of that trace."""
    s = named(Assembly().run(served_then_called(0x1234)))
    client = s[(GATEWAY, "CLIENT")]
    assert (client.context.trace_id, client.context.span_id, client.parent) == (0x1234, KERNEL_SPAN, None)


def test_kernel_ids_whose_request_never_starts_are_forgotten_and_counted() -> None:
    run = Assembly(inflight_timeout_ns=10 * MS)
    run.run([info(GATEWAY), kernel_ids(0, GATEWAY, 5, KERNEL_TRACE, 0), opened(100, GATEWAY, 6, 0)])
    assert run.total("otel_ebpf.trace.inflight_evicted") == 1
