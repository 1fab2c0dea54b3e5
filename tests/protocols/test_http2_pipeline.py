"""The HTTP/2 plugin in the agent's pipeline (found through its entry point): both ends of a
connection on one node, so the trace assembly must match each stream's server span with its own
client span, by the request starts the session announces."""

from __future__ import annotations

from hpack import Encoder
from http2_replay import load, pipeline_spans
from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.pipeline.events import ConnData, ConnOpen, Event, ProcessInfo
from otel_ebpf.protocol import Direction, Endpoint, Role
from otel_ebpf.protocol_testing import Chunk, as_client

CLIENT_PID, SERVER_PID = 100, 200
CLIENT_END, SERVER_END = Endpoint("10.0.0.2", 51000), Endpoint("10.0.0.1", 50051)
T0 = 1_700_000_000_000_000_000
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def both_ends(chunks: list[Chunk]) -> list[Event]:
    """The server's view of a connection and the client's, in one event stream: the client writes
    a syscall's bytes 10 µs before the server reads them, and the other way round."""
    protocols_events: list[Event] = [
        ProcessInfo(T0, CLIENT_PID, "/usr/bin/client", "client", {}),
        ProcessInfo(T0, SERVER_PID, "/usr/bin/server", "server", {}),
        ConnOpen(T0, CLIENT_PID, 3, 1, Role.CLIENT, CLIENT_END, SERVER_END),
        ConnOpen(T0, SERVER_PID, 4, 1, Role.SERVER, SERVER_END, CLIENT_END),
    ]
    for server_chunk, client_chunk in zip(chunks, as_client(chunks), strict=True):
        t = T0 + server_chunk.t_ns
        writer_first = server_chunk.direction is Direction.EGRESS  # the server wrote it
        server_at, client_at = (t, t + 10_000) if writer_first else (t + 10_000, t)
        protocols_events += [
            ConnData(
                server_at,
                SERVER_PID,
                SERVER_PID,
                4,
                1,
                server_chunk.direction,
                len(server_chunk.data),
                server_chunk.data,
            ),
            ConnData(
                client_at,
                CLIENT_PID,
                CLIENT_PID,
                3,
                1,
                client_chunk.direction,
                len(client_chunk.data),
                client_chunk.data,
            ),
        ]
    return sorted(protocols_events, key=lambda e: e.timestamp_ns)


def _pairs(spans: list[ReadableSpan]) -> list[tuple[ReadableSpan, ReadableSpan]]:
    by_kind = {
        kind: sorted((s for s in spans if s.kind is kind), key=lambda s: s.start_time)
        for kind in (trace.SpanKind.CLIENT, trace.SpanKind.SERVER)
    }
    return list(zip(by_kind[trace.SpanKind.CLIENT], by_kind[trace.SpanKind.SERVER], strict=True))


def test_grpc_server_spans_are_children_of_their_client_spans() -> None:
    spans = pipeline_spans(both_ends(load("grpc_unary")))
    pairs = _pairs(spans)
    assert len(pairs) == 3
    for client, server in pairs:
        assert client.name == server.name == "otelebpf.test.Echo/Unary"
        assert server.parent is not None and server.parent.span_id == client.context.span_id
        assert server.context.trace_id == client.context.trace_id
        assert client.start_time <= server.start_time <= server.end_time <= client.end_time
    assert {s.instrumentation_scope.name for s in spans} == {"otel_ebpf.protocols.http2"}


def test_concurrent_streams_in_one_syscall_keep_their_own_parents() -> None:
    """Two requests in one write, answered in the other order: each server span is the child of
    the client span of its own stream (the requests' start times differ by 1 ns)."""
    encoders = {Direction.INGRESS: Encoder(), Direction.EGRESS: Encoder()}

    def headers(direction: Direction, stream: int, fields: list, end: bool = True) -> bytes:
        flags = ["END_HEADERS"] + (["END_STREAM"] if end else [])
        return HeadersFrame(stream, encoders[direction].encode(fields), flags=flags).serialize()

    request = [(":method", "GET"), (":scheme", "http"), (":authority", "api:8080")]
    chunks = [
        Chunk(Direction.INGRESS, 0, PREFACE + SettingsFrame(0).serialize()),
        Chunk(Direction.EGRESS, 1_000, SettingsFrame(0).serialize()),
        Chunk(
            Direction.INGRESS,
            2_000,
            headers(Direction.INGRESS, 1, [*request, (":path", "/slow")])
            + headers(Direction.INGRESS, 3, [*request, (":path", "/fast")]),
        ),
        Chunk(
            Direction.EGRESS,
            3_000_000,
            headers(Direction.EGRESS, 3, [(":status", "200")], end=False)
            + DataFrame(3, b"fast", flags=["END_STREAM"]).serialize(),
        ),
        Chunk(
            Direction.EGRESS,
            9_000_000,
            headers(Direction.EGRESS, 1, [(":status", "200")], end=False)
            + DataFrame(1, b"slow", flags=["END_STREAM"]).serialize(),
        ),
    ]
    spans = pipeline_spans(both_ends(chunks))
    clients = {s.attributes["url.full"].rsplit("/", 1)[1]: s for s in spans if s.kind is trace.SpanKind.CLIENT}
    servers = {s.attributes["url.path"][1:]: s for s in spans if s.kind is trace.SpanKind.SERVER}
    assert sorted(clients) == sorted(servers) == ["fast", "slow"]
    for path in ("fast", "slow"):
        assert servers[path].parent.span_id == clients[path].context.span_id
    assert clients["fast"].start_time == clients["slow"].start_time + 1
    assert len({s.context.span_id for s in spans}) == 4
