"""HTTP semantics shared by every HTTP version: span names, attributes, status and metric points.

A version-specific plugin (HTTP/1.x now, HTTP/2 later) reduces one request/response pair to an
:class:`HttpTransaction` and lets this module describe it, so both versions emit the same attributes
and metrics under the current OpenTelemetry semantic conventions.

Choices the conventions leave open, made here once:

* ``http.route`` is never set: the agent sees URLs, not the application's routing table. The span
  name is ``"{method} {template}"`` with :func:`route_template`, which replaces the parts of a path
  that look like values with placeholders, so span names stay low-cardinality (the placeholders
  are documented there); targets without a path (``CONNECT host:port``, ``*``) give ``"{method}"``.
* Methods outside the conventions' list become ``_OTHER`` (the original goes to
  ``http.request.method_original``), and span names then use ``HTTP`` as the conventions require.
* An exchange without a final response is an error with ``error.type`` ``response_missing``; one
  whose response the connection's end cut short, ``connection_closed``.
* Secrets never leave the agent: the values of credential-bearing headers become ``REDACTED`` even
  when the user allow-lists those headers, every query-string value becomes ``REDACTED`` (keys are
  kept), and bodies are only ever counted.
* ``server.address`` / ``server.port`` name the logical origin (absolute-form request target, then
  ``Host`` / ``:authority``, defaulting the port from the scheme) and fall back to the socket's
  server end when the request names none.
* ``client.address`` is the first ``X-Forwarded-For`` hop when present (then ``client.port`` is left
  out, since the socket's port belongs to the proxy), else the socket's client end.
* Body sizes count content bytes after removing transfer framing (chunk headers, trailers); a size
  the capture lost (a gap inside a chunked body) is ``None`` and is left out rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from otel_ebpf.protocol import (
    AttributeValue,
    ConnectionInfo,
    InstrumentKind,
    InstrumentSpec,
    MetricPoint,
    Role,
    SpanDescription,
    SpanKind,
    StatusCode,
)

Headers = Sequence[tuple[str, str]]  # (lower-case name, value) in wire order; names may repeat

REDACTED = "REDACTED"
OTHER_METHOD = "_OTHER"
KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)

# error.type values for exchanges that did not end with a complete response
RESPONSE_MISSING = "response_missing"  # the connection ended before any final response
CONNECTION_CLOSED = "connection_closed"  # the connection ended in the middle of the response

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


def _duration(side: str) -> InstrumentSpec:
    return InstrumentSpec(
        name=f"http.{side}.request.duration",
        kind=InstrumentKind.HISTOGRAM,
        unit="s",
        description=f"Duration of HTTP {side} requests.",
        boundaries=DURATION_BUCKETS,
    )


def _body_size(side: str, message: str) -> InstrumentSpec:
    return InstrumentSpec(
        name=f"http.{side}.{message}.body.size",
        kind=InstrumentKind.HISTOGRAM,
        unit="By",
        description=f"Size of HTTP {side} {message} bodies.",
    )


HTTP_INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    _duration("server"),
    _duration("client"),
    _body_size("server", "request"),
    _body_size("server", "response"),
    _body_size("client", "request"),
    _body_size("client", "response"),
)

_DEFAULT_PORTS = {"http": 80, "https": 443}

# Header names whose values are credentials, and fragments that mark a name as one.
_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
    }
)
_SECRET_FRAGMENTS = ("token", "secret", "password", "apikey", "api-key", "api_key", "credential")


def is_secret_header(name: str) -> bool:
    """Whether a header's value may hold a credential; ``name`` must be lower-case.

    Errs on the side of hiding: a false positive costs one ``REDACTED`` value, a false negative
    leaks a credential into a tracing backend.
    """
    return name in _SECRET_HEADERS or any(fragment in name for fragment in _SECRET_FRAGMENTS)


def normalize_method(method: str) -> tuple[str, str | None]:
    """``(http.request.method, http.request.method_original)``.

    The conventions allow only the RFC 9110 methods plus PATCH, matched case-sensitively; anything
    else becomes ``_OTHER`` so an arbitrary client cannot mint new metric series.
    """
    if method in KNOWN_METHODS:
        return method, None
    return OTHER_METHOD, method


_SEGMENT_PLACEHOLDERS = {
    "num": "{id}",
    "uuid": "{uuid}",
    "date": "{date}",
    "hash": "{hash}",
    "token": "{token}",
    "digits": "{id}",
}
# Tried in order on a whole path segment; the first alternative that matches names the placeholder.
_VALUE_SEGMENT = re.compile(
    r"(?P<num>[0-9]+)"
    r"|(?P<uuid>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"|(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[Tt][0-9:.]+(?:[Zz]|[+-][0-9:]+)?)?)"
    r"|(?P<hash>[0-9a-fA-F]{16,})"
    r"|(?P<token>(?=[^0-9]*[0-9])(?=[^A-Za-z]*[A-Za-z])[A-Za-z0-9_.~+=-]{16,})"
    r"|(?P<digits>.*?[0-9]{4}.*)",
    re.ASCII | re.DOTALL,
)


def route_template(path: str) -> str:
    """A low-cardinality stand-in for ``http.route``, used only in span names.

    Each ``/``-separated segment that looks like a value is replaced:

    ========== =================================================================================
    ``{id}``    decimal numbers, and any segment holding a run of 4+ digits (``order-12345``)
    ``{uuid}``  UUIDs (``8-4-4-4-12`` hex digits)
    ``{date}``  ISO 8601 dates, optionally with a time (``2024-05-01``, ``2024-05-01T10:00:00Z``)
    ``{hash}``  16 or more hex digits (content hashes, trace ids, hex object ids)
    ``{token}`` 16 or more base64 / base64url characters mixing letters and digits (keys, JWTs)
    ========== =================================================================================

    Words, short version markers (``v1``, ``sha256``) and file names without long digit runs stay.
    """
    segments = path.split("/")
    for i, segment in enumerate(segments):
        if segment:
            match = _VALUE_SEGMENT.fullmatch(segment)
            if match is not None:
                segments[i] = _SEGMENT_PLACEHOLDERS[match.lastgroup or ""]
    return "/".join(segments)


def redact_query(query: str) -> str:
    """Keep the keys of a query string, replace every value: values carry tokens and signatures."""
    return "&".join(
        f"{key}={REDACTED}" if sep else key
        for key, sep, _ in (item.partition("=") for item in query.split("&"))
    )


@dataclass(frozen=True, slots=True)
class Target:
    """A request target split into what the attributes need (RFC 9112 section 3.2 forms)."""

    authority: str | None  # from absolute-form ("http://host:8080/x") or authority-form (CONNECT)
    path: str  # "" for authority-form; "*" for asterisk-form
    query: str | None  # without "?"; None when absent or empty
    scheme: str | None = None  # from absolute-form only


def split_target(target: str) -> Target:
    scheme = authority = None
    rest = target
    if not target.startswith("/") and target != "*":
        scheme_part, sep, after = target.partition("://")
        if not sep:  # authority-form
            return Target(authority=target, path="", query=None)
        scheme = scheme_part.lower()
        slash = len(after)
        for delimiter in "/?":
            found = after.find(delimiter)
            if found != -1:
                slash = min(slash, found)
        authority, rest = after[:slash], after[slash:]
        if not rest.startswith("/"):
            rest = "/" + rest
    path, _, query = rest.partition("?")
    return Target(authority=authority, path=path, query=query or None, scheme=scheme)


def split_authority(authority: str, scheme: str) -> tuple[str, int | None]:
    """``host[:port]`` / ``[v6]:port`` → (host, port), defaulting the port from the scheme."""
    host, port_text = authority, ""
    if authority.startswith("["):
        close = authority.find("]")
        if close != -1:
            host, port_text = authority[1:close], authority[close + 1 :].lstrip(":")
    elif authority.count(":") == 1:
        host, _, port_text = authority.partition(":")
    if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5:
        return host, int(port_text)
    return host, _DEFAULT_PORTS.get(scheme)


def first_header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def header_attributes(
    prefix: str, headers: Headers, allowed: Collection[str]
) -> dict[str, AttributeValue]:
    """``http.{request,response}.header.<name>`` string arrays for the allow-listed headers.

    Secret-bearing headers are exported as ``REDACTED`` even when allow-listed, so that a broad
    allow-list never turns into a credential leak.
    """
    values: dict[str, list[str]] = {}
    for name, value in headers:
        if name in allowed:
            values.setdefault(name, []).append(REDACTED if is_secret_header(name) else value)
    return {prefix + name: tuple(found) for name, found in values.items()}


@dataclass(frozen=True, slots=True)
class HttpTransaction:
    """One request and what was seen of its response, independent of the HTTP version.

    ``authority`` is what the request named as its origin (``Host`` or ``:authority``).
    ``status`` is ``None`` when no final response was seen; ``error`` then (or when the response was
    cut short) says why, as an ``error.type`` value.
    """

    method: str
    target: str
    version: str  # network.protocol.version: "1.0", "1.1", "2"
    start_ns: int
    end_ns: int
    request_headers: Headers = ()
    request_body_size: int | None = 0
    authority: str | None = None
    status: int | None = None
    response_headers: Headers = ()
    response_body_size: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Common:
    """What both the span and the metric points derive from one transaction."""

    method: str
    method_original: str | None
    target: Target
    scheme: str
    server_address: str | None
    server_port: int | None
    status: StatusCode
    error_type: str | None
    is_server: bool


def _common(tx: HttpTransaction, conn: ConnectionInfo) -> _Common:
    method, original = normalize_method(tx.method)
    target = split_target(tx.target)
    scheme = target.scheme or conn.scheme
    authority = target.authority or tx.authority
    address: str | None = None
    port: int | None = None
    if authority:
        address, port = split_authority(authority, scheme)
    elif conn.server is not None:
        address, port = conn.server.address, conn.server.port
    is_server = conn.role is Role.SERVER
    status, error_type = StatusCode.UNSET, tx.error
    if tx.status is None and error_type is None:
        error_type = RESPONSE_MISSING
    if error_type is None and tx.status is not None and tx.status >= (500 if is_server else 400):
        error_type = str(tx.status)
    if error_type is not None:
        status = StatusCode.ERROR
    return _Common(
        method, original, target, scheme, address or None, port, status, error_type, is_server
    )


def _span_name(common: _Common) -> str:
    method = "HTTP" if common.method == OTHER_METHOD else common.method
    path = common.target.path
    return f"{method} {route_template(path)}" if path.startswith("/") else method


def _url_full(common: _Common) -> str | None:
    if common.server_address is None:
        return None
    host = f"[{common.server_address}]" if ":" in common.server_address else common.server_address
    port = common.server_port
    if port is not None and port != _DEFAULT_PORTS.get(common.scheme):
        host = f"{host}:{port}"
    path = common.target.path if common.target.path.startswith("/") else ""
    query = f"?{redact_query(common.target.query)}" if common.target.query else ""
    return f"{common.scheme}://{host}{path}{query}"


_STATUS_DESCRIPTIONS = {
    RESPONSE_MISSING: "the connection ended before a response",
    CONNECTION_CLOSED: "the connection ended in the middle of the response",
}


def describe_span(
    tx: HttpTransaction, conn: ConnectionInfo, capture_headers: Collection[str] = ()
) -> SpanDescription:
    """The span for one transaction; ``capture_headers`` holds lower-case header names."""
    common = _common(tx, conn)
    attributes: dict[str, AttributeValue] = {"http.request.method": common.method}
    if common.method_original is not None:
        attributes["http.request.method_original"] = common.method_original
    if common.is_server:
        if common.target.path:
            attributes["url.path"] = common.target.path
        if common.target.query:
            attributes["url.query"] = redact_query(common.target.query)
        attributes["url.scheme"] = common.scheme
    else:
        url_full = _url_full(common)
        if url_full is not None:
            attributes["url.full"] = url_full
    if common.server_address is not None:
        attributes["server.address"] = common.server_address
    if common.server_port is not None:
        attributes["server.port"] = common.server_port
    if common.is_server:
        _client_attributes(attributes, tx, conn)
    if conn.peer is not None:
        attributes["network.peer.address"] = conn.peer.address
        attributes["network.peer.port"] = conn.peer.port
    attributes["network.protocol.version"] = tx.version
    if tx.status is not None:
        attributes["http.response.status_code"] = tx.status
    if common.is_server:
        user_agent = first_header(tx.request_headers, "user-agent")
        if user_agent is not None:
            attributes["user_agent.original"] = user_agent
    if tx.request_body_size is not None:
        attributes["http.request.body.size"] = tx.request_body_size
    if tx.response_body_size is not None:
        attributes["http.response.body.size"] = tx.response_body_size
    if common.error_type is not None:
        attributes["error.type"] = common.error_type
    if capture_headers:
        attributes.update(
            header_attributes("http.request.header.", tx.request_headers, capture_headers)
        )
        attributes.update(
            header_attributes("http.response.header.", tx.response_headers, capture_headers)
        )
    return SpanDescription(
        name=_span_name(common),
        kind=SpanKind.SERVER if common.is_server else SpanKind.CLIENT,
        start_ns=tx.start_ns,
        end_ns=tx.end_ns,
        attributes=attributes,
        status=common.status,
        status_description=_STATUS_DESCRIPTIONS.get(common.error_type or ""),
    )


def _client_attributes(
    attributes: dict[str, AttributeValue], tx: HttpTransaction, conn: ConnectionInfo
) -> None:
    forwarded = first_header(tx.request_headers, "x-forwarded-for")
    if forwarded:
        attributes["client.address"] = forwarded.split(",", 1)[0].strip()
    elif conn.client is not None:
        attributes["client.address"] = conn.client.address
        attributes["client.port"] = conn.client.port


def metric_points(tx: HttpTransaction, conn: ConnectionInfo) -> list[MetricPoint]:
    """Duration and body-size points, with the conventions' low-cardinality attributes only."""
    common = _common(tx, conn)
    attributes: dict[str, AttributeValue] = {
        "http.request.method": common.method,
        "url.scheme": common.scheme,
        "network.protocol.version": tx.version,
    }
    if tx.status is not None:
        attributes["http.response.status_code"] = tx.status
    if not common.is_server:
        if common.server_address is not None:
            attributes["server.address"] = common.server_address
        if common.server_port is not None:
            attributes["server.port"] = common.server_port
    if common.error_type is not None:
        attributes["error.type"] = common.error_type
    side = "http.server." if common.is_server else "http.client."
    points = [MetricPoint(side + "request.duration", (tx.end_ns - tx.start_ns) / 1e9, attributes)]
    if tx.request_body_size is not None:
        points.append(MetricPoint(side + "request.body.size", tx.request_body_size, attributes))
    if tx.response_body_size is not None:
        points.append(MetricPoint(side + "response.body.size", tx.response_body_size, attributes))
    return points
