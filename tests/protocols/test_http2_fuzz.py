"""Hostile input for the HTTP/2 plugin: random bytes, mutated recordings, random frames and header
blocks. Nothing raises, state stays bounded, and whatever comes out can be described."""

from __future__ import annotations

from hpack import Encoder
from hypothesis import given, settings
from hypothesis import strategies as st
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from otel_ebpf.protocol import Direction, RequestStart, Role
from otel_ebpf.protocols.http2 import HTTP2
from otel_ebpf.protocols.http2.frames import PREFACE
from otel_ebpf.protocols.http2.hpack_context import HpackContext
from otel_ebpf.protocols.http2.session import MAX_STREAMS

from stream_replay import Chunk, mutate, replay
from http2_replay import RECORDINGS, conn, load

PROTOCOLS = [
    HTTP2({"capture_headers": ["content-type", "authorization"], "semconv_stability_opt_in": mode})
    for mode in ("", "rpc/dup")
]
MAX_BUFFERED = 5 * 64 * 1024  # frame body, sync hold, header block, handshake: each bounded


def run_hostile(chunks: list[Chunk], closes: bool) -> None:
    for protocol in PROTOCOLS:
        for role in (Role.SERVER, Role.CLIENT):
            run = replay(chunks, role, protocol, close=closes)
            assert run.max_buffered <= MAX_BUFFERED
            assert run.session.open_streams <= MAX_STREAMS and run.stitcher.pending <= MAX_STREAMS
            if closes:
                assert run.session.buffered == 0 and run.stitcher.pending == 0
            for exchange in run.exchanges:  # describing whatever came out must not fail either
                span = exchange.span(conn(role))
                assert span.start_ns <= span.end_ns
                list(exchange.metric_points(conn(role)))


chunk_lists = st.lists(
    st.builds(
        Chunk,
        st.sampled_from(list(Direction)),
        st.integers(0, 10**9),
        st.binary(max_size=300),
        st.sampled_from([0, 0, 0, 1, 9, 5000]),
    ),
    max_size=30,
).map(
    lambda chunks: [
        Chunk(c.direction, c.t_ns, PREFACE + c.data, c.gap) if i == 0 else c
        for i, c in enumerate(sorted(chunks, key=lambda c: c.t_ns))
    ]
)


@settings(max_examples=200, deadline=None)
@given(chunk_lists, st.booleans())
def test_random_bytes(chunks: list[Chunk], closes: bool) -> None:
    run_hostile(chunks, closes)


@st.composite
def mutated_recordings(draw: st.DrawFn) -> list[Chunk]:
    return mutate(draw, load(draw(st.sampled_from([name for name in RECORDINGS if name != "grpc_large"]))))


@settings(max_examples=300, deadline=None)
@given(mutated_recordings(), st.booleans())
def test_mutated_recordings(chunks: list[Chunk], closes: bool) -> None:
    run_hostile(chunks, closes)


FIELDS = [
    (":method", "GET"),
    (":method", "POST"),
    (":method", "BREW"),
    (":path", "/a/1"),
    (":path", "/pkg.S/M"),
    (":scheme", "http"),
    (":authority", "example.com:8080"),
    (":status", "200"),
    (":status", "503"),
    (":status", "100"),
    (":status", "x"),
    ("content-type", "application/grpc"),
    ("grpc-status", "13"),
    ("grpc-status", "99"),
    ("grpc-message", "bad%20thing"),
    ("te", "trailers"),
    ("x-request-id", "r-1"),
    ("authorization", "Bearer secret"),
    ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
]
streams = st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1])


