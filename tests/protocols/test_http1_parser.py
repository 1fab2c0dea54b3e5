"""Edge cases of the HTTP/1 session and stitcher, on hand-written byte streams."""

from __future__ import annotations

import pytest
from http1_replay import Chunk, messages, replay

from otel_ebpf.protocol import (
    NEED_MORE,
    NO_MATCH,
    ConnectionInfo,
    Direction,
    Endpoint,
    Message,
    Role,
    Sniff,
    StatusCode,
)
from otel_ebpf.protocol_testing import Replay
from otel_ebpf.protocols.http1 import HTTP1, FifoStitcher, HTTP1Session, Request, Response
from otel_ebpf.protocols.http1.parser import MAX_HEAD, MAX_PENDING, parse_fields
from otel_ebpf.protocols.http1.types import MALFORMED
from otel_ebpf.protocols.http_semconv import CAPTURE_GAP, CONNECTION_CLOSED

IN, OUT = Direction.INGRESS, Direction.EGRESS
CLIENT_CONN = ConnectionInfo(Role.CLIENT, Endpoint("127.0.0.1", 50000), Endpoint("127.0.0.1", 8080))
GET = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"


def ok(body: bytes = b"", status: int = 200, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d OK\r\n%sContent-Length: %d\r\n\r\n%s" % (status, extra, len(body), body)


def chunks(*items: tuple[Direction, bytes] | tuple[Direction, bytes, int]) -> list[Chunk]:
    """Chunks at t = 10, 20, 30, ...; a third element is a gap after the chunk's bytes."""
    return [Chunk(item[0], 10 * (i + 1), item[1], item[2] if len(item) > 2 else 0) for i, item in enumerate(items)]


def brief(run: Replay) -> list[tuple]:
    return [
        (
            e.request.method,
            e.request.target,
            e.request.body_size,
            e.request.incomplete,
            e.response and e.response.status,
            e.response and e.response.body_size,
            e.response and e.response.incomplete,
        )
        for e in run.exchanges
    ]


# -- sniff ----------------------------------------------------------------------------------------

SERVER, CLIENT = Sniff(True, role=Role.SERVER), Sniff(True, role=Role.CLIENT)


@pytest.mark.parametrize(
    ("direction", "data", "want"),
    [
        (IN, b"GET /x HTTP/1.1\r\nHost: a\r\n", SERVER),
        (OUT, b"GET /x HTTP/1.1\r\n", CLIENT),
        (IN, b"PROPFIND /dav HTTP/1.0\n", SERVER),
        (OUT, b"HTTP/1.1 200 OK\r\n", SERVER),
        (IN, b"HTTP/1.0 404 Not Found\r\n", CLIENT),
        (IN, b"HTTP/1.1 204\r\n", CLIENT),
        (IN, b"", NEED_MORE),
        (IN, b"G", NEED_MORE),
        (IN, b"GET /x HT", NEED_MORE),
        (IN, b"GET /x HTTP/1.1", NEED_MORE),
        (IN, b"GET /x HTTP/1.1\r", NEED_MORE),
        (OUT, b"HTTP/1.", NEED_MORE),
        (OUT, b"HTTP/1.1 2", NEED_MORE),
        (IN, b"get /x HTTP/1.1\r\n", NO_MATCH),
        (IN, b"GET /x HTTP/2.0\r\n", NO_MATCH),
        (IN, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", NO_MATCH),
        (IN, b"GET /x y HTTP/1.1\r\n", NO_MATCH),
        (IN, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", NO_MATCH),
        (OUT, b"HTTP/1.1 20x OK\r\n", NO_MATCH),
        (OUT, b"HTTP/1.1 2x", NO_MATCH),
        (IN, b"GET  /x", NO_MATCH),
        (IN, b"*1\r\n$4\r\nPING\r\n", NO_MATCH),
    ],
)
def test_sniff(direction: Direction, data: bytes, want: Sniff) -> None:
    assert HTTP1().sniff(direction, data) == want


# -- options --------------------------------------------------------------------------------------


def test_options() -> None:
    assert HTTP1({"capture_headers": ["Content-Type", "X-Request-Id"]}).capture_headers == {
        "content-type",
        "x-request-id",
    }
    assert HTTP1().capture_headers == {"x-request-id", "x-correlation-id"}
    assert HTTP1({"capture_headers": []}).capture_headers == frozenset()
    with pytest.raises(ValueError, match=r"^capture_headers: "):
        HTTP1({"capture_headers": "content-type"})
    with pytest.raises(ValueError, match=r"^capture_headers: "):
        HTTP1({"capture_headers": ["ok", 3]})
    with pytest.raises(ValueError, match=r"^capture_headers: .*'bad name'"):
        HTTP1({"capture_headers": ["bad name"]})
    with pytest.raises(ValueError, match=r"^capture_body: unknown option"):
        HTTP1({"capture_body": True})


# -- framing --------------------------------------------------------------------------------------


def test_bare_lf_and_folded_headers() -> None:
    session = HTTP1Session(Role.SERVER)
    (request,) = messages(session, IN, b"GET /a HTTP/1.0\nX-Long: one\n  two\nHost: h\n\n", 1)
    assert (request.version, request.headers) == ("1.0", (("x-long", "one two"), ("host", "h")))


@pytest.mark.parametrize(
    ("block", "want"),
    [
        (b"Connection:\r\n close\r\n", (("connection", "close"),)),
        (b"Connection:\n\t close \n", (("connection", "close"),)),
        (b"X-A: one\r\n two\r\n \r\n", (("x-a", "one two"),)),
        (b"X-A:\r\n \r\n", (("x-a", ""),)),
        (b"Na\rme: v\r\n", None),  # the fast path's verdict
        (b"Na\rme: v\r\n folded\r\n", None),  # the fold path's, which must be the same
        (b"X-A: one\r\nB\tad: v\r\n more\r\n", None),
    ],
)
def test_folded_header_lines(block: bytes, want: tuple | None) -> None:
    assert parse_fields(block) == want


def test_interim_responses_are_not_exchanges() -> None:
    run = replay(
        chunks(
            (IN, b"POST /u HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"),
            (OUT, b"HTTP/1.1 100 Continue\r\n\r\n"),
            (IN, b"abc"),
            (OUT, b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"),
            (OUT, ok(b"done", 201)),
        )
    )
    assert brief(run) == [("POST", "/u", 3, None, 201, 4, None)]
    (exchange,) = run.exchanges
    assert (exchange.request.start_ns, exchange.request.end_ns) == (10, 30)
    assert (exchange.response.start_ns, exchange.end_ns) == (50, 50)


def test_read_until_close_ends_at_the_last_byte() -> None:
    run = replay(chunks((IN, GET), (OUT, b"HTTP/1.0 200 OK\r\n\r\nab"), (OUT, b"cd")))
    assert brief(run) == [("GET", "/a", 0, None, 200, 4, None)]
    assert run.exchanges[0].end_ns == 30
    assert run.exchanges[0].response.version == "1.0"


def test_response_cut_by_close_is_an_error() -> None:
    run = replay(chunks((IN, GET), (OUT, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")))
    assert brief(run) == [("GET", "/a", 0, None, 200, 3, CONNECTION_CLOSED)]
    assert run.exchanges[0].transaction().error == CONNECTION_CLOSED


def test_unanswered_request_is_flushed_with_the_close_time() -> None:
    run = replay(chunks((IN, GET), (IN, b"POST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nab")))
    assert brief(run) == [
        ("GET", "/a", 0, None, None, None, None),
        ("POST", "/b", 2, CONNECTION_CLOSED, None, None, None),
    ]
    assert [e.end_ns for e in run.exchanges] == [21, 21]  # replay closes at last t + 1


def test_upgrade_switches_both_directions_off() -> None:
    frames = b"\x81\x05hello" * 3
    run = replay(
        chunks(
            (IN, b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
            (OUT, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n" + frames),
            (IN, frames + b"GET /not-http HTTP/1.1\r\n\r\n"),
            (OUT, frames + ok()),
        )
    )
    assert brief(run) == [("GET", "/ws", 0, None, 101, 0, None)]
    assert run.session.parse_errors == 0
    assert run.session.buffered == 0


def test_connect_tunnel() -> None:
    run = replay(
        chunks(
            (OUT, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"),
            (IN, b"HTTP/1.1 200 Connection established\r\n\r\n"),
            (OUT, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"),
            (IN, b"\x16\x03\x03\x00\x7a\x02\x00\x00\x76"),
        ),
        Role.CLIENT,
    )
    assert brief(run) == [("CONNECT", "example.com:443", 0, None, 200, 0, None)]
    assert run.session.parse_errors == 0


def test_connect_with_content_length_has_no_body() -> None:
    """RFC 9110 section 9.3.6: CONNECT has no content; the 200 opens the tunnel at once."""
    tunnel = b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" * 4
    run = replay(
        chunks(
            (OUT, b"CONNECT example.com:443 HTTP/1.1\r\nContent-Length: 40\r\n\r\n"),
            (IN, b"HTTP/1.1 200 Connection established\r\n\r\n"),
            (OUT, tunnel),
            (IN, tunnel + ok()),
        ),
        Role.CLIENT,
    )
    assert brief(run) == [("CONNECT", "example.com:443", 0, None, 200, 0, None)]
    assert (run.stitcher.unmatched, run.session.parse_errors, run.session.buffered) == (0, 0, 0)


def test_refused_connect_keeps_the_connection_http() -> None:
    run = replay(
        chunks(
            (OUT, b"CONNECT example.com:443 HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            (IN, ok(b"auth", 407)),
            (OUT, b"CONNECT example.com:443 HTTP/1.1\r\nProxy-Authorization: Basic eA==\r\n\r\n"),
            (IN, b"HTTP/1.1 200 OK\r\n\r\n"),
            (OUT, b"GET /inside HTTP/1.1\r\n\r\n"),
        ),
        Role.CLIENT,
    )
    assert [(m, s) for m, _, _, _, s, _, _ in brief(run)] == [("CONNECT", 407), ("CONNECT", 200)]
    assert (run.stitcher.unmatched, run.session.parse_errors) == (0, 0)


@pytest.mark.parametrize(
    ("request_bytes", "body"),
    [
        (b"POST /up HTTP/1.1\r\nUpgrade: websocket\r\nContent-Length: 100\r\n\r\n" + b"x" * 30, 30),
        (b"POST /up HTTP/1.1\r\nUpgrade: h2c\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 5),
    ],
)
def test_request_in_its_body_ends_where_the_protocol_switches(request_bytes: bytes, body: int) -> None:
    frames = b"\x81\x05hello" * 3
    run = replay(
        chunks(
            (IN, request_bytes),
            (OUT, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n" + frames),
            (IN, frames + b"GET /not-http HTTP/1.1\r\n\r\n"),
        )
    )
    assert brief(run) == [("POST", "/up", body, None, 101, 0, None)]
    assert run.exchanges[0].request.end_ns == 10  # its last byte, not the switch
    assert (run.stitcher.unmatched, run.session.parse_errors, run.session.buffered) == (0, 0, 0)


def test_early_response_pairs_with_the_request_it_interrupted() -> None:
    """A server may answer (413, 401) before reading the whole upload; the client then gives up."""
    run = replay(
        chunks(
            (IN, b"PUT /big HTTP/1.1\r\nContent-Length: 1000000\r\n\r\nxxxx"),
            (OUT, ok(b"too big", 413, b"Connection: close\r\n")),
            (IN, b"yyyy"),
        )
    )
    assert brief(run) == [("PUT", "/big", 8, CONNECTION_CLOSED, 413, 7, None)]
    assert run.stitcher.unmatched == 0


def test_head_response_whose_request_was_not_seen() -> None:
    """Content-Length on a response to an uncaptured HEAD: the next status line is not its body."""
    run = replay(chunks((OUT, ok(b"x" * 50)[:-50]), (IN, GET), (OUT, ok(b"hi"))))
    assert brief(run) == [("GET", "/a", 0, None, 200, 2, None)]
    assert run.stitcher.unmatched == 1


def test_invalid_content_length_keeps_the_fifo_aligned() -> None:
    run = replay(
        chunks(
            (IN, b"POST /a HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n"),
            (IN, GET),
            (OUT, ok(b"1")),
            (OUT, ok(b"2")),
        )
    )
    assert brief(run) == [
        ("POST", "/a", None, MALFORMED, 200, 1, None),
        ("GET", "/a", 0, None, 200, 1, None),
    ]
    assert run.session.parse_errors == 1


def test_matching_content_length_duplicates_are_accepted() -> None:
    (request,) = messages(
        HTTP1Session(Role.SERVER), IN, b"POST /a HTTP/1.1\r\nContent-Length: 2, 2\r\ncontent-length: 2\r\n\r\nab", 1
    )
    assert request.body_size == 2


def test_transfer_encoding_wins_over_content_length() -> None:
    (request,) = messages(
        HTTP1Session(Role.SERVER),
        IN,
        b"POST /a HTTP/1.1\r\nContent-Length: 99\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        1,
    )
    assert (request.body_size, request.incomplete) == (2, None)


# -- resynchronisation ----------------------------------------------------------------------------


def test_mid_stream_garbage_counts_one_error_per_resync() -> None:
    run = replay(chunks((IN, b'ue", "tail": [1, 2, 3]}' * 50 + GET), (OUT, ok())))
    assert brief(run) == [("GET", "/a", 0, None, 200, 0, None)]
    assert run.session.parse_errors == 1


def test_known_method_preferred_when_glued_to_garbage() -> None:
    run = replay(chunks((IN, b"\x00\x01ZZGET /a HTTP/1.1\r\n\r\n"), (OUT, ok())))
    assert brief(run) == [("GET", "/a", 0, None, 200, 0, None)]


def test_bad_chunk_size_reports_the_message_and_resyncs() -> None:
    run = replay(
        chunks(
            (IN, GET),
            (IN, GET),
            (OUT, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"),
            (OUT, ok(b"x")),
        )
    )
    assert brief(run) == [
        ("GET", "/a", 0, None, 200, None, MALFORMED),
        ("GET", "/a", 0, None, 200, 1, None),
    ]
    assert run.session.parse_errors == 1


# -- capture gaps ---------------------------------------------------------------------------------


def test_gap_inside_a_chunk_is_skipped() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    run = replay(chunks((IN, GET), (OUT, head + b"100\r\nab", 254), (OUT, b"\r\n0\r\n\r\n")))
    assert brief(run) == [("GET", "/a", 0, None, 200, 256, None)]


def test_gap_across_chunk_framing_resyncs_to_the_next_response() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    run = replay(
        chunks(
            (IN, GET + GET),
            (OUT, head + b"10\r\nab", 500),
            (OUT, b"more chunks\r\n0\r\n\r\n" + ok(b"next")),
        )
    )
    assert brief(run) == [
        ("GET", "/a", 0, None, 200, None, CAPTURE_GAP),
        ("GET", "/a", 0, None, 200, 4, None),
    ]
    assert run.session.parse_errors == 0  # a gap is a known loss, not malformed input
    # Not the peer's failure: no error, but the span says the capture lost the end.
    assert run.exchanges[0].transaction().error == CAPTURE_GAP
    span = run.exchanges[0].span(CLIENT_CONN)
    assert span.status is StatusCode.UNSET and "error.type" not in span.attributes
    assert span.attributes["otel_ebpf.capture.gap"] is True
    assert "otel_ebpf.capture.gap" not in run.exchanges[1].span(CLIENT_CONN).attributes


def test_a_chunked_upload_whose_framing_a_gap_hid_is_marked_on_its_span() -> None:
    # aiohttp streaming a body in 64 KiB chunks, the server reading 64 KiB at a time: each read
    # past the capture cap hides chunk size lines, so the request's end and size are unknown.
    post = b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n10000\r\nxx"
    run = replay(chunks((IN, post, 0x10000 + 40), (IN, b"x" * 100, 65436), (OUT, ok(b"stored"))))
    assert brief(run) == [("POST", "/up", None, CAPTURE_GAP, 200, 6, None)]
    span = run.exchanges[0].span(CLIENT_CONN)
    assert span.attributes["otel_ebpf.capture.gap"] is True and "http.request.body.size" not in span.attributes
    assert span.status is StatusCode.UNSET and run.session.parse_errors == 0


def test_a_request_line_the_capture_cut_is_told_from_its_first_bytes() -> None:
    line = b"GET /search?q=" + b"q" * 5000 + b" HTTP/1.1\r\nHost: h\r\n\r\n"
    run = replay(chunks((IN, line[:4096], len(line) - 4096), (OUT, ok(b"hits")), (IN, GET), (OUT, ok())))
    assert brief(run) == [
        ("GET", "/search?q=" + "q" * 4082, None, CAPTURE_GAP, 200, 4, None),
        ("GET", "/a", 0, None, 200, 0, None),
    ]
    assert run.session.parse_errors == 0


def test_a_request_line_a_close_cut_is_no_request() -> None:
    run = replay(chunks((IN, b"GET /search?q=qqqq")))  # closed after it
    assert brief(run) == [] and run.session.parse_errors == 0


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("captured", "hidden", "body"),
    [
        # a download's last read: the capture stops in its one big chunk, the terminator hidden too
        (CHUNKED_HEAD + b"100000\r\n" + b"a" * 100, 0x100000 - 100 + 7, 0x100000),
        (CHUNKED_HEAD + b"10\r\n" + b"a" * 16, 7, 16),  # hidden from the chunk's CRLF on
        (CHUNKED_HEAD + b"10\r\n" + b"a" * 16 + b"\r\n", 5, 16),  # hidden from the last chunk on
    ],
)
def test_a_gap_that_is_exactly_the_end_of_a_chunked_body_ends_it(captured: bytes, hidden: int, body: int) -> None:
    run = replay(chunks((IN, GET + GET), (OUT, captured, hidden), (OUT, ok(b"next"))))
    assert brief(run) == [("GET", "/a", 0, None, 200, body, None), ("GET", "/a", 0, None, 200, 4, None)]
    assert run.session.parse_errors == 0
    assert run.exchanges[0].end_ns == 20  # the read that carried the end


def test_a_gap_one_byte_off_the_end_of_a_chunked_body_is_a_capture_gap() -> None:
    captured = CHUNKED_HEAD + b"100\r\n" + b"a" * 16
    for hidden in (0x100 - 16 + 6, 0x100 - 16 + 8):
        run = replay(chunks((IN, GET + GET), (OUT, captured, hidden), (OUT, ok(b"next"))))
        assert brief(run)[0] == ("GET", "/a", 0, None, 200, None, CAPTURE_GAP)
        assert brief(run)[1][4:] == (200, 4, None)


def test_a_guess_the_next_bytes_contradict_counts_them_malformed() -> None:
    # The hidden 7 bytes were a CRLF and a 2-byte chunk's size line and data, not the terminator:
    # the message was reported ended with the content seen, the rest does not start a message.
    captured = CHUNKED_HEAD + b"10\r\n" + b"a" * 16
    run = replay(chunks((IN, GET + GET), (OUT, captured, 7), (OUT, b"\r\n0\r\n\r\n" + ok(b"next"))))
    assert brief(run) == [("GET", "/a", 0, None, 200, 16, None), ("GET", "/a", 0, None, 200, 4, None)]
    assert run.session.parse_errors == 1


CHUNK = 0x2000
# A chunked download as Node.js and Python's http.server send one (a write per chunk), read as a
# client reads it: 20,000 bytes a read, the first 4 KiB of each captured (the size lines between
# hidden), the last read holding the end of the body.
DOWNLOAD = CHUNKED_HEAD + b"".join(b"%x\r\n%s\r\n" % (CHUNK, b"d" * CHUNK) for _ in range(6)) + b"0\r\n\r\n"


def _reads(stream: bytes, size: int, t: int = 20, cap: int = 4096) -> list[Chunk]:
    """``stream`` read ``size`` bytes at a time from ``t`` on, 10 apart, each captured to ``cap``."""
    reads = [stream[at : at + size] for at in range(0, len(stream), size)]
    return [Chunk(OUT, t + 10 * i, read[:cap], max(len(read) - cap, 0)) for i, read in enumerate(reads)]


@pytest.mark.parametrize("last", ["captured", "tail"])
def test_a_download_read_several_chunks_at_a_time_ends_with_its_last_chunk(last: str) -> None:
    """The gaps hide the size lines: the response is held, not ended at the first such gap, and
    ends with the read that ends with the last chunk: captured whole, or past the cap with its
    last bytes reported apart (the kernel's DATA_LAST_CHUNK, a feed after the gap)."""
    stream = DOWNLOAD if last == "captured" else DOWNLOAD[:-3000] + b"d" * 3000 + DOWNLOAD[-3000:]
    reads = _reads(stream, 20000)
    if last == "tail":
        final = reads.pop()
        assert final.gap > 7
        reads += [Chunk(OUT, final.t_ns, final.data, final.gap - 7), Chunk(OUT, final.t_ns, b"\r\n0\r\n\r\n")]
    end = reads[-1].t_ns
    run = replay([Chunk(IN, 10, GET + GET), *reads, Chunk(OUT, end + 10, ok(b"next"))])
    assert brief(run) == [("GET", "/a", 0, None, 200, None, CAPTURE_GAP), ("GET", "/a", 0, None, 200, 4, None)]
    assert run.exchanges[0].response.end_ns == end
    assert run.session.parse_errors == 0


def test_a_download_whose_end_was_hidden_ends_when_the_next_request_goes_out() -> None:
    reads = _reads(DOWNLOAD[:-20], 20000)
    run = replay([Chunk(IN, 10, GET), *reads, Chunk(IN, 500, GET), Chunk(OUT, 510, ok(b"next"))])
    assert brief(run) == [("GET", "/a", 0, None, 200, None, CAPTURE_GAP), ("GET", "/a", 0, None, 200, 4, None)]
    assert run.exchanges[0].response.end_ns == reads[-1].t_ns
    assert run.session.parse_errors == 0


def test_an_upload_answered_before_its_end_is_skipped_to_the_next_request() -> None:
    """A chunked upload whose size lines the cap hid, answered early (413): the request ends at
    its last read before the answer; the rest of the upload is skipped, not counted malformed."""
    upload = b"POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + DOWNLOAD[len(CHUNKED_HEAD) :]
    reads = [Chunk(IN, 10 + 10 * i, read.data, read.gap) for i, read in enumerate(_reads(upload, 20000)[:3])]
    run = replay([*reads, Chunk(OUT, 100, ok(b"no", 413)), Chunk(IN, 110, b"d" * 3000), Chunk(IN, 120, GET)])
    assert brief(run)[0] == ("POST", "/up", None, CAPTURE_GAP, 413, 2, None)
    assert run.exchanges[0].request.end_ns == 30
    assert brief(run)[1][:2] == ("GET", "/a")
    assert run.session.parse_errors == 0


def test_a_download_whose_end_was_hidden_ends_at_its_last_read_when_the_connection_closes() -> None:
    reads = _reads(DOWNLOAD[:-20], 20000)
    run = replay([Chunk(IN, 10, GET), *reads])
    assert brief(run) == [("GET", "/a", 0, None, 200, None, CAPTURE_GAP)]
    assert run.exchanges[0].response.end_ns == reads[-1].t_ns


def test_chunks_written_whole_past_the_cap_keep_their_framing() -> None:
    """A write per chunk (size line, data, CRLF) past the cap hides the data's end and its CRLF:
    the next write starts with the next size line, so the body's size stays exact."""
    writes = [b"%x\r\n%s\r\n" % (CHUNK, b"d" * CHUNK)] * 3 + [b"0\r\n\r\n"]
    run = replay(
        [
            Chunk(IN, 10, GET),
            Chunk(OUT, 20, CHUNKED_HEAD),
            *(Chunk(OUT, 30 + 10 * i, w[:4096], max(len(w) - 4096, 0)) for i, w in enumerate(writes)),
        ]
    )
    assert brief(run) == [("GET", "/a", 0, None, 200, 3 * CHUNK, None)]
    assert run.exchanges[0].response.end_ns == 60


def test_gap_past_the_end_of_a_known_length_body() -> None:
    run = replay(chunks((IN, GET + GET + GET), (OUT, ok(b"a" * 100)[:60], 200), (OUT, ok(b"c"))))
    # the gap held the rest of the first response and all of the second
    assert brief(run)[0] == ("GET", "/a", 0, None, 200, 100, None)
    assert brief(run)[1][4:] == (200, 1, None)


def test_gap_inside_the_head_salvages_start_line_and_complete_header_lines() -> None:
    head = b"POST /up?x=1 HTTP/1.1\r\nHost: example.com\r\nX-Big: " + b"v" * 50
    run = replay(chunks((IN, head, 5000), (IN, b"tail of the body"), (OUT, ok(b"k"))))
    (exchange,) = run.exchanges
    assert brief(run) == [("POST", "/up?x=1", None, CAPTURE_GAP, 200, 1, None)]
    assert exchange.request.headers == (("host", "example.com"),)


# -- bounds ---------------------------------------------------------------------------------------


def test_header_section_is_bounded() -> None:
    session = HTTP1Session(Role.SERVER)
    messages(session, IN, b"GET /a HTTP/1.1\r\n", 1)
    for i in range(20):
        messages(session, IN, b"X-Filler: " + b"f" * 8000 + b"\r\n", i)
        assert session.buffered <= MAX_HEAD
    assert session.parse_errors == 1
    assert messages(session, IN, b"\r\n" + GET, 99)[0].target == "/a"


def test_pending_requests_are_bounded() -> None:
    protocol = HTTP1()
    session, stitcher = protocol.new_session(Role.CLIENT), protocol.new_stitcher(Role.CLIENT)
    for i in range(MAX_PENDING + 44):
        for message in messages(session, OUT, b"GET /%d HTTP/1.1\r\n\r\n" % i, i):
            assert stitcher.add(message) == []
    assert stitcher.pending == MAX_PENDING
    assert stitcher.unmatched == 44
    (message,) = messages(session, IN, ok(b"x" * 10), 10_000)
    assert message.body_size == 10  # the response parser used the method of a request still queued
    (exchange,) = stitcher.add(message)
    assert exchange.request.target == "/44"


def test_stitcher_counts_foreign_and_orphan_messages() -> None:
    stitcher = FifoStitcher()
    response = Response(IN, 5, 6, 200, "OK", "1.1", (), 0)
    assert stitcher.add(response) == []
    assert stitcher.add(Request(OUT, 7, 7, "GET", "/", "1.1", (), 0)) == []  # started after it
    assert stitcher.unmatched == 1
    assert stitcher.add(Foreign()) == []
    assert stitcher.unmatched == 2
    (exchange,) = stitcher.flush(100)
    assert (exchange.response, exchange.end_ns) == (None, 100)
    assert stitcher.pending == 0


class Foreign(Message):
    """A message from some other protocol's session, handed to the wrong stitcher."""

    direction, start_ns, end_ns = IN, 0, 0


# -- timestamps -----------------------------------------------------------------------------------


def test_start_is_the_feed_of_the_first_byte_even_when_resynchronising() -> None:
    session = HTTP1Session(Role.SERVER)
    assert messages(session, IN, b"\x00garbage\xffGE", 1) == []
    assert messages(session, IN, b"T /a HTTP/1.1\r\nHost:", 2) == []
    (request,) = messages(session, IN, b" h\r\nContent-Length: 2\r\n\r\nx", 3) + messages(session, IN, b"y", 4)
    assert (request.start_ns, request.end_ns, request.body_size) == (1, 4, 2)
    assert session.parse_errors == 1


def test_pipelined_messages_start_in_the_feed_that_carries_them() -> None:
    session = HTTP1Session(Role.CLIENT)
    first, second = messages(session, IN, ok(b"1") + ok(b"22")[:20], 5) + messages(session, IN, ok(b"22")[20:], 6)
    assert (first.start_ns, first.end_ns, second.start_ns, second.end_ns) == (5, 5, 5, 6)


def test_close_reports_a_head_cut_short_and_ignores_later_input() -> None:
    session = HTTP1Session(Role.SERVER)
    messages(session, IN, b"GET /a HTTP/1.1\r\nHost: h\r\nAcc", 7)
    (request,) = session.close(9)
    assert (request.target, request.headers, request.incomplete) == (
        "/a",
        (("host", "h"),),
        CONNECTION_CLOSED,
    )
    assert (request.start_ns, request.end_ns) == (7, 7)
    assert messages(session, IN, GET, 10) == []
