"""HTTP/2 framing of one direction of a connection, as captured: bytes and gaps in, frames out.

:class:`FrameReader` is a resumable state machine. Frame bodies are parsed by ``hyperframe``; the
9-byte frame header is unpacked here with the same ``struct`` format, because only the few frames
whose body matters (HEADERS, CONTINUATION, PUSH_PROMISE, SETTINGS, RST_STREAM, GOAWAY) are worth a
``hyperframe`` object, and DATA bodies must stream: a DATA frame may be megabytes long while the
capture copies 4 KiB of each syscall, so its payload goes to the sink chunk by chunk and the bytes
the capture skipped (:meth:`FrameReader.gap`) are counted, not lost.

A gap that ends past the current frame hides where the next frames start: the reader then
*resynchronises*, accepting a position as a frame boundary only on strong evidence
(:meth:`FrameReader._sync_point`): frame headers that pass strict checks (:func:`frame_at`: known
type, defined flags, fixed lengths right, stream id zero or not and of the sender's parity), three
in a row, or two at the start of a syscall (writers write whole frames), or tiling the bytes to
their end; or a HEADERS frame whose block decodes to pseudo-headers. Random bytes and TLS records do
not pass. A connection whose capture started mid-stream begins in the same state, without counting
an error.
"""

from __future__ import annotations

import re
import struct
from typing import Protocol as Interface

from hyperframe.exceptions import HyperframeError
from hyperframe.frame import FRAMES, Frame, HeadersFrame

from .hpack_context import HpackContext

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_SIZE = 9
DEFAULT_MAX_FRAME_SIZE = 16384  # SETTINGS_MAX_FRAME_SIZE until the receiver's SETTINGS say more
MAX_FRAME_SIZE = 2**24 - 1  # the most SETTINGS_MAX_FRAME_SIZE can say
MAX_BUFFERED_BODY = 64 * 1024  # bodies of non-DATA frames held whole; larger ones are skipped
MAX_SYNC_HOLD = 64 * 1024  # bytes held while a resynchronisation candidate waits for its successor
MAX_SYNC_CANDIDATES = 512  # positions examined per feed while resynchronising (bounds the cost)

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = 0x01
END_HEADERS = 0x04
PADDED = 0x08
PRIORITY_FLAG = 0x20

_HEADER = struct.Struct(">HBBBL")
# Flags each frame type defines (RFC 9113 section 6): anything else fails the strict check.
_DEFINED_FLAGS = (0x09, 0x2D, 0x00, 0x00, 0x01, 0x0C, 0x01, 0x00, 0x00, 0x04)
_CONNECTION_TYPES = frozenset({SETTINGS, PING, GOAWAY})  # stream 0 only
_FIXED_LENGTHS = {PRIORITY: 5, RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}
# Where a frame header may start: a known type followed by one of its flag bytes (the reserved
# bit of the stream id clear is checked after). A fast pre-filter for the strict check.
_CANDIDATE = re.compile(
    rb"(?=[\x00-\xff]{3}(?:\x00[\x00\x01\x08\x09]|\x01[\x00\x01\x04\x05\x08\x09\x0c\x0d\x20\x21\x24\x25\x28"
    rb"\x29\x2c\x2d]|[\x02\x03\x07\x08]\x00|[\x04\x06][\x00\x01]|\x05[\x00\x04\x08\x0c]|\x09[\x00\x04])"
    rb"[\x00-\x7f])",
    re.DOTALL,
)

_PARSED = frozenset({HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, GOAWAY, CONTINUATION})  # bodies that matter
_CHAIN = 64  # frames checked in a row while resynchronising
REQUEST_PSEUDO_HEADERS = frozenset({":method", ":path"})
RESPONSE_PSEUDO_HEADERS = frozenset({":status"})
_HEADER_BLOCKS = (HEADERS, CONTINUATION, PUSH_PROMISE)

# reader states
_FRAME_HEADER, _BODY, _PAD_LENGTH, _PAYLOAD, _SKIP, _SYNC, _PREFACE = range(7)


