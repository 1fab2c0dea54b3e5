"""gRPC semantics shared by every transport that carries it: span names, attributes, status, metrics.

A transport plugin (HTTP/2 now) reduces one call to a :class:`GrpcCall` and lets this module
describe it under the OpenTelemetry RPC semantic conventions.

Which conventions (``OTEL_SEMCONV_STABILITY_OPT_IN``, read once where the plugin is built, see
:func:`semconv_from_opt_in`): the RPC conventions were reworked after v1.37.0 and the
instrumentations' migration rule applies — keep emitting the old (v1.37.0) set by default;
``rpc`` selects the new set only; ``rpc/dup`` both (it wins over ``rpc``).

* old: ``rpc.system`` ``grpc``, ``rpc.service`` ``pkg.Service``, ``rpc.method`` ``Method``,
  ``rpc.grpc.status_code`` (int); metrics ``rpc.{server,client}.duration`` (ms) and
  ``rpc.{server,client}.{requests,responses}_per_rpc`` (``{count}``); opt-in metadata
  ``rpc.grpc.{request,response}.metadata.<key>``.
* new: ``rpc.system.name`` ``grpc``, ``rpc.method`` ``pkg.Service/Method``,
  ``rpc.response.status_code`` (the code's name); metric ``rpc.{server,client}.call.duration``
  (s, buckets 0.005 … 10); opt-in metadata ``rpc.{request,response}.metadata.<key>``. Span names
  follow the new rule whenever the new set is emitted.

Choices the conventions leave open, made here once:

* Span name: ``pkg.Service/Method``; when the method is unknown (its ``:path`` was compressed
  against header state from before the capture) or, in the new set, ``_OTHER``, the span is named
  ``grpc`` (the new set's ``{rpc.system.name}``) and ``rpc.method`` is ``_OTHER`` (with
  ``rpc.service`` left out in the old set).
* New set only: a method the server answered with UNIMPLEMENTED is one it does not recognise, so
  ``rpc.method`` is ``_OTHER`` and the path goes to ``rpc.method_original``. An agent cannot know
  a server's method table otherwise; anything else the server answered counts as recognised.
* Status: from ``grpc-status`` in the trailers (or a Trailers-Only response); a non-200 HTTP status
  maps to a gRPC code as gRPC clients map it (``http-grpc-status-mapping.md``); a reset stream
  maps as gRPC's HTTP/2 transport maps RST_STREAM codes; a response that ended without trailers
  is INTERNAL (what a gRPC client reports). ``grpc-message`` (percent-decoded) is the span's status
  description. A status the capture could not tell is left out, with the span status unset.
* Span status: SERVER spans are errors for UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL,
  UNAVAILABLE and DATA_LOSS; CLIENT spans for every code but OK. ``error.type`` is the code's name
  then, or ``response_missing`` / ``connection_closed`` (as for HTTP) when no status came.
* Message counts have no attribute in either set: spans carry them as
  ``otel_ebpf.rpc.request.message_count`` / ``otel_ebpf.rpc.response.message_count`` (and
  ``otel_ebpf.rpc.{request,response}.compressed`` when a message had its compressed flag set),
  in the agent's own namespace rather than one the conventions own; the old set's
  ``*_per_rpc`` histograms record them too. Counts a capture gap made uncertain are left out.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import unquote

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

from .caching import memoize_attributes
from .http_semconv import (
    CAPTURE_GAP,
    CAPTURE_GAP_ATTRIBUTE,
    DURATION_BUCKETS,
    Headers,
    header_attributes,
    split_authority,
)

SYSTEM = "grpc"
OTHER_METHOD = "_OTHER"
STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
OK, CANCELLED, UNKNOWN = 0, 1, 2
UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 12, 13, 14
_SERVER_ERRORS = frozenset({UNKNOWN, 4, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, 15})
# HTTP status of a response that is not a gRPC one -> the code a gRPC client reports
_HTTP_TO_GRPC = {
    400: INTERNAL,
    401: 16,
    403: 7,
    404: UNIMPLEMENTED,
    429: UNAVAILABLE,
    502: UNAVAILABLE,
    503: UNAVAILABLE,
    504: UNAVAILABLE,
}
# HTTP/2 RST_STREAM error code -> gRPC code (gRPC's PROTOCOL-HTTP2.md); others are INTERNAL
_RESET_TO_GRPC = {0x7: UNAVAILABLE, 0x8: CANCELLED, 0xB: 8, 0xC: 7}


class Semconv(enum.Flag):
    """Which RPC convention sets to emit."""

    OLD = enum.auto()
    NEW = enum.auto()
    DUP = OLD | NEW


def semconv_from_opt_in(value: str | None) -> Semconv:
    """``OTEL_SEMCONV_STABILITY_OPT_IN`` (comma-separated) -> the RPC sets to emit."""
    tokens = {token.strip() for token in (value or "").split(",")}
    if "rpc/dup" in tokens:
        return Semconv.DUP
    return Semconv.NEW if "rpc" in tokens else Semconv.OLD


def instruments(semconv: Semconv) -> tuple[InstrumentSpec, ...]:
    """The instruments :func:`metric_points` records into under ``semconv``."""
    specs: list[InstrumentSpec] = []
    for side in ("server", "client"):
        if semconv is not Semconv.NEW:  # the old set, alone or with the new
            specs.append(
                InstrumentSpec(
                    f"rpc.{side}.duration",
                    InstrumentKind.HISTOGRAM,
                    "ms",
                    f"Measures the duration of {_DIRECTION[side]} RPC.",
                )
            )
            for kind in ("requests", "responses"):
                specs.append(
                    InstrumentSpec(
                        f"rpc.{side}.{kind}_per_rpc",
                        InstrumentKind.HISTOGRAM,
                        "{count}",
                        f"Measures the number of messages {_MESSAGES[side, kind]} per RPC.",
                    )
                )
        if semconv is not Semconv.OLD:  # the new set, alone or with the old
            specs.append(
                InstrumentSpec(
                    f"rpc.{side}.call.duration",
                    InstrumentKind.HISTOGRAM,
                    "s",
                    f"Measures the duration of {_DIRECTION[side]} remote procedure calls.",
                    DURATION_BUCKETS,
                )
            )
    return tuple(specs)


_DIRECTION = {"server": "inbound", "client": "outbound"}
_MESSAGES = {
    ("server", "requests"): "received",
    ("server", "responses"): "sent",
    ("client", "requests"): "sent",
    ("client", "responses"): "received",
}


@dataclass(frozen=True, slots=True)
class GrpcCall:
    """One call and what was seen of its outcome, independent of the transport.

    ``path`` is ``/pkg.Service/Method`` (``None``: unknown). ``status`` is the gRPC status code
    (``None``: not known), ``error`` the ``error.type`` for a call without one that failed
    (``response_missing``, ``connection_closed``). Message counts are ``None`` when unknown.
    """

    path: str | None
    start_ns: int
    end_ns: int
    authority: str | None = None
    status: int | None = None
    message: str | None = None
    error: str | None = None
    request_messages: int | None = None
    response_messages: int | None = None
    request_compressed: bool = False
    response_compressed: bool = False
    request_metadata: Headers = ()
    response_metadata: Headers = ()


def status_from_http(status: int) -> int:
    return _HTTP_TO_GRPC.get(status, UNKNOWN)


def status_from_reset(error_code: int) -> int:
    return _RESET_TO_GRPC.get(error_code, INTERNAL)


def parse_status(value: str | None) -> int | None:
    """A ``grpc-status`` value; ``None`` when absent or not a number."""
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 9:
        return None
    return int(value)


def decode_message(value: str | None) -> str | None:
    """``grpc-message`` is percent-encoded UTF-8 (it reaches us decoded as Latin-1)."""
    if not value:
        return None
    return unquote(value.encode("latin-1").decode("utf-8", "replace")) if "%" in value else value


def _split(path: str | None) -> tuple[str | None, str | None]:
    """``/pkg.Service/Method`` -> (``pkg.Service``, ``Method``); (None, None) if not that shape."""
    if path is None or not path.startswith("/"):
        return None, None
    service, slash, method = path[1:].rpartition("/")
    return (service, method) if slash and service and method else (None, None)


def status_name(code: int) -> str:
    """``NOT_FOUND`` for 5; codes past the known ones (the wire allows any) as their number."""
    return STATUS_NAMES[code] if code < len(STATUS_NAMES) else str(code)


def _error_type(call: GrpcCall, is_server: bool) -> str | None:
    status = call.status
    if status is None:
        return None if call.error == CAPTURE_GAP else call.error
    if (status in _SERVER_ERRORS) if is_server else (status != OK):
        return status_name(status)
    return None


def error_type(call: GrpcCall, conn: ConnectionInfo) -> str | None:
    """The call's ``error.type``, as the side that saw it judges its status."""
    return _error_type(call, conn.role is Role.SERVER)


