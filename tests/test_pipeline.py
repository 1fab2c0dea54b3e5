"""The user-space pipeline on hand-built event streams: exact spans, resources, metrics, self-metrics.

Every stream is made of real HTTP/1.1 bytes run through the real ``http1`` plugin (found through
its entry point, as the agent finds it); nothing is mocked. Times are explicit, so each span's
start and end must equal the timestamp of a known event (docs/architecture.md, "Deterministic after
the ring buffer"), and every drop must show up in a self-metric (docs/architecture.md, "Bounded and
counted").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import AggregationTemporality, ResourceMetrics
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf import __version__
from otel_ebpf.pipeline import Pipeline
from otel_ebpf.pipeline.connections import SNIFF_MAX_BYTES, SNIFF_MAX_EVENTS, ConnectionTracker, tls_record_start
from otel_ebpf.pipeline.events import (
    ConnClose,
    ConnData,
    ConnKey,
    ConnOpen,
    Event,
    HttpRequestCounts,
    KernelLoss,
    ProcessExit,
    ProcessInfo,
)
from otel_ebpf.pipeline.metrics import DELTA_KINDS
from otel_ebpf.pipeline.reorder import EventReorderer
from otel_ebpf.pipeline.telemetry import EXITED_GRACE_NS, Telemetry
from otel_ebpf.protocol import Direction, Endpoint, Protocol, Role, Session, Sniff, Stitcher, Transport, load_protocols
from otel_ebpf.protocols.http_semconv import DURATION_BUCKETS
from otel_ebpf.sampling import SpanSampler
from otel_ebpf.selfmetrics import SelfMetrics

PROTOCOLS = load_protocols()
HOST = "node-1"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000
IN, OUT = Direction.INGRESS, Direction.EGRESS
SERVER_END = Endpoint("10.0.0.1", 8080)
CLIENT_END = Endpoint("10.0.0.2", 51000)
SDK = {"telemetry.sdk.name": "otel-ebpf", "telemetry.sdk.language": "python", "telemetry.sdk.version": __version__}
UNSET, ERROR = trace.StatusCode.UNSET, trace.StatusCode.ERROR
SERVER, CLIENT = trace.SpanKind.SERVER, trace.SpanKind.CLIENT


# ---- building streams ----------------------------------------------------------------------------


def at(ms: float) -> int:
    return T0 + int(ms * MS)


def opened(
    ms: float,
    pid: int,
    fd: int,
    gen: int = 0,
    role: Role | None = Role.SERVER,
    local: Endpoint | None = SERVER_END,
    peer: Endpoint | None = CLIENT_END,
    transport: Transport = Transport.TCP,
) -> ConnOpen:
    return ConnOpen(at(ms), pid, fd, gen, role, local, peer, transport)


def data(
    ms: float,
    pid: int,
    fd: int,
    direction: Direction,
    payload: bytes,
    gen: int = 0,
    tid: int | None = None,
    length: int | None = None,
) -> ConnData:
    return ConnData(
        at(ms),
        pid,
        pid if tid is None else tid,
        fd,
        gen,
        direction,
        len(payload) if length is None else length,
        payload,
    )


def closed(ms: float, pid: int, fd: int, gen: int = 0) -> ConnClose:
    return ConnClose(at(ms), pid, fd, gen)


def info(
    pid: int,
    executable: str = "/usr/bin/python3",
    command_line: str = "python3 app.py",
    environment: Mapping[str, str] | None = None,
    ms: float = 0,
) -> ProcessInfo:
    return ProcessInfo(at(ms), pid, executable, command_line, dict(environment or {}))


def get(path: str, host: str = "api.local:8080", extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (path.encode(), host.encode(), extra)


def ok(body: bytes = b"", status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


class Run:
    """A fresh pipeline, as the agent wires it."""

    def __init__(
        self,
        max_connections: int = 16384,
        max_processes: int = 1024,
        extra: Mapping[str, str] | None = None,
        delta: str = "cumulative",
        kernel_http_metrics: bool = False,
        sampler: SpanSampler | None = None,
    ) -> None:
        self.selfmetrics = SelfMetrics()
        self.unknown: list[ConnKey] = []
        self.ciphertext: list[ConnKey] = []
        self.tracker = ConnectionTracker(
            PROTOCOLS, self.selfmetrics, max_connections, self.unknown.append, self.ciphertext.append
        )
        self.telemetry = Telemetry(
            PROTOCOLS,
            HOST,
            dict(extra or {}),
            self.selfmetrics,
            max_processes,
            DELTA_KINDS[delta],
            kernel_http_metrics,
            sampler,
        )
        # no reorder window: each feed's spans come out at once (tests/test_assembly.py covers it)
        self.pipeline = Pipeline(
            self.tracker, self.telemetry, self.selfmetrics, reorderer=EventReorderer(self.selfmetrics, window_ns=0)
        )

    def feed(self, events: Iterable[Event]) -> list[ReadableSpan]:
        self.pipeline.handle(events)
        return self.telemetry.take_spans()

    def total(self, name: str) -> int:
        return self.selfmetrics.total(name)


def summary(span: ReadableSpan) -> tuple:
    return (
        span.name,
        span.kind,
        span.start_time,
        span.end_time,
        span.status.status_code,
        span.status.description,
        dict(span.attributes),
    )


def ids(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


def points(resource_metrics: Sequence[ResourceMetrics]) -> dict[tuple, object]:
    """(service.name, metric name, sorted attributes) -> data point; also checks each key is unique."""
    table: dict[tuple, object] = {}
    for rm in resource_metrics:
        service = rm.resource.attributes["service.name"]
        for sm in rm.scope_metrics:
            assert sm.scope.name == "otel_ebpf.protocols.http1"
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    key = (service, metric.name, tuple(sorted(point.attributes.items())))
                    assert key not in table
                    table[key] = point
    return table


def attrs(**kv: object) -> tuple:
    return tuple(sorted((k.replace("__", "."), v) for k, v in kv.items()))


def server_attrs(
    path: str,
    status: int | None,
    *,
    method: str = "GET",
    query: str | None = None,
    request_body: int | None = 0,
    response_body: int | None = None,
    error: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> dict:
    """Span attributes of a server exchange on the default endpoints with ``Host: api.local:8080``."""
    a: dict[str, object] = {"http.request.method": method, "url.path": path}
    if query is not None:
        a["url.query"] = query
    a.update(
        {
            "url.scheme": "http",
            "server.address": "api.local",
            "server.port": 8080,
            "client.address": "10.0.0.2",
            "client.port": 51000,
            "network.peer.address": "10.0.0.2",
            "network.peer.port": 51000,
            "network.protocol.version": "1.1",
        }
    )
    if status is not None:
        a["http.response.status_code"] = status
    a.update(extra or {})
    if request_body is not None:
        a["http.request.body.size"] = request_body
    if response_body is not None:
        a["http.response.body.size"] = response_body
    if error is not None:
        a["error.type"] = error
    return a


def buckets(bounds: Sequence[float], *indexes: int) -> list[int]:
    counts = [0] * (len(bounds) + 1)
    for i in indexes:
        counts[i] += 1
    return counts


# ---- keep-alive, ids, determinism ---------------------------------------------------------------

PID = 100


def keepalive_stream() -> list[Event]:
    return [
        info(PID, environment={"OTEL_SERVICE_NAME": "api"}),
        opened(0, PID, 7),
        data(1, PID, 7, IN, get("/items/42?x=1&sig=abc", extra=b"User-Agent: t/1\r\n"), tid=101),
        data(4, PID, 7, OUT, ok(b"hello"), tid=101),
        # a POST whose head and body arrive in two reads, on another thread
        data(10, PID, 7, IN, b"POST /items HTTP/1.1\r\nHost: api.local:8080\r\nContent-Length: 7\r\n\r\n", tid=102),
        data(11, PID, 7, IN, b'{"a":1}', tid=102),
        data(20, PID, 7, OUT, ok(status=b"201 Created"), tid=102),
        data(30, PID, 7, IN, b"DELETE /items/42 HTTP/1.1\r\nHost: api.local:8080\r\n\r\n", tid=103),
        data(100, PID, 7, OUT, b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 11\r\n\r\n", tid=103),
        data(130, PID, 7, OUT, b"this failed", tid=103),
        data(140, PID, 7, IN, get("/items/7"), tid=101),
        data(150, PID, 7, OUT, ok(b"abc"), tid=101),
        closed(200, PID, 7),
    ]


def test_keepalive_connection_gives_one_exact_span_per_request() -> None:
    run = Run()
    spans = run.feed(keepalive_stream())
    assert [summary(s) for s in spans] == [
        (
            "GET /items/{id}",
            SERVER,
            at(1),
            at(4),
            UNSET,
            None,
            server_attrs(
                "/items/42", 200, query="x=REDACTED&sig=REDACTED", response_body=5, extra={"user_agent.original": "t/1"}
            ),
        ),
        (
            "POST /items",
            SERVER,
            at(10),
            at(20),
            UNSET,
            None,
            server_attrs("/items", 201, method="POST", request_body=7, response_body=0),
        ),
        (
            "DELETE /items/{id}",
            SERVER,
            at(30),
            at(130),
            ERROR,
            None,
            server_attrs("/items/42", 500, method="DELETE", response_body=11, error="500"),
        ),
        ("GET /items/{id}", SERVER, at(140), at(150), UNSET, None, server_attrs("/items/7", 200, response_body=3)),
    ]
    assert len({s.context.span_id for s in spans}) == 4
    assert len({s.context.trace_id for s in spans}) == 4
    for span in spans:
        assert span.parent is None
        assert span.context.trace_flags.sampled
        assert span.instrumentation_scope.name == "otel_ebpf.protocols.http1"
        assert span.resource.attributes["service.name"] == "api"
    assert run.total("otel_ebpf.events.received") == 13
    assert run.total("otel_ebpf.connections.opened") == 1
    assert run.total("otel_ebpf.connections.tracked") == 0
    assert run.total("otel_ebpf.parse.errors") == 0
    assert run.total("otel_ebpf.messages.unmatched") == 0
    assert len(run.tracker) == 0


def test_keepalive_metrics_are_exact() -> None:
    run = Run()
    run.feed(keepalive_stream())
    table = points(run.telemetry.collect_metrics(at(1000)))
    base = dict(
        http__request__method="GET",
        url__scheme="http",
        network__protocol__version="1.1",
        http__response__status_code=200,
    )
    get_attrs = attrs(**base)
    post_attrs = attrs(**{**base, "http__request__method": "POST", "http__response__status_code": 201})
    delete_attrs = attrs(
        **{**base, "http__request__method": "DELETE", "http__response__status_code": 500, "error__type": "500"}
    )
    assert set(table) == {
        ("api", name, a)
        for name in ("http.server.request.duration", "http.server.request.body.size", "http.server.response.body.size")
        for a in (get_attrs, post_attrs, delete_attrs)
    }
    body_bounds = [
        0.0,
        5.0,
        10.0,
        25.0,
        50.0,
        75.0,
        100.0,
        250.0,
        500.0,
        750.0,
        1000.0,
        2500.0,
        5000.0,
        7500.0,
        10000.0,
    ]

    duration = table[("api", "http.server.request.duration", get_attrs)]
    # 3 ms, then exactly 10 ms: an upper bound belongs to its own bucket
    assert (duration.count, duration.sum, duration.min, duration.max) == (2, 0.0 + 0.003 + 0.01, 0.003, 0.01)
    assert duration.bucket_counts == buckets(DURATION_BUCKETS, 0, 1)
    assert duration.explicit_bounds == list(DURATION_BUCKETS)
    assert (duration.start_time_unix_nano, duration.time_unix_nano) == (at(4), at(1000))
    delete = table[("api", "http.server.request.duration", delete_attrs)]
    assert (delete.count, delete.sum, delete.start_time_unix_nano) == (1, 0.1, at(130))
    assert delete.bucket_counts == buckets(DURATION_BUCKETS, 5)  # (0.075, 0.1]
    post = table[("api", "http.server.request.duration", post_attrs)]
    assert (post.count, post.sum, post.bucket_counts) == (1, 0.01, buckets(DURATION_BUCKETS, 1))

    response = table[("api", "http.server.response.body.size", get_attrs)]
    assert (response.count, response.sum, response.min, response.max) == (2, 8, 3, 5)
    assert response.bucket_counts == buckets(body_bounds, 1, 1)  # 3 and 5 fall in (0, 5]
    assert response.explicit_bounds == body_bounds
    request = table[("api", "http.server.request.body.size", post_attrs)]
    assert (request.count, request.sum, request.bucket_counts) == (1, 7, buckets(body_bounds, 2))
    zero = table[("api", "http.server.request.body.size", get_attrs)]
    assert (zero.count, zero.sum, zero.bucket_counts) == (2, 0, buckets(body_bounds, 0, 0))

    rm = run.telemetry.collect_metrics(at(1000))[0]
    assert {m.data.aggregation_temporality for m in rm.scope_metrics[0].metrics} == {AggregationTemporality.CUMULATIVE}


def test_same_stream_through_fresh_pipelines_gives_identical_telemetry() -> None:
    outputs = []
    for _ in range(2):
        run = Run()
        spans = run.feed(keepalive_stream())
        metrics = run.telemetry.collect_metrics(at(1000))
        outputs.append(
            (
                [(ids(s), summary(s), dict(s.resource.attributes)) for s in spans],
                [rm.to_json() for rm in metrics],
                run.selfmetrics.snapshot(),
            )
        )
    assert outputs[0] == outputs[1]
    assert len(outputs[0][0]) == 4


def test_ids_depend_on_position_and_connection_identity() -> None:
    """Two pipelined requests share start and end times: only their position tells their ids apart,
    and the same bytes on a reused fd (new generation) get other ids again."""
    two = get("/a") + get("/b")
    answers = ok(b"1") + ok(b"2")

    def stream(gen: int) -> list[Event]:
        return [
            opened(0, PID, 9, gen),
            data(1, PID, 9, IN, two, gen),
            data(2, PID, 9, OUT, answers, gen),
            closed(3, PID, 9, gen),
        ]

    run = Run()
    first = run.feed(stream(1))
    second = run.feed(stream(2))
    assert [(s.name, s.start_time, s.end_time) for s in first + second] == [
        ("GET /a", at(1), at(2)),
        ("GET /b", at(1), at(2)),
    ] * 2
    assert len({ids(s)[0] for s in first + second}) == 4
    assert len({ids(s)[1] for s in first + second}) == 4
    # not a random draw: a fresh pipeline gives the very same ids
    again = Run().feed(stream(1))
    assert [ids(s) for s in again] == [ids(s) for s in first]


# ---- capture starting mid-stream ----------------------------------------------------------------


def test_capture_starting_mid_body_is_claimed_at_the_first_clean_request() -> None:
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, b'x": [1, 2, 3], "tail": true}\n'),  # end of an upload the agent missed
            data(2, PID, 7, IN, b"ail, the rest of the body"),
            data(5, PID, 7, IN, get("/one")),
            data(6, PID, 7, OUT, ok(b"1")),
            data(7, PID, 7, IN, get("/two")),
            data(9, PID, 7, OUT, ok(b"22")),
            closed(10, PID, 7),
        ]
    )
    assert [summary(s) for s in spans] == [
        ("GET /one", SERVER, at(5), at(6), UNSET, None, server_attrs("/one", 200, response_body=1)),
        ("GET /two", SERVER, at(7), at(9), UNSET, None, server_attrs("/two", 200, response_body=2)),
    ]
    assert run.total("otel_ebpf.parse.errors") == 0
    assert run.total("otel_ebpf.messages.unmatched") == 0
    assert run.total("otel_ebpf.connections.unknown_protocol") == 0


def test_capture_starting_before_an_orphan_response_counts_it_unmatched() -> None:
    """The response to a request the agent never saw claims the connection; it pairs with nothing."""
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, b"...end of body}\n"),
            data(2, PID, 7, OUT, ok(b"late", b"201 Created")),
            data(5, PID, 7, IN, get("/next")),
            data(6, PID, 7, OUT, ok()),
            closed(10, PID, 7),
        ]
    )
    assert [summary(s) for s in spans] == [
        ("GET /next", SERVER, at(5), at(6), UNSET, None, server_attrs("/next", 200, response_body=0)),
    ]
    assert run.total("otel_ebpf.messages.unmatched") == 1
    assert run.total("otel_ebpf.parse.errors") == 0


def test_request_line_split_over_two_reads_is_sniffed_whole() -> None:
    request = get("/split")
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, request[:2]),  # "GE"
            data(2, PID, 7, IN, request[2:]),
            data(3, PID, 7, OUT, ok()),
        ]
    )
    assert [(s.name, s.start_time, s.end_time) for s in spans] == [("GET /split", at(1), at(3))]


def test_garbage_that_looks_like_a_request_prefix_does_not_hide_the_next_request() -> None:
    """Capture starts inside a text body whose last line could begin a request line ("WORD x"):
    the next read, a clean request, must still claim the connection."""
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, b"NOTE see-attached"),
            data(2, PID, 7, IN, get("/after")),
            data(3, PID, 7, OUT, ok()),
            closed(4, PID, 7),
        ]
    )
    assert [(s.name, s.start_time, s.end_time, s.attributes["url.path"]) for s in spans] == [
        ("GET /after", at(2), at(3), "/after")
    ]
    assert run.total("otel_ebpf.parse.errors") == 0


# ---- protocols no plugin claims -----------------------------------------------------------------

TLS_CLIENT_HELLO = bytes.fromhex("16030100f8010000f40303" + "5a" * 32 + "20" + "c3" * 32 + "0008130213031301c02f0100")


def test_tls_connection_is_given_up_after_the_sniff_budget() -> None:
    key = (PID, 7, 3)
    run = Run()
    events: list[Event] = [opened(0, PID, 7, 3), data(1, PID, 7, OUT, TLS_CLIENT_HELLO, 3)]
    events += [
        data(2 + i, PID, 7, i % 2 and OUT or IN, bytes([0x17, 3, 3, 0, 32]) + bytes(range(i, i + 32)), 3)
        for i in range(SNIFF_MAX_EVENTS - 2)
    ]
    assert run.feed(events) == []
    assert run.unknown == []  # one event short of the budget
    assert run.total("otel_ebpf.connections.unknown_protocol") == 0
    assert run.ciphertext == [] and run.total("otel_ebpf.connections.tls_ciphertext") == 0
    assert run.feed([data(50, PID, 7, IN, b"\x15\x03\x03\x00\x02\x02\x28", 3)]) == []
    assert run.unknown == [key]
    assert run.total("otel_ebpf.connections.unknown_protocol") == 1
    assert run.ciphertext == [key]  # the user is told why (its TLS library is not hooked)
    assert run.total("otel_ebpf.connections.tls_ciphertext") == 1
    # from now on its bytes are ignored, even ones a plugin would have claimed
    assert (
        run.feed(
            [
                data(60, PID, 7, IN, get("/x"), 3),
                data(61, PID, 7, OUT, ok(), 3),
                data(62, PID, 7, IN, b"\x00" * 100, 3, length=5000),
            ]
        )
        == []
    )
    assert run.unknown == [key]
    assert run.total("otel_ebpf.connections.unknown_protocol") == 1
    assert run.total("otel_ebpf.payload.not_captured") == 4900
    assert len(run.tracker) == 1
    run.pipeline.flush()
    assert run.telemetry.take_spans() == []
    assert run.total("otel_ebpf.parse.errors") == 0


def test_unknown_protocol_after_the_byte_budget() -> None:
    run = Run()
    blob = bytes(range(256)) * (SNIFF_MAX_BYTES // 512)  # half the budget, with newlines in it
    assert run.feed([data(1, PID, 7, IN, blob)]) == []
    assert run.unknown == []
    assert run.feed([data(2, PID, 7, IN, blob)]) == []
    assert run.unknown == [(PID, 7, 0)]
    assert run.total("otel_ebpf.connections.unknown_protocol") == 1
    assert run.ciphertext == [] and run.total("otel_ebpf.connections.tls_ciphertext") == 0  # not TLS


def test_tls_record_start() -> None:
    assert tls_record_start(TLS_CLIENT_HELLO)
    assert tls_record_start(b"\x17\x03\x03\x40\x11" + bytes(10))  # application data, 16 KiB + 17
    assert tls_record_start(b"\x15\x03\x03\x00\x02\x02\x28")  # an alert
    assert not tls_record_start(b"\x17\x03\x03\x48\x01")  # longer than a record may be
    assert not tls_record_start(b"\x18\x03\x03\x00\x10")  # no such content type
    assert not tls_record_start(b"\x16\xfe\xfd\x00\x10")  # DTLS 1.2
    assert not tls_record_start(b"\x16\x03\x01")  # too short to tell
    assert not tls_record_start(get("/"))


def test_a_tls_connection_closed_before_the_sniff_budget_is_told() -> None:
    """A short one (a handshake, a request, a response, as curl makes against a server whose TLS
    library is not hooked): judged at its close. Connections still open when the agent stops are
    not judged, and a connection that began with something else is not TLS."""
    run = Run()
    app_data = b"\x17\x03\x03\x00\x20" + bytes(32)
    events: list[Event] = [opened(0, PID, 7), data(1, PID, 7, IN, TLS_CLIENT_HELLO)]
    events += [data(2, PID, 7, OUT, app_data), data(3, PID, 7, IN, app_data), closed(4, PID, 7)]
    events += [opened(5, PID, 8), data(6, PID, 8, IN, b"\x00\x01binary"), closed(7, PID, 8)]
    events += [opened(8, PID, 9), data(9, PID, 9, IN, TLS_CLIENT_HELLO)]
    assert run.feed(events) == []
    run.pipeline.flush()
    assert run.ciphertext == [(PID, 7, 0)] and run.total("otel_ebpf.connections.tls_ciphertext") == 1
    assert run.unknown == [] and run.total("otel_ebpf.connections.unknown_protocol") == 0


def test_a_tls_connection_the_ssl_probes_knew_is_not_told_for_closing_after_its_handshake() -> None:
    """A TLS health check: a handshake, then the close. Its ciphertext reached user space before
    the SSL probes named its socket (a memory-BIO server reads the ClientHello outside any SSL
    call), and no plaintext came; the close says the probes knew it, so its library is hooked."""
    run = Run()
    events: list[Event] = [opened(0, PID, 7), data(1, PID, 7, IN, TLS_CLIENT_HELLO)]
    events.append(ConnClose(at(2), PID, 7, 0, tls=True))
    assert run.feed(events) == []
    assert run.ciphertext == [] and run.total("otel_ebpf.connections.tls_ciphertext") == 0


def test_udp_connection_is_not_offered_to_a_tcp_only_plugin() -> None:
    run = Run()
    events: list[Event] = [opened(0, PID, 5, transport=Transport.UDP)]
    events += [data(1 + i, PID, 5, IN, get(f"/{i}")) for i in range(SNIFF_MAX_EVENTS)]
    assert run.feed(events) == []
    assert run.unknown == [(PID, 5, 0)]
    assert run.total("otel_ebpf.connections.unknown_protocol") == 1


# ---- payload beyond the capture cap -------------------------------------------------------------


def test_bytes_past_the_capture_cap_are_counted_and_content_length_bodies_keep_their_size() -> None:
    cap = 128
    upload_head = b"POST /upload HTTP/1.1\r\nHost: api.local:8080\r\nContent-Length: 1000\r\n\r\n"
    upload = upload_head + b"u" * 1000
    download_head = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n"
    download = download_head + b"d" * 5000
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            # the first syscall is still being sniffed when its gap arrives
            data(1, PID, 7, IN, upload[:cap], length=len(upload)),
            data(2, PID, 7, OUT, download[:cap], length=3000),
            data(3, PID, 7, OUT, download[3000 : 3000 + cap], length=len(download) - 3000),
            data(4, PID, 7, IN, get("/small")),
            data(5, PID, 7, OUT, ok(b"x" * 200)[:cap], length=len(ok(b"x" * 200))),
        ]
    )
    assert [summary(s) for s in spans] == [
        (
            "POST /upload",
            SERVER,
            at(1),
            at(3),
            UNSET,
            None,
            server_attrs("/upload", 200, method="POST", request_body=1000, response_body=5000),
        ),
        ("GET /small", SERVER, at(4), at(5), UNSET, None, server_attrs("/small", 200, response_body=200)),
    ]
    not_captured = (len(upload) - cap) + (3000 - cap) + (len(download) - 3000 - cap) + (len(ok(b"x" * 200)) - cap)
    assert run.total("otel_ebpf.payload.not_captured") == not_captured
    assert run.total("otel_ebpf.parse.errors") == 0


def test_the_last_chunk_the_kernel_read_past_the_cap_ends_a_chunked_body() -> None:
    """A download read many chunks a read (size lines hidden past the cap); the last read ends
    with the last chunk, which the kernel reads apart (a tail): the span ends with that read, and
    the payload not captured is what lies between prefix and tail."""
    cap = 128
    chunk = b"400\r\n" + b"d" * 0x400 + b"\r\n"
    download = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 8 + b"0\r\n\r\n"
    last = data(4, PID, 7, OUT, download[6000 : 6000 + cap], length=len(download) - 6000)
    last.tail = b"\r\n0\r\n\r\n"
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/dl")),
            data(2, PID, 7, OUT, download[:cap], length=3000),
            data(3, PID, 7, OUT, download[3000 : 3000 + cap], length=3000),
            last,
        ]
    )
    ((name, kind, start, end, *_),) = [summary(s) for s in spans]
    assert (name, kind, start, end) == ("GET /dl", SERVER, at(1), at(4))
    assert spans[0].attributes["otel_ebpf.capture.gap"] is True
    assert run.total("otel_ebpf.payload.not_captured") == len(download) - 3 * cap - 7
    assert run.total("otel_ebpf.parse.errors") == 0


def test_a_download_whose_end_the_cap_hid_is_a_span_when_the_agent_stops() -> None:
    """The size lines hidden, the last chunk too: the response is held for its end. The agent
    stops with the connection idle: the exchange is reported, ending at its last read, not
    counted as in flight."""
    cap = 128
    chunk = b"400\r\n" + b"d" * 0x400 + b"\r\n"
    download = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 8 + b"0\r\n\r\n"
    run = Run()
    run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/dl")),
            data(2, PID, 7, OUT, download[:cap], length=3000),
            data(3, PID, 7, OUT, download[3000 : 3000 + cap], length=len(download) - 3000),
            KernelLoss(at(50), 0),
        ]
    )
    run.pipeline.flush()
    (span,) = run.telemetry.take_spans()
    assert (span.name, span.start_time, span.end_time) == ("GET /dl", at(1), at(3))
    assert "error.type" not in span.attributes and span.attributes["otel_ebpf.capture.gap"] is True
    assert run.total("otel_ebpf.spans.shed") == 0


def test_a_request_line_longer_than_the_capture_cap_still_makes_a_span() -> None:
    """A URL of 6 KB (a signed link, a long query): the cap cuts the request line, so the
    connection is claimed by its response; the request is told from the line's first bytes. The
    server reads the line in two syscalls (nginx: 1 KiB first), the client writes it in one."""
    cap = 4096
    request = get("/files/7?sig=" + "s" * 6000)
    server, client = 7, 8
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, server),
            data(1, PID, server, IN, request[:1024]),
            data(2, PID, server, IN, request[1024 : 1024 + cap], length=len(request) - 1024),
            data(3, PID, server, OUT, ok(b"file")),
            opened(4, PID, client, role=Role.CLIENT, local=CLIENT_END, peer=SERVER_END),
            data(5, PID, client, OUT, request[:cap], length=len(request)),
            data(6, PID, client, IN, ok(b"file")),
        ]
    )
    gap = {"otel_ebpf.capture.gap": True}
    server_span, client_span = (summary(span) for span in spans)
    assert server_span == (
        "GET /files/{id}",
        SERVER,
        at(1),
        at(3),
        UNSET,
        None,
        {
            **server_attrs("/files/7", 200, query="sig=REDACTED", request_body=None, response_body=4, extra=gap),
            "server.address": "10.0.0.1",  # the Host header was past the cap: the socket's end
        },
    )
    assert client_span[:5] == ("GET /files/{id}", CLIENT, at(5), at(6), UNSET)
    assert client_span[6]["url.full"] == "http://10.0.0.1:8080/files/7?sig=REDACTED"
    assert client_span[6]["otel_ebpf.capture.gap"] is True
    assert run.total("otel_ebpf.parse.errors") == 0 and run.total("otel_ebpf.connections.unknown_protocol") == 0


# ---- the connection table -----------------------------------------------------------------------


def test_lru_cap_evicts_the_least_recently_used_connections() -> None:
    run = Run(max_connections=3)
    spans = run.feed(
        [
            opened(0, PID, 1),
            opened(1, PID, 2),
            opened(2, PID, 3),
            data(3, PID, 2, IN, get("/two")),
            data(4, PID, 3, IN, get("/three")),
            data(5, PID, 1, IN, get("/one")),  # fd 1, opened first, is now the most recently used
            opened(6, PID, 4),  # evicts fd 2
            opened(7, PID, 5),  # evicts fd 3
        ]
    )
    assert spans == []
    assert len(run.tracker) == 3
    assert run.total("otel_ebpf.connections.tracked") == 3
    assert run.total("otel_ebpf.connections.opened") == 5
    assert run.total("otel_ebpf.connections.evicted") == 2
    # fd 1 kept its pending request; fds 2 and 3 were forgotten with theirs, each counted
    assert [(o.value, o.attributes) for o in run.selfmetrics.observe("otel_ebpf.spans.shed")] == [
        (2, {"reason": "evicted"})
    ]
    spans = run.feed([data(8, PID, 1, OUT, ok()), closed(9, PID, 1), closed(9, PID, 3)])
    assert [(s.name, s.start_time, s.end_time) for s in spans] == [("GET /one", at(5), at(8))]
    assert len(run.tracker) == 2
    assert run.total("otel_ebpf.connections.tracked") == 2
    assert run.total("otel_ebpf.connections.evicted") == 2
    run.pipeline.flush()
    assert run.telemetry.take_spans() == []
    assert run.total("otel_ebpf.connections.tracked") == 0


def test_data_on_a_connection_never_opened_is_tracked_and_its_role_sniffed() -> None:
    run = Run()
    spans = run.feed(
        [
            # a server whose ConnOpen was lost
            data(1, PID, 7, IN, get("/in")),
            data(2, PID, 7, OUT, ok(b"ab")),
            # a client, same process, whose ConnOpen was lost too
            data(
                3, PID, 8, OUT, b"GET http://backend:9000/v1/models?key=s3cr3t HTTP/1.1\r\nHost: backend:9000\r\n\r\n"
            ),
            data(4, PID, 8, IN, ok(b"{}", b"404 Not Found")),
        ]
    )
    assert [summary(s) for s in spans] == [
        (
            "GET /in",
            SERVER,
            at(1),
            at(2),
            UNSET,
            None,
            {
                "http.request.method": "GET",
                "url.path": "/in",
                "url.scheme": "http",
                "server.address": "api.local",
                "server.port": 8080,
                "network.protocol.version": "1.1",
                "http.response.status_code": 200,
                "http.request.body.size": 0,
                "http.response.body.size": 2,
            },
        ),
        (
            "GET /v1/models",
            CLIENT,
            at(3),
            at(4),
            ERROR,
            None,
            {
                "http.request.method": "GET",
                "url.full": "http://backend:9000/v1/models?key=REDACTED",
                "server.address": "backend",
                "server.port": 9000,
                "network.protocol.version": "1.1",
                "http.response.status_code": 404,
                "http.request.body.size": 0,
                "http.response.body.size": 2,
                "error.type": "404",
            },
        ),
    ]
    assert run.total("otel_ebpf.connections.opened") == 2
    table = points(run.telemetry.collect_metrics(at(10)))
    client = attrs(
        http__request__method="GET",
        url__scheme="http",
        network__protocol__version="1.1",
        http__response__status_code=404,
        server__address="backend",
        server__port=9000,
        error__type="404",
    )
    assert table[("unknown_process", "http.client.request.duration", client)].count == 1


def tls(ms: float, pid: int, fd: int, direction: Direction, payload: bytes, tid: int | None = None) -> ConnData:
    """Plaintext from the SSL probes."""
    return ConnData(at(ms), pid, pid if tid is None else tid, fd, 0, direction, len(payload), payload, tls=True)


def test_tls_plaintext_replaces_the_ciphertext_seen_before_it() -> None:
    """The handshake of a connection whose library was hooked late reached user space as
    ciphertext and no plugin claimed it; the plaintext that follows is parsed, as https."""
    handshake = bytes([0x16, 0x03, 0x01, 0x02, 0x00]) + bytes(range(256)) * 2
    run = Run()
    events = [opened(0, PID, 7)] + [data(0.1 * i, PID, 7, IN, handshake) for i in range(1, 17)]
    spans = run.feed(
        [
            *events,
            tls(5, PID, 7, IN, get("/secure")),
            data(5.5, PID, 7, OUT, b"\x17\x03\x03\x00\x20" + bytes(32)),  # ciphertext in flight: ignored
            tls(6, PID, 7, OUT, ok(b"{}")),
        ]
    )
    assert run.unknown == [(PID, 7, 0)]  # the kernel was told to stop copying the ciphertext
    assert [(s.name, s.attributes["url.scheme"], s.attributes["http.response.status_code"]) for s in spans] == [
        ("GET /secure", "https", 200)
    ]
    assert run.total("otel_ebpf.connections.tls") == 1
    assert run.total("otel_ebpf.parse.errors") == 0
    # judged when its budget ran out, before the plaintext came: counted as given up then
    assert run.total("otel_ebpf.connections.tls_ciphertext") == 1


def test_open_sorted_after_its_data_fills_in_the_connection() -> None:
    """Keys are unique per connection (the generation changes when an fd is reused), so a ConnOpen
    for a key in the table announces that very connection, e.g. one recorded before announcements
    were stamped like the data that revealed them: the request is kept and gets its ends."""
    run = Run()
    spans = run.feed([data(1, PID, 7, IN, get("/late-open")), opened(2, PID, 7), data(3, PID, 7, OUT, ok(b"x"))])
    assert [(s.name, s.attributes["client.address"], s.attributes["http.response.status_code"]) for s in spans] == [
        ("GET /late-open", CLIENT_END.address, 200)
    ]
    assert len(run.tracker) == 1
    assert run.total("otel_ebpf.connections.opened") == 1


# ---- ends of connections, processes and the agent -----------------------------------------------


def test_connection_closed_before_the_response_is_an_error_span() -> None:
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/slow")),
            closed(30, PID, 7),
            opened(40, PID, 8),
            data(41, PID, 8, IN, get("/cut")),
            data(42, PID, 8, OUT, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"),
            data(43, PID, 8, OUT, b"0123456789"),
            closed(50, PID, 8),
        ]
    )
    assert [summary(s) for s in spans] == [
        (
            "GET /slow",
            SERVER,
            at(1),
            at(30),
            ERROR,
            "the connection ended before a response",
            server_attrs("/slow", None, error="response_missing"),
        ),
        (
            "GET /cut",
            SERVER,
            at(41),
            at(43),
            ERROR,
            "the connection ended in the middle of the response",
            server_attrs("/cut", 200, response_body=20, error="connection_closed"),
        ),
    ]
    table = points(run.telemetry.collect_metrics(at(100)))
    missing = attrs(
        http__request__method="GET",
        url__scheme="http",
        network__protocol__version="1.1",
        error__type="response_missing",
    )
    point = table[("unknown_process", "http.server.request.duration", missing)]
    assert (point.count, point.sum) == (1, 0.029)
    assert ("unknown_process", "http.server.response.body.size", missing) not in table


def test_process_exit_flushes_only_that_process_and_the_stop_counts_the_rest() -> None:
    run = Run()
    spans = run.feed(
        [
            info(100),
            info(200, environment={"OTEL_SERVICE_NAME": "other"}),
            opened(0, 100, 7),
            opened(0, 100, 8),
            opened(0, 200, 7),
            data(1, 100, 7, IN, get("/a")),
            data(2, 100, 8, IN, get("/b")),
            data(3, 200, 7, IN, get("/c")),
            ProcessExit(at(20), 100),
            KernelLoss(at(25), 0),  # the latest event time, which the final flush uses
        ]
    )
    assert [
        (s.name, s.start_time, s.end_time, s.attributes["error.type"], s.resource.attributes["process.pid"])
        for s in spans
    ] == [("GET /a", at(1), at(20), "response_missing", 100), ("GET /b", at(2), at(20), "response_missing", 100)]
    assert all(s.attributes["otel_ebpf.process.exited"] is True for s in spans)  # cut by the exit
    assert len(run.tracker) == 1
    assert run.total("otel_ebpf.connections.tracked") == 1
    run.pipeline.flush()  # the agent stops: /c is in flight, not failed
    assert run.telemetry.take_spans() == []
    assert run.selfmetrics.snapshot()["otel_ebpf.spans.shed"] == 1
    assert len(run.tracker) == 0
    assert run.total("otel_ebpf.connections.tracked") == 0


def test_flush_finishes_nothing_that_is_complete_twice() -> None:
    run = Run()
    spans = run.feed([opened(0, PID, 7), data(1, PID, 7, IN, get("/done")), data(2, PID, 7, OUT, ok())])
    assert len(spans) == 1
    run.pipeline.flush()
    assert run.telemetry.take_spans() == []


def test_kernel_loss_and_received_events_are_counted() -> None:
    run = Run()
    run.feed([KernelLoss(at(1), 7), KernelLoss(at(3), 0), KernelLoss(at(2), 35), info(PID, ms=0)])
    assert run.total("otel_ebpf.events.lost") == 42
    assert run.total("otel_ebpf.events.received") == 4
    # the time a final flush uses is the latest seen, even when events arrive out of order
    assert run.pipeline.last_timestamp_ns == at(3)


# ---- resources ---------------------------------------------------------------------------------


def test_each_process_gets_its_own_resource() -> None:
    extra = {"deployment.environment.name": "staging", "k8s.cluster.name": "c1", "service.name": "agent-default"}
    run = Run(extra=extra)
    spans = run.feed(
        [
            info(
                1,
                "/usr/bin/python3.11",
                "python3 serve.py --api-key sekrit --port 8080",
                {
                    "OTEL_SERVICE_NAME": "svc",
                    "OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored,deployment.environment.name=prod,team=ml%20infra",
                    "PATH": "/usr/bin",
                },
            ),
            info(2, "/opt/app/bin/worker", "worker", {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs"}),
            info(3, "/usr/local/bin/uvicorn", "uvicorn main:app"),
            info(4, "", "node server.js"),
            *[e for pid in (1, 2, 3, 4) for e in (data(pid, pid, 7, IN, get("/")), data(pid + 0.5, pid, 7, OUT, ok()))],
            data(9, 5, 7, IN, get("/")),
            data(10, 5, 7, OUT, ok()),  # no identity: overflow resource
        ]
    )
    resources = [dict(s.resource.attributes) for s in spans]

    def own(pid: int, exe: str, name: str, cmd: str, service: str, **more: str) -> dict:
        return {
            "deployment.environment.name": "staging",
            "k8s.cluster.name": "c1",
            "host.name": HOST,
            "process.pid": pid,
            "process.executable.name": name,
            "process.executable.path": exe,
            "process.command_line": cmd,
            "service.instance.id": f"{HOST}/{pid}",
            **more,
            "service.name": service,
            **SDK,
        }

    assert resources == [
        own(
            1,
            "/usr/bin/python3.11",
            "python3.11",
            "python3 serve.py --api-key REDACTED --port 8080",
            "svc",
            **{"deployment.environment.name": "prod", "team": "ml infra"},
        ),
        own(2, "/opt/app/bin/worker", "worker", "worker", "from-attrs"),
        own(3, "/usr/local/bin/uvicorn", "uvicorn", "uvicorn main:app", "uvicorn"),
        own(4, "", "node", "node server.js", "node"),
        {
            "deployment.environment.name": "staging",
            "k8s.cluster.name": "c1",
            "service.name": "unknown_process",
            "host.name": HOST,
            **SDK,
        },
    ]
    # metrics carry the same resources
    metric_resources = [dict(rm.resource.attributes) for rm in run.telemetry.collect_metrics(at(20))]
    assert metric_resources == resources


def test_processes_past_max_processes_share_the_overflow_resource() -> None:
    run = Run(max_processes=2)
    spans = run.feed(
        [
            info(1, "/bin/a"),
            info(2, "/bin/b"),
            info(3, "/bin/c"),
            info(3, "/bin/c"),
            *[e for pid in (1, 2, 3) for e in (data(pid, pid, 7, IN, get("/")), data(pid + 0.5, pid, 7, OUT, ok()))],
        ]
    )
    assert [s.resource.attributes["service.name"] for s in spans] == ["a", "b", "unknown_process"]
    assert run.total("otel_ebpf.resources.overflow") == 2
    assert [rm.resource.attributes["service.name"] for rm in run.telemetry.collect_metrics(at(10))] == [
        "a",
        "b",
        "unknown_process",
    ]


def test_the_overflow_resource_takes_no_process_slot() -> None:
    """Spans of a process whose identity was lost must not push a real process out of the table."""
    run = Run(max_processes=2)
    spans = run.feed(
        [
            data(1, 9, 7, IN, get("/")),
            data(2, 9, 7, OUT, ok()),  # pid 9: no ProcessInfo
            info(1, "/bin/a"),
            info(2, "/bin/b"),
            data(3, 1, 7, IN, get("/")),
            data(4, 1, 7, OUT, ok()),
            data(5, 2, 7, IN, get("/")),
            data(6, 2, 7, OUT, ok()),
        ]
    )
    assert [s.resource.attributes["service.name"] for s in spans] == ["unknown_process", "a", "b"]
    assert run.total("otel_ebpf.resources.overflow") == 0


def test_kernel_counts_of_a_process_forgotten_after_its_grace_come_back_to_its_resource() -> None:
    """On a loaded agent, or at the final read when it stops, the kernel's last counts of a process
    can come after its grace: they land on its own resource (its series go on), collected once
    more, not on the overflow resource."""
    run = Run(kernel_http_metrics=True)
    run.feed([info(1, "/bin/a"), ProcessExit(at(3), 1)])
    run.telemetry.collect_metrics(at(3) + EXITED_GRACE_NS)  # forgotten
    run.feed([counts(4, 1, Role.SERVER, 200, 1, 2.0, (1,) + (0,) * 14)])
    (late,) = run.telemetry.collect_metrics(at(3) + EXITED_GRACE_NS + 1000 * MS)
    assert late.resource.attributes["service.name"] == "a"
    assert run.telemetry.collect_metrics(at(3) + EXITED_GRACE_NS + 2000 * MS) == []  # and forgotten again


def test_exited_processes_are_forgotten_at_the_first_collection_past_the_grace() -> None:
    run = Run(max_processes=1)
    run.feed([info(1, "/bin/a"), data(1, 1, 7, IN, get("/")), data(2, 1, 7, OUT, ok()), ProcessExit(at(3), 1)])
    # its last points are still collected, under its own resource, until a collection
    # EXITED_GRACE_NS after its exit (the kernel's last counts of its requests may still come)
    for collected_at in (at(10), at(3) + EXITED_GRACE_NS):
        collected = run.telemetry.collect_metrics(collected_at)
        assert [(rm.resource.attributes["service.name"], len(points([rm]))) for rm in collected] == [("a", 3)]
    assert run.telemetry.collect_metrics(at(3) + EXITED_GRACE_NS + MS) == []
    # its slot is free again: a new process gets its own resource, no overflow
    spans = run.feed(
        [
            info(2, "/bin/b"),
            data(21, 2, 7, IN, get("/")),
            data(22, 2, 7, OUT, ok()),
            data(23, 1, 8, IN, get("/")),
            data(24, 1, 8, OUT, ok()),
        ]
    )
    assert [s.resource.attributes["service.name"] for s in spans] == ["b", "unknown_process"]
    assert run.total("otel_ebpf.resources.overflow") == 0


def test_exec_keeps_the_old_images_uncollected_points() -> None:
    """After exec a process announces a new identity; what its old image recorded is not lost."""
    run = Run()
    spans = run.feed(
        [
            info(1, "/bin/sh", "sh -c ./server"),
            data(1, 1, 7, IN, get("/")),
            data(2, 1, 7, OUT, ok()),
            info(1, "/srv/server", "./server", ms=3),
            data(4, 1, 8, IN, get("/")),
            data(5, 1, 8, OUT, ok()),
        ]
    )
    assert [s.resource.attributes["service.name"] for s in spans] == ["sh", "server"]
    collected = run.telemetry.collect_metrics(at(10))
    durations = {
        rm.resource.attributes["service.name"]: (p.count, p.start_time_unix_nano, p.time_unix_nano)
        for rm in collected
        for (_, name, _), p in points([rm]).items()
        if name == "http.server.request.duration"
    }
    # the old image's series end when it was replaced
    assert durations == {"sh": (1, at(2), at(3)), "server": (1, at(5), at(10))}
    assert [rm.resource.attributes["service.name"] for rm in run.telemetry.collect_metrics(at(20))] == ["server"]


def test_delta_temporality_restarts_series_after_each_collection() -> None:
    run = Run(delta="delta")
    run.feed([info(1, "/bin/a"), data(1, 1, 7, IN, get("/")), data(2, 1, 7, OUT, ok(b"abc"))])
    key = (
        "a",
        "http.server.response.body.size",
        attrs(
            http__request__method="GET",
            url__scheme="http",
            network__protocol__version="1.1",
            http__response__status_code=200,
        ),
    )
    first = points(run.telemetry.collect_metrics(at(10)))[key]
    assert (first.count, first.sum, first.start_time_unix_nano, first.time_unix_nano) == (1, 3, at(2), at(10))
    assert run.telemetry.collect_metrics(at(20)) == []
    run.feed([data(30, 1, 7, IN, get("/")), data(31, 1, 7, OUT, ok(b"abcde"))])
    rms = run.telemetry.collect_metrics(at(40))
    second = points(rms)[key]
    assert (second.count, second.sum, second.start_time_unix_nano, second.time_unix_nano) == (1, 5, at(31), at(40))
    assert {m.data.aggregation_temporality for m in rms[0].scope_metrics[0].metrics} == {AggregationTemporality.DELTA}


# ---- hostile input -----------------------------------------------------------------------------

_HTTP_PIECES = [
    get("/a"),
    get("/b?q=1"),
    ok(b"hello"),
    ok(),
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"POST /p HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"HEAD / HTTP/1.1\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    b"CONNECT h:443 HTTP/1.1\r\n\r\n",
    TLS_CLIENT_HELLO,
    b"\r\n",
    b"GE",
    b"HTTP/1.",
]


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(st.binary(max_size=64))
    piece = draw(st.sampled_from(_HTTP_PIECES))
    if kind == 1:
        return piece
    cut = draw(st.integers(0, len(piece)))
    return piece[:cut] if draw(st.booleans()) else piece[cut:]


@st.composite
def event_streams(draw: st.DrawFn) -> list[Event]:
    events: list[Event] = []
    t = T0
    for _ in range(draw(st.integers(0, 60))):
        t += draw(st.integers(0, 5 * MS))
        pid, fd, gen = draw(st.integers(1, 3)), draw(st.integers(3, 5)), draw(st.integers(0, 1))
        kind = draw(st.sampled_from(["data"] * 6 + ["open", "close", "exit", "info", "loss"]))
        if kind == "data":
            payload = draw(payloads())
            length = len(payload) + draw(st.sampled_from([0, 0, 0, 1, 100, 70_000]))
            events.append(ConnData(t, pid, pid * 10, fd, gen, draw(st.sampled_from([IN, OUT])), length, payload))
        elif kind == "open":
            role = draw(st.sampled_from([Role.SERVER, Role.CLIENT, None]))
            transport = draw(st.sampled_from([Transport.TCP, Transport.TCP, Transport.UDP]))
            ends = draw(st.sampled_from([(SERVER_END, CLIENT_END), (None, None), (Endpoint("::1", 1), None)]))
            events.append(ConnOpen(t, pid, fd, gen, role, *ends, transport))
        elif kind == "close":
            events.append(ConnClose(t, pid, fd, gen))
        elif kind == "exit":
            events.append(ProcessExit(t, pid))
        elif kind == "info":
            env = draw(st.sampled_from([{}, {"OTEL_SERVICE_NAME": "s"}, {"OTEL_RESOURCE_ATTRIBUTES": "a=%zz,=,b"}]))
            events.append(ProcessInfo(t, pid, draw(st.sampled_from(["", "/bin/x"])), "x --token t", env))
        else:
            events.append(KernelLoss(t, draw(st.integers(0, 3))))
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_streams(), st.integers(1, 4))
def test_random_event_streams_never_raise_and_stay_bounded(events: list[Event], cap: int) -> None:
    outputs = []
    for _ in range(2):
        run = Run(max_connections=cap, max_processes=2)
        for event in events:
            run.pipeline.handle([event])
            assert len(run.tracker) <= cap
            assert run.total("otel_ebpf.connections.tracked") == len(run.tracker)
        run.pipeline.flush()
        assert len(run.tracker) == 0
        spans = run.telemetry.take_spans()
        for span in spans:
            assert span.start_time <= span.end_time
        metrics = run.telemetry.collect_metrics(run.pipeline.last_timestamp_ns)
        outputs.append(
            ([(ids(s), summary(s)) for s in spans], [rm.to_json() for rm in metrics], run.selfmetrics.snapshot())
        )
        assert run.total("otel_ebpf.events.received") == len(events)
    assert outputs[0] == outputs[1]


# ---- what the kernel summarised and shed (bpf/http1_summary.h) ---------------------------------


def test_events_after_a_loss_drop_the_partial_exchange_it_left() -> None:
    """The kernel lost /a's response (and counted the exchange as shed): the next event says so,
    /a is dropped unreported instead of becoming a failed span, /b is whole."""
    run = Run()
    lost_then = ConnData(at(20), PID, PID, 7, 0, IN, len(get("/b")), get("/b"), after_loss=True)
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/a")),
            lost_then,
            data(21, PID, 7, OUT, ok(b"b")),
            closed(30, PID, 7),
        ]
    )
    assert [(s.name, s.start_time, s.end_time, s.status.status_code) for s in spans] == [
        ("GET /b", at(20), at(21), UNSET)
    ]
    assert run.total("otel_ebpf.messages.unmatched") == 0


def test_a_close_after_a_loss_reports_no_failed_request() -> None:
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/a")),
            ConnClose(at(30), PID, 7, 0, after_loss=True),
        ]
    )
    assert spans == []


def test_a_close_of_a_socket_that_answered_unseen_counts_its_waiting_requests() -> None:
    """A server answering through splice or io_uring: its reads show the requests, no syscall
    shows the responses, and its close says the socket moved bytes outside the syscalls. What was
    answered where the agent could see is a span; the requests still waiting are counted
    ``response_unseen``, not reported as failed (``response_missing``)."""
    run = Run()
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/a")),
            data(2, PID, 7, OUT, ok(b"a")),
            data(3, PID, 7, IN, get("/b")),
            data(4, PID, 7, IN, get("/c")),
            ConnClose(at(30), PID, 7, 0, unseen_io=True),
        ]
    )
    assert [(s.name, s.status.status_code) for s in spans] == [("GET /a", UNSET)]
    assert run.total("otel_ebpf.spans.shed") == 2  # response_unseen: nothing else was shed


def test_a_response_the_close_ends_is_a_span_on_a_socket_that_answered_unseen() -> None:
    run = Run()
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nthe body"
    spans = run.feed(
        [
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/a")),
            data(2, PID, 7, OUT, until_close),
            ConnClose(at(30), PID, 7, 0, unseen_io=True),
        ]
    )
    assert [(s.name, s.status.status_code, s.end_time) for s in spans] == [("GET /a", UNSET, at(2))]
    assert run.total("otel_ebpf.spans.shed") == 0


def counts(
    ms: float,
    pid: int,
    role: Role,
    status: int,
    count: int,
    sum_ms: float,
    buckets: tuple[int, ...],
    server_address: str = "",
    server_port: int = 8080,
) -> HttpRequestCounts:
    return HttpRequestCounts(
        at(ms),
        pid,
        role,
        "GET",
        status,
        "1.1",
        False,
        server_address,
        server_port,
        count,
        int(sum_ms * MS),
        buckets,
        1 * MS,
        30 * MS,
    )


def test_kernel_counts_are_the_duration_histograms_and_exchanges_add_none() -> None:
    run = Run(kernel_http_metrics=True)
    buckets = (2, 1) + (0,) * 13
    run.feed(
        [
            info(PID),
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/a")),
            data(2, PID, 7, OUT, ok(b"a")),
            counts(5, PID, Role.SERVER, 200, 3, 12.0, buckets),
            counts(6, PID, Role.CLIENT, 503, 1, 30.0, (0,) * 3 + (1,) + (0,) * 11, "10.0.0.9", 9000),
            counts(7, PID, Role.SERVER, 200, 1, 2.0, (1,) + (0,) * 14),
            counts(8, PID, Role.SERVER, 0, 2, 4.0, (2,) + (0,) * 14),  # closed before any response
        ]
    )
    table = points(run.telemetry.collect_metrics(at(100)))
    server = attrs(
        http__request__method="GET",
        url__scheme="http",
        network__protocol__version="1.1",
        http__response__status_code=200,
    )
    point = table[("python3", "http.server.request.duration", server)]
    assert (point.count, point.sum, list(point.bucket_counts)) == (4, 0.014, [3, 1] + [0] * 13)
    assert (point.min, point.max) == (0.001, 0.03)
    assert list(point.explicit_bounds) == list(DURATION_BUCKETS)
    client = attrs(
        http__request__method="GET",
        url__scheme="http",
        network__protocol__version="1.1",
        http__response__status_code=503,
        server__address="10.0.0.9",
        server__port=9000,
        error__type="503",
    )
    assert table[("python3", "http.client.request.duration", client)].count == 1
    unanswered = attrs(
        http__request__method="GET",
        url__scheme="http",
        network__protocol__version="1.1",
        error__type="response_missing",
    )
    assert table[("python3", "http.server.request.duration", unanswered)].count == 2
    # the exchange still gives its body sizes; its duration is the kernel's to count
    assert ("python3", "http.server.response.body.size", server) in table
    assert sum(1 for key in table if key[1] == "http.server.request.duration") == 2


def test_sampling_keeps_errors_and_slow_requests_and_counts_the_rest_metrics_untouched() -> None:
    run = Run(sampler=SpanSampler(1e-9, keep_slower_than_ns=50 * MS))  # plain spans: (almost) never
    spans = run.feed(
        [
            info(PID),
            opened(0, PID, 7),
            data(1, PID, 7, IN, get("/fast")),
            data(2, PID, 7, OUT, ok(b"a")),
            data(3, PID, 7, IN, get("/boom")),
            data(4, PID, 7, OUT, ok(status=b"500 Internal Server Error")),
            data(5, PID, 7, IN, get("/slow")),
            data(60, PID, 7, OUT, ok(b"c")),
        ]
    )
    assert [s.name for s in spans] == ["GET /boom", "GET /slow"]
    assert run.selfmetrics.snapshot()["otel_ebpf.spans.shed"] == 1
    table = points(run.telemetry.collect_metrics(at(100)))
    durations = [p for key, p in table.items() if key[1] == "http.server.request.duration"]
    assert sum(p.count for p in durations) == 3


# ---- a plugin that raises costs its connection, not the agent -------------------------------------


class _Raising(Protocol):
    """Claims connections that start with ``BOOM``; its session raises on ``die`` and on close."""

    name = "raising"
    transports = frozenset({Transport.TCP})

    def sniff(self, direction: Direction, data: bytes) -> Sniff:
        return Sniff(data.startswith(b"BOOM"), role=Role.SERVER)

    def new_session(self, role: Role) -> Session:
        class Dying(Session):
            def feed(self, direction: Direction, data: bytes, timestamp_ns: int) -> list:
                if b"die" in data:
                    raise KeyError("a plugin bug")
                return []

            def feed_gap(self, direction: Direction, length: int, timestamp_ns: int) -> list:
                return []

            def close(self, timestamp_ns: int) -> list:
                raise ValueError("a plugin bug on close")

        return Dying()

    def new_stitcher(self, role: Role) -> Stitcher:
        return PROTOCOLS[0].new_stitcher(role)


def test_a_plugin_that_raises_costs_only_its_connection() -> None:
    selfmetrics = SelfMetrics()
    unknown: list[ConnKey] = []
    tracker = ConnectionTracker([_Raising(), *PROTOCOLS], selfmetrics, on_unknown=unknown.append)
    telemetry = Telemetry(PROTOCOLS, HOST, {}, selfmetrics, 1024, DELTA_KINDS["cumulative"], False, None)
    pipeline = Pipeline(tracker, telemetry, selfmetrics, reorderer=EventReorderer(selfmetrics, window_ns=0))
    pipeline.handle(
        [
            opened(0, 10, 3),
            opened(0, 10, 4),
            opened(0, 10, 5),
            data(1, 10, 3, IN, b"BOOM hello"),
            data(2, 10, 3, IN, b"then die"),  # given up here
            data(3, 10, 3, IN, b"more die"),  # ignored: the connection is left alone
            data(1, 10, 4, IN, b"BOOM quiet"),
            closed(5, 10, 4),  # raises on close
            data(4, 10, 5, IN, get("/a")),
            data(5, 10, 5, OUT, ok(b"hi")),
        ]
    )
    spans = telemetry.take_spans()
    assert [s.name for s in spans] == ["GET /a"]
    assert selfmetrics.total("otel_ebpf.protocol.failures") == 2
    assert [o.attributes for o in selfmetrics.observe("otel_ebpf.protocol.failures")] == [{"protocol": "raising"}]
    assert unknown == [(10, 3, 0), (10, 4, 0)]


@pytest.mark.parametrize(
    ("peer", "joined"),
    [(Endpoint("10.0.0.9", 51000), True), (Endpoint("127.0.0.1", 51000), False), (Endpoint("::1", 51000), False)],
)
def test_spans_of_a_connection_between_hosts_carry_its_initial_sequence_numbers(peer: Endpoint, joined: bool) -> None:
    isns = (0xDEADBEEF, 7)
    opening = replace(opened(0, PID, 7, peer=peer), client_isn=isns[0], server_isn=isns[1])
    spans = Run().feed([opening, data(1, PID, 7, IN, get("/a")), data(2, PID, 7, OUT, ok()), closed(3, PID, 7)])
    assert len(spans) == 1
    attributes = spans[0].attributes
    expected = isns if joined else (None, None)
    assert (attributes.get("otel_ebpf.tcp.client_isn"), attributes.get("otel_ebpf.tcp.server_isn")) == expected


def test_an_exchange_during_which_its_socket_retransmitted_says_how_many_times() -> None:
    """Data events carry the socket's running retransmission count: an exchange's span carries
    what it grew by between the exchange's first syscall and its last; before the first and
    after the last does not count."""

    def counted(event: ConnData, retransmissions: int) -> ConnData:
        return replace(event, retransmissions=retransmissions)

    events = [opened(0, PID, 7)]
    running = 0
    for i, (during, after) in enumerate([(3, 0), (0, 2), (0, 0), (1, 1)] + [(1, 0)] * 12):
        start = 10 * i + 1
        events.append(counted(data(start, PID, 7, IN, get(f"/{i}")), running))
        running += during
        events.append(counted(data(start + 1, PID, 7, OUT, ok()), running))
        running += after  # seen by the next exchange's first syscall: not in either
    spans = Run().feed([*events, closed(500, PID, 7)])
    on_spans = [s.attributes.get("otel_ebpf.tcp.retransmissions") for s in spans]
    # more changes than the connection keeps marks of: the oldest are summed up, the rest exact
    assert on_spans == [3, None, None, 1] + [1] * 12
