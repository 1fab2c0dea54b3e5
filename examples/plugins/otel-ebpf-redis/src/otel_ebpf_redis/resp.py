"""RESP2/RESP3 framing and parsing, on the plugin kit's stream helper (otel_ebpf.framing).

A frame is one RESP line (``*3``, ``$5``, ``+OK``, ``:1``, ...) and, for the blob types (``$``
bulk strings, ``!`` bulk errors, ``=`` verbatim strings), the payload that follows it as the
frame's body. Small bodies are kept (command names, the arguments the spans need, error
messages); large ones are skipped by the stream without being buffered, so a 100 MB value costs
nothing and a capture cap inside it loses nothing but the value. :class:`RespFramer` assembles
frames into one message per top-level value: a :class:`Command` in the direction the observed
process's commands travel, a :class:`Reply` in the other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from otel_ebpf.framing import INVALID, Framer, Head, Invalid
from otel_ebpf.protocol import Direction, Message

MAX_LINE = 4096  # longest line (simple string, error, inline command) followed; longer is invalid
MAX_DEPTH = 32  # nesting of aggregates (Redis itself nests replies a few levels at most)
KEEP_BODY = 512  # blob payloads up to this size are read; longer ones are skipped
MAX_ITEMS = 8  # direct elements of a top-level value kept (command arguments, push kinds)
MAX_COUNT = 1 << 32  # element counts and blob lengths beyond this are not RESP

AGGREGATES = frozenset(b"*%~>|")  # array, map, set, push, attribute
BLOBS = frozenset(b"$!=")  # bulk string, bulk error, verbatim string
_NUMBER = re.compile(rb"-?[0-9]{1,20}\Z")
_DOUBLE = re.compile(rb"[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|inf|nan)\Z", re.IGNORECASE)
# What a command starts with: an array header, then its first bulk string's header.
_COMMAND_START = re.compile(rb"\*[1-9][0-9]{0,9}\r\n\$")
_COMMAND_PREFIX = re.compile(rb"\*(?:[1-9][0-9]{0,9}(?:\r\n?)?)?\Z")  # the same, cut short
_INLINE = re.compile(rb"[A-Za-z][A-Za-z0-9._|-]{0,63}(?:[ \t][^\r\n]*)?\Z")

Item = bytes | int | None  # a kept element: a string's bytes, an integer, or unknown/other


@dataclass(slots=True)
class Command(Message):
    """A command the client sent. ``args`` are its first elements (name first), ``None`` where
    an element was too large to keep or not captured; ``arg_count`` counts them all."""

    direction: Direction
    start_ns: int
    end_ns: int
    args: tuple[Item, ...]
    arg_count: int
    inline: bool = False

    @property
    def name(self) -> str | None:
        first = self.args[0] if self.args else None
        return first.decode("ascii", "replace").upper() if isinstance(first, bytes) else None


@dataclass(slots=True)
class Reply(Message):
    """A value the server sent: its RESP type (``+``, ``-``, ``*``, ``>``, ...), the error prefix
    for an error (``ERR``, ``WRONGTYPE``), and its first direct elements (an aggregate's)."""

    direction: Direction
    start_ns: int
    end_ns: int
    kind: str
    error: str | None = None
    items: tuple[Item, ...] = ()


@dataclass(slots=True)
class Lost(Message):
    """The capture lost bytes of this direction at ``start_ns``: the message then in progress,
    and maybe more, are gone."""

    direction: Direction
    start_ns: int
    end_ns: int


def _count(line: bytes, allow_null: bool) -> int | None:
    if not _NUMBER.match(line):
        return None
    n = int(line)
    if n < (-1 if allow_null else 0) or n > MAX_COUNT:
        return None
    return n


def _scalar_ok(kind: int, line: bytes) -> bool:
    if kind == ord(":") or kind == ord("("):
        return bool(_NUMBER.match(line)) if kind == ord(":") else line.lstrip(b"-+").isdigit()
    if kind == ord(","):
        return bool(_DOUBLE.match(line))
    if kind == ord("#"):
        return line in (b"t", b"f")
    if kind == ord("_"):
        return line == b""
    return kind in (ord("+"), ord("-"))


def _error_prefix(text: bytes) -> str:
    word = text.split(None, 1)[0] if text.strip() else b"ERR"
    return word.decode("ascii", "replace")[:32]


class _Level:
    """An aggregate being read: elements still to come; whether it is (inside) an attribute."""

    __slots__ = ("attribute", "hidden", "remaining")

    def __init__(self, remaining: int, attribute: bool, hidden: bool) -> None:
        self.remaining = remaining
        self.attribute = attribute  # a RESP3 attribute: metadata, not one of its parent's elements
        self.hidden = hidden  # inside an attribute: nothing kept


class RespFramer(Framer[Message]):
    """One direction of a Redis connection: commands (``commands=True``) or replies."""

    def __init__(self, direction: Direction, commands: bool) -> None:
        self.direction = direction
        self.commands = commands
        self._levels: list[_Level] = []
        self._start_ns: int | None = None  # first byte of the value in progress
        self._kind = ""
        self._error: str | None = None
        self._items: list[Item] = []
        self._count = 0  # direct elements of the top-level value

    # ---- framing ----------------------------------------------------------------------------

    def head(self, data: bytearray, start: int) -> Head | Invalid | None:
        eol = data.find(b"\n", start, start + MAX_LINE + 2)
        if eol == -1:
            return INVALID if len(data) - start > MAX_LINE + 1 else None
        kind = data[start]
        if kind in AGGREGATES or kind in BLOBS or kind in b"+-:,(#_":
            if data[eol - 1] != 13 or eol == start:  # typed lines end in CRLF
                return INVALID
            line = bytes(data[start + 1 : eol - 1])
            length = eol + 1 - start
            if kind in BLOBS:
                n = _count(line, allow_null=kind == ord("$"))
                if n is None:
                    return INVALID
                if n == -1:
                    return Head(length, (ord("_"), b""))
                return Head(length, (kind, n), n + 2, keep_body=n <= KEEP_BODY)
            if kind in AGGREGATES:
                n = _count(line, allow_null=kind == ord("*"))
                return INVALID if n is None else Head(length, (kind, n))
            return Head(length, (kind, line)) if _scalar_ok(kind, line) else INVALID
        if self.commands and not self._levels:
            line = bytes(data[start:eol]).rstrip(b"\r")
            return Head(eol + 1 - start, (0, line)) if _INLINE.match(line) else INVALID
        return INVALID

    def resync(self, data: bytearray, start: int) -> int | None:
        """Commands: the next array header followed by a bulk string header (or a prefix of one
        at the end of the bytes). Replies: the next byte that starts a RESP type, after a line end."""
        if self.commands:
            at = start
            while (at := data.find(b"*", at)) != -1:
                piece = bytes(data[at : at + 16])
                if _COMMAND_START.match(piece) or _COMMAND_PREFIX.match(piece):
                    return at
                at += 1
            return None
        if start < len(data) and (data[start] in AGGREGATES or data[start] in BLOBS or data[start] in b"+-:,(#_"):
            return start
        at = data.find(b"\n", start)
        return at + 1 if at != -1 and at + 1 < len(data) else None

    # ---- parsing ----------------------------------------------------------------------------

    def frame(self, value: Any, body: bytes | None, start_ns: int, end_ns: int) -> Iterable[Message] | Invalid:
        kind, arg = value
        if self._start_ns is None:
            self._start_ns = start_ns
        levels = self._levels
        if kind == 0:  # an inline command: one line, space-separated
            words = arg.split()
            self._kind, self._count = "inline", len(words)
            self._items = list(words[:MAX_ITEMS])
            return self._done(end_ns)
        if self.commands and (kind != ord("*") if not levels else kind != ord("$")):
            return INVALID  # a client sends arrays of bulk strings, nothing else
        if self.commands and not levels and arg < 1:
            self._clear()  # Redis ignores an empty or null array from a client: nothing to answer
            return ()
        if not levels:
            if kind != ord("|"):
                self._kind = chr(kind)
            if kind == ord("-"):
                self._error = _error_prefix(arg)
            elif kind == ord("!"):
                self._error = _error_prefix(body) if body is not None else "ERR"
        elif not levels[-1].hidden and len(levels) == 1:
            self._keep(kind, arg, body)
        if kind in AGGREGATES and arg != -1:
            count = arg * 2 if kind in (ord("%"), ord("|")) else arg
            if len(levels) >= MAX_DEPTH:
                return INVALID
            attribute = kind == ord("|")
            if count:
                levels.append(_Level(count, attribute, attribute or bool(levels and levels[-1].hidden)))
                return ()
            return self._complete(attribute, end_ns)
        return self._complete(False, end_ns)

    def _keep(self, kind: int, arg: Any, body: bytes | None) -> None:
        self._count += 1
        if len(self._items) < MAX_ITEMS:
            if kind in BLOBS:
                self._items.append(body[:-2] if body is not None and body.endswith(b"\r\n") else None)
            elif kind == ord(":"):
                self._items.append(int(arg))
            elif kind == ord("+"):
                self._items.append(arg)
            else:
                self._items.append(None)

    def _complete(self, attribute: bool, end_ns: int) -> Iterable[Message]:
        """A value ended (``attribute``: it was an attribute): close the aggregates it ends."""
        levels = self._levels
        while levels:
            if not attribute:
                levels[-1].remaining -= 1
                if levels[-1].remaining:
                    return ()
            elif levels[-1].remaining:
                return ()
            attribute = levels.pop().attribute
        if attribute:
            return ()  # an attribute before a reply: the reply is still to come
        return self._done(end_ns)

    def _done(self, end_ns: int) -> list[Message]:
        start_ns = self._start_ns if self._start_ns is not None else end_ns
        if self.commands:
            message: Message = Command(
                self.direction, start_ns, end_ns, tuple(self._items), self._count, self._kind == "inline"
            )
        else:
            message = Reply(self.direction, start_ns, end_ns, self._kind, self._error, tuple(self._items))
        self._clear()
        return [message]

    def lost(self, timestamp_ns: int) -> list[Message]:
        self._clear()
        return [Lost(self.direction, timestamp_ns, timestamp_ns)]

    def _clear(self) -> None:
        self._levels.clear()
        self._start_ns = None
        self._kind = ""
        self._error = None
        self._items = []
        self._count = 0
