"""The stream half of the plugin kit: one direction of a connection as a sequence of frames.

Every plugin needs the same machinery around its parser: buffer the bytes of each direction across
syscalls, know which syscall carried each byte (a message starts at the timestamp of its first
byte and ends at that of its last), skip payloads it does not need without holding them, survive
bytes the capture lost (a gap) and input it cannot parse, and find its place again. A
:class:`FramedStream` owns all of that; the plugin supplies a :class:`Framer`, which knows only the
protocol's framing (where a frame's head ends and how long its body is) and what its frames mean.

A *frame* is a head the framer parses from buffered bytes, followed by ``body_length`` bytes that
the stream either hands over whole (``keep_body``, for small bodies the parser reads) or skips as
they come, captured or lost, without buffering them. A message may be one frame (most binary
protocols: a length-prefixed header and payload) or several (RESP's nested arrays are frames of
one line each, with bulk payloads as bodies): the framer assembles them and returns a message when
one is complete.

Lost bytes: a gap inside a body only shortens it (a kept body is then handed over as ``None``);
a gap anywhere else hides where the next frame starts. The stream then tells the framer
(:meth:`Framer.lost`: drop the message in progress), counts it in :attr:`FramedStream.lost`, and
resynchronises: it asks :meth:`Framer.resync` for the first offset in the following bytes where a
message could begin and parses from there. Input the framer rejects (:data:`INVALID`) is counted in
:attr:`FramedStream.parse_errors` and resynchronised the same way, from the next byte.

Sans-I/O like the plugins that use it: bytes and timestamps in, messages out, nothing raised on
hostile input, the buffer bounded by ``max_buffered``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

M = TypeVar("M")


class Invalid(enum.Enum):
    INVALID = "invalid"


INVALID = Invalid.INVALID  # what a framer returns for bytes that cannot be its protocol


@dataclass(frozen=True, slots=True)
class Head:
    """A frame head found at the start of the buffered bytes: ``length`` bytes of head, then
    ``body_length`` bytes of body. ``value`` is what the framer parsed from the head; it comes
    back to :meth:`Framer.frame` with the body."""

    length: int
    value: Any = None
    body_length: int = 0
    keep_body: bool = False  # hand the body over (else skip it); bodies over max_buffered are skipped


class Framer(ABC, Generic[M]):
    """A protocol's framing and parsing for one direction of one connection."""

    @abstractmethod
    def head(self, data: bytearray, start: int) -> Head | Invalid | None:
        """The frame head at ``data[start:]``; ``None`` when more bytes are needed to tell. Must
        not keep a reference to ``data``."""

    @abstractmethod
    def frame(self, value: Any, body: bytes | None, start_ns: int, end_ns: int) -> Iterable[M] | Invalid:
        """A whole frame: the head's ``value``, its body (``None`` when skipped or not captured
        whole) and the timestamps of the syscalls that carried its first and last byte. Returns the
        messages it completes, or :data:`INVALID` when it cannot follow the frames before it (the
        stream then resynchronises)."""

    @abstractmethod
    def resync(self, data: bytearray, start: int) -> int | None:
        """The first offset ``>= start`` in ``data`` where a message could begin, judged on the
        bytes there (it may need more bytes to be sure; :meth:`head` decides); ``None`` if none."""

    @abstractmethod
    def lost(self, timestamp_ns: int) -> Iterable[M]:
        """The stream lost its place at ``timestamp_ns`` (a gap or invalid input): forget the
        message in progress. Returns messages that report the loss, if the protocol has any use for
        them (e.g. a marker telling a stitcher that answers went missing)."""


