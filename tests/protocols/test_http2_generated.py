"""Generated HTTP/2 conversations (HTTP and gRPC streams, interleaved) round-trip through session
and stitcher, however framed, padded, compressed and chunked, as server and as client."""

from __future__ import annotations

from dataclasses import dataclass

from genai_paths import llm_call
from hpack import Encoder
from http2_replay import conn, replay, summary
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf.protocol import Direction, Role
from otel_ebpf.protocol_testing import Chunk, as_client, cut
from otel_ebpf.protocols.http2.frames import PREFACE
from otel_ebpf.protocols.http2.types import REFUSED_STREAM

CLIENT, SERVER = Direction.INGRESS, Direction.EGRESS  # seen from the server
SAFE = "abcdefghijklmnopqrstuvwxyz0123456789-._~"


@dataclass
class Stream:
    id: int
    fields: list[tuple[str, str]]
    body: bytes
    messages: int | None  # gRPC messages in the request body (None: not gRPC)
    status: int | None  # None: refused by GOAWAY
    response_fields: list[tuple[str, str]]
    response_body: bytes
    response_messages: int | None
    trailers: list[tuple[str, str]]
    reset: int | None  # the server resets the stream instead of ending it


@st.composite
def grpc_body(draw: st.DrawFn) -> tuple[bytes, int]:
    payloads = draw(st.lists(st.binary(max_size=40), max_size=4))
    return b"".join(b"\x00" + len(p).to_bytes(4, "big") + p for p in payloads), len(payloads)


@st.composite
def streams(draw: st.DrawFn, stream_id: int, refused: bool) -> Stream:
    grpc = draw(st.booleans())
    path = draw(
        st.text(SAFE, min_size=1, max_size=10)
        .map(lambda name: "/" + name + ("/M" if grpc else ""))
        .filter(lambda path: not llm_call("POST", path))
    )
    fields = [
        (":method", "POST" if grpc else draw(st.sampled_from(["GET", "POST", "PUT"]))),
        (":scheme", "http"),
        (":path", path),
        (":authority", "svc:8080"),
    ]
    fields += [("content-type", "application/grpc"), ("te", "trailers")] if grpc else []
    fields += draw(
        st.lists(
            st.tuples(st.sampled_from(["x-request-id", "user-agent", "x-custom"]), st.text(SAFE, max_size=12)),
            max_size=3,
        )
    )
    body, messages = draw(grpc_body()) if grpc else (draw(st.binary(max_size=100)), None)
    response_body, response_messages = draw(grpc_body()) if grpc else (draw(st.binary(max_size=100)), None)
    status = None if refused else (200 if grpc else draw(st.sampled_from([200, 201, 404, 500])))
    trailers = [("grpc-status", str(draw(st.sampled_from([0, 5, 13])))), ("grpc-message", "")] if grpc else []
    reset = draw(st.sampled_from([None, None, None, 8, 2])) if not refused else None
    return Stream(
        stream_id,
        fields,
        body,
        messages,
        status,
        [(":status", str(status))] if status else [],
        response_body,
        response_messages,
        trailers,
        reset,
    )


@dataclass
class Event:
    """Frames one side sends at once, encoded when the conversation is laid out in wire order."""

    direction: Direction
    stream: int
    kind: str  # "headers", "data", "rst", "noise"
    fields: list[tuple[str, str]] | None = None
    data: bytes = b""
    end_stream: bool = False


def _pieces(draw: st.DrawFn, body: bytes) -> list[bytes]:
    return cut(body, draw(st.sets(st.integers(1, max(1, len(body))), max_size=3))) or [b""]


def _events(draw: st.DrawFn, stream: Stream) -> list[Event]:
    events = [Event(CLIENT, stream.id, "headers", stream.fields, end_stream=not stream.body)]
    pieces = _pieces(draw, stream.body) if stream.body else []
    events += [Event(CLIENT, stream.id, "data", data=p, end_stream=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    if stream.status is None:
        return events
    events.append(
        Event(
            SERVER,
            stream.id,
            "headers",
            stream.response_fields,
            end_stream=not stream.response_body and not stream.trailers and stream.reset is None,
        )
    )
    pieces = _pieces(draw, stream.response_body) if stream.response_body else []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1 and not stream.trailers and stream.reset is None
        events.append(Event(SERVER, stream.id, "data", data=piece, end_stream=last))
    if stream.reset is not None:
        events.append(Event(SERVER, stream.id, "rst", data=bytes([stream.reset])))
    elif stream.trailers:
        events.append(Event(SERVER, stream.id, "headers", stream.trailers, end_stream=True))
    return events


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[Chunk], list[Stream]]:
    count = draw(st.integers(1, 5))
    refused = draw(st.integers(0, min(2, count - 1)))
    all_streams = [draw(streams(2 * i + 1, refused=i >= count - refused)) for i in range(count)]
    # interleave the streams' events, each stream's in order, streams opened in id order (the
    # server answers a stream only after its request HEADERS went out)
    queues = [_events(draw, s) for s in all_streams]
    order: list[Event] = []
    opened = 0
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues[: opened + 1] if q]))
        if opened < len(queues) and queue is queues[opened]:
            opened += 1
        order.append(queue.pop(0))
        if draw(st.integers(0, 9)) == 0:
            order.append(Event(draw(st.sampled_from([CLIENT, SERVER])), 0, "noise"))
    if refused:
        order.append(Event(SERVER, 0, "goaway", data=bytes([all_streams[-refused].id - 2])))
    encoders = {CLIENT: Encoder(), SERVER: Encoder()}
    chunks = [Chunk(CLIENT, 0, PREFACE + SettingsFrame(0).serialize()), Chunk(SERVER, 1, SettingsFrame(0).serialize())]
    for t, event in enumerate(order, start=2):
        data = b"".join(frame.serialize() for frame in _frames(draw, event, encoders[event.direction]))
        chunks.append(Chunk(event.direction, t * 1000, data))
    # what one syscall carries: neighbours in the same direction may be written together
    merged: list[Chunk] = []
    for chunk in chunks:
        if merged and merged[-1].direction is chunk.direction and draw(st.booleans()):
            merged[-1] = Chunk(chunk.direction, merged[-1].t_ns, merged[-1].data + chunk.data)
        else:
            merged.append(chunk)
    return merged, all_streams


