"""Incremental, sans-I/O decoders for streamed LLM responses: Server-Sent Events, NDJSON and gRPC.

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


GRPC_PREFIX = 5  # 1-byte compressed flag, 4-byte big-endian length
GrpcMessage = tuple[int, bytes, bool]  # (timestamp, payload, whether the payload is the whole message)


class GrpcMessageDecoder:
    """gRPC's length-prefixed messages in one direction of a call, from DATA payloads cut anywhere.

    A message comes out with the timestamp of the piece that completed it: whole, or, when it is
    longer than ``MAX_EVENT`` or a capture gap of known length fell inside it, as its captured
    bytes (``whole`` false; protobuf writes fields in number order, so the first ones still
    read). A gap of unknown length, or one that runs past a message's end, hides where the next
    message starts: the message it cut comes out as far as it came, and the framing is lost for
    the rest of the call (counted once in ``errors``).
    A compressed message cannot be read: counted in ``compressed`` and skipped. Never raises.
    """

    __slots__ = ("errors", "compressed", "_lost", "_prefix", "_remaining", "_body", "_cut", "_skip", "_last_ns")

    def __init__(self) -> None:
        self.errors = 0
        self.compressed = 0
        self._lost = False
        self._prefix: bytes | None = b""  # the prefix read so far; None inside a message's body
        self._remaining = 0  # body bytes of the current message still to come
        self._body = bytearray()
        self._cut = False  # the current message lost bytes (a gap, or past MAX_EVENT)
        self._skip = False  # the current message is compressed
        self._last_ns = 0

    def feed(self, data: bytes, timestamp_ns: int) -> list[GrpcMessage]:
        self._last_ns = timestamp_ns
        out: list[GrpcMessage] = []
        if self._lost:
            return out
        pos, end = 0, len(data)
        while True:
            if self._prefix is None:  # inside a body
                take = min(self._remaining, end - pos)
                room = MAX_EVENT - len(self._body)
                if not (self._skip or self._cut):  # bytes after a cut would not follow on from it
                    if take > room:
                        self._cut = True
                    self._body += data[pos : pos + min(take, room)]
                self._remaining -= take
                pos += take
                if self._remaining:
                    return out
                self._end(timestamp_ns, out)
                continue
            if pos >= end:
                return out
            need = GRPC_PREFIX - len(self._prefix)
            prefix = self._prefix + data[pos : pos + need]
            pos += need
            if len(prefix) < GRPC_PREFIX:
                self._prefix = prefix
                return out
            self._prefix = None
            self._skip = bool(prefix[0] & 1)
            self.compressed += self._skip
            self._remaining = int.from_bytes(prefix[1:], "big")

    def gap(self, length: int | None) -> list[GrpcMessage]:
        """``length`` bytes went uncaptured (``None``: an unknown number); a message they ended
        comes out with the last timestamp seen."""
        out: list[GrpcMessage] = []
        if self._lost or length == 0:
            return out
        if length is None or self._prefix is not None or length > self._remaining:
            self._lost = True
            self.errors += 1
            if self._prefix is None and self._body:  # the message it cut: what came of it
                self._cut = True
                self._end(self._last_ns, out)
            return out
        self._remaining -= length
        self._cut = True
        if not self._remaining:
            self._end(self._last_ns, out)
        return out

    def _end(self, timestamp_ns: int, out: list[GrpcMessage]) -> None:
        if not self._skip:
            out.append((timestamp_ns, bytes(self._body), not self._cut))
        self._prefix, self._body, self._cut = b"", bytearray(), False