def server_endpoint(call: GrpcCall, conn: ConnectionInfo) -> tuple[str | None, int | None]:
    """(``server.address``, ``server.port``): the call's ``:authority``, else the connection's
    server. Over a unix socket, the socket's path: gRPC names such a channel's authority after the
    path, percent-encoded (``tmp%2Fapp.sock``) or ``localhost``, which names no network host."""
    server = conn.server
    if conn.transport is Transport.UNIX and server is not None and server.address:
        return server.address, None
    if call.authority:
        return split_authority(call.authority, conn.scheme)
    return (server.address or None, server.port or None) if server is not None else (None, None)


def _put_server(attributes: dict[str, AttributeValue], address: str | None, port: int | None) -> None:
    if address:
        attributes["server.address"] = address
    if port is not None:
        attributes["server.port"] = port


def _put_endpoints(
    attributes: dict[str, AttributeValue], call: GrpcCall, conn: ConnectionInfo, is_server: bool
) -> None:
    _put_server(attributes, *server_endpoint(call, conn))
    if is_server:
        put_socket_end(attributes, "client", conn.client)


def describe_span(
    call: GrpcCall, conn: ConnectionInfo, semconv: Semconv, capture_metadata: Collection[str] = ()
) -> SpanDescription:
    """The span for one call; ``capture_metadata`` holds the lower-case metadata keys to export."""
    is_server = conn.role is Role.SERVER
    service, method = _split(call.path)
    recognised = call.status != UNIMPLEMENTED
    error_type = _error_type(call, is_server)
    attributes: dict[str, AttributeValue] = {}
    if semconv is not Semconv.NEW:  # the old set, alone or with the new
        attributes["rpc.system"] = SYSTEM
        if service is not None:
            attributes["rpc.service"] = service
        attributes["rpc.method"] = method or OTHER_METHOD
        if call.status is not None:
            attributes["rpc.grpc.status_code"] = call.status
    if semconv is not Semconv.OLD:  # the new set, alone or with the old
        attributes["rpc.system.name"] = SYSTEM
        if service is not None and recognised:
            attributes["rpc.method"] = f"{service}/{method}"
        else:
            attributes["rpc.method"] = OTHER_METHOD
            if service is not None:
                attributes["rpc.method_original"] = f"{service}/{method}"
        if call.status is not None:
            attributes["rpc.response.status_code"] = status_name(call.status)
    _put_endpoints(attributes, call, conn, is_server)
    put_socket_end(attributes, "network.peer", conn.peer)
    attributes["network.transport"] = conn.transport.value
    attributes["network.protocol.name"] = "http"
    attributes["network.protocol.version"] = "2"
    for side, count, compressed in (
        ("request", call.request_messages, call.request_compressed),
        ("response", call.response_messages, call.response_compressed),
    ):
        if count is not None:
            attributes[f"otel_ebpf.rpc.{side}.message_count"] = count
        if compressed:
            attributes[f"otel_ebpf.rpc.{side}.compressed"] = True
    if error_type is not None:
        attributes["error.type"] = error_type
    elif call.error == CAPTURE_GAP:
        attributes[CAPTURE_GAP_ATTRIBUTE] = True
    if capture_metadata:
        for prefix_old, prefix_new, metadata in (
            ("rpc.grpc.request.metadata.", "rpc.request.metadata.", call.request_metadata),
            ("rpc.grpc.response.metadata.", "rpc.response.metadata.", call.response_metadata),
        ):
            if semconv is not Semconv.NEW:  # the old set, alone or with the new
                attributes.update(header_attributes(prefix_old, metadata, capture_metadata))
            if semconv is not Semconv.OLD:  # the new set, alone or with the old
                attributes.update(header_attributes(prefix_new, metadata, capture_metadata))

    if semconv is not Semconv.OLD:  # the new set, alone or with the old
        name = f"{service}/{method}" if service is not None and recognised else SYSTEM
    else:
        name = f"{service}/{method}" if service is not None else SYSTEM
    kind = SpanKind.SERVER if is_server else SpanKind.CLIENT
    if error_type is None:
        return SpanDescription(name, kind, call.start_ns, call.end_ns, attributes)
    return SpanDescription(name, kind, call.start_ns, call.end_ns, attributes, StatusCode.ERROR, call.message)


