"""HTTP/1.x messages and the exchange they form."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from otel_ebpf.protocol import (
    ConnectionInfo,
    Direction,
    Exchange,
    Message,
    MetricPoint,
    SpanDescription,
)

from ..genai import GenAICall, GenAIRequest, GenAIResponse
from ..http_semconv import (
    CAPTURE_GAP,
    CONNECTION_CLOSED,
    Headers,
    HttpTransaction,
    describe_span,
    error_type,
    first_header,
    metric_points,
    server_endpoint,
)

# Why a message's end was not seen (``incomplete``): CAPTURE_GAP (bytes past the capture cap hid
# the framing) and CONNECTION_CLOSED (the connection ended mid-message) are HTTP's, or
MALFORMED = "malformed"  # framing the parser could not follow


# Request, Response and HTTP1Exchange are made for every message and exchange: plain dataclasses
# with slots (a frozen one sets each field through object.__setattr__). Treat them as values.
@dataclass(slots=True)
class Request(Message):
    """A request head and the size of its body.

    ``incomplete`` is ``None`` for a message seen to its last byte, else why not
    (``CAPTURE_GAP``, ``CONNECTION_CLOSED``, ``MALFORMED``); ``headers`` then holds the header
    lines seen before the loss. ``body_size`` counts content bytes without chunk framing; it is
    ``None`` when the loss hid how much content there was.
    """

    direction: Direction
    start_ns: int
    end_ns: int
    method: str
    target: str
    version: str  # "1.0" or "1.1"
    headers: Headers
    body_size: int | None
    incomplete: str | None = None
    genai: GenAIRequest | None = None  # the request as an LLM call (see ..genai)


@dataclass(slots=True)
class Response(Message):
    """A final response (interim 1xx responses never become messages); fields as for Request."""

    direction: Direction
    start_ns: int
    end_ns: int
    status: int
    reason: str
    version: str
    headers: Headers
    body_size: int | None
    incomplete: str | None = None
    genai: GenAIResponse | None = None  # what the response said, when its request is an LLM call


@dataclass(slots=True)
class HTTP1Exchange(Exchange):
    """A request and its response, or a request the connection never answered (``response=None``).

    ``end_ns`` is the response's last byte, or for an unanswered request the time the pipeline
    learned that the connection was gone.
    """

    request: Request
    response: Response | None
    end_ns: int
    capture_headers: Collection[str] = ()
    content_chars: int = 0  # LLM prompt and output text exported, at most (0: none)
    # Derived once, since the span and the metric points both describe it.
    _transaction: HttpTransaction = field(init=False, repr=False, compare=False)
    _call: GenAICall | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._transaction = tx = self._to_transaction()
        request, response = self.request.genai, self.response.genai if self.response is not None else None
        self._call = GenAICall(request, response, tx.start_ns, tx.end_ns) if request is not None else None

    def transaction(self) -> HttpTransaction:
        return self._transaction

    def _to_transaction(self) -> HttpTransaction:
        request, response = self.request, self.response
        response_headers: Headers
        if response is None:
            version, status, response_headers, response_body_size = request.version, None, (), None
            error = None
        else:
            # a server answers in at most the version it was asked in, so the response's is used
            version, status = response.version, response.status
            response_headers, response_body_size = response.headers, response.body_size
            # Cut short by the connection's end is an error, unless an LLM stream had reached its
            # end; an end the capture lost (the response's, or the request's: a chunked upload) is
            # not, but the span says so (CAPTURE_GAP).
            if response.incomplete == CONNECTION_CLOSED:
                error = None if response.genai and response.genai.reached_end else CONNECTION_CLOSED
            else:
                error = CAPTURE_GAP if CAPTURE_GAP in (response.incomplete, request.incomplete) else None
        authority = first_header(request.headers, "host")
        # positional, in field order: keywords would make this per-exchange call a third slower
        return HttpTransaction(
            request.method,
            request.target,
            version,
            request.start_ns,
            self.end_ns,
            request.headers,
            request.body_size,
            authority,
            status,
            response_headers,
            response_body_size,
            error,
        )

    def span(self, conn: ConnectionInfo) -> SpanDescription:
        span = describe_span(self._transaction, conn, self.capture_headers)
        return span if self._call is None else self._call.describe(span, self.content_chars)

    def metric_points(self, conn: ConnectionInfo) -> list[MetricPoint]:
        points = metric_points(self._transaction, conn)
        if self._call is not None:
            tx = self._transaction
            points += self._call.metric_points(conn, server_endpoint(tx, conn), error_type(tx, conn))
        return points
