"""The HTTP/1 parser on byte streams recorded from real servers and clients (record_streams.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf.protocol import Role
from otel_ebpf.protocols.http1 import HTTP1

from http1_replay import (
    RECORDINGS,
    Chunk,
    as_client,
    capped,
    load,
    replay,
    summary,
)
from stream_replay import byte_by_byte, every_split, rechunked

# Per exchange: method, target, request body size, status, response body size, and the indices of
# the chunks carrying the request's first and last byte and the response's first and last byte.
EXPECTED: dict[str, list[tuple[str, str, int, int, int, int, int, int, int]]] = {
    "keepalive": [
        ("GET", "/users/123", 0, 200, 13, 0, 0, 1, 1),
        ("GET", "/users/456?page=2&token=abc", 0, 200, 13, 2, 2, 3, 4),
        ("POST", "/users", 10, 201, 16, 5, 5, 6, 7),
    ],
    "chunked": [
        ("GET", "/chunked", 0, 200, 38, 0, 0, 1, 2),
        ("GET", "/users/1", 0, 200, 11, 3, 3, 4, 5),
    ],
    "large": [("GET", "/large", 0, 200, 204800, 0, 0, 1, 5)],
    "head": [
        ("HEAD", "/users/7", 0, 200, 0, 0, 0, 1, 1),
        ("GET", "/users/8", 0, 200, 11, 2, 2, 3, 4),
    ],
    "no_body": [
        ("GET", "/empty", 0, 204, 0, 0, 0, 1, 1),
        ("GET", "/cached", 0, 200, 16, 2, 2, 3, 4),
        ("GET", "/cached", 0, 304, 0, 5, 5, 6, 6),
        ("GET", "/users/9", 0, 200, 11, 7, 7, 8, 9),
    ],
    "continue": [("POST", "/upload", 3000, 201, 18, 0, 2, 3, 4)],
    "errors": [
        ("GET", "/missing", 0, 404, 22, 0, 0, 1, 1),
        ("GET", "/error", 0, 500, 17, 2, 2, 3, 4),
    ],
    "until_close": [("GET", "/stream", 0, 200, 21, 0, 0, 1, 4)],
    "pipelined": [
        ("GET", "/users/1", 0, 200, 11, 0, 0, 1, 2),
        ("HEAD", "/users/2", 0, 200, 0, 0, 0, 3, 3),
        ("POST", "/echo", 5, 201, 15, 0, 0, 3, 3),
        ("GET", "/chunked", 0, 200, 38, 0, 0, 3, 3),
    ],
}
SMALL = [name for name in RECORDINGS if name != "large"]


def expected(name: str) -> list[tuple]:
    """``EXPECTED[name]`` in the shape of ``summary``, chunk indices turned into timestamps."""
    t = [chunk.t_ns for chunk in load(name)]
    want = []
    for method, target, req_body, status, resp_body, *chunks in EXPECTED[name]:
        req_start, req_end, resp_start, resp_end = (t[i] for i in chunks)
        response = (status, resp_body, None, resp_start, resp_end)
        want.append((method, target, req_body, None, req_start, req_end, response, resp_end))
    return want


def test_every_recording_has_expectations() -> None:
    assert sorted(EXPECTED) == RECORDINGS


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
@pytest.mark.parametrize("name", RECORDINGS)
def test_recording(name: str, role: Role) -> None:
    chunks = load(name) if role is Role.SERVER else as_client(load(name))
    run = replay(chunks, role)
    assert [summary(e) for e in run.exchanges] == expected(name)
    assert run.session.parse_errors == 0
    assert run.stitcher.unmatched == 0


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_split_point(name: str) -> None:
    """Each syscall's bytes split in two at every byte boundary (but the large body's chunks)."""
    want = expected(name)
    for split in every_split(load(name)):
        assert [summary(e) for e in replay(split).exchanges] == want


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
@pytest.mark.parametrize("name", SMALL)
def test_one_byte_at_a_time(name: str, role: Role) -> None:
    chunks = load(name) if role is Role.SERVER else as_client(load(name))
    run = replay(byte_by_byte(chunks), role)
    assert [summary(e) for e in run.exchanges] == expected(name)
    assert run.session.parse_errors == 0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_rechunking(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(SMALL))
    assert [summary(e) for e in replay(rechunked(data, load(name))).exchanges] == expected(name)


@pytest.mark.parametrize(("name", "cap"), [("large", 160), ("large", 4096), ("large", 65535), ("continue", 1024)])
def test_capture_cap_inside_known_length_bodies(name: str, cap: int) -> None:
    """Bytes past the cap of a syscall arrive as gaps; inside a Content-Length body, skipped."""
    run = replay(capped(load(name), cap))
    assert [summary(e) for e in run.exchanges] == expected(name)
    assert run.session.parse_errors == 0


@pytest.mark.parametrize("name", RECORDINGS)
def test_capture_starting_at_a_later_syscall(name: str) -> None:
    """An agent that attaches to a live connection sees it from some syscall on: it reports every
    exchange whose request it saw whole, and counts the responses to requests it missed."""
    chunks = load(name)
    want = expected(name)
    for first in range(len(chunks)):
        run = replay(chunks[first:])
        seen = [i for i, e in enumerate(EXPECTED[name]) if e[5] >= first]
        orphans = sum(1 for e in EXPECTED[name] if e[5] < first <= e[7])
        assert [summary(e) for e in run.exchanges] == [want[i] for i in seen]
        assert run.stitcher.unmatched == orphans
        assert run.session.parse_errors <= 2  # at most one resynchronisation per direction


@pytest.mark.parametrize("name", SMALL)
def test_capture_starting_at_any_byte(name: str) -> None:
    """Even from inside a syscall's bytes (a method cut to ``EAD``, a head cut in half), every
    exchange whose request starts in a later syscall comes out exactly as from a full capture."""
    chunks = load(name)
    want = expected(name)
    for index, chunk in enumerate(chunks):
        later = sum(1 for e in EXPECTED[name] if e[5] > index)
        for offset in range(1, len(chunk.data)):
            run = replay([Chunk(chunk.direction, chunk.t_ns, chunk.data[offset:]), *chunks[index + 1 :]])
            got = [summary(e) for e in run.exchanges]
            if later:
                assert got[-later:] == want[-later:]


def test_recordings_through_the_entry_point() -> None:
    from otel_ebpf.protocol import load_protocols

    (protocol,) = load_protocols(["http1"], {"http1": {"capture_headers": ["content-type"]}})
    assert isinstance(protocol, HTTP1)
    run = replay(load("keepalive"), protocol=protocol)
    span = run.exchanges[0].span(_server_conn())
    assert span.attributes["http.response.header.content-type"] == ("application/json",)


def _server_conn():
    from otel_ebpf.protocol import ConnectionInfo, Endpoint

    return ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8080), Endpoint("127.0.0.1", 50000))
