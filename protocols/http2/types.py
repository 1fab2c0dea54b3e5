"""HTTP/2 messages (one per stream and direction) and the exchange a stream forms.

An exchange is described with the HTTP conventions (:mod:`..http_semconv`) or, for a gRPC call,
the RPC ones (:mod:`..grpc_semconv`); an LLM call (:mod:`..genai`, over HTTP or gRPC) adds the
GenAI ones on top. What the capture could not tell stays unknown: a request
whose ``:method`` or ``:path`` was compressed against header state from before the capture has
``UNKNOWN_METHOD`` / ``UNKNOWN_TARGET``, a response without a known ``:status``
``UNKNOWN_STATUS``, and ``unknown`` counts the fields left out.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from otel_ebpf.protocol import ConnectionInfo, Direction, Exchange, Message, MetricPoint, SpanDescription

from .. import grpc_semconv, http_semconv
from ..genai import GenAICall, GenAIRequest, GenAIResponse
from ..grpc_semconv import GrpcCall, Semconv
from ..http_semconv import (
    CAPTURE_GAP,
    CONNECTION_CLOSED,
    RESPONSE_MISSING,
    UNKNOWN_METHOD,
    UNKNOWN_STATUS,
    UNKNOWN_TARGET,
    Headers,
    HttpTransaction,
    first_header,
)

# HTTP/2 error codes (RFC 9113 section 7), as error.type of a reset stream
ERROR_CODES = (
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "SETTINGS_TIMEOUT",
    "STREAM_CLOSED",
    "FRAME_SIZE_ERROR",
    "REFUSED_STREAM",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONNECT_ERROR",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "HTTP_1_1_REQUIRED",
)
REFUSED_STREAM = 0x7


@dataclass(frozen=True, slots=True)
class Request(Message):
    """A stream's request: its header fields (pseudo-headers included, in wire order) and body.

    ``unknown`` counts header and trailer fields the capture could not tell. ``body_size`` is the
    DATA payload length (``None`` if a gap hid part of it); ``messages`` / ``compressed`` count
    gRPC length-prefixed messages (``messages`` is ``None`` when not counted or uncertain).
    ``incomplete`` is ``None`` for a request seen to its END_STREAM, else why not.
    """

    direction: Direction
    start_ns: int
    end_ns: int
    stream: int
    headers: Headers
    unknown: int = 0
    body_size: int | None = 0
    messages: int | None = None
    compressed: int = 0
    incomplete: str | None = None
    genai: GenAIRequest | None = None  # the request as an LLM call (see ..genai)


@dataclass(frozen=True, slots=True)
class Response(Message):
    """A stream's response (interim 1xx responses are skipped); fields as for :class:`Request`.

    ``status`` is ``None`` when no response HEADERS were seen (a stream reset before them),
    ``UNKNOWN_STATUS`` when they were but their ``:status`` could not be told;
    ``reset`` the RST_STREAM error code that ended the stream (from either side), or
    REFUSED_STREAM for a stream the server's GOAWAY did not take.
    """

    direction: Direction
    start_ns: int
    end_ns: int
    stream: int
    status: int | None
    headers: Headers = ()
    trailers: Headers = ()
    unknown: int = 0
    body_size: int | None = 0
    messages: int | None = None
    compressed: int = 0
    reset: int | None = None
    incomplete: str | None = None
    genai: GenAIResponse | None = None  # what the response said, when its request is an LLM call


@dataclass(frozen=True, slots=True)
class StreamDropped(Message):
    """A stream the session could not report: its request HEADERS were never seen (it began
    before the capture, or a gap hid them), or it was evicted from a full stream table."""

    direction: Direction
    start_ns: int
    end_ns: int
    stream: int


@dataclass(frozen=True)
class Settings:
    """What the plugin's options decide about every exchange."""

    capture_headers: Collection[str] = ()
    semconv: Semconv = Semconv.OLD
    content_chars: int = 0  # LLM prompt and output text exported, at most (0: none)


def pseudo(headers: Headers, name: str) -> str | None:
    """A pseudo-header's value (pseudo-headers come first in a block, so the scan is short)."""
    for key, value in headers:
        if key == name:
            return value
        if not key.startswith(":"):
            return None
    return None


def is_grpc(request: Request, response: Response | None) -> bool:
    """``content-type: application/grpc`` (``+proto``, ``;...``), not gRPC-Web; or, when the capture
    could not tell the request's content type, a response that carries ``grpc-status`` or
    ``grpc-message`` (a literal in every gRPC response, so known even mid-stream)."""
    content_type = first_header(request.headers, "content-type")
    if content_type is not None:
        return content_type == "application/grpc" or content_type.startswith(("application/grpc+", "application/grpc;"))
    if request.unknown and response is not None:
        return any(name in ("grpc-status", "grpc-message") for name, _ in (*response.headers, *response.trailers))
    return False


