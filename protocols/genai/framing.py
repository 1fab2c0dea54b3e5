"""Incremental, sans-I/O decoders for streamed LLM responses: Server-Sent Events and NDJSON.

They are fed the content bytes of a response body (HTTP/1.1 chunk framing or HTTP/2 DATA framing
already removed) in whatever pieces the syscalls moved, and return each complete event with the
timestamp of the piece that completed it: that is when the peer could first act on it. Events are
bounded (``MAX_EVENT``); a longer one, or one broken by a capture gap, is skipped up to the next
separator and counted in ``errors``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

MAX_EVENT = 256 * 1024

Event = tuple[int, bytes]  # (timestamp of the syscall that completed it, payload)


class StreamDecoder(ABC):
    """Splits a body into events; never raises."""

    _SEPARATOR: re.Pattern[bytes]

    def __init__(self) -> None:
        self.errors = 0  # events skipped: oversized or cut by a capture gap
        self._pending = b""  # the start of an event whose separator has not come yet
        self._skipping = False  # inside a broken event: drop bytes up to the next separator

    def feed(self, data: bytes, timestamp_ns: int) -> list[Event]:
        pending = self._pending
        # Usually nothing is pending and ``data`` is whole events: no copy but the payloads.
        buf = pending + data if pending else data
        search = self._SEPARATOR.search
        events: list[Event] = []
        start = 0
        found = search(buf, max(0, len(pending) - 3))  # a separator may straddle two feeds
        while found is not None:
            if self._skipping:
                self._skipping = False
            else:
                payload = self._payload(buf[start : found.start()])
                if payload is not None:
                    events.append((timestamp_ns, payload))
            start = found.end()
            found = search(buf, start)
        self._pending = buf[start:] if start < len(buf) else b""
        if len(self._pending) > MAX_EVENT:
            self._break()
        return events

    def gap(self) -> None:
        """Bytes moved but were not captured: the event they fell in is lost."""
        self._break()

    def _break(self) -> None:
        if not self._skipping:
            self.errors += 1
        self._skipping = True
        self._pending = b""

    @abstractmethod
    def _payload(self, block: bytes) -> bytes | None:
        """An event's bytes (without its separator) → its payload, or ``None`` for nothing."""


class SSEDecoder(StreamDecoder):
    """``text/event-stream``: events end with a blank line; their ``data:`` lines are the payload."""

    _SEPARATOR = re.compile(rb"\r\n\r\n|\n\n|\r\r|\n\r\n|\r\n\n")

    def _payload(self, block: bytes) -> bytes | None:
        if block.startswith(b"data: ") and b"\n" not in block and b"\r" not in block:
            return block[6:]  # the usual event: one data line
        data: list[bytes] = []
        for line in re.split(rb"\r\n|\n|\r", block):
            if line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
        return b"\n".join(data) if data else None  # comments (keep-alives) and event-only blocks


class NDJSONDecoder(StreamDecoder):
    """``application/x-ndjson`` (Ollama): one JSON document per line."""

    _SEPARATOR = re.compile(rb"\n")

    def _payload(self, block: bytes) -> bytes | None:
        block = block.strip()
        return block or None


class WholeBody:
    """A non-streamed body: kept whole (up to ``MAX_EVENT``) and delivered as one event at the end."""

    def __init__(self) -> None:
        self.errors = 0
        self.truncated = False
        self._buf = bytearray()
        self._last_ns = 0

    def feed(self, data: bytes, timestamp_ns: int) -> list[Event]:
        self._last_ns = timestamp_ns
        room = MAX_EVENT - len(self._buf)
        if len(data) > room:
            self.truncated = True
        self._buf += data[: max(room, 0)]
        return []

    def gap(self) -> None:
        self.truncated = True

    def finish(self) -> list[Event]:
        return [(self._last_ns, bytes(self._buf))] if self._buf else []
