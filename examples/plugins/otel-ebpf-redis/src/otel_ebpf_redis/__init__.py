"""Redis (RESP2 and RESP3) for otel-ebpf: one database span per command, on the client and on
the server, and the ``db.client.operation.duration`` histogram.

An out-of-tree plugin, built on the plugin kit: framing on :mod:`otel_ebpf.framing` (``resp``),
pairing in ``stitcher``, semantic conventions in ``semconv``. Registered under the
``otel_ebpf.protocols`` entry point as ``redis``.

Options (``protocols.redis`` in the agent configuration):

``query_text``
    ``sanitized`` (default): ``db.query.text`` is the command with each argument replaced by
    ``?`` (``SET ? ?``), so no key or value leaves the node; ``off``: no ``db.query.text``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from otel_ebpf.protocol import (
    NEED_MORE,
    NO_MATCH,
    STREAMS,
    Direction,
    Protocol,
    Role,
    Sniff,
)

from .resp import Command, Lost, Reply, RespFramer
from .semconv import INSTRUMENTS, QueryText, RedisExchange
from .session import RedisSession
from .stitcher import RedisStitcher

__all__ = ["Command", "Lost", "Redis", "RedisExchange", "RedisSession", "RedisStitcher", "Reply", "RespFramer"]

# A command as clients send it: an array whose first bulk string is a command name.
_COMMAND = re.compile(rb"\*([1-9][0-9]{0,5})\r\n\$([1-9][0-9]?)\r\n([A-Za-z][A-Za-z0-9._|-]*)\r\n")
_COMMAND_PREFIX = re.compile(
    rb"\*(?:[1-9][0-9]{0,5}(?:\r(?:\n(?:\$(?:[1-9][0-9]?(?:\r(?:\n[A-Za-z][A-Za-z0-9._|-]*\r?)?)?)?)?)?)?)?\Z"
)
# Inline commands (redis-cli's, telnet's) are claimed only for commands that need no argument or
# are common enough to be worth it; any text line would do otherwise.
_INLINE = re.compile(
    rb"(?i:PING|HELLO|INFO|DBSIZE|TIME|QUIT|(?:GET|SET|DEL|EXISTS|INCR|SELECT|AUTH|ECHO|KEYS) [^\r\n]*)\r?\n"
)


class Redis(Protocol):
    name = "redis"
    transports = STREAMS
    instruments = INSTRUMENTS

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        query_text = options.pop("query_text", QueryText.SANITIZED.value)
        super().__init__(options)
        try:
            self.query_text = QueryText(query_text)
        except ValueError:
            choices = ", ".join(q.value for q in QueryText)
            raise ValueError(f"query_text: expected one of {choices}, got {query_text!r}") from None

    def sniff(self, direction: Direction, data: bytes) -> Sniff:
        """A command at the very start: the observed process sends it (client) or gets it (server).
        Replies are not claimed: their types say too little about who is talking."""
        command = _COMMAND.match(data)
        if command is not None and len(command.group(3)) == int(command.group(2)) or _INLINE.match(data):
            return Sniff(True, role=Role.CLIENT if direction is Direction.EGRESS else Role.SERVER)
        if _COMMAND_PREFIX.match(data[:32]) and len(data) < 32:
            return NEED_MORE
        return NO_MATCH

    def new_session(self, role: Role) -> RedisSession:
        return RedisSession(role)

    def new_stitcher(self, role: Role) -> RedisStitcher:
        return RedisStitcher(self.query_text)