@dataclass(frozen=True, slots=True)
class HTTP2Exchange(Exchange):
    """A stream: its request and response (``None``: never answered before the connection ended).

    ``end_ns`` is the last byte of the stream, or for an unanswered request the time the
    pipeline learned that the connection was gone.
    """

    request: Request
    response: Response | None
    end_ns: int
    settings: Settings = field(default_factory=Settings)
    # Derived once, since the span and the metric points both describe it.
    _call: GrpcCall | None = field(init=False, repr=False, compare=False)
    _transaction: HttpTransaction | None = field(init=False, repr=False, compare=False)
    _genai: GenAICall | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grpc = is_grpc(self.request, self.response)
        # how a frozen dataclass sets derived fields
        object.__setattr__(self, "_call", self._to_call() if grpc else None)
        tx = None if grpc else self._to_transaction()
        object.__setattr__(self, "_transaction", tx)
        request = self.request.genai
        call = None
        if request is not None:
            timed: GrpcCall | HttpTransaction = tx if tx is not None else self._call  # type: ignore[assignment]
            call = GenAICall(request, self.response.genai if self.response else None, timed.start_ns, timed.end_ns)
        object.__setattr__(self, "_genai", call)

    @property
    def call(self) -> GrpcCall | None:
        """The gRPC call, for a gRPC exchange."""
        return self._call

    @property
    def transaction(self) -> HttpTransaction | None:
        """The HTTP transaction, for any other exchange."""
        return self._transaction

    def span(self, conn: ConnectionInfo) -> SpanDescription:
        if self._call is not None:
            span = grpc_semconv.describe_span(self._call, conn, self.settings.semconv, self.settings.capture_headers)
        else:
            span = http_semconv.describe_span(self._transaction, conn, self.settings.capture_headers)  # type: ignore[arg-type]
        return span if self._genai is None else self._genai.describe(span, self.settings.content_chars)

    def metric_points(self, conn: ConnectionInfo) -> list[MetricPoint]:
        call, genai = self._call, self._genai
        if call is not None:
            points = grpc_semconv.metric_points(call, conn, self.settings.semconv)
            if genai is not None:
                server, error = grpc_semconv.server_endpoint(call, conn), grpc_semconv.error_type(call, conn)
                points += genai.metric_points(conn, server, error)
            return points
        tx: HttpTransaction = self._transaction  # type: ignore[assignment]
        points = http_semconv.metric_points(tx, conn)
        if genai is not None:
            server, error = http_semconv.server_endpoint(tx, conn), http_semconv.error_type(tx, conn)
            points += genai.metric_points(conn, server, error)
        return points

    def _to_transaction(self) -> HttpTransaction:
        request, response = self.request, self.response
        headers = request.headers
        method = pseudo(headers, ":method") or UNKNOWN_METHOD
        target = pseudo(headers, ":path") or (pseudo(headers, ":authority") if method == "CONNECT" else None)
        authority = pseudo(headers, ":authority") or first_header(headers, "host")
        if response is None:
            return HttpTransaction(
                method,
                target or UNKNOWN_TARGET,
                "2",
                request.start_ns,
                self.end_ns,
                headers,
                request.body_size,
                authority,
            )
        return HttpTransaction(
            method,
            target or UNKNOWN_TARGET,
            "2",
            request.start_ns,
            self.end_ns,
            headers,
            request.body_size,
            authority,
            response.status,
            (*response.headers, *response.trailers),
            response.body_size,
            _response_error(response),
        )

    def _to_call(self) -> GrpcCall:
        request, response = self.request, self.response
        path = pseudo(request.headers, ":path")
        authority = pseudo(request.headers, ":authority")
        start, end = request.start_ns, self.end_ns
        if response is None:
            return GrpcCall(
                path,
                start,
                end,
                authority,
                error=RESPONSE_MISSING,
                request_messages=request.messages,
                request_compressed=bool(request.compressed),
                request_metadata=request.headers,
            )
        status, message, error = _grpc_outcome(response)
        return GrpcCall(
            path,
            start,
            end,
            authority,
            status,
            message,
            error,
            request.messages,
            response.messages,
            bool(request.compressed),
            bool(response.compressed),
            request.headers,
            (*response.headers, *response.trailers),
        )


def _response_error(response: Response) -> str | None:
    """``error.type`` of an HTTP response that did not end normally: the code of the reset that
    ended it, the connection's end, or for a stream reset before any response, that code."""
    if response.status is not None and response.genai is not None and response.genai.reached_end:
        return None  # the LLM stream had ended: a client that stops reading there cancels nothing
    if response.reset is not None:
        return ERROR_CODES[response.reset] if response.reset < len(ERROR_CODES) else hex(response.reset)
    if response.incomplete == CAPTURE_GAP:
        return CAPTURE_GAP  # not an error: the span says the capture lost its end
    if response.status is None:
        return RESPONSE_MISSING
    if response.incomplete == CONNECTION_CLOSED:
        return CONNECTION_CLOSED
    return None


def _grpc_outcome(response: Response) -> tuple[int | None, str | None, str | None]:
    """(gRPC status code, status message, error.type without a status) of a call's response."""
    fields = response.trailers or response.headers  # Trailers-Only: the status is in the headers
    status = grpc_semconv.parse_status(first_header(fields, "grpc-status"))
    message = grpc_semconv.decode_message(first_header(fields, "grpc-message"))
    if status is not None:
        return status, message, None
    if response.status is not None and response.status not in (200, UNKNOWN_STATUS):
        return grpc_semconv.status_from_http(response.status), message, None
    if response.reset is not None:
        return grpc_semconv.status_from_reset(response.reset), message, None
    if response.incomplete in (CONNECTION_CLOSED, CAPTURE_GAP):
        return None, message, response.incomplete
    if response.incomplete is None and not response.unknown and response.status is not None:
        return grpc_semconv.INTERNAL, message or "missing trailers", None  # ended without a status
    return None, message, None  # the capture could not tell
