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

This runs for every request a node serves or sends, and the same targets and authorities come
again and again, so their parsed forms and route templates are memoised (:mod:`.caching`).
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
    Transport,
    put_socket_end,
)

from .caching import memoize, memoize_attributes

Headers = Sequence[tuple[str, str]]  # (lower-case name, value) in wire order; names may repeat

REDACTED = "REDACTED"
OTHER_METHOD = "_OTHER"
KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})

# error.type values for exchanges that did not end with a complete response
RESPONSE_MISSING = "response_missing"  # the connection ended before any final response
# Why the end of a message was not seen, when the capture lost it (the bytes were moved but not
# copied, or dropped under load): the agent's loss, not the peer's failure, so no error.type; the
# span says so in CAPTURE_GAP_ATTRIBUTE instead.
CAPTURE_GAP = "capture_gap"
CAPTURE_GAP_ATTRIBUTE = "otel_ebpf.capture.gap"
# Request-correlation headers, captured by default: they join an exchange to the logs of the
# programs at both ends, whatever the trace assembly concluded.
CORRELATION_HEADERS = frozenset({"x-request-id", "x-correlation-id"})
CONNECTION_CLOSED = "connection_closed"
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def capture_headers_option(value: object) -> frozenset[str]:
    """The ``capture_headers`` plugin option: lower-case header names, the correlation headers
    when absent; ``ValueError("capture_headers: ...")`` when it is not a list of header names."""
    if value is None:
        return CORRELATION_HEADERS
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        raise ValueError("capture_headers: must be a list of header names")
    invalid = [name for name in value if not _HEADER_NAME.fullmatch(name)]
    if invalid:
        raise ValueError(f"capture_headers: not a header name: {invalid[0]!r}")
    return frozenset(name.lower() for name in value)  # the connection ended in the middle of the response


# What a transaction holds for parts of a message the capture could not tell (HTTP/2 header
# fields compressed against state from before the capture): the method, the target, and the
# status of a response that was seen.
UNKNOWN_METHOD = ""
UNKNOWN_TARGET = ""
UNKNOWN_STATUS = 0

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
    else becomes ``_OTHER`` so an arbitrary client cannot mint new metric series. An empty method
    is one the capture could not tell (:data:`UNKNOWN_METHOD`): ``_OTHER``, without an original.
    """
    if method in KNOWN_METHODS:
        return method, None
    return OTHER_METHOD, method or None


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


@memoize
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
        f"{key}={REDACTED}" if sep else key for key, sep, _ in (item.partition("=") for item in query.split("&"))
    )


@dataclass(frozen=True, slots=True)
class Target:
    """A request target split into what the attributes need (RFC 9112 section 3.2 forms)."""

    authority: str | None  # from absolute-form ("http://host:8080/x") or authority-form (CONNECT)
    path: str  # "" for authority-form; "*" for asterisk-form
    query: str | None  # without "?"; None when absent or empty
    scheme: str | None = None  # from absolute-form only


@memoize
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
    host, port = _host_port(authority)
    return (host, port) if port is not None else (host, _DEFAULT_PORTS.get(scheme))


@memoize
def _host_port(authority: str) -> tuple[str, int | None]:
    """``host[:port]`` / ``[v6]:port`` → (host, port), the port ``None`` unless valid."""
    host, port_text = authority, ""
    if authority.startswith("["):
        close = authority.find("]")
        if close != -1:
            host, port_text = authority[1:close], authority[close + 1 :].lstrip(":")
    elif authority.count(":") == 1:
        host, _, port_text = authority.partition(":")
    if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5:
        return host, int(port_text)
    return host, None


def first_header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def header_attributes(prefix: str, headers: Headers, allowed: Collection[str]) -> dict[str, AttributeValue]:
    """``http.{request,response}.header.<name>`` string arrays for the allow-listed headers.

    Secret-bearing headers are exported as ``REDACTED`` even when allow-listed, so that a broad
    allow-list never turns into a credential leak.
    """
    values: dict[str, list[str]] = {}
    for name, value in headers:
        if name in allowed:
            values.setdefault(name, []).append(REDACTED if is_secret_header(name) else value)
    return {prefix + name: tuple(found) for name, found in values.items()}


# made for every exchange: a plain dataclass with slots, cheaper to make than a frozen one; a value
@dataclass(slots=True)
class HttpTransaction:
    """One request and what was seen of its response, independent of the HTTP version.

    ``authority`` is what the request named as its origin (``Host`` or ``:authority``).
    ``status`` is ``None`` when no final response was seen; ``error`` then (or when the response was
    cut short) says why, as an ``error.type`` value. :data:`UNKNOWN_STATUS` is a response whose
    status the capture could not tell: neither an error nor a status attribute.
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