def _frames(draw: st.DrawFn, event: Event, encoder: Encoder) -> list[Frame]:
    if event.kind == "noise":
        return [
            draw(
                st.sampled_from(
                    [
                        PingFrame(0, b"pingpong"),
                        WindowUpdateFrame(0, window_increment=1000),
                        PriorityFrame(1, depends_on=0, stream_weight=16),
                        SettingsFrame(0, flags=["ACK"]),
                    ]
                )
            )
        ]
    if event.kind == "rst":
        return [RstStreamFrame(event.stream, error_code=event.data[0])]
    if event.kind == "goaway":
        return [GoAwayFrame(0, last_stream_id=event.data[0])]
    if event.kind == "data":
        frame = DataFrame(event.stream, event.data, flags=["END_STREAM"] if event.end_stream else [])
        _pad(draw, frame)
        return [frame]
    if draw(st.integers(0, 4)) == 0:  # the encoder changes its table size (SETTINGS_HEADER_TABLE_SIZE)
        encoder.header_table_size = draw(st.sampled_from([0, 64, 256, 4096]))
    block = encoder.encode(event.fields, huffman=draw(st.booleans()))
    fragments = cut(block, draw(st.sets(st.integers(1, len(block)), max_size=2))) if block else [b""]
    flags = ["END_STREAM"] if event.end_stream else []
    first = HeadersFrame(event.stream, fragments[0], flags=flags + (["END_HEADERS"] if len(fragments) == 1 else []))
    _pad(draw, first)
    if draw(st.booleans()):
        first.flags.add("PRIORITY")
        first.depends_on, first.stream_weight = 0, 200
    rest = [
        ContinuationFrame(event.stream, fragment, flags=["END_HEADERS"] if i == len(fragments) - 2 else [])
        for i, fragment in enumerate(fragments[1:])
    ]
    return [first, *rest]


def _pad(draw: st.DrawFn, frame: DataFrame | HeadersFrame) -> None:
    if draw(st.integers(0, 3)) == 0:
        frame.flags.add("PADDED")
        frame.pad_length = draw(st.integers(0, 30))


def expected(all_streams: list[Stream], chunks: list[Chunk]) -> list[tuple]:
    """(stream, method, path, request body, request messages, response) in completion order
    (timestamps are checked separately)."""
    rows = []
    for s in all_streams:
        method = dict(s.fields)[":method"]
        if s.status is None:
            response = (None, 0, None, 14 if s.messages is not None else None, REFUSED_STREAM, None)
        elif s.reset is not None:
            grpc = None if s.messages is None else {8: 1}.get(s.reset, 13)
            response = (s.status, len(s.response_body), s.response_messages, grpc, s.reset, None)
        else:
            grpc = None if s.messages is None else int(s.trailers[0][1])
            response = (s.status, len(s.response_body), s.response_messages, grpc, None, None)
        rows.append((s.id, method, dict(s.fields)[":path"], len(s.body), s.messages, response))
    return rows


@settings(max_examples=200, deadline=None)
@given(conversations(), st.booleans(), st.data())
def test_generated_conversations(
    conversation: tuple[list[Chunk], list[Stream]], client: bool, data: st.DataObject
) -> None:
    chunks, all_streams = conversation
    role = Role.CLIENT if client else Role.SERVER
    if data.draw(st.booleans()):  # and cut anywhere
        chunks = [
            Chunk(c.direction, c.t_ns, piece)
            for c in chunks
            for piece in cut(c.data, data.draw(st.sets(st.integers(1, len(c.data)), max_size=3)))
        ]
    run = replay(as_client(chunks) if client else chunks, role)
    got = sorted(summary(e)[:5] + (summary(e)[6],) for e in run.exchanges)
    assert got == sorted(expected(all_streams, chunks))
    assert (run.session.parse_errors, run.session.partial_messages, run.stitcher.unmatched) == (0, 0, 0)
    assert len(run.starts) == len(all_streams)
    for exchange in run.exchanges:
        span = exchange.span(conn(role))
        assert span.start_ns <= span.end_ns
        if exchange.call is not None:
            assert span.name == dict(exchange.request.headers)[":path"][1:]
