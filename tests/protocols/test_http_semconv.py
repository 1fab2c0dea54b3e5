"""HTTP semantic conventions: span names, attributes, redaction, status and metric points."""

from __future__ import annotations

import pytest

from otel_ebpf.protocol import (
    Attributes,
    ConnectionInfo,
    Endpoint,
    InstrumentKind,
    MetricPoint,
    Role,
    SpanKind,
    StatusCode,
    Transport,
)
from otel_ebpf.protocols.http_semconv import (
    DURATION_BUCKETS,
    HTTP_INSTRUMENTS,
    HttpTransaction,
    describe_span,
    is_secret_header,
    metric_points,
    redact_query,
    route_template,
    split_authority,
    split_target,
)

SERVER_CONN = ConnectionInfo(Role.SERVER, local=Endpoint("10.0.0.5", 8080), peer=Endpoint("10.0.0.9", 51234))
CLIENT_CONN = ConnectionInfo(Role.CLIENT, local=Endpoint("10.0.0.9", 51234), peer=Endpoint("10.0.0.5", 8080))


def tx(**fields: object) -> HttpTransaction:
    base: dict[str, object] = dict(
        method="GET",
        target="/users/123/orders/9f1c2b3a4d5e6f708192a3b4c5d6e7f8?page=2&token=s3cr3t",
        version="1.1",
        start_ns=1_000_000_000,
        end_ns=1_250_000_000,
        request_headers=(
            ("host", "api.example.com"),
            ("user-agent", "curl/8.5.0"),
            ("authorization", "Bearer abc"),
        ),
        request_body_size=0,
        authority="api.example.com",
        status=200,
        response_headers=(
            ("content-type", "application/json"),
            ("set-cookie", "sid=1"),
            ("set-cookie", "x=2"),
        ),
        response_body_size=42,
    )
    base.update(fields)
    return HttpTransaction(**base)  # type: ignore[arg-type]


def test_server_span() -> None:
    span = describe_span(tx(), SERVER_CONN)
    assert span.name == "GET /users/{id}/orders/{hash}"
    assert span.kind is SpanKind.SERVER
    assert (span.start_ns, span.end_ns) == (1_000_000_000, 1_250_000_000)
    assert span.status is StatusCode.UNSET and span.status_description is None
    assert span.attributes == {
        "http.request.method": "GET",
        "url.path": "/users/123/orders/9f1c2b3a4d5e6f708192a3b4c5d6e7f8",
        "url.query": "page=REDACTED&token=REDACTED",
        "url.scheme": "http",
        "server.address": "api.example.com",
        "server.port": 80,
        "client.address": "10.0.0.9",
        "client.port": 51234,
        "network.peer.address": "10.0.0.9",
        "network.peer.port": 51234,
        "network.protocol.version": "1.1",
        "http.response.status_code": 200,
        "user_agent.original": "curl/8.5.0",
        "http.request.body.size": 0,
        "http.response.body.size": 42,
    }


def test_client_span() -> None:
    span = describe_span(tx(authority="api.example.com:8443", method="POST", request_body_size=7), CLIENT_CONN)
    assert span.name == "POST /users/{id}/orders/{hash}"
    assert span.kind is SpanKind.CLIENT
    assert span.attributes == {
        "http.request.method": "POST",
        "url.full": "http://api.example.com:8443/users/123/orders/9f1c2b3a4d5e6f708192a3b4c5d6e7f8"
        "?page=REDACTED&token=REDACTED",
        "server.address": "api.example.com",
        "server.port": 8443,
        "network.peer.address": "10.0.0.5",
        "network.peer.port": 8080,
        "network.protocol.version": "1.1",
        "http.response.status_code": 200,
        "http.request.body.size": 7,
        "http.response.body.size": 42,
    }


def test_without_host_the_socket_names_the_server() -> None:
    plain = tx(authority=None, target="/", request_headers=())
    assert describe_span(plain, CLIENT_CONN).attributes["url.full"] == "http://10.0.0.5:8080/"
    attributes = describe_span(plain, SERVER_CONN).attributes
    assert (attributes["server.address"], attributes["server.port"]) == ("10.0.0.5", 8080)
    tls = ConnectionInfo(Role.CLIENT, peer=Endpoint("::1", 443), scheme="https")
    assert describe_span(plain, tls).attributes["url.full"] == "https://[::1]/"
    unknown = ConnectionInfo(Role.CLIENT)
    assert "url.full" not in describe_span(plain, unknown).attributes


def test_over_a_unix_socket_the_host_names_the_server_else_the_path_does_without_a_url() -> None:
    path, unnamed = Endpoint("/run/app.sock", 0, 7), Endpoint("", 0, 8)
    client = ConnectionInfo(Role.CLIENT, unnamed, path, Transport.UNIX)
    server = ConnectionInfo(Role.SERVER, path, unnamed, Transport.UNIX)
    named = describe_span(tx(authority="localhost", request_headers=(("host", "localhost"),)), client).attributes
    assert (named["server.address"], named["server.port"]) == ("localhost", 80)
    assert named["url.full"].startswith("http://localhost/users/123/")
    assert (named["network.transport"], named["network.peer.address"]) == ("unix", "/run/app.sock")
    hostless = tx(authority=None, version="1.0", request_headers=())
    for conn in (client, server):
        attributes = describe_span(hostless, conn).attributes
        assert attributes["server.address"] == "/run/app.sock" and "url.full" not in attributes
        assert not {"server.port", "network.peer.port", "client.address", "client.port"} & set(attributes)
    assert "network.peer.address" not in describe_span(hostless, server).attributes