# instrument names by "the process serves": the old set's duration, requests and responses per
# call, the new set's duration
_INSTRUMENTS = {
    is_server: tuple(
        f"rpc.{side}.{name}" for name in ("duration", "requests_per_rpc", "responses_per_rpc", "call.duration")
    )
    for is_server, side in ((True, "server"), (False, "client"))
}


def metric_points(call: GrpcCall, conn: ConnectionInfo, semconv: Semconv) -> list[MetricPoint]:
    """Duration (and, in the old set, messages per call) with low-cardinality attributes only."""
    is_server = conn.role is Role.SERVER
    duration, requests, responses, call_duration = _INSTRUMENTS[is_server]
    service, method = _split(call.path)
    error_type = _error_type(call, is_server)
    address, port = (None, None) if is_server else server_endpoint(call, conn)
    seconds = (call.end_ns - call.start_ns) / 1e9
    points = []
    if semconv is not Semconv.NEW:  # the old set, alone or with the new
        attributes = _metric_attributes(False, service, method, call.status, error_type, address, port)
        points.append(MetricPoint(duration, seconds * 1e3, attributes))
        if call.request_messages is not None:
            points.append(MetricPoint(requests, call.request_messages, attributes))
        if call.response_messages is not None:
            points.append(MetricPoint(responses, call.response_messages, attributes))
    if semconv is not Semconv.OLD:  # the new set, alone or with the old
        attributes = _metric_attributes(True, service, method, call.status, error_type, address, port)
        points.append(MetricPoint(call_duration, seconds, attributes))
    return points


@memoize_attributes
def _metric_attributes(
    new: bool,
    service: str | None,
    method: str | None,
    status: int | None,
    error_type: str | None,
    address: str | None,
    port: int | None,
) -> dict[str, AttributeValue]:
    """The metrics' attributes in the new set of conventions (``new``) or the old one."""
    attributes: dict[str, AttributeValue]
    if new:
        recognised = service is not None and status != UNIMPLEMENTED
        attributes = {"rpc.system.name": SYSTEM, "rpc.method": f"{service}/{method}" if recognised else OTHER_METHOD}
        if status is not None:
            attributes["rpc.response.status_code"] = status_name(status)
    else:
        attributes = {"rpc.system": SYSTEM, "rpc.method": method or OTHER_METHOD}
        if service is not None:
            attributes["rpc.service"] = service
        if status is not None:
            attributes["rpc.grpc.status_code"] = status
    if error_type is not None:
        attributes["error.type"] = error_type
    _put_server(attributes, address, port)
    return attributes