class FramedStream(Generic[M]):
    """Buffers one direction of a connection and drives a :class:`Framer` over it."""

    def __init__(self, framer: Framer[M], max_buffered: int = 64 * 1024) -> None:
        self.framer = framer
        self.max_buffered = max_buffered
        self.parse_errors = 0  # input the framer rejected, skipped to the next message start
        self.lost = 0  # times a gap hid a frame boundary (the message in progress was dropped)
        self._buf = bytearray()
        self._base = 0  # stream offset of _buf[0]
        self._times: deque[tuple[int, int]] = deque()  # (stream offset one past a syscall's bytes, its time)
        self._resyncing = False
        # the frame whose body is still arriving: its head value, start time, body bytes to go
        self._value: Any = None
        self._start_ns = 0
        self._body_left = 0
        self._body: bytearray | None = None  # kept body so far; None when skipping
        self._body_whole = True
        self._in_body = False

    @property
    def buffered(self) -> int:
        return len(self._buf) + (len(self._body) if self._body is not None else 0)

    def feed(self, data: bytes, timestamp_ns: int) -> list[M]:
        """Bytes one syscall moved in this direction at ``timestamp_ns``."""
        if not data:
            return []
        self._buf += data
        self._times.append((self._base + len(self._buf), timestamp_ns))
        return self._run()

    def gap(self, length: int, timestamp_ns: int) -> list[M]:
        """``length`` bytes moved at ``timestamp_ns`` but were not captured."""
        out: list[M] = []
        if length <= 0:
            return out
        if self._in_body and not self._buf:
            skipped = min(length, self._body_left)
            self._body_left -= skipped
            self._body_whole = False
            length -= skipped
            if not self._body_left:
                self._finish_frame(timestamp_ns, out)
            if not length:
                return out
        self._lose(timestamp_ns, out)
        return out

    def close(self) -> None:
        """The connection closed: a frame cut off by it is counted as lost."""
        if (self._buf or self._in_body) and not self._resyncing:
            self.lost += 1
        self._reset()

    # ---- internals ---------------------------------------------------------------------------

    def _run(self) -> list[M]:
        out: list[M] = []
        while self._buf:
            if self._in_body:
                if not self._take_body(out):
                    break
            elif self._resyncing:
                at = self.framer.resync(self._buf, 0)
                if at is None:
                    self._consume(len(self._buf))
                    break
                self._consume(at)
                self._resyncing = False
            elif not self._take_head(out):
                break
        if len(self._buf) > self.max_buffered:  # a head longer than the framer could ever need
            self._invalid(out)
            self._consume(len(self._buf))
        self._compact()
        return out

    def _take_head(self, out: list[M]) -> bool:
        head = self.framer.head(self._buf, 0)
        if head is None:
            return False
        if isinstance(head, Invalid) or head.length <= 0 or head.body_length < 0:
            self._invalid(out)
            self._consume(1)  # resync from the next byte on
            return True
        self._value = head.value
        self._start_ns = self._time_at(self._base)
        self._consume(head.length)
        self._body_left = head.body_length
        self._body = bytearray() if head.keep_body and head.body_length <= self.max_buffered else None
        self._body_whole = True
        self._in_body = True
        if not self._body_left:
            self._finish_frame(self._time_at(self._base - 1), out)
        return True

    def _take_body(self, out: list[M]) -> bool:
        n = min(self._body_left, len(self._buf))
        if self._body is not None:
            self._body += self._buf[:n]
        end_ns = self._time_at(self._base + n - 1)
        self._consume(n)
        self._body_left -= n
        if self._body_left:
            return False
        self._finish_frame(end_ns, out)
        return True

    def _finish_frame(self, end_ns: int, out: list[M]) -> None:
        body = bytes(self._body) if self._body is not None and self._body_whole else None
        value = self._value
        self._in_body = False
        self._value = self._body = None
        result = self.framer.frame(value, body, self._start_ns, end_ns)
        if isinstance(result, Invalid):
            self._invalid(out)
        else:
            out.extend(result)

    def _invalid(self, out: list[M]) -> None:
        self.parse_errors += 1
        out.extend(self.framer.lost(self._time_at(self._base)))
        self._in_body = False
        self._value = self._body = None
        self._resyncing = True

    def _lose(self, timestamp_ns: int, out: list[M]) -> None:
        if not self._resyncing:  # still looking for the boundary the last gap hid: the same loss
            self.lost += 1
        out.extend(self.framer.lost(timestamp_ns))
        self._reset()
        self._resyncing = True

    def _reset(self) -> None:
        self._base += len(self._buf)
        self._buf.clear()
        self._times.clear()
        self._in_body = False
        self._value = self._body = None
        self._resyncing = False

    def _consume(self, n: int) -> None:
        del self._buf[:n]
        self._base += n
        times = self._times
        # keep the syscall of the byte just consumed: a frame that ends there takes its time
        while len(times) > 1 and times[0][0] < self._base:
            times.popleft()

    def _compact(self) -> None:
        if not self._buf:
            self._times.clear()

    def _time_at(self, offset: int) -> int:
        """Timestamp of the syscall that carried stream byte ``offset`` (buffered or just consumed)."""
        for end, t_ns in self._times:
            if offset < end:
                return t_ns
        return self._times[-1][1] if self._times else 0