class FrameSink(Interface):
    """What a :class:`FrameReader` tells about the frames it reads (the session implements it)."""

    def on_preface(self) -> None:
        """The client's connection preface: the connection's start is in the capture."""

    def on_block(
        self, frame_type: int, stream_id: int, flags: int, fragment: bytes | None, start_ns: int, end_ns: int
    ) -> None:
        """A HEADERS, PUSH_PROMISE or CONTINUATION frame's header block fragment (padding and
        priority fields removed); ``None`` when the frame was not read whole (a gap, too large,
        malformed)."""

    def on_frame(self, frame: Frame, start_ns: int, end_ns: int) -> None:
        """A whole RST_STREAM, SETTINGS or GOAWAY frame, parsed by hyperframe."""

    def on_data(self, stream_id: int, payload: bytes, timestamp_ns: int) -> None:
        """Captured payload bytes of a DATA frame (padding removed)."""

    def on_data_gap(self, stream_id: int, length: int | None, timestamp_ns: int) -> None:
        """DATA payload bytes that moved uncaptured; ``None``: how many is unknown (lost padding)."""

    def on_end_stream(self, stream_id: int, timestamp_ns: int) -> None:
        """The last byte of a DATA frame flagged END_STREAM."""

    def on_lost(self, timestamp_ns: int) -> None:
        """Bytes whose framing is unknown were skipped: frames of any stream may have been lost."""

    def knows_stream(self, stream_id: int) -> bool:
        """Whether a stream is open, as evidence for resynchronisation."""

    def plausible_stream(self, stream_id: int) -> bool:
        """Whether a stream id is plausible on this connection (not far past those seen)."""


def frame_at(buf: bytes | bytearray, pos: int, from_client: bool | None, max_frame: int = MAX_FRAME_SIZE) -> int:
    """The length of the frame whose 9-byte header is at ``pos`` if that header passes the strict
    checks (see the module doc), else -1. ``from_client``: who sent it, ``None`` if unknown."""
    length_high, length_low, frame_type, flags, stream = _HEADER.unpack_from(buf, pos)
    length = (length_high << 8) | length_low
    if frame_type > CONTINUATION or stream >> 31 or flags & ~_DEFINED_FLAGS[frame_type] or length > max_frame:
        return -1
    if (stream == 0) != (frame_type in _CONNECTION_TYPES) and frame_type != WINDOW_UPDATE:
        return -1
    if _FIXED_LENGTHS.get(frame_type, length) != length:
        return -1
    if frame_type == SETTINGS and (length % 6 or (flags and length)):
        return -1
    if (frame_type == GOAWAY and length < 8) or (frame_type == PUSH_PROMISE and length < 4):
        return -1
    if frame_type in (DATA, HEADERS) and (flags & PADDED or frame_type == HEADERS) and not length:
        return -1
    if frame_type == DATA and not length and not flags:  # says nothing: but runs of zeros look so
        return -1
    # Clients open odd streams and may only reset, prioritise or give window to even (pushed)
    # ones; only servers push.
    if from_client and (
        frame_type == PUSH_PROMISE
        or (stream and not stream & 1 and frame_type not in (RST_STREAM, PRIORITY, WINDOW_UPDATE))
    ):
        return -1
    return length


