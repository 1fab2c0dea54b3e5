"""Pairing HTTP/2 requests and responses by stream id."""

from __future__ import annotations

from otel_ebpf.protocol import Exchange, Message, Stitcher

from ..http1 import FifoStitcher
from ..http1.types import Request as HTTP1Request
from ..http1.types import Response as HTTP1Response
from .session import MAX_STREAMS
from .types import HTTP2Exchange, Request, Response, Settings, StreamDropped


class StreamStitcher(Stitcher):
    """The session reports a stream's request before its response, so pairing is a lookup.

    A response whose request was never reported (its HEADERS came before the capture) and a
    :class:`StreamDropped` stream are counted in ``unmatched``; so are requests evicted from the
    bounded table of those waiting for their response. A connection whose h2c upgrade the server
    declined stays HTTP/1.1: its messages are paired by the HTTP/1 plugin's FIFO stitcher.
    """

    def __init__(self, settings: Settings, max_pending: int = MAX_STREAMS) -> None:
        self._settings = settings
        self._max_pending = max_pending
        self._requests: dict[int, Request] = {}  # by stream id, in arrival order
        self._http1: FifoStitcher | None = None
        self._unmatched = 0

    @property
    def unmatched(self) -> int:  # type: ignore[override]
        return self._unmatched + (self._http1.unmatched if self._http1 is not None else 0)

    @property
    def pending(self) -> int:
        return len(self._requests) + (self._http1.pending if self._http1 is not None else 0)

    def add(self, message: Message) -> list[Exchange]:
        if isinstance(message, Response):
            request = self._requests.pop(message.stream, None)
            if request is None:
                self._unmatched += 1
                return []
            return [HTTP2Exchange(request, message, max(request.end_ns, message.end_ns), self._settings)]
        if isinstance(message, Request):
            if len(self._requests) >= self._max_pending:
                del self._requests[next(iter(self._requests))]
                self._unmatched += 1
            self._requests[message.stream] = message
        elif isinstance(message, StreamDropped):
            self._requests.pop(message.stream, None)
            self._unmatched += 1
        elif isinstance(message, (HTTP1Request, HTTP1Response)):
            if self._http1 is None:
                self._http1 = FifoStitcher(self._settings.capture_headers)
            return list(self._http1.add(message))
        else:
            self._unmatched += 1
        return []

    def flush(self, timestamp_ns: int) -> list[Exchange]:
        exchanges: list[Exchange] = [
            HTTP2Exchange(request, None, max(request.end_ns, timestamp_ns), self._settings)
            for request in self._requests.values()
        ]
        self._requests.clear()
        if self._http1 is not None:
            exchanges += self._http1.flush(timestamp_ns)
        return exchanges