def _server(target: Target, authority: str | None, scheme: str, conn: ConnectionInfo) -> tuple[str | None, int | None]:
    """``(server.address, server.port)``: the origin the request names, else the socket's server."""
    authority = target.authority or authority
    if authority:
        address, port = split_authority(authority, scheme)
        return address or None, port
    server = conn.server
    if server is not None:
        return server.address or None, server.port or None  # a unix socket's: its path, no port
    return None, None


def _error_type(tx: HttpTransaction, is_server: bool) -> str | None:
    """``error.type``: why the response is missing or cut short, else an error status code."""
    gap = tx.error == CAPTURE_GAP
    if tx.error is not None and not gap:
        return tx.error
    if tx.status is None:
        return None if gap else RESPONSE_MISSING
    if tx.status == UNKNOWN_STATUS:
        return None
    if tx.status >= (500 if is_server else 400):
        return str(tx.status)
    return None


def error_type(tx: HttpTransaction, conn: ConnectionInfo) -> str | None:
    """The transaction's ``error.type`` as the observed process's side sees it."""
    return _error_type(tx, conn.role is Role.SERVER)


def server_endpoint(tx: HttpTransaction, conn: ConnectionInfo) -> tuple[str | None, int | None]:
    """``(server.address, server.port)`` of the transaction."""
    target = split_target(tx.target)
    return _server(target, tx.authority, target.scheme or conn.scheme, conn)


def _span_name(method: str, path: str) -> str:
    method = "HTTP" if method == OTHER_METHOD else method
    return f"{method} {route_template(path)}" if path.startswith("/") else method


def _url_full(scheme: str, address: str | None, port: int | None, target: Target) -> str | None:
    if address is None:
        return None
    host = f"[{address}]" if ":" in address else address
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    path = target.path if target.path.startswith("/") else ""
    query = f"?{redact_query(target.query)}" if target.query else ""
    return f"{scheme}://{host}{path}{query}"


# Looked up on every span: a module constant costs a sixth of an enum member's lookup (~70 ns)
_UNIX = Transport.UNIX

_STATUS_DESCRIPTIONS = {
    RESPONSE_MISSING: "the connection ended before a response",
    CONNECTION_CLOSED: "the connection ended in the middle of the response",
}


def _put_server(attributes: dict[str, AttributeValue], address: str | None, port: int | None) -> None:
    if address is not None:
        attributes["server.address"] = address
    if port is not None:
        attributes["server.port"] = port


def describe_span(tx: HttpTransaction, conn: ConnectionInfo, capture_headers: Collection[str] = ()) -> SpanDescription:
    """The span for one transaction; ``capture_headers`` holds lower-case header names."""
    is_server = conn.role is Role.SERVER
    method, method_original = normalize_method(tx.method)
    target = split_target(tx.target)
    scheme = target.scheme or conn.scheme
    address, port = _server(target, tx.authority, scheme, conn)
    error_type = _error_type(tx, is_server)

    attributes: dict[str, AttributeValue] = {"http.request.method": method}
    if method_original is not None:
        attributes["http.request.method_original"] = method_original
    if is_server:
        if target.path:
            attributes["url.path"] = target.path
        if target.query:
            attributes["url.query"] = redact_query(target.query)
        attributes["url.scheme"] = scheme
    # A URL without its path would name another resource; one whose host is a unix socket's path
    # (a request that named no host) names none.
    elif tx.target != UNKNOWN_TARGET and (port is not None or conn.transport is not _UNIX):
        url_full = _url_full(scheme, address, port, target)
        if url_full is not None:
            attributes["url.full"] = url_full
    _put_server(attributes, address, port)
    if is_server:
        _client_attributes(attributes, tx, conn)
    # TCP is what the conventions take for HTTP/1 and HTTP/2; a unix socket's ends have a path at
    # most, and no port. The TCP case is written out: it is every span's.
    if conn.transport is _UNIX:
        attributes["network.transport"] = _UNIX.value
        put_socket_end(attributes, "network.peer", conn.peer)
    elif (peer := conn.peer) is not None:
        attributes["network.peer.address"] = peer.address
        attributes["network.peer.port"] = peer.port
    attributes["network.protocol.version"] = tx.version
    if tx.status:  # neither missing nor UNKNOWN_STATUS
        attributes["http.response.status_code"] = tx.status
    if is_server:
        user_agent = first_header(tx.request_headers, "user-agent")
        if user_agent is not None:
            attributes["user_agent.original"] = user_agent
    if tx.request_body_size is not None:
        attributes["http.request.body.size"] = tx.request_body_size
    if tx.response_body_size is not None:
        attributes["http.response.body.size"] = tx.response_body_size
    if error_type is not None:
        attributes["error.type"] = error_type
    elif tx.error == CAPTURE_GAP:
        attributes[CAPTURE_GAP_ATTRIBUTE] = True
    if capture_headers:
        attributes.update(header_attributes("http.request.header.", tx.request_headers, capture_headers))
        attributes.update(header_attributes("http.response.header.", tx.response_headers, capture_headers))

    name = _span_name(method, target.path)
    kind = SpanKind.SERVER if is_server else SpanKind.CLIENT
    if error_type is None:
        status, description = StatusCode.UNSET, None
    else:
        status, description = StatusCode.ERROR, _STATUS_DESCRIPTIONS.get(error_type)
    # positional, in field order: keywords would make this per-span call a quarter slower
    return SpanDescription(name, kind, tx.start_ns, tx.end_ns, attributes, status, description)


