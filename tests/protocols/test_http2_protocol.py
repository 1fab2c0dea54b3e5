"""The HTTP/2 plugin's parts on hand-built input: sniffing, the tolerant HPACK table, framing
corner cases (padding, CONTINUATION, resets, GOAWAY, gaps), gRPC message framing and semantics."""

from __future__ import annotations

import pytest
from hpack import Encoder
from http2_replay import RECORDINGS, conn, load, replay, summary
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import ConnData, ConnOpen
from otel_ebpf.protocol import (
    NEED_MORE,
    NO_MATCH,
    ConnectionInfo,
    Direction,
    Endpoint,
    Role,
    SpanKind,
    StatusCode,
    Transport,
)
from otel_ebpf.protocol_testing import Chunk
from otel_ebpf.protocols import grpc_semconv
from otel_ebpf.protocols.grpc_semconv import GrpcCall, Semconv, semconv_from_opt_in
from otel_ebpf.protocols.http1 import HTTP1
from otel_ebpf.protocols.http2 import HTTP2
from otel_ebpf.protocols.http2.grpc_framing import MessageCounter
from otel_ebpf.protocols.http2.hpack_context import MAX_TABLE_SIZE, HpackContext
from otel_ebpf.selfmetrics import SelfMetrics

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
IN, OUT = Direction.INGRESS, Direction.EGRESS
GRPC_REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/pkg.Svc/Get"),
    (":authority", "svc:50051"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def wire(*frames: Frame) -> bytes:
    return b"".join(frame.serialize() for frame in frames)


def message(payload: bytes, compressed: bool = False) -> bytes:
    return bytes([compressed]) + len(payload).to_bytes(4, "big") + payload


class Conversation:
    """Hand-built frames, one syscall each, as the server sees them."""

    def __init__(self, preface: bool = True) -> None:
        self.encoders = {IN: Encoder(), OUT: Encoder()}
        self.chunks = [Chunk(IN, 0, PREFACE + SettingsFrame(0).serialize())] if preface else []

    def send(self, direction: Direction, *frames: Frame, gap: int = 0) -> Conversation:
        self.chunks.append(Chunk(direction, 1000 * len(self.chunks), wire(*frames), gap))
        return self

    def headers(
        self, direction: Direction, stream: int, fields: list, end_stream: bool = False, **kwargs
    ) -> HeadersFrame:
        flags = ["END_HEADERS"] + (["END_STREAM"] if end_stream else [])
        return HeadersFrame(stream, self.encoders[direction].encode(fields), flags=flags, **kwargs)

    def run(self, role: Role = Role.SERVER):
        chunks = (
            self.chunks
            if role is Role.SERVER
            else [Chunk(c.direction.reverse(), c.t_ns, c.data, c.gap) for c in self.chunks]
        )
        return replay(chunks, role)


# -- sniffing ---------------------------------------------------------------------------------------


def test_sniff_preface_tells_the_role() -> None:
    http2 = HTTP2()
    assert http2.sniff(IN, PREFACE).role is Role.SERVER
    assert http2.sniff(OUT, PREFACE + b"\x00\x00\x00\x04").role is Role.CLIENT
    for cut in range(1, len(PREFACE)):
        assert http2.sniff(IN, PREFACE[:cut]) == NEED_MORE
    assert HTTP1().sniff(IN, PREFACE) == NO_MATCH  # never both


def test_sniff_frames_mid_connection() -> None:
    """A capture that starts after the preface: frames that pass the strict checks."""
    http2 = HTTP2()
    conversation = Conversation(preface=False)
    request = conversation.headers(IN, 7, [(":method", "GET"), (":path", "/x"), (":scheme", "http")])
    two = wire(request, WindowUpdateFrame(7, window_increment=10))
    assert http2.sniff(IN, two).role is Role.SERVER  # the HEADERS block is a request
    assert http2.sniff(OUT, two).role is Role.CLIENT
    assert http2.sniff(IN, wire(request)).role is Role.SERVER  # one whole HEADERS frame decodes
    response = conversation.headers(OUT, 7, [(":status", "200")])
    assert http2.sniff(OUT, wire(response)).role is Role.SERVER
    pings = wire(WindowUpdateFrame(0, window_increment=5), WindowUpdateFrame(0, window_increment=5))
    verdict = http2.sniff(IN, pings)
    assert verdict.matched and verdict.role is None  # the agent's own idea of the role stands
    assert http2.sniff(IN, two[:12]) == NEED_MORE
    assert http2.sniff(IN, two[:5]) == NEED_MORE


@pytest.mark.parametrize(
    "data",
    [
        bytes.fromhex("160301020001000200030100") + bytes(500),  # TLS ClientHello
        bytes.fromhex("1703030045") + bytes(range(69)),  # TLS application data
        bytes.fromhex("170303010940") + bytes(range(256)) * 2,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",
        bytes(64),
        b"\xff" * 64,
        b"SSH-2.0-OpenSSH_9.2\r\n",
    ],
)
def test_sniff_rejects_other_protocols(data: bytes) -> None:
    assert not HTTP2().sniff(IN, data).matched
    assert not HTTP2().sniff(OUT, data).matched


def test_sniff_h2c_upgrade_request() -> None:
    http2 = HTTP2()
    head = (
        b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"
    )
    assert http2.sniff(IN, head).role is Role.SERVER
    assert http2.sniff(IN, head[:40]) == NEED_MORE
    assert http2.sniff(IN, head.replace(b"h2c", b"websocket")) == NO_MATCH
    assert http2.sniff(IN, head.replace(b"HTTP2-Settings: ", b"X-Other: ")) == NO_MATCH


def test_recordings_are_claimed_by_one_plugin_in_either_order() -> None:
    """Each recording's first bytes in each direction: HTTP/1 and HTTP/2 never both claim them,
    but for the h2c upgrade request, which goes to whichever plugin is tried first."""
    http1, http2 = HTTP1(), HTTP2()
    for name in RECORDINGS:
        for direction in Direction:
            first = next(c.data for c in load(name) if c.direction is direction)
            both = http1.sniff(direction, first).matched and http2.sniff(direction, first).matched
            assert both == (name == "h2_curl_upgrade" and direction is IN), name


def _tracker(order: list) -> ConnectionTracker:
    return ConnectionTracker(order, SelfMetrics())


@pytest.mark.parametrize(("order", "claims"), [("http1,http2", "http1"), ("http2,http1", "http2")])
def test_h2c_upgrade_goes_to_the_plugin_tried_first(order: str, claims: str) -> None:
    plugins = {"http1": HTTP1(), "http2": HTTP2()}
    tracker = _tracker([plugins[name] for name in order.split(",")])
    key = (1, 3, 1)
    tracker.open(ConnOpen(0, *key, Role.SERVER, Endpoint("127.0.0.1", 80), Endpoint("127.0.0.1", 5000), Transport.TCP))
    outcomes = []
    for chunk in load("h2_curl_upgrade"):
        outcomes += tracker.data(
            ConnData(chunk.t_ns, *key[:1], 1, *key[1:], chunk.direction, len(chunk.data), chunk.data)
        )
    conn_state = tracker._table[key]  # noqa: SLF001 -- which plugin got the connection
    assert conn_state.protocol.name == claims
    exchanges = [outcome for _, outcome, _ in outcomes if hasattr(outcome, "span")]
    (exchange,) = exchanges
    span = exchange.span(conn_state.info())
    # HTTP/1 reports the upgrade request answered 101 and stops; HTTP/2 follows it to its end
    assert span.attributes["http.response.status_code"] == (101 if claims == "http1" else 200)


# -- HPACK ------------------------------------------------------------------------------------------


def test_mid_stream_hpack_never_resolves_an_entry_it_did_not_see() -> None:
    encoder = Encoder()
    early = encoder.encode([(":path", "/early"), ("x-a", "1")])  # inserted before the capture
    later = encoder.encode([(":path", "/later"), ("x-b", "2")])  # inserted after it began
    mixed = encoder.encode([(":path", "/early"), ("x-b", "2"), (":path", "/later"), (":method", "GET")])
    context = HpackContext(complete=False)
    assert context.decode(later) == (((":path", "/later"), ("x-b", "2")), 0)
    fields, unknown = context.decode(mixed)
    assert fields == (("x-b", "2"), (":path", "/later"), (":method", "GET")) and unknown == 1
    complete = HpackContext(complete=True)
    complete.decode(early)
    complete.decode(later)
    assert complete.decode(mixed) == (((":path", "/early"), ("x-b", "2"), (":path", "/later"), (":method", "GET")), 0)
    assert HpackContext(complete=True).decode(mixed) is None  # out of range from the start: malformed


def test_unknown_names_keep_insertion_positions() -> None:
    """A literal whose name references an entry from before the capture is inserted as unknown,
    so entries inserted after it keep their positions."""
    encoder = Encoder()
    encoder.encode([("x-early", "a")])  # before the capture: dynamic index 62
    block = encoder.encode([("x-early", "b")])  # literal, name = index 62, incremental indexing
    block += encoder.encode([("x-new", "c")])
    block += encoder.encode([("x-early", "b"), ("x-new", "c")])  # both indexed now
    context = HpackContext(complete=False)
    fields, unknown = context.decode(block)
    assert fields == (("x-new", "c"), ("x-new", "c")) and unknown == 2


def test_table_size_updates_are_followed_and_capped() -> None:
    encoder = Encoder()
    context = HpackContext(complete=True)
    encoder.header_table_size = 0  # the decoder's SETTINGS_HEADER_TABLE_SIZE went to 0
    block = encoder.encode([("x-a", "1")])
    assert context.decode(block) == ((("x-a", "1"),), 0)
    assert context.table.maxsize == 0 and not context.table.dynamic_entries
    encoder.header_table_size = 10**9
    assert context.decode(encoder.encode([("x-b", "2")])) == ((("x-b", "2"),), 0)
    assert context.table.maxsize == MAX_TABLE_SIZE


def test_identical_blocks_are_decoded_once_per_table_state() -> None:
    encoder = Encoder()
    context = HpackContext(complete=True)
    context.decode(encoder.encode([("x-a", "1")]))
    block = encoder.encode([("x-a", "1")])  # indexed: leaves the table as it is
    assert context.decode(block) is context.decode(block)


# -- framing ----------------------------------------------------------------------------------------


def test_padding_priority_and_continuation() -> None:
    c = Conversation()
    block = c.encoders[IN].encode([(":method", "POST"), (":path", "/upload"), (":scheme", "http"), (":authority", "h")])
    first = HeadersFrame(1, block[:3], flags=["PADDED", "PRIORITY"], pad_length=7, depends_on=0, stream_weight=9)
    c.send(IN, first, ContinuationFrame(1, block[3:6]), ContinuationFrame(1, block[6:], flags=["END_HEADERS"]))
    data = DataFrame(1, b"x" * 10, flags=["PADDED", "END_STREAM"], pad_length=20)
    c.send(IN, data)
    c.send(OUT, c.headers(OUT, 1, [(":status", "201")]), DataFrame(1, b"ok", flags=["END_STREAM"]))
    (exchange,) = c.run().exchanges
    assert summary(exchange)[:5] == (1, "POST", "/upload", 10, None)
    assert exchange.response.status == 201 and exchange.response.body_size == 2


def test_reset_and_goaway_end_streams_with_an_error() -> None:
    c = Conversation()
    get = [(":method", "GET"), (":path", "/slow"), (":scheme", "http"), (":authority", "h")]
    c.send(
        IN,
        c.headers(IN, 1, get, end_stream=True),
        c.headers(IN, 3, get, end_stream=True),
        c.headers(IN, 5, get, end_stream=True),
    )
    c.send(OUT, c.headers(OUT, 1, [(":status", "200")]))
    c.send(IN, RstStreamFrame(1, error_code=8))  # the client cancels
    c.send(OUT, GoAwayFrame(0, last_stream_id=3), c.headers(OUT, 3, [(":status", "200")], end_stream=True))
    spans = {e.request.stream: e.span(conn(Role.SERVER)) for e in c.run().exchanges}
    assert spans[1].attributes["error.type"] == "CANCEL" and spans[1].status is StatusCode.ERROR
    assert spans[3].attributes["http.response.status_code"] == 200 and "error.type" not in spans[3].attributes
    assert spans[5].attributes["error.type"] == "REFUSED_STREAM"


def test_push_promise_and_flow_control_are_harmless() -> None:
    c = Conversation()
    c.send(IN, c.headers(IN, 1, [(":method", "GET"), (":path", "/"), (":scheme", "http")], end_stream=True))
    promise = PushPromiseFrame(
        1,
        promised_stream_id=2,
        flags=["END_HEADERS"],
        data=c.encoders[OUT].encode([(":method", "GET"), (":path", "/style.css")]),
    )
    c.send(OUT, promise, c.headers(OUT, 1, [(":status", "200")], end_stream=True))
    c.send(
        OUT,
        c.headers(OUT, 2, [(":status", "200")]),
        DataFrame(2, b"css", flags=["END_STREAM"]),
        WindowUpdateFrame(0, window_increment=99),
    )
    run = c.run()
    assert [summary(e)[:3] for e in run.exchanges] == [(1, "GET", "/")]
    assert run.session.parse_errors == 0 and run.stitcher.unmatched == 0


def test_gap_inside_a_data_frame_is_counted() -> None:
    c = Conversation()
    c.send(IN, c.headers(IN, 1, [(":method", "POST"), (":path", "/"), (":scheme", "http")]))
    body = DataFrame(1, b"y" * 1000, flags=["END_STREAM"]).serialize()
    c.chunks.append(Chunk(IN, 9000, body[:100], gap=len(body) - 100))
    c.send(OUT, c.headers(OUT, 1, [(":status", "200")], end_stream=True))
    run = c.run()
    assert run.exchanges[0].request.body_size == 1000
    assert run.session.parse_errors == 0


def test_gap_hiding_frames_resynchronises_on_the_next_syscall() -> None:
    c = Conversation()
    get = [(":method", "GET"), (":path", "/a"), (":scheme", "http")]
    c.send(IN, c.headers(IN, 1, get, end_stream=True))
    tail = wire(DataFrame(1, b"z" * 50), WindowUpdateFrame(0, window_increment=1))
    c.chunks.append(
        Chunk(OUT, 5000, c.headers(OUT, 1, [(":status", "200")]).serialize() + tail[:20], gap=len(tail) - 20)
    )
    c.send(OUT, DataFrame(1, b"", flags=["END_STREAM"]))
    run = c.run()
    (exchange,) = run.exchanges
    assert exchange.response.status == 200 and exchange.response.body_size is None
    assert exchange.response.incomplete is None  # its END_STREAM came after the resynchronisation
    assert run.session.parse_errors == 1


def _download_with_hidden_frames(method: str, status: int, end_stream: bool = True) -> Conversation:
    """A response declaring ``content-length: 80`` whose DATA frames a gap partly hid (nginx's
    SSL_write over 16 KiB frames, past the capture cap); then its END_STREAM, unless a reset."""
    c = Conversation()
    c.send(IN, c.headers(IN, 1, [(":method", method), (":path", "/big"), (":scheme", "https")], end_stream=True))
    tail = wire(DataFrame(1, b"z" * 50), DataFrame(1, b"z" * 20))
    head = c.headers(OUT, 1, [(":status", str(status)), ("content-length", "80")]).serialize()
    c.chunks.append(Chunk(OUT, 5000, head + tail[:20], gap=len(tail) - 20))
    if end_stream:
        c.send(OUT, DataFrame(1, b"z" * 10, flags=["END_STREAM"]))
    else:
        c.send(OUT, RstStreamFrame(1, error_code=8))
    return c


def test_a_response_seen_to_its_end_takes_its_content_length_when_a_gap_hid_frames() -> None:
    (exchange,) = _download_with_hidden_frames("GET", 200).run().exchanges
    assert exchange.response.body_size == 80
    assert exchange.span(conn(Role.SERVER)).attributes["http.response.body.size"] == 80


@pytest.mark.parametrize(
    ("method", "status", "end_stream"), [("HEAD", 200, True), ("GET", 304, True), ("GET", 200, False)]
)
def test_a_content_length_that_is_not_the_body_leaves_a_hidden_size_unknown(
    method: str, status: int, end_stream: bool
) -> None:
    (exchange,) = _download_with_hidden_frames(method, status, end_stream).run().exchanges
    assert exchange.response.body_size is None


def test_connection_closed_mid_response() -> None:
    c = Conversation()
    c.send(
        IN,
        c.headers(IN, 1, [(":method", "GET"), (":path", "/a"), (":scheme", "http")], end_stream=True),
        c.headers(IN, 3, [(":method", "GET"), (":path", "/b"), (":scheme", "http")], end_stream=True),
    )
    c.send(OUT, c.headers(OUT, 1, [(":status", "200")]), DataFrame(1, b"partial"))
    spans = {e.request.stream: e.span(conn(Role.SERVER)) for e in c.run().exchanges}
    assert spans[1].attributes["error.type"] == "connection_closed"
    assert spans[3].attributes["error.type"] == "response_missing"


def test_requests_starting_in_one_syscall_get_distinct_start_times() -> None:
    c = Conversation()
    get = [(":method", "GET"), (":path", "/"), (":scheme", "http")]
    c.send(IN, c.headers(IN, 1, get, end_stream=True), c.headers(IN, 3, get, end_stream=True))
    c.send(
        OUT,
        c.headers(OUT, 3, [(":status", "200")], end_stream=True),
        c.headers(OUT, 1, [(":status", "200")], end_stream=True),
    )
    run = c.run()
    starts = {s.stream: s.start_ns for s in run.starts}
    assert starts[3] == starts[1] + 1
    assert {e.request.stream: e.span(conn(Role.SERVER)).start_ns for e in run.exchanges} == starts


# -- gRPC -------------------------------------------------------------------------------------------


def test_message_counter_across_frames_and_gaps() -> None:
    counter = MessageCounter()
    stream = message(b"a" * 10) + message(b"b" * 3, compressed=True) + message(b"")
    for i in range(len(stream)):  # a byte at a time: prefixes straddle every boundary
        counter.feed(stream[i : i + 1])
    assert (counter.known_count, counter.compressed) == (3, 1)
    counter.feed(message(b"c" * 100)[:20])
    counter.skip(85)  # inside the message body
    assert counter.known_count == 4
    counter.skip(10)  # past its end: the next prefix is hidden
    assert counter.known_count is None


@pytest.mark.parametrize(
    ("status", "server_error", "client_error"),
    [
        (0, False, False),
        (5, False, True),
        (2, True, True),
        (4, True, True),
        (12, True, True),
        (13, True, True),
        (14, True, True),
        (15, True, True),
        (16, False, True),
        (1, False, True),
    ],
)
def test_grpc_status_to_span_status(status: int, server_error: bool, client_error: bool) -> None:
    call = GrpcCall("/pkg.Svc/Get", 0, 10, "svc:50051", status, "why")
    for role, error in ((Role.SERVER, server_error), (Role.CLIENT, client_error)):
        span = grpc_semconv.describe_span(call, conn(role), Semconv.OLD)
        assert (span.status is StatusCode.ERROR) == error
        assert span.attributes.get("error.type") == (grpc_semconv.STATUS_NAMES[status] if error else None)
        assert span.status_description == ("why" if error else None)
        assert span.kind is (SpanKind.SERVER if role is Role.SERVER else SpanKind.CLIENT)


def test_a_call_over_a_unix_socket_names_the_socket_as_its_server() -> None:
    """gRPC's authority for a unix target is the path, percent-encoded: the socket's own path is
    ``server.address``, with no port; the client's peer is that path, the server's peer unnamed."""
    call = GrpcCall("/pkg.Svc/Get", 0, 10, "tmp%2Fapp.sock", 0, None)
    path, unnamed = Endpoint("/tmp/app.sock", 0, 7), Endpoint("", 0, 8)
    client = ConnectionInfo(Role.CLIENT, unnamed, path, Transport.UNIX)
    server = ConnectionInfo(Role.SERVER, path, unnamed, Transport.UNIX)
    client_attributes = grpc_semconv.describe_span(call, client, Semconv.OLD).attributes
    server_attributes = grpc_semconv.describe_span(call, server, Semconv.OLD).attributes
    for attributes in (client_attributes, server_attributes):
        assert (attributes["server.address"], attributes["network.transport"]) == ("/tmp/app.sock", "unix")
        assert not {"server.port", "network.peer.port", "client.address", "client.port"} & set(attributes)
    assert client_attributes["network.peer.address"] == "/tmp/app.sock"
    assert "network.peer.address" not in server_attributes
    points = grpc_semconv.metric_points(call, client, Semconv.OLD)
    assert all(p.attributes["server.address"] == "/tmp/app.sock" and "server.port" not in p.attributes for p in points)


def test_semconv_opt_in() -> None:
    assert semconv_from_opt_in(None) is Semconv.OLD
    assert semconv_from_opt_in("http,rpc") is Semconv.NEW
    assert semconv_from_opt_in("rpc, rpc/dup") is Semconv.DUP
    with pytest.raises(ValueError, match="semconv_stability_opt_in"):
        HTTP2({"semconv_stability_opt_in": 3})
    with pytest.raises(ValueError, match="no_such_option"):
        HTTP2({"no_such_option": 1})


def test_semconv_sets() -> None:
    call = GrpcCall("/pkg.Svc/Get", 0, 2_000_000, "svc:50051", 5, None, None, 1, 0)
    old = grpc_semconv.describe_span(call, conn(Role.CLIENT), Semconv.OLD)
    new = grpc_semconv.describe_span(call, conn(Role.CLIENT), Semconv.NEW)
    dup = grpc_semconv.describe_span(call, conn(Role.CLIENT), Semconv.DUP)
    assert old.name == new.name == dup.name == "pkg.Svc/Get"
    assert (
        old.attributes["rpc.system"],
        old.attributes["rpc.service"],
        old.attributes["rpc.method"],
        old.attributes["rpc.grpc.status_code"],
    ) == ("grpc", "pkg.Svc", "Get", 5)
    assert "rpc.system.name" not in old.attributes
    assert (
        new.attributes["rpc.system.name"],
        new.attributes["rpc.method"],
        new.attributes["rpc.response.status_code"],
    ) == ("grpc", "pkg.Svc/Get", "NOT_FOUND")
    assert "rpc.system" not in new.attributes and "rpc.service" not in new.attributes
    assert dup.attributes["rpc.system"] == dup.attributes["rpc.system.name"] == "grpc"
    points = {p.instrument: p for p in grpc_semconv.metric_points(call, conn(Role.CLIENT), Semconv.DUP)}
    assert points["rpc.client.duration"].value == pytest.approx(2.0)  # ms
    assert points["rpc.client.call.duration"].value == pytest.approx(0.002)  # s
    assert points["rpc.client.requests_per_rpc"].value == 1
    units = {spec.name: spec.unit for spec in grpc_semconv.instruments(Semconv.DUP)}
    assert units["rpc.server.duration"] == "ms" and units["rpc.server.call.duration"] == "s"


def test_unknown_and_unimplemented_methods() -> None:
    unknown = grpc_semconv.describe_span(GrpcCall(None, 0, 1), conn(Role.SERVER), Semconv.DUP)
    assert unknown.name == "grpc" and unknown.attributes["rpc.method"] == "_OTHER"
    assert "rpc.service" not in unknown.attributes and "rpc.method_original" not in unknown.attributes
    unimplemented = GrpcCall("/scan.Me/Now", 0, 1, status=12)
    new = grpc_semconv.describe_span(unimplemented, conn(Role.SERVER), Semconv.NEW)
    assert (new.name, new.attributes["rpc.method"], new.attributes["rpc.method_original"]) == (
        "grpc",
        "_OTHER",
        "scan.Me/Now",
    )
    assert grpc_semconv.describe_span(unimplemented, conn(Role.SERVER), Semconv.OLD).name == "scan.Me/Now"


def _grpc_call(c: Conversation, response: list[Frame], stream: int = 1) -> None:
    c.send(IN, c.headers(IN, stream, GRPC_REQUEST), DataFrame(stream, message(b"q"), flags=["END_STREAM"]))
    c.send(OUT, *response)


@pytest.mark.parametrize(
    ("response", "status", "description"),
    [
        ("trailers-only", 5, "gone away"),
        ("http-503", 14, None),
        ("no-trailers", 13, "missing trailers"),
        ("reset-cancel", 1, None),
        ("reset-internal", 13, None),
    ],
)
def test_grpc_outcomes(response: str, status: int, description: str | None) -> None:
    c = Conversation()
    ok = [(":status", "200"), ("content-type", "application/grpc")]
    frames = {  # built only for the case at hand: encoding changes the encoder's table
        "trailers-only": lambda: [
            c.headers(OUT, 1, ok + [("grpc-status", "5"), ("grpc-message", "gone%20away")], end_stream=True)
        ],
        "http-503": lambda: [c.headers(OUT, 1, [(":status", "503")], end_stream=True)],
        "no-trailers": lambda: [c.headers(OUT, 1, ok), DataFrame(1, message(b"r"), flags=["END_STREAM"])],
        "reset-cancel": lambda: [c.headers(OUT, 1, ok), RstStreamFrame(1, error_code=8)],
        "reset-internal": lambda: [RstStreamFrame(1, error_code=2)],
    }[response]()
    _grpc_call(c, frames)
    (exchange,) = c.run(Role.CLIENT).exchanges
    span = exchange.span(conn(Role.CLIENT))
    assert span.attributes["rpc.grpc.status_code"] == status
    assert span.status is StatusCode.ERROR and span.status_description == description
    assert span.attributes["error.type"] == grpc_semconv.STATUS_NAMES[status]


def test_grpc_messages_straddling_frames() -> None:
    c = Conversation()
    body = message(b"a" * 30) + message(b"b" * 7, compressed=True)
    pieces = [body[:3], body[3:37], body[37:]]
    c.send(
        IN, c.headers(IN, 1, GRPC_REQUEST), *(DataFrame(1, p) for p in pieces), DataFrame(1, b"", flags=["END_STREAM"])
    )
    c.send(
        OUT,
        c.headers(OUT, 1, [(":status", "200"), ("content-type", "application/grpc")]),
        c.headers(OUT, 1, [("grpc-status", "0")], end_stream=True),
    )
    (exchange,) = c.run().exchanges
    span = exchange.span(conn(Role.SERVER))
    assert span.attributes["otel_ebpf.rpc.request.message_count"] == 2
    assert span.attributes["otel_ebpf.rpc.request.compressed"] is True
    assert span.attributes["otel_ebpf.rpc.response.message_count"] == 0


# -- h2c upgrade ------------------------------------------------------------------------------------

UPGRADE = (
    b"POST /submit HTTP/1.1\r\nHost: svc:8080\r\nContent-Length: 5\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\nhello"
)


def test_upgrade_request_with_a_body_becomes_stream_1() -> None:
    c = Conversation(preface=False)
    c.chunks += [Chunk(IN, 0, UPGRADE[:40]), Chunk(IN, 10, UPGRADE[40:])]
    switching = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
    c.send(OUT, SettingsFrame(0))
    c.chunks[-1] = Chunk(OUT, 20, switching + c.chunks[-1].data)  # the 101 and the first frame in one write
    c.send(IN, SettingsFrame(0))
    c.chunks[-1] = Chunk(IN, 30, PREFACE + c.chunks[-1].data)
    c.send(OUT, c.headers(OUT, 1, [(":status", "200")]), DataFrame(1, b"done", flags=["END_STREAM"]))
    run = c.run()
    (exchange,) = run.exchanges
    assert summary(exchange)[:6] == (1, "POST", "/submit", 5, None, 0)
    assert (exchange.response.status, exchange.response.body_size) == (200, 4)
    assert [(s.stream, s.start_ns) for s in run.starts] == [(1, 0)]
    span = exchange.span(conn(Role.SERVER))
    assert (span.name, span.attributes["server.address"], span.attributes["network.protocol.version"]) == (
        "POST /submit",
        "svc",
        "2",
    )


def test_an_upgrade_request_is_announced_when_its_head_arrives() -> None:
    """Before the answer tells HTTP/2 from HTTP/1: once, as stream 1's request, whichever."""
    waiting = replay([Chunk(IN, 0, UPGRADE[:40]), Chunk(IN, 10, UPGRADE[40:60])], close=False)
    assert waiting.starts == []  # the head is not whole yet
    waiting = replay([Chunk(IN, 0, UPGRADE[:40]), Chunk(IN, 10, UPGRADE[40:])], close=False)
    (start,) = waiting.starts
    assert (start.start_ns, start.stream, start.carrier[:2]) == (0, 1, ((":method", "POST"), (":path", "/submit")))


def test_declined_upgrade_stays_http1() -> None:
    """A server that does not speak h2c answers in HTTP/1.1: the HTTP/1 plugin's session takes the
    connection from its first byte, and its stitcher pairs what follows."""
    chunks = [
        Chunk(IN, 0, UPGRADE),
        Chunk(OUT, 10, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        Chunk(IN, 20, b"GET /next HTTP/1.1\r\nHost: svc\r\n\r\n"),
        Chunk(OUT, 30, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
    ]
    run = replay(chunks)
    spans = [e.span(conn(Role.SERVER)) for e in run.exchanges]
    assert [
        (s.name, s.attributes["http.response.status_code"], s.attributes["network.protocol.version"]) for s in spans
    ] == [("POST /submit", 200, "1.1"), ("GET /next", 404, "1.1")]
    assert [s.start_ns for s in run.starts] == [0, 20]  # the upgrade request's announced as it came
    assert [s.start_ns for s in spans] == [0, 20]
    assert run.session.parse_errors == 0 and run.stitcher.unmatched == 0


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_unknown_method_and_path_are_left_out(role: Role) -> None:
    """Mid-connection, a request whose method and path the encoder indexed before the capture:
    no method, path or URL is made up, and the message is counted partial."""
    c = Conversation(preface=False)
    c.encoders[IN].encode([(":method", "PURGE"), (":path", "/cache/1")])  # before the capture
    c.send(
        IN,
        c.headers(IN, 9, [(":method", "PURGE"), (":path", "/cache/1"), (":scheme", "http")], end_stream=True),
        WindowUpdateFrame(0, window_increment=1),
    )
    c.send(OUT, c.headers(OUT, 9, [(":status", "204")], end_stream=True))
    run = c.run(role)
    (exchange,) = run.exchanges
    span = exchange.span(conn(role))
    assert span.name == "HTTP" and span.attributes["http.request.method"] == "_OTHER"
    assert {"http.request.method_original", "url.path", "url.full"}.isdisjoint(span.attributes)
    assert span.attributes["http.response.status_code"] == 204
    assert (run.session.partial_messages, run.session.parse_errors) == (1, 0)
