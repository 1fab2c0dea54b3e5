"""Hostile input: random bytes and mutated recordings never raise and never grow state unbounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, RequestStart, Role
from otel_ebpf.protocols.http1 import HTTP1
from otel_ebpf.protocols.http1.parser import MAX_HEAD, MAX_PENDING

from http1_replay import Chunk, load
from stream_replay import mutate

RECORDINGS = [
    "keepalive",
    "chunked",
    "head",
    "no_body",
    "continue",
    "errors",
    "until_close",
    "pipelined",
]
PROTOCOL = HTTP1({"capture_headers": ["host", "authorization", "content-type"]})
TOKENS = [
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 101 Switching\r\n\r\n",
    b"GET /x HTTP/1.1\r\n",
    b"HEAD / HTTP/1.0\r\n",
    b"CONNECT a:1 HTTP/1.1\r\n",
    b"\r\n\r\n",
    b"\n",
    b"Content-Length: 99999\r\n",
    b"Content-Length: -1\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip\r\n",
    b"ffffffffffffffff\r\n",
    b"0\r\n\r\n",
    b"Host: [::1:80\r\n",
    b" folded\r\n",
    b"\x00",
    b"\xff" * 3,
]


def run_hostile(chunks: list[Chunk], closes: bool) -> None:
    for role in (Role.SERVER, Role.CLIENT):
        session, stitcher = PROTOCOL.new_session(role), PROTOCOL.new_stitcher(role)
        conn = ConnectionInfo(role, Endpoint("10.0.0.1", 80), Endpoint("10.0.0.2", 40000))
        exchanges = []
        for chunk in chunks:
            messages = list(session.feed(chunk.direction, chunk.data, chunk.t_ns))
            if chunk.gap:
                messages += session.feed_gap(chunk.direction, chunk.gap, chunk.t_ns)
            for message in messages:
                if not isinstance(message, RequestStart):
                    exchanges += stitcher.add(message)
            assert session.buffered <= 2 * MAX_HEAD
            assert stitcher.pending <= 2 * MAX_PENDING
        if closes:
            for message in session.close(10**12):
                exchanges += stitcher.add(message)
            exchanges += stitcher.flush(10**12)
            assert session.buffered == 0 and stitcher.pending == 0
        for exchange in exchanges:  # describing whatever came out must not fail either
            span = exchange.span(conn)
            assert span.start_ns <= span.end_ns
            list(exchange.metric_points(conn))


chunk_lists = st.lists(
    st.builds(
        Chunk,
        st.sampled_from(list(Direction)),
        st.integers(0, 10**9),
        st.one_of(st.binary(max_size=300), st.lists(st.sampled_from(TOKENS), max_size=8).map(b"".join)),
        st.sampled_from([0, 0, 0, 1, 7, 5000]),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(chunk_lists.map(lambda cs: sorted(cs, key=lambda c: c.t_ns)), st.booleans())
def test_random_input(chunks: list[Chunk], closes: bool) -> None:
    run_hostile(chunks, closes)


@st.composite
def mutated_recordings(draw: st.DrawFn) -> list[Chunk]:
    return mutate(draw, load(draw(st.sampled_from(RECORDINGS))), TOKENS)


@settings(max_examples=300, deadline=None)
@given(mutated_recordings(), st.booleans())
def test_mutated_recordings(chunks: list[Chunk], closes: bool) -> None:
    run_hostile(chunks, closes)


def test_flood_of_pipelined_requests_stays_bounded() -> None:
    chunks = [Chunk(Direction.INGRESS, i, b"GET /%d HTTP/1.1\r\n\r\n" % i * 10) for i in range(100)]
    run_hostile(chunks, closes=True)