@st.composite
def frame_streams(draw: st.DrawFn) -> list[Chunk]:
    """Frames of every type with random fields, header blocks from real encoders (sometimes
    corrupted), in random syscalls, directions and gaps, after a preface."""
    encoders = {direction: Encoder() for direction in Direction}
    chunks = [Chunk(Direction.INGRESS, 0, PREFACE)]
    for t in range(1, draw(st.integers(1, 25))):
        direction = draw(st.sampled_from(list(Direction)))
        stream = draw(streams)
        kind = draw(
            st.sampled_from(
                [
                    "headers",
                    "continuation",
                    "data",
                    "rst",
                    "goaway",
                    "settings",
                    "push",
                    "ping",
                    "priority",
                    "window",
                    "unknown",
                ]
            )
        )
        flags = set(draw(st.sets(st.sampled_from(["END_STREAM", "END_HEADERS", "PADDED", "PRIORITY", "ACK"]))))
        if kind in ("headers", "continuation", "push"):
            block = encoders[direction].encode(draw(st.lists(st.sampled_from(FIELDS), max_size=8)))
            if draw(st.booleans()):
                block = draw(st.binary(max_size=40)) if draw(st.booleans()) else block[: len(block) // 2]
            if kind == "headers":
                frame = HeadersFrame(max(stream, 1), block, flags=flags & {"END_STREAM", "END_HEADERS"})
                if "PADDED" in flags:
                    frame.flags.add("PADDED")
                    frame.pad_length = draw(st.integers(0, 20))
            elif kind == "push":
                frame = PushPromiseFrame(
                    max(stream, 1), promised_stream_id=2 * t, data=block, flags=flags & {"END_HEADERS"}
                )
            else:
                frame = ContinuationFrame(max(stream, 1), block, flags=flags & {"END_HEADERS"})
        elif kind == "data":
            frame = DataFrame(max(stream, 1), draw(st.binary(max_size=64)), flags=flags & {"END_STREAM"})
            if "PADDED" in flags:
                frame.flags.add("PADDED")
                frame.pad_length = draw(st.integers(0, 20))
        elif kind == "rst":
            frame = RstStreamFrame(max(stream, 1), error_code=draw(st.integers(0, 20)))
        elif kind == "goaway":
            frame = GoAwayFrame(0, last_stream_id=draw(streams), error_code=draw(st.integers(0, 20)))
        elif kind == "settings":
            frame = SettingsFrame(
                0,
                settings={
                    SettingsFrame.HEADER_TABLE_SIZE: draw(st.sampled_from([0, 100, 4096, 2**20])),
                    SettingsFrame.MAX_FRAME_SIZE: draw(st.sampled_from([16384, 2**24 - 1])),
                },
            )
        elif kind == "ping":
            frame = PingFrame(0, b"12345678")
        elif kind == "priority":
            frame = PriorityFrame(max(stream, 1), depends_on=draw(streams) or 3, stream_weight=7)
        elif kind == "window":
            frame = WindowUpdateFrame(stream, window_increment=draw(st.integers(1, 2**31 - 1)))
        else:  # an extension frame type, to be skipped
            chunks.append(Chunk(direction, t, b"\x00\x00\x03\x42\x00\x00\x00\x00\x01abc"))
            continue
        chunks.append(Chunk(direction, t, frame.serialize(), draw(st.sampled_from([0, 0, 0, 3, 100]))))
    return chunks


@settings(max_examples=300, deadline=None)
@given(frame_streams(), st.booleans())
def test_random_frames(chunks: list[Chunk], closes: bool) -> None:
    run_hostile(chunks, closes)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8), st.booleans())
def test_header_blocks_never_raise(blocks: list[bytes], complete: bool) -> None:
    context = HpackContext(complete)
    for block in blocks:
        decoded = context.decode(block)
        assert decoded is None or all(isinstance(name, str) and isinstance(value, str) for name, value in decoded[0])
        assert len(context.table.dynamic_entries) * 32 <= 64 * 1024


def test_many_streams_stay_bounded() -> None:
    """A client that opens streams and never ends them: the oldest are dropped, counted."""
    encoder = Encoder()
    data = PREFACE + b"".join(
        HeadersFrame(
            stream, encoder.encode([(":method", "GET"), (":path", "/"), (":scheme", "http")]), flags=["END_HEADERS"]
        ).serialize()
        for stream in range(1, 2 * (MAX_STREAMS + 100), 2)
    )
    session, stitcher = PROTOCOLS[0].new_session(Role.SERVER), PROTOCOLS[0].new_stitcher(Role.SERVER)
    for output in session.feed(Direction.INGRESS, data, 1):
        if not isinstance(output, RequestStart):
            stitcher.add(output)
    assert session.open_streams == MAX_STREAMS
    assert stitcher.unmatched == 100
