"""FIFO pairing of HTTP/1.x requests and responses on one connection."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

from otel_ebpf.protocol import Message, Stitcher

from .parser import MAX_PENDING
from .types import HTTP1Exchange, Request, Response


class FifoStitcher(Stitcher):
    """HTTP/1.x answers requests strictly in order, pipelined or not, so pairing is a queue.

    A response only answers a request that started before it. It may be reported before its
    request completes (a server that answers before it has read the whole upload); such a response
    waits for the request. A response that no captured request could have caused (the capture
    began mid-exchange) is counted in ``unmatched``. Both queues are bounded: overflow drops the
    oldest entry, counted.
    """

    def __init__(
        self, capture_headers: Collection[str] = (), max_pending: int = MAX_PENDING, content_chars: int = 0
    ) -> None:
        self.unmatched = 0
        self._capture_headers = capture_headers
        self._content_chars = content_chars
        self._max_pending = max_pending
        self._requests: deque[Request] = deque()
        self._early: deque[Response] = deque()  # responses waiting for their request to complete

    @property
    def pending(self) -> int:
        return len(self._requests) + len(self._early)

    def add(self, message: Message) -> list[HTTP1Exchange]:
        if isinstance(message, Request):
            early = self._early
            while early and early[0].start_ns < message.start_ns:
                early.popleft()
                self.unmatched += 1
            if early:
                return [self._exchange(message, early.popleft())]
            self._enqueue(self._requests, message)
        elif isinstance(message, Response):
            if not self._requests:
                self._enqueue(self._early, message)
            elif self._requests[0].start_ns > message.start_ns:
                self.unmatched += 1  # it answers a request from before the capture
            else:
                return [self._exchange(self._requests.popleft(), message)]
        else:
            self.unmatched += 1
        return []

    def flush(self, timestamp_ns: int) -> list[HTTP1Exchange]:
        exchanges = [
            HTTP1Exchange(request, None, max(request.end_ns, timestamp_ns), self._capture_headers, self._content_chars)
            for request in self._requests
        ]
        self.unmatched += len(self._early)
        self._requests.clear()
        self._early.clear()
        return exchanges

    def _enqueue(self, queue: deque, message: Message) -> None:
        if len(queue) >= self._max_pending:
            queue.popleft()
            self.unmatched += 1
        queue.append(message)

    def _exchange(self, request: Request, response: Response) -> HTTP1Exchange:
        return HTTP1Exchange(request, response, response.end_ns, self._capture_headers, self._content_chars)
