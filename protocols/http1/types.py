"""HTTP/1.x messages and the exchange they form."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from otel_ebpf.protocol import (
    ConnectionInfo,
    Direction,
    Exchange,
    Message,
    MetricPoint,
    SpanDescription,
)

from ..http_semconv import (
    CONNECTION_CLOSED,
    Headers,
    HttpTransaction,
    describe_span,
    first_header,
    metric_points,
)

# Why a message's end was not seen (``incomplete``); CONNECTION_CLOSED (shared with error.type)
# means the connection ended mid-message.
CAPTURE_GAP = "capture_gap"  # bytes past the capture cap hid the framing
MALFORMED = "malformed"  # framing the parser could not follow


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class HTTP1Exchange(Exchange):
    """A request and its response, or a request the connection never answered (``response=None``).

    ``end_ns`` is the response's last byte, or for an unanswered request the time the pipeline
    learned that the connection was gone.
    """

    request: Request
    response: Response | None
    end_ns: int
    capture_headers: Collection[str] = ()

    def transaction(self) -> HttpTransaction:
        request, response = self.request, self.response
        error = None
        if response is not None and response.incomplete == CONNECTION_CLOSED:
            error = CONNECTION_CLOSED
        return HttpTransaction(
            method=request.method,
            target=request.target,
            # a server answers in at most the version it was asked in, so the response's is used
            version=response.version if response is not None else request.version,
            start_ns=request.start_ns,
            end_ns=self.end_ns,
            request_headers=request.headers,
            request_body_size=request.body_size,
            authority=first_header(request.headers, "host"),
            status=response.status if response is not None else None,
            response_headers=response.headers if response is not None else (),
            response_body_size=response.body_size if response is not None else None,
            error=error,
        )

    def span(self, conn: ConnectionInfo) -> SpanDescription:
        return describe_span(self.transaction(), conn, self.capture_headers)

    def metric_points(self, conn: ConnectionInfo) -> list[MetricPoint]:
        return metric_points(self.transaction(), conn)
