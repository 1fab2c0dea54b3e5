"""Generated HTTP/1.1 conversations round-trip through session and stitcher, however chunked."""

from __future__ import annotations

from dataclasses import dataclass

from genai_paths import llm_call
from http1_replay import Chunk, cut, replay
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from otel_ebpf.protocol import Direction, Role

METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "PURGE", "PROPFIND"]
HEADER_NAMES = ["Accept", "User-Agent", "X-Request-Id", "traceparent", "Cache-Control", "X-Custom"]
SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~"


@dataclass(frozen=True)
class Wire:
    """One message as bytes on the wire, and the body size the parser must report."""

    wire: bytes
    body_size: int


def _case(draw: st.DrawFn, name: str) -> str:
    return draw(st.sampled_from([name, name.lower(), name.upper()]))


@st.composite
def bodies(draw: st.DrawFn, eol: str, allow_close: bool) -> tuple[str, bytes, bytes]:
    """(framing header lines, encoded body, raw body) for a message that has a body."""
    # A response "body" that starts like a status line is read as the next response when the
    # method is not a known one (see ResponseParser._framing); real bodies do not look like that.
    body = draw(st.binary(max_size=200).filter(lambda b: not (b and b"HTTP/1.".startswith(b[:7]))))
    framing = draw(st.sampled_from(["length", "chunked"] + (["close"] if allow_close else [])))
    if framing == "length":
        return f"{_case(draw, 'Content-Length')}: {len(body)}{eol}", body, body
    if framing == "close":
        return "", body, body
    encoded = b""
    for piece in cut(body, draw(st.sets(st.integers(1, max(1, len(body))), max_size=4))):
        size = f"{len(piece):x}"
        size = draw(st.sampled_from([size, size.upper(), "0" + size]))
        extension = draw(st.sampled_from(["", ";x=1", ';name="v"']))
        encoded += f"{size}{extension}{eol}".encode() + piece + eol.encode()
    trailers = draw(st.sampled_from(["", f"X-Checksum: 1{eol}"]))
    encoded += f"0{eol}{trailers}{eol}".encode()
    return f"{_case(draw, 'Transfer-Encoding')}: chunked{eol}", encoded, body


@st.composite
def headers(draw: st.DrawFn, eol: str) -> str:
    fields = draw(
        st.lists(
            st.tuples(st.sampled_from(HEADER_NAMES), st.text(SAFE + " /;=,", max_size=20)),
            max_size=4,
        )
    )
    return "".join(f"{name}: {value.strip()}{eol}" for name, value in fields)


@st.composite
def exchanges(draw: st.DrawFn, eol: str, last: bool) -> tuple[Wire, Wire, tuple]:
    method = draw(st.sampled_from(METHODS))
    segments = draw(st.lists(st.text(SAFE, min_size=1, max_size=8), max_size=4))
    query = draw(st.sampled_from(["", "?a=1", "?q=x&page=2"]))
    target = "/" + "/".join(segments) + query
    assume(not llm_call(method, target))
    request_head = f"{method} {target} HTTP/1.1{eol}Host: example.com{eol}" + draw(headers(eol))
    if method in ("POST", "PUT", "PATCH") or draw(st.booleans()):
        framing, encoded, body = draw(bodies(eol, allow_close=False))
    else:
        framing, encoded, body = "", b"", b""
    request = Wire((request_head + framing + eol).encode() + encoded, len(body))

    status = draw(st.sampled_from([200, 201, 204, 301, 304, 404, 500, 503]))
    interim = draw(
        st.sampled_from(
            [
                "",
                f"HTTP/1.1 100 Continue{eol}{eol}",
                f"HTTP/1.1 103 Early Hints{eol}Link: </a>{eol}{eol}",
            ]
        )
    )
    response_head = f"{interim}HTTP/1.1 {status} Whatever{eol}" + draw(headers(eol))
    if status in (204, 304):
        response = Wire((response_head + eol).encode(), 0)
    elif method == "HEAD":  # announces the body a GET would have had, sends none
        response = Wire((response_head + f"Content-Length: {draw(st.integers(0, 999))}{eol}{eol}").encode(), 0)
    else:
        framing, encoded, body = draw(bodies(eol, allow_close=last))
        response = Wire((response_head + framing + eol).encode() + encoded, len(body))
    return request, response, (method, target, request.body_size, status, response.body_size)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[list[tuple[Wire, Wire, tuple]]], Role]:
    eol = draw(st.sampled_from(["\r\n", "\n"]))
    count = draw(st.integers(1, 6))
    items = [draw(exchanges(eol, last=i == count - 1)) for i in range(count)]
    # pipelined batches: each batch's requests go out together, then its responses come back
    batches, i = [], 0
    while i < count:
        size = draw(st.integers(1, count - i))
        batches.append(items[i : i + size])
        i += size
    return batches, draw(st.sampled_from([Role.SERVER, Role.CLIENT]))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_generated_conversations_round_trip(data: st.DataObject) -> None:
    batches, role = data.draw(conversations())
    requests_out = Direction.INGRESS if role is Role.SERVER else Direction.EGRESS
    chunks: list[Chunk] = []
    for batch in batches:
        for direction, wire in (
            (requests_out, b"".join(r.wire for r, _, _ in batch)),
            (requests_out.reverse(), b"".join(r.wire for _, r, _ in batch)),
        ):
            for piece in cut(wire, data.draw(st.sets(st.integers(1, max(1, len(wire))), max_size=8))):
                chunks.append(Chunk(direction, 1000 * (len(chunks) + 1), piece))
    run = replay(chunks, role)

    want = [expected for batch in batches for _, _, expected in batch]
    got = [
        (
            e.request.method,
            e.request.target,
            e.request.body_size,
            e.response and e.response.status,
            e.response and e.response.body_size,
        )
        for e in run.exchanges
    ]
    assert got == want
    assert run.session.parse_errors == 0
    assert run.stitcher.unmatched == 0
    for exchange in run.exchanges:
        assert exchange.response is not None and exchange.response.incomplete is None
        assert exchange.request.start_ns <= exchange.request.end_ns <= exchange.end_ns
        assert exchange.response.start_ns <= exchange.response.end_ns == exchange.end_ns
    starts = [e.request.start_ns for e in run.exchanges]
    assert starts == sorted(starts)