def test_absolute_form_target_names_the_origin() -> None:
    proxied = tx(target="http://origin.example:81/a/b?x=1", authority="proxy.local")
    attributes = describe_span(proxied, CLIENT_CONN).attributes
    assert attributes["url.full"] == "http://origin.example:81/a/b?x=REDACTED"
    assert (attributes["server.address"], attributes["server.port"]) == ("origin.example", 81)
    assert describe_span(proxied, SERVER_CONN).attributes["url.path"] == "/a/b"


def test_connect_span_is_named_by_method_only() -> None:
    span = describe_span(tx(method="CONNECT", target="db.internal:5432", authority=None), CLIENT_CONN)
    assert span.name == "CONNECT"
    assert (span.attributes["server.address"], span.attributes["server.port"]) == (
        "db.internal",
        5432,
    )


def test_forwarded_client() -> None:
    forwarded = tx(request_headers=(("x-forwarded-for", "203.0.113.7, 10.0.0.1"),))
    attributes = describe_span(forwarded, SERVER_CONN).attributes
    assert attributes["client.address"] == "203.0.113.7"
    assert "client.port" not in attributes
    assert attributes["network.peer.address"] == "10.0.0.9"


def test_captured_headers_never_leak_secrets() -> None:
    allow = frozenset({"authorization", "content-type", "set-cookie", "x-session-token", "absent"})
    headers = (
        ("authorization", "Bearer abc"),
        ("x-session-token", "t"),
        ("content-type", "text/plain"),
    )
    span = describe_span(tx(request_headers=headers), SERVER_CONN, allow)
    captured = {k: v for k, v in span.attributes.items() if ".header." in k}
    assert captured == {
        "http.request.header.authorization": ("REDACTED",),
        "http.request.header.x-session-token": ("REDACTED",),
        "http.request.header.content-type": ("text/plain",),
        "http.response.header.content-type": ("application/json",),
        "http.response.header.set-cookie": ("REDACTED", "REDACTED"),
    }
    assert "Bearer abc" not in repr(span) and "sid=1" not in repr(span)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("authorization", True),
        ("proxy-authorization", True),
        ("cookie", True),
        ("set-cookie", True),
        ("x-api-key", True),
        ("api-key", True),
        ("x-auth-token", True),
        ("x-csrf-token", True),
        ("x-client-secret", True),
        ("x-db-password", True),
        ("x-apikey", True),
        ("x-goog-api-key", True),
        ("content-type", False),
        ("user-agent", False),
        ("x-request-id", False),
        ("traceparent", False),
    ],
)
def test_secret_headers(name: str, secret: bool) -> None:
    assert is_secret_header(name) is secret


@pytest.mark.parametrize(
    ("query", "redacted"),
    [
        ("a=1&b=2", "a=REDACTED&b=REDACTED"),
        ("flag&x=", "flag&x=REDACTED"),
        ("sig=a=b", "sig=REDACTED"),
        ("", ""),
    ],
)
def test_redact_query(query: str, redacted: str) -> None:
    assert redact_query(query) == redacted


def test_empty_query_is_left_out() -> None:
    assert "url.query" not in describe_span(tx(target="/a?"), SERVER_CONN).attributes


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/", "/"),
        ("/users/123/orders/456", "/users/{id}/orders/{id}"),
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/items/550e8400-e29b-41d4-a716-446655440000", "/items/{uuid}"),
        ("/items/550E8400-E29B-41D4-A716-446655440000/", "/items/{uuid}/"),
        ("/blobs/sha256/9f86d081884c7d659a2feaa0c55ad015", "/blobs/sha256/{hash}"),
        ("/trace/4bf92f3577b34da6a3ce929d0e0e4736", "/trace/{hash}"),
        ("/reports/2024-05-01", "/reports/{date}"),
        ("/reports/2024-05-01T10:00:00Z/csv", "/reports/{date}/csv"),
        ("/reset/eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "/reset/{token}"),
        ("/keys/AKIAIOSFODNN7EXAMPLE", "/keys/{token}"),
        ("/orders/order-12345", "/orders/{id}"),
        ("/files/report.pdf", "/files/report.pdf"),
        ("/apis/apps/v1/namespaces/default", "/apis/apps/v1/namespaces/default"),
        ("/getUserProfileSettings", "/getUserProfileSettings"),
        ("/a//b", "/a//b"),
        ("/ipv4/sha256/http2", "/ipv4/sha256/http2"),
    ],
)
def test_route_template(path: str, template: str) -> None:
    assert route_template(path) == template


def test_query_never_enters_the_name() -> None:
    assert describe_span(tx(target="/search?q=secret"), SERVER_CONN).name == "GET /search"


