"""One HTTP/1.x connection: a request parser and a response parser that share the request FIFO."""

from __future__ import annotations

from collections import deque

from otel_ebpf.protocol import Direction, Role, Session, SessionOutput

from ..genai import GenAIOptions
from .parser import MAX_PENDING, Pending, RequestParser, ResponseParser


class HTTP1Session(Session):
    """Routes each direction to its parser and keeps the two in step.

    The response parser must know the method of the request each response answers (a response to
    HEAD has no body whatever its headers say) and, for an LLM call, how to read its body; responses
    come in request order, so the request parser appends both to a bounded FIFO that the response
    parser consumes. When a
    response switches protocols (101, or 2xx to CONNECT) both directions stop being HTTP/1. A
    message held because a gap hid its chunk framing ends when bytes move the other way.
    """

    def __init__(self, role: Role, genai: GenAIOptions | None = None) -> None:
        methods: deque[Pending] = deque(maxlen=MAX_PENDING)
        requests = Direction.INGRESS if role is Role.SERVER else Direction.EGRESS
        self._requests = RequestParser(requests, methods, genai)
        self._responses = ResponseParser(requests.reverse(), methods, genai)
        self._parsers: dict[Direction, RequestParser | ResponseParser] = {
            requests: self._requests,
            requests.reverse(): self._responses,
        }
        self._holding: RequestParser | ResponseParser | None = None  # the parser whose message is lost

    @property
    def parse_errors(self) -> int:  # type: ignore[override]
        return self._requests.parse_errors + self._responses.parse_errors

    @property
    def buffered(self) -> int:  # type: ignore[override]
        """Bytes held for an unfinished head or line: at most ``MAX_HEAD`` per direction."""
        return self._requests.buffered + self._responses.buffered

    def feed(self, direction: Direction, data: bytes, timestamp_ns: int) -> list[SessionOutput]:
        parser = self._parsers[direction]
        held = self._end_held(parser) if self._holding is not None else []
        messages = held + parser.feed(data, timestamp_ns)
        return self._follow_upgrade() + messages if self._responses.opaque else messages

    def feed_gap(self, direction: Direction, length: int, timestamp_ns: int) -> list[SessionOutput]:
        parser = self._parsers[direction]
        held = self._end_held(parser) if self._holding is not None else []
        messages = held + parser.gap(length, timestamp_ns)
        if parser.lost:
            self._holding = parser
        return self._follow_upgrade() + messages if self._responses.opaque else messages

    def _end_held(self, moving: RequestParser | ResponseParser) -> list[SessionOutput]:
        """Bytes move through ``moving``: a message the other direction holds is over."""
        return [] if self._holding is moving else self.finish_held()

    def finish_held(self) -> list[SessionOutput]:
        held, self._holding = self._holding, None
        return held.end_lost() if held is not None else []

    def close(self, timestamp_ns: int) -> list[SessionOutput]:
        # Requests first: an unanswered request must reach the stitcher before a late response.
        return self._requests.close() + self._responses.close()

    def _follow_upgrade(self) -> list[SessionOutput]:
        """The responses switched protocols: the requests stop being HTTP/1 too. A request still
        in its body ends there; it goes first, so the stitcher pairs it with the switching
        response."""
        return [] if self._requests.opaque else self._requests.switch()