class FrameReader:
    """Splits one direction's bytes into frames for a :class:`FrameSink`.

    ``from_client`` tells which end writes this direction (for the strict checks). With
    ``preface`` the reader expects the client's connection preface first, and resynchronises if
    the bytes are something else (the capture began later); otherwise it starts resynchronising,
    unless told the connection's start is next (:meth:`assume_boundary`). ``parse_errors``
    counts malformed frames and lost synchronisations.
    """

    def __init__(self, sink: FrameSink, from_client: bool, preface: bool = False) -> None:
        self._sink = sink
        self.from_client = from_client
        # the receiver's SETTINGS_MAX_FRAME_SIZE, for resynchronisation: until SETTINGS say more,
        # frames over the default are not taken as evidence of a boundary
        self.max_frame = DEFAULT_MAX_FRAME_SIZE
        self.parse_errors = 0
        self._state = _PREFACE if preface else _SYNC
        self._buf = bytearray()  # a partial preface, frame header or body; or bytes held while syncing
        self._start_ns = 0  # timestamp of the feed that carried the current frame's first byte
        self._type = self._flags = self._stream = 0
        self._remaining = 0  # body bytes still to come (_BODY, _PAD_LENGTH, _SKIP)
        self._payload = self._padding = 0  # DATA payload and padding bytes still to come

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def close(self) -> None:
        """No more bytes will come: forget what was held."""
        self._buf.clear()
        self._state = _SYNC

    def assume_boundary(self) -> None:
        """The next byte starts a frame (the connection's first), if nothing was read yet."""
        if self._state == _SYNC and not self._buf:
            self._state = _FRAME_HEADER

    # -- input ------------------------------------------------------------------------------------

    def feed(self, data: bytes, timestamp_ns: int) -> None:
        """The captured bytes of one syscall."""
        if self._state == _PREFACE:
            data = self._after_preface(data)
        pos = 0
        if self._state == _SYNC:
            data, pos = self._sync(data, feed_start=True)
        end = len(data)
        while pos < end:
            state = self._state
            if state == _FRAME_HEADER:
                if self._buf or end - pos < HEADER_SIZE:
                    pos = self._buffer_header(data, pos, timestamp_ns)
                else:  # the common case: a whole header here, often its whole frame
                    length_high, length_low, frame_type, flags, stream = _HEADER.unpack_from(data, pos)
                    if frame_type == WINDOW_UPDATE and length_low == 4 and not length_high and end - pos >= 13:
                        pos += 13  # flow control, the most frequent frame: nothing to learn
                        continue
                    pos = self._frame(
                        frame_type,
                        flags,
                        stream & 0x7FFFFFFF,
                        (length_high << 8) | length_low,
                        data,
                        pos + HEADER_SIZE,
                        timestamp_ns,
                        timestamp_ns,
                    )
            elif state == _PAYLOAD:
                pos = self._read_payload(data, pos, timestamp_ns)
            elif state == _BODY:
                pos = self._read_body(data, pos, timestamp_ns)
            elif state == _SKIP:
                take = min(self._remaining, end - pos)
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _FRAME_HEADER
            elif state == _PAD_LENGTH:
                padding = data[pos]
                pos += 1
                if padding >= self._remaining:
                    self._lose(timestamp_ns)
                else:
                    self._start_payload(self._remaining - 1 - padding, padding, timestamp_ns)
            else:  # _SYNC: a malformed frame in this very feed
                data, pos = self._sync(data[pos:], feed_start=False)
                end = len(data)

    def gap(self, length: int, timestamp_ns: int) -> None:
        """``length`` bytes moved right after the last feed but were not captured."""
        state = self._state
        if length <= 0:
            return
        if state == _SYNC:
            self._buf.clear()  # held bytes no longer adjoin what comes next
            return
        if state == _PAYLOAD:
            payload = min(length, self._payload)
            if payload:
                self._sink.on_data_gap(self._stream, payload, timestamp_ns)
            padding = min(length - payload, self._padding)
            self._payload -= payload
            self._padding -= padding
            length -= payload + padding
            if self._payload or self._padding:
                return
            self._end_data(timestamp_ns)
        elif state in (_BODY, _SKIP, _PAD_LENGTH):
            if state == _BODY:
                self._buf.clear()
                self._lost_frame(timestamp_ns)
            covered = min(length, self._remaining)
            self._remaining -= covered
            length -= covered
            if state == _PAD_LENGTH:  # how much of the rest is padding is unknown
                self._sink.on_data_gap(self._stream, None, timestamp_ns)
                self._start_payload(self._remaining, 0, timestamp_ns)
            elif self._remaining:
                self._state = _SKIP
            else:
                self._state = _FRAME_HEADER
            if self._remaining:
                return
        if length:  # a frame header is hidden: the boundaries are lost
            self._lose(timestamp_ns)

    # -- states -----------------------------------------------------------------------------------

    def _after_preface(self, data: bytes) -> bytes:
        """The client's first bytes: the connection preface, or else the capture began later."""
        if self._buf:
            data = bytes(self._buf) + data
            self._buf.clear()
        if len(data) < len(PREFACE) and PREFACE.startswith(data):
            self._buf += data
            return b""
        if data.startswith(PREFACE):
            self._state = _FRAME_HEADER
            self._sink.on_preface()
            return data[len(PREFACE) :]
        self._state = _SYNC
        return data

    def _buffer_header(self, data: bytes, pos: int, ts: int) -> int:
        """A frame header split across syscalls."""
        buf = self._buf
        if not buf:
            self._start_ns = ts
        take = min(HEADER_SIZE - len(buf), len(data) - pos)
        buf += data[pos : pos + take]
        pos += take
        if len(buf) < HEADER_SIZE:
            return pos
        length_high, length_low, frame_type, flags, stream = _HEADER.unpack(buf)
        buf.clear()
        return self._frame(
            frame_type, flags, stream & 0x7FFFFFFF, (length_high << 8) | length_low, data, pos, self._start_ns, ts
        )

    def _frame(
        self, frame_type: int, flags: int, stream: int, length: int, data: bytes, body: int, start_ns: int, ts: int
    ) -> int:
        """A frame header was read; its body begins at ``data[body]``. Frames wholly in ``data``
        are handled at once; the others set the state that reads the rest. Returns where to go on."""
        self._type, self._flags, self._stream, self._start_ns = frame_type, flags, stream, start_ns
        if frame_type <= CONTINUATION and (
            ((stream == 0) != (frame_type in _CONNECTION_TYPES) and frame_type != WINDOW_UPDATE)
            or _FIXED_LENGTHS.get(frame_type, length) != length
        ):
            self._lose(ts)  # its length is no more to be trusted than the rest
            return body
        stop = body + length
        whole = stop <= len(data)
        if frame_type == DATA:
            if flags & PADDED:
                self._remaining = length
                if length:
                    self._state = _PAD_LENGTH
                else:
                    self._lose(ts)
            elif whole:
                if length:
                    self._sink.on_data(stream, data[body:stop], ts)
                if flags & END_STREAM:
                    self._sink.on_end_stream(stream, ts)
                return stop
            else:
                self._start_payload(length, 0, ts)
            return body
        if frame_type in _PARSED:
            if length > MAX_BUFFERED_BODY:
                self._remaining = length
                self._lost_frame(ts)
                return body
            if whole:
                self._parse(data[body:stop], ts)
                return stop
            self._remaining = length
            self._state = _BODY
            return body
        if whole:  # PRIORITY, PING, WINDOW_UPDATE and extension frames: nothing to learn
            return stop
        self._remaining = length
        self._state = _SKIP
        return body

    def _read_body(self, data: bytes, pos: int, ts: int) -> int:
        buf = self._buf
        take = min(self._remaining, len(data) - pos)
        buf += data[pos : pos + take]
        self._remaining -= take
        if not self._remaining:
            body = bytes(buf)
            buf.clear()
            self._parse(body, ts)
        return pos + take

    def _parse(self, body: bytes, ts: int) -> None:
        self._state = _FRAME_HEADER
        frame_type, flags, stream = self._type, self._flags, self._stream
        if frame_type == CONTINUATION or (frame_type == HEADERS and not flags & (PADDED | PRIORITY_FLAG)):
            self._sink.on_block(frame_type, stream, flags, body, self._start_ns, ts)  # all block fragment
            return
        frame = FRAMES[frame_type](stream)
        frame.parse_flags(flags)
        try:
            frame.parse_body(memoryview(body))
        except HyperframeError:
            self.parse_errors += 1
            self._lost_frame(ts)
            return
        if frame_type in _HEADER_BLOCKS:
            self._sink.on_block(frame_type, stream, flags, frame.data, self._start_ns, ts)
        else:
            self._sink.on_frame(frame, self._start_ns, ts)

    def _lost_frame(self, ts: int) -> None:
        """The frame being read will not be read whole (its body is skipped, if any is left)."""
        if self._type in _HEADER_BLOCKS:
            self._sink.on_block(self._type, self._stream, self._flags, None, self._start_ns, ts)
        self._state = _SKIP if self._remaining else _FRAME_HEADER

    def _start_payload(self, payload: int, padding: int, ts: int) -> None:
        self._payload, self._padding = payload, padding
        self._state = _PAYLOAD
        if not payload and not padding:
            self._end_data(ts)

    def _read_payload(self, data: bytes, pos: int, ts: int) -> int:
        available = len(data) - pos
        if self._payload:
            take = min(self._payload, available)
            self._sink.on_data(self._stream, data[pos : pos + take], ts)
            self._payload -= take
            pos += take
            available -= take
        if not self._payload:
            take = min(self._padding, available)
            self._padding -= take
            pos += take
            if not self._padding:
                self._end_data(ts)
        return pos

    def _end_data(self, ts: int) -> None:
        self._state = _FRAME_HEADER
        if self._flags & END_STREAM:
            self._sink.on_end_stream(self._stream, ts)

    # -- losing and finding the frame boundaries ---------------------------------------------------

    def _lose(self, ts: int) -> None:
        """The frame boundaries are lost: a gap hid a frame header, or a header made no sense (so
        neither does its length)."""
        self.parse_errors += 1
        self._state = _SYNC
        self._buf.clear()
        self._sink.on_lost(ts)

    def _sync(self, data: bytes, feed_start: bool) -> tuple[bytes, int]:
        """Look for a frame boundary in the held bytes followed by ``data``. Returns the buffer and
        the boundary to go on from (the state is then synced), or ``(b"", 0)`` having held what
        may still begin one."""
        held = bytes(self._buf)
        self._buf.clear()
        buf = held + data if held else data
        start = len(held) if feed_start else -1
        undecided = -1  # the first plausible position whose successor is not here yet
        for examined, match in enumerate(_CANDIDATE.finditer(buf)):
            pos = match.start()
            if pos + HEADER_SIZE > len(buf) or examined >= MAX_SYNC_CANDIDATES:
                break
            verdict = self._sync_point(buf, pos, pos == start)
            if verdict:  # strong evidence, even past an undecided position
                self._state = _FRAME_HEADER
                return buf, pos
            if verdict is None and undecided == -1:
                undecided = pos
        # keep what may still begin a frame: from the undecided position, or the last bytes
        self._buf += buf[undecided:] if undecided != -1 else buf[-(HEADER_SIZE - 1) :]
        return b"", 0

    def _sync_point(self, buf: bytes, pos: int, at_feed_start: bool) -> bool | None:
        """Whether a frame starts at ``pos``: True, False, or None when it cannot be told yet.

        The frames from ``pos`` on must all pass the strict checks, and: tile the bytes to their
        end, or be three in a row, or two at the start of a syscall (writers write whole
        frames); or the first is a HEADERS frame whose block decodes to a request's or response's
        pseudo-headers, or, at the start of a syscall, continues a stream the sink knows. Away from
        a syscall's start an empty frame is no evidence: its 9 bytes are too easily a coincidence;
        nor is a first frame on a stream id far past those the connection used.
        """
        stream = int.from_bytes(buf[pos + 5 : pos + HEADER_SIZE], "big")
        if stream and not self._sink.plausible_stream(stream):
            return False
        end = len(buf)
        at, count = pos, 0
        while at + HEADER_SIZE <= end and count < _CHAIN:
            # only the first frame is held to the negotiated size: its length is the evidence
            length = frame_at(buf, at, self.from_client, MAX_FRAME_SIZE if count else self.max_frame)
            if length < 0 or (not count and not length and not at_feed_start):
                return False
            at += HEADER_SIZE + length
            count += 1
        if at == end or count >= 3 or (at_feed_start and count >= 2):
            return True
        frame_type = buf[pos + 3]
        first_end = pos + HEADER_SIZE + frame_at(buf, pos, None)
        if frame_type == HEADERS and buf[pos + 4] & END_HEADERS and first_end <= end:
            names = header_names(buf[pos:first_end])
            if names & (REQUEST_PSEUDO_HEADERS if self.from_client else RESPONSE_PSEUDO_HEADERS):
                return True
        if at_feed_start and frame_type in (DATA, HEADERS) and self._sink.knows_stream(stream):
            return True
        return None if at + HEADER_SIZE - pos <= MAX_SYNC_HOLD else False


def header_names(frame: bytes) -> frozenset[str]:
    """The names a whole HEADERS frame's block decodes to without any earlier HPACK state (static
    table and literals); empty if it does not decode."""
    parsed = HeadersFrame(int.from_bytes(frame[5:HEADER_SIZE], "big") & 0x7FFFFFFF)
    parsed.parse_flags(frame[4])
    try:
        parsed.parse_body(memoryview(frame[HEADER_SIZE:]))
    except HyperframeError:
        return frozenset()
    decoded = HpackContext().decode(parsed.data)
    return frozenset() if decoded is None else frozenset(name for name, _ in decoded[0])