@pytest.mark.parametrize("method", ["PURGE", "get", "PROPFIND", "\x00"])
def test_unknown_methods(method: str) -> None:
    span = describe_span(tx(method=method, target="/x"), SERVER_CONN)
    assert span.name == "HTTP /x"
    assert span.attributes["http.request.method"] == "_OTHER"
    assert span.attributes["http.request.method_original"] == method
    (duration, *_) = metric_points(tx(method=method), SERVER_CONN)
    assert duration.attributes["http.request.method"] == "_OTHER"


@pytest.mark.parametrize(
    ("status", "role", "error"),
    [
        (200, Role.SERVER, None),
        (404, Role.SERVER, None),
        (499, Role.SERVER, None),
        (500, Role.SERVER, "500"),
        (503, Role.SERVER, "503"),
        (302, Role.CLIENT, None),
        (400, Role.CLIENT, "400"),
        (404, Role.CLIENT, "404"),
        (599, Role.CLIENT, "599"),
        (101, Role.CLIENT, None),
    ],
)
def test_status(status: int, role: Role, error: str | None) -> None:
    conn = SERVER_CONN if role is Role.SERVER else CLIENT_CONN
    span = describe_span(tx(status=status), conn)
    assert span.status is (StatusCode.ERROR if error else StatusCode.UNSET)
    assert span.attributes.get("error.type") == error
    assert span.status_description is None


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_no_response(role: Role) -> None:
    conn = SERVER_CONN if role is Role.SERVER else CLIENT_CONN
    span = describe_span(tx(status=None, response_headers=(), response_body_size=None), conn)
    assert span.status is StatusCode.ERROR
    assert span.attributes["error.type"] == "response_missing"
    assert "http.response.status_code" not in span.attributes
    assert "http.response.body.size" not in span.attributes
    assert span.status_description


def test_response_cut_short() -> None:
    span = describe_span(tx(error="connection_closed"), CLIENT_CONN)
    assert (span.status, span.attributes["error.type"]) == (StatusCode.ERROR, "connection_closed")
    assert span.attributes["http.response.status_code"] == 200


def test_server_metric_points() -> None:
    attributes: Attributes = {
        "http.request.method": "GET",
        "url.scheme": "http",
        "network.protocol.version": "1.1",
        "http.response.status_code": 503,
        "error.type": "503",
    }
    assert metric_points(tx(status=503), SERVER_CONN) == [
        MetricPoint("http.server.request.duration", 0.25, attributes),
        MetricPoint("http.server.request.body.size", 0, attributes),
        MetricPoint("http.server.response.body.size", 42, attributes),
    ]


def test_client_metric_points() -> None:
    attributes: Attributes = {
        "http.request.method": "GET",
        "url.scheme": "https",
        "network.protocol.version": "1.1",
        "server.address": "api.example.com",
        "server.port": 443,
        "error.type": "response_missing",
    }
    tls = ConnectionInfo(Role.CLIENT, peer=Endpoint("10.0.0.5", 443), scheme="https")
    missing = tx(status=None, response_body_size=None, request_body_size=None)
    assert metric_points(missing, tls) == [MetricPoint("http.client.request.duration", 0.25, attributes)]


def test_instruments() -> None:
    by_name = {spec.name: spec for spec in HTTP_INSTRUMENTS}
    assert sorted(by_name) == sorted(
        f"http.{side}.{what}"
        for side in ("server", "client")
        for what in ("request.duration", "request.body.size", "response.body.size")
    )
    for spec in HTTP_INSTRUMENTS:
        assert spec.kind is InstrumentKind.HISTOGRAM
        assert (spec.unit, spec.boundaries) == (("s", DURATION_BUCKETS) if "duration" in spec.name else ("By", None))
    assert DURATION_BUCKETS == (
        0.005,
        0.01,
        0.025,
        0.05,
        0.075,
        0.1,
        0.25,
        0.5,
        0.75,
        1,
        2.5,
        5,
        7.5,
        10,
    )


@pytest.mark.parametrize(
    ("authority", "scheme", "want"),
    [
        ("example.com", "http", ("example.com", 80)),
        ("example.com", "https", ("example.com", 443)),
        ("example.com:8080", "http", ("example.com", 8080)),
        ("[2001:db8::1]:9000", "http", ("2001:db8::1", 9000)),
        ("[2001:db8::1]", "https", ("2001:db8::1", 443)),
        ("example.com:http", "http", ("example.com", 80)),
        ("example.com", "ftp", ("example.com", None)),
    ],
)
def test_split_authority(authority: str, scheme: str, want: tuple) -> None:
    assert split_authority(authority, scheme) == want


def test_split_target_forms() -> None:
    assert (split_target("/a?b=1").path, split_target("/a?b=1").query) == ("/a", "b=1")
    absolute = split_target("HTTP://h:1?x")
    assert (absolute.scheme, absolute.authority, absolute.path, absolute.query) == (
        "http",
        "h:1",
        "/",
        "x",
    )
    assert (split_target("*").path, split_target("*").authority) == ("*", None)
    assert (split_target("h:443").path, split_target("h:443").authority) == ("", "h:443")