def _client_attributes(attributes: dict[str, AttributeValue], tx: HttpTransaction, conn: ConnectionInfo) -> None:
    forwarded = first_header(tx.request_headers, "x-forwarded-for")
    if forwarded:
        attributes["client.address"] = forwarded.split(",", 1)[0].strip()
        return
    client = conn.client
    if conn.transport is _UNIX:
        put_socket_end(attributes, "client", client)
    elif client is not None:
        attributes["client.address"] = client.address
        attributes["client.port"] = client.port


# instrument names (duration, request body size, response body size), by "the process serves"
_INSTRUMENT_NAMES = {
    is_server: tuple(f"http.{side}.{name}" for name in ("request.duration", "request.body.size", "response.body.size"))
    for is_server, side in ((True, "server"), (False, "client"))
}


@memoize_attributes
def _metric_attributes(
    is_server: bool,
    method: str,
    scheme: str,
    version: str,
    status: int | None,
    server: tuple[str | None, int | None],
    error_type: str | None,
) -> dict[str, AttributeValue]:
    """The conventions' low-cardinality attributes of the HTTP metrics."""
    attributes: dict[str, AttributeValue] = {
        "http.request.method": normalize_method(method)[0],
        "url.scheme": scheme,
        "network.protocol.version": version,
    }
    if status:  # neither missing nor UNKNOWN_STATUS
        attributes["http.response.status_code"] = status
    if not is_server:
        _put_server(attributes, *server)
    if error_type is not None:
        attributes["error.type"] = error_type
    return attributes


def counted_duration(
    role: Role, method: str, status: int, version: str, tls: bool, server_address: str, server_port: int
) -> tuple[str, dict[str, AttributeValue]]:
    """Instrument and attributes for requests counted without a transaction at hand (the kernel's
    HTTP/1 counts): those of :func:`metric_points`, the server being the socket's peer. Status 0:
    the connection closed before any response (``response_missing``)."""
    is_server = role is Role.SERVER
    if not status:
        error_type: str | None = RESPONSE_MISSING
    else:
        error_type = str(status) if status >= (500 if is_server else 400) else None
    server = (server_address or None, server_port or None)
    attributes = _metric_attributes(is_server, method, "https" if tls else "http", version, status, server, error_type)
    return _INSTRUMENT_NAMES[is_server][0], attributes


def metric_points(tx: HttpTransaction, conn: ConnectionInfo) -> list[MetricPoint]:
    """Duration and body-size points, with the conventions' low-cardinality attributes only."""
    is_server = conn.role is Role.SERVER
    target = split_target(tx.target)
    scheme = target.scheme or conn.scheme
    server = _server(target, tx.authority, scheme, conn) if not is_server else (None, None)
    attributes = _metric_attributes(
        is_server, tx.method, scheme, tx.version, tx.status, server, _error_type(tx, is_server)
    )
    duration, request_size, response_size = _INSTRUMENT_NAMES[is_server]
    points = [MetricPoint(duration, (tx.end_ns - tx.start_ns) / 1e9, attributes)]
    if tx.request_body_size is not None:
        points.append(MetricPoint(request_size, tx.request_body_size, attributes))
    if tx.response_body_size is not None:
        points.append(MetricPoint(response_size, tx.response_body_size, attributes))
    return points
