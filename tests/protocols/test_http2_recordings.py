"""The HTTP/2 plugin on byte streams recorded from real peers (record_h2_streams.py): grpcio,
hypercorn, httpx and curl. Fed whole, at every split point, byte by byte, re-chunked at random,
as server and as client, capped like the capture caps syscalls, and from any point on (a capture
that starts mid-connection)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from http2_replay import RECORDINGS, conn, load, replay, summary
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf.protocol import Role, SpanKind, StatusCode, load_protocols
from otel_ebpf.protocol_testing import Chunk, Replay, byte_by_byte, capped, every_split, rechunked
from otel_ebpf.protocols.http2 import HTTP2, HTTP2Exchange

# Per stream: id, method, path, request body size, request gRPC messages, the chunk carrying the
# request's first byte, (status, response body size, response gRPC messages, gRPC status, reset,
# incomplete), the chunk carrying the stream's last byte.
EXPECTED: dict[str, list[tuple]] = {
    "grpc_bidi": [(1, "POST", "/otelebpf.test.Echo/Bidi", 28, 3, 2, (200, 28, 3, 0, None, None), 13)],
    "grpc_client_stream": [
        (1, "POST", "/otelebpf.test.Echo/ClientStream", 38, 4, 3, (200, 16, 1, 0, None, None), 10),
    ],
    "grpc_large": [
        (1, "POST", "/otelebpf.test.Echo/Unary", 100016, 1, 3, (200, 100018, 1, 0, None, None), 8),
        (3, "POST", "/otelebpf.test.Echo/Unary", 13, 1, 10, (200, 15, 1, 0, None, None), 12),
    ],
    "grpc_not_found": [
        (1, "POST", "/otelebpf.test.Echo/Unary", 13, 1, 3, (200, 15, 1, 0, None, None), 6),
        (3, "POST", "/otelebpf.test.Echo/Unary", 14, 1, 9, (200, 0, 0, 5, None, None), 10),  # Trailers-Only
    ],
    "grpc_server_stream": [
        (1, "POST", "/otelebpf.test.Echo/ServerStream", 13, 1, 3, (200, 148, 10, 0, None, None), 18),
    ],
    "grpc_unary": [
        (1, "POST", "/otelebpf.test.Echo/Unary", 13, 1, 3, (200, 15, 1, 0, None, None), 6),
        (3, "POST", "/otelebpf.test.Echo/Unary", 13, 1, 9, (200, 15, 1, 0, None, None), 10),
        (5, "POST", "/otelebpf.test.Echo/Unary", 13, 1, 11, (200, 15, 1, 0, None, None), 12),
    ],
    "h2_curl_prior_knowledge": [(1, "GET", "/large", 0, None, 0, (200, 100000, None, None, None, None), 9)],
    "h2_curl_upgrade": [(1, "GET", "/items/8", 0, None, 0, (200, 13, None, None, None, None), 7)],
    "h2_httpx": [
        (1, "GET", "/items/1", 0, None, 0, (200, 13, None, None, None, None), 6),
        (3, "POST", "/upload", 3000, None, 7, (201, 18, None, None, None, None), 10),
    ],
}
SMALL = [name for name in RECORDINGS if name not in ("grpc_large", "h2_curl_prior_knowledge")]


def expected(name: str) -> list[tuple]:
    """``EXPECTED[name]`` in the shape of ``summary``, chunk indices turned into timestamps."""
    t = [chunk.t_ns for chunk in load(name)]
    return [(*row[:5], t[row[5]], row[6], t[row[7]]) for row in EXPECTED[name]]


def test_every_recording_has_expectations() -> None:
    assert sorted(EXPECTED) == RECORDINGS


# 100000-byte bodies a byte at a time would only repeat what the split points test shows
CHUNKINGS = [(name, list) for name in RECORDINGS] + [(name, byte_by_byte) for name in SMALL]


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
@pytest.mark.parametrize(("name", "chunking"), CHUNKINGS, ids=[f"{n}-{c.__name__}" for n, c in CHUNKINGS])
def test_recording(name: str, role: Role, chunking: Callable[[list[Chunk]], list[Chunk]]) -> None:
    """Each recording as the syscalls carried it, and a byte per syscall, seen by either end."""
    run = replay(chunking(load(name, role)), role)
    assert [summary(e) for e in run.exchanges] == expected(name)
    assert len(run.starts) == len(EXPECTED[name])
    assert (run.session.parse_errors, run.session.partial_messages, run.stitcher.unmatched) == (0, 0, 0)
    assert run.session.buffered == 0 and run.stitcher.pending == 0


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_grpc_spans(role: Role) -> None:
    run = replay(load("grpc_not_found", role), role)
    ok, not_found = (e.span(conn(role)) for e in run.exchanges)
    kind = SpanKind.SERVER if role is Role.SERVER else SpanKind.CLIENT
    for span in (ok, not_found):
        assert (span.name, span.kind) == ("otelebpf.test.Echo/Unary", kind)
        assert span.attributes["rpc.system"] == "grpc"
        assert span.attributes["rpc.service"] == "otelebpf.test.Echo"
        assert span.attributes["rpc.method"] == "Unary"
        assert span.attributes["network.protocol.version"] == "2"
        assert span.attributes["server.port"] == int(span.attributes["server.port"])
    assert ok.attributes["rpc.grpc.status_code"] == 0 and ok.status is StatusCode.UNSET
    assert "error.type" not in ok.attributes
    assert not_found.attributes["rpc.grpc.status_code"] == 5
    assert ok.attributes["otel_ebpf.rpc.request.message_count"] == 1
    assert ok.attributes["otel_ebpf.rpc.response.message_count"] == 1
    assert not_found.attributes["otel_ebpf.rpc.response.message_count"] == 0
    if role is Role.SERVER:  # NOT_FOUND is the caller's problem, not the server's
        assert not_found.status is StatusCode.UNSET and "error.type" not in not_found.attributes
    else:
        assert not_found.status is StatusCode.ERROR
        assert not_found.status_description == "no such note: missing"
        assert not_found.attributes["error.type"] == "NOT_FOUND"
    points = {p.instrument: p for e in run.exchanges for p in e.metric_points(conn(role))}
    side = role.value
    assert points[f"rpc.{side}.duration"].value == pytest.approx((not_found.end_ns - not_found.start_ns) / 1e6)
    assert points[f"rpc.{side}.requests_per_rpc"].value == 1


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_http_spans(role: Role) -> None:
    run = replay(load("h2_httpx", role), role)
    get, post = (e.span(conn(role)) for e in run.exchanges)
    assert (get.name, post.name) == ("GET /items/{id}", "POST /upload")
    assert get.attributes["network.protocol.version"] == "2"
    assert get.attributes["http.response.status_code"] == 200
    assert post.attributes["http.request.body.size"] == 3000
    assert post.attributes["http.response.body.size"] == 18
    if role is Role.SERVER:
        assert get.attributes["url.path"] == "/items/1"
        assert get.attributes["user_agent.original"].startswith("python-httpx/")
    else:
        assert get.attributes["url.full"] == f"http://127.0.0.1:{get.attributes['server.port']}/items/1"
    durations = [p for e in run.exchanges for p in e.metric_points(conn(role)) if p.instrument.endswith("duration")]
    assert [p.instrument for p in durations] == [f"http.{role.value}.request.duration"] * 2


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_split_point(name: str) -> None:
    """Each syscall's bytes split in two at every byte boundary (but the large bodies' chunks)."""
    want = expected(name)
    for split in every_split(load(name)):
        run = replay(split)
        assert ([summary(e) for e in run.exchanges], run.session.parse_errors) == (want, 0)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(RECORDINGS), st.sampled_from(list(Role)))
def test_random_rechunking(data: st.DataObject, name: str, role: Role) -> None:
    """Syscall boundaries anywhere, as either end saw them."""
    run = replay(rechunked(data, load(name, role)), role)
    assert [summary(e) for e in run.exchanges] == expected(name)


@pytest.mark.parametrize(
    ("name", "cap"),
    [("grpc_large", 34738), ("h2_curl_prior_knowledge", 49188)],
)
def test_capture_cap_inside_data_frames(name: str, cap: int) -> None:
    """Bytes past the cap of a syscall arrive as gaps; inside DATA frames of known length they are
    counted (body sizes, gRPC messages) and the frames stay in sync. (Each cap is the smallest
    whose gaps all end inside a DATA frame: 34738 is the length of the write carrying the end of
    the 100016-byte frame and two WINDOW_UPDATEs, 49188 the offset of the last DATA frame's
    payload in curl's 50884-byte write.)"""
    run = replay(capped(load(name), cap))
    assert [summary(e) for e in run.exchanges] == expected(name)
    assert run.session.parse_errors == 0


def test_capture_cap_hiding_frames_resynchronises() -> None:
    """At the agent's default 4 KiB cap the tail of a large write hides whole frames: the reader
    resynchronises at the next syscall and counts it; what those frames said is not guessed, but
    the body, seen to its END_STREAM, takes the size its content-length declared."""
    run = replay(capped(load("h2_curl_prior_knowledge"), 4096))
    (exchange,) = run.exchanges
    stream, method, path, _, _, start, response, end = summary(exchange)
    assert (stream, method, path, response[0]) == (1, "GET", "/large", 200)
    assert ("content-length", "100000") in exchange.response.headers
    assert response[1] == expected("h2_curl_prior_knowledge")[0][6][1] == 100000
    assert (start, end) == expected("h2_curl_prior_knowledge")[0][5::2]
    assert run.session.parse_errors == 1  # one resynchronisation


def test_capture_cap_in_grpc_calls() -> None:
    """A 100000-byte gRPC message at the 4 KiB cap: the call whose end (trailers) the gap hid is
    reported at the connection's end as ``capture_gap``; later calls on the channel are still
    reported, their fields compressed against lost table entries left unknown, never guessed."""
    run = replay(capped(load("grpc_large"), 4096))
    by_stream = {e.request.stream: e for e in run.exchanges}
    large, small = by_stream[1], by_stream[3]
    assert large.request.body_size == 100016 and large.request.messages == 1
    assert large.response.incomplete == "capture_gap" and large.response.status == 200
    assert large.call is not None and large.call.status is None  # the trailers were in the gap
    span = small.span(conn(Role.SERVER))
    assert span.name == "grpc" and span.attributes["rpc.method"] == "_OTHER"
    assert small.request.unknown and small.response.unknown
    assert run.session.partial_messages == 2
    assert run.session.parse_errors == 2  # one resynchronisation per direction


def test_a_response_lost_whole_is_a_capture_gap_not_an_error() -> None:
    """A gap that swallows a stream's whole response (HEADERS, DATA, trailers: what a loss under
    load does) leaves the call unanswered in the capture, not at the peer: at the connection's end
    it is reported as ``capture_gap``, and its span is not an ERROR but says the capture is
    incomplete. The calls before and after it are unaffected."""
    chunks = load("grpc_unary")
    lost = chunks[10]  # stream 3's whole response
    assert lost.data[:9] == b"\x00\x00\x03\x01\x04\x00\x00\x00\x03"
    chunks[10] = Chunk(lost.direction, lost.t_ns, b"", len(lost.data))
    run = replay(chunks)
    by_stream = {e.request.stream: e for e in run.exchanges}
    assert sorted(by_stream) == [1, 3, 5]
    gone = by_stream[3]
    assert gone.response is not None and gone.response.incomplete == "capture_gap"
    span = gone.span(conn(Role.SERVER))
    assert span.status is StatusCode.UNSET and "error.type" not in span.attributes
    assert span.attributes["otel_ebpf.capture.gap"] is True
    for stream in (1, 5):
        span = by_stream[stream].span(conn(Role.SERVER))
        assert span.status is StatusCode.UNSET and "otel_ebpf.capture.gap" not in span.attributes


def _truth(name: str) -> dict[int, tuple[tuple, tuple]]:
    full = replay(load(name))
    return {e.request.stream: (e.request.headers, e.response.headers + e.response.trailers) for e in full.exchanges}


def _check_against(truth: dict[int, tuple[tuple, tuple]], run: Replay) -> None:
    """Every field decoded is the one really sent, in order; the others are counted unknown.
    (A capture that begins inside the h2c upgrade request leaves the connection to HTTP/1.)"""
    run.exchanges = [e for e in run.exchanges if isinstance(e, HTTP2Exchange)]
    for exchange in run.exchanges:
        request_truth, response_truth = truth[exchange.request.stream]
        _subsequence(exchange.request.headers, request_truth)
        assert len(exchange.request.headers) == len(request_truth) or exchange.request.unknown
        if exchange.response is not None:
            got = exchange.response.headers + exchange.response.trailers
            _subsequence(got, response_truth)
            assert len(got) == len(response_truth) or exchange.response.unknown or exchange.response.incomplete
    partial = sum(bool(e.request.unknown) + bool(e.response is not None and e.response.unknown) for e in run.exchanges)
    assert run.session.partial_messages >= partial


def _subsequence(got: tuple, truth: tuple) -> None:
    it = iter(truth)
    assert all(field in it for field in got), (got, truth)


@pytest.mark.parametrize("name", RECORDINGS)
def test_capture_starting_at_a_later_syscall(name: str) -> None:
    """An agent that attaches to a live connection sees it from some syscall on: streams whose
    request HEADERS it saw are reported, without a header it cannot know."""
    chunks = load(name)
    truth = _truth(name)
    for first in range(1, len(chunks)):
        run = replay(chunks[first:])
        _check_against(truth, run)
        seen = [row for row in EXPECTED[name] if row[5] >= first]
        assert [e.request.stream for e in run.exchanges if e.request.start_ns >= chunks[first].t_ns] == [
            row[0] for row in seen
        ]


@pytest.mark.parametrize("name", SMALL)
def test_capture_starting_at_any_byte(name: str) -> None:
    """From inside a syscall's bytes (inside a frame, a preface, a header block) nothing raises,
    no header is mis-attributed, and every stream that starts in a later syscall is reported."""
    chunks = load(name)
    truth = _truth(name)
    for index, chunk in enumerate(chunks):
        later = [row[0] for row in EXPECTED[name] if row[5] > index]
        for offset in range(1, len(chunk.data)):
            run = replay([Chunk(chunk.direction, chunk.t_ns, chunk.data[offset:]), *chunks[index + 1 :]])
            _check_against(truth, run)
            reported = [e.request.stream for e in run.exchanges]
            assert all(stream in reported for stream in later), (index, offset, reported)


def test_mid_stream_grpc_channel_is_partial_not_wrong() -> None:
    """Attaching after a grpcio channel's first call: its later calls index every field but
    ``:method``, ``:scheme`` and ``:status`` in the dynamic table, so they are gRPC calls (the
    ``grpc-message`` literal says so) with an unknown method, and counted partial."""
    chunks = load("grpc_unary")
    run = replay(chunks[7:])  # from the PING after the first call
    assert [e.request.stream for e in run.exchanges] == [3, 5]
    for exchange in run.exchanges:
        assert exchange.request.headers == ((":method", "POST"), (":scheme", "http"))
        assert exchange.request.unknown == 6
        span = exchange.span(conn(Role.SERVER))
        assert (span.name, span.attributes["rpc.method"], span.status) == ("grpc", "_OTHER", StatusCode.UNSET)
        assert "rpc.grpc.status_code" not in span.attributes  # grpc-status: 0 was indexed
    assert run.session.partial_messages == 4
    assert run.session.parse_errors == 0


def test_recordings_through_the_entry_point() -> None:
    (protocol,) = load_protocols(
        ["http2"], {"http2": {"capture_headers": ["content-type"], "semconv_stability_opt_in": "rpc"}}
    )
    assert isinstance(protocol, HTTP2)
    run = replay(load("grpc_unary"), protocol=protocol)
    span = run.exchanges[0].span(conn(Role.SERVER))
    assert span.attributes["rpc.request.metadata.content-type"] == ("application/grpc",)
    assert span.attributes["rpc.method"] == "otelebpf.test.Echo/Unary"
    assert span.attributes["rpc.response.status_code"] == "OK"
