"""Pairs commands with replies: Redis answers in order, pipelined or not, except for pub/sub."""

from __future__ import annotations

from collections import deque

from otel_ebpf.protocol import Message, Stitcher

from .resp import Command, Lost, Reply
from .semconv import QueryText, RedisExchange

MAX_PENDING = 1024  # commands awaiting replies on one connection (a deep pipeline); oldest dropped
SUBSCRIBE = frozenset({"SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE"})
UNSUBSCRIBE = frozenset({"UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE"})
# what a RESP2 message pushed to a subscribed connection starts with
MESSAGES = frozenset({b"message", b"pmessage", b"smessage"})


class RedisStitcher(Stitcher):
    """FIFO pairing, as Redis replies in command order. What is not a reply:

    - pub/sub traffic: RESP3 push values (``>``) other than the confirmation a (un)subscribe
      command gets, and on a RESP2 connection in subscribed mode the ``message`` arrays; a
      command naming N channels gets N confirmations, the first is its reply. Counted in
      ``pushes``, not in ``unmatched``.
    - a reply that started before the oldest pending command (it answers a command from before
      the capture, or one a gap hid): ``unmatched``.

    When a gap hides replies, the commands pending at that moment lost theirs (and which later
    replies belong to whom is unknown): they are dropped, counted in ``unmatched``, never paired
    with a wrong reply. The database index comes from the replies to SELECT.
    """

    def __init__(self, query_text: QueryText) -> None:
        self.unmatched = 0
        self.pushes = 0
        self._query_text = query_text
        self._pending: deque[Command] = deque()
        self._namespace: str | None = None
        self._subscribed = False  # RESP2: only pub/sub traffic flows until all are unsubscribed
        self._confirmations = 0  # further (un)subscribe confirmations of the last such command

    def add(self, message: Message) -> list[RedisExchange]:
        if isinstance(message, Command):
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self.unmatched += 1
            self._pending.append(message)
        elif isinstance(message, Reply):
            return self._reply(message)
        elif isinstance(message, Lost) and self._pending and message.direction is not self._pending[0].direction:
            while self._pending and self._pending[0].start_ns <= message.start_ns:
                self._pending.popleft()
                self.unmatched += 1
        return []

    def flush(self, timestamp_ns: int) -> list[RedisExchange]:
        """Commands never answered (the connection closed, or the agent stops) are counted."""
        self.unmatched += len(self._pending)
        self._pending.clear()
        return []

    def _reply(self, reply: Reply) -> list[RedisExchange]:
        pending = self._pending
        first = reply.items[0] if reply.items else None
        word = first.decode("ascii", "replace").upper() if isinstance(first, bytes) else None
        confirmation = word in SUBSCRIBE or word in UNSUBSCRIBE
        if reply.kind == ">" or (self._subscribed and reply.kind == "*" and (confirmation or first in MESSAGES)):
            answers = confirmation and not self._confirmations and pending and pending[0].name == word
            if not answers:
                if confirmation:
                    self._confirmations = max(0, self._confirmations - 1)
                    self._track_subscriptions(reply)
                self.pushes += 1
                return []
        if not pending or pending[0].start_ns > reply.start_ns:
            self.unmatched += 1
            return []
        command = pending.popleft()
        exchange = RedisExchange(command, reply, self._namespace, self._query_text)
        self._after(command, reply)
        return [exchange]

    def _after(self, command: Command, reply: Reply) -> None:
        """What a command changed on its connection."""
        name = command.name
        if reply.error is not None:
            return
        if name == "SELECT" and len(command.args) > 1 and isinstance(command.args[1], bytes):
            index = command.args[1].decode("ascii", "replace")
            self._namespace = index if index.isdigit() else None
        elif name in SUBSCRIBE or name in UNSUBSCRIBE:
            self._confirmations = max(0, command.arg_count - 2)
            self._track_subscriptions(reply)
        elif name == "RESET":
            self._subscribed = False
            self._namespace = "0"

    def _track_subscriptions(self, reply: Reply) -> None:
        """(Un)subscribe confirmations end in the number of subscriptions left."""
        if len(reply.items) >= 3 and isinstance(reply.items[2], int):
            self._subscribed = reply.items[2] > 0
