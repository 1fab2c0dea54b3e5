"""One HTTP/2 connection: a frame reader and an HPACK decoder per direction, and its streams.

The session follows each stream from its request HEADERS to the end of its response and returns,
per stream, a :class:`RequestStart` as soon as the request's header block is decoded, then a
:class:`Request` and a :class:`Response` message, in that order, for the stitcher to pair:

* the request message when the request ends (END_STREAM), or else when the stream does;
* the response message when the stream ends: END_STREAM of the response, RST_STREAM from either
  side, or a GOAWAY from the server that did not take the stream. The exchange is over then,
  whatever the request side would still send (a gRPC status ends a call);
* at the connection's end (``close``), what each open stream got so far.

Streams whose request HEADERS the capture missed are reported as :class:`StreamDropped` (the
stitcher counts them as unmatched), as are streams evicted from the bounded stream table; late
frames of streams already finished are ignored, and so are pushed streams. Flow control
(WINDOW_UPDATE), PING and PRIORITY carry nothing to report. SETTINGS_MAX_FRAME_SIZE tightens the
resynchronisation checks; SETTINGS_HEADER_TABLE_SIZE needs no action, since an encoder announces
every change of its table's size in the header blocks (RFC 7541 section 4.2), which the decoder
follows.

When bytes are lost (a gap past a frame boundary, a header block too large or cut by a gap), the
frames resynchronise (:mod:`.frames`) and the direction's HPACK table becomes partly unknown
(:mod:`.hpack_context`); the streams open in that direction may have lost frames, so their body
sizes and message counts become unknown, and one whose end never comes is reported at the
connection's end as ``capture_gap``.

Requests that start in the same syscall get start times 1 ns apart, in frame order: a request's
start time is what matches its announcement with its exchange, so no two may share one.
"""

from __future__ import annotations

from typing import Any

from hyperframe.frame import Frame, GoAwayFrame, RstStreamFrame, SettingsFrame

from otel_ebpf.protocol import Direction, RequestStart, Role, Session, SessionOutput

from ..genai import GenAIOptions, RequestBody, ResponseBody, Route
from ..http1.session import HTTP1Session
from ..http_semconv import CAPTURE_GAP, UNKNOWN_STATUS, Headers, first_header
from .frames import (
    CONTINUATION,
    DEFAULT_MAX_FRAME_SIZE,
    END_HEADERS,
    END_STREAM,
    MAX_FRAME_SIZE,
    PREFACE,
    PUSH_PROMISE,
    FrameReader,
)
from .grpc_framing import MessageCounter
from .hpack_context import HpackContext
from .types import CONNECTION_CLOSED, REFUSED_STREAM, Request, Response, StreamDropped, pseudo
from .upgrade import Handshake, http1_request

MAX_STREAMS = 1024  # streams followed per connection; the oldest is dropped beyond
MAX_HEADER_BLOCK = 64 * 1024  # a header block with its CONTINUATION frames
_FRESH_STREAMS = 1 << 20


class _Half:
    """What one direction of a stream carried so far."""

    __slots__ = ("start_ns", "end_ns", "headers", "trailers", "unknown", "body", "counter", "ended", "lost_ns", "tap")

    def __init__(self, start_ns: int, headers: Headers, unknown: int, grpc: bool) -> None:
        self.start_ns = self.end_ns = start_ns
        self.headers = headers
        self.trailers: Headers = ()
        self.unknown = unknown  # fields the capture could not tell
        self.body: int | None = 0
        self.counter = MessageCounter() if grpc else None
        self.ended = False  # END_STREAM seen
        self.lost_ns = 0  # when a gap may have hidden some of its frames (0: never)
        self.tap: RequestBody | ResponseBody | None = None  # the GenAI layer's reader, LLM calls only

    def last_ns(self) -> int:
        return max(self.end_ns, self.lost_ns)

    def body_size(self, has_body: bool = True) -> int | None:
        """The DATA payload length; when a gap hid some of it, the Content-Length of a half seen
        to its END_STREAM, which must equal it (RFC 9113, 8.1.1). ``has_body`` is false for a
        response to HEAD, and a 204 or 304, whose Content-Length is not theirs."""
        if self.body is not None or not self.ended or not has_body:
            return self.body
        declared = first_header(self.headers, "content-length")
        if declared is None or not (declared.isascii() and declared.isdigit() and len(declared) <= 18):
            return None
        return int(declared)

    def messages(self) -> tuple[int | None, int]:
        """(gRPC messages, of which compressed); ``None`` when not counted or uncertain."""
        counter = self.counter
        return (None, 0) if counter is None else (counter.known_count, counter.compressed)

    def incomplete(self, reason: str) -> str:
        """Why its end was not seen: the capture lost it, or ``reason``."""
        return CAPTURE_GAP if self.lost_ns else reason


class _Stream:
    __slots__ = ("id", "request", "response", "status", "reported", "route", "response_lost")

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.route: Route | None = None  # an LLM call's API: how to read its response
        self.request: _Half | None = None  # None: its HEADERS were not seen
        self.response: _Half | None = None
        self.status = UNKNOWN_STATUS
        self.reported = False  # its request message was returned
        self.response_lost = False  # a gap in the responses' direction may have hidden its HEADERS


class _Block:
    """A header block being assembled from a HEADERS (or PUSH_PROMISE) and CONTINUATION frames."""

    __slots__ = ("stream", "data", "end_stream", "start_ns", "push")

    def __init__(self, stream: int, data: bytes | None, end_stream: bool, start_ns: int, push: bool) -> None:
        self.stream = stream
        self.data = data  # None: a fragment was lost
        self.end_stream = end_stream
        self.start_ns = start_ns
        self.push = push


def _may_be_grpc(headers: Headers, unknown: int) -> bool:
    """Whether to count gRPC messages: a gRPC content type, or one the capture could not tell."""
    for name, value in headers:
        if name == "content-type":
            return value.startswith("application/grpc")
    return bool(unknown)


def _status(headers: Headers) -> int:
    value = pseudo(headers, ":status")
    if value is None or len(value) != 3 or not value.isdigit():
        return UNKNOWN_STATUS
    return int(value)


class HTTP2Session(Session):
    """Parses both directions of one HTTP/2 connection (see the module doc)."""

    def __init__(self, role: Role, genai: GenAIOptions | None = None) -> None:
        self.role = role
        self._genai = genai
        self._requests = Direction.INGRESS if role is Role.SERVER else Direction.EGRESS
        self._responses = self._requests.reverse()
        self._readers = {
            self._requests: FrameReader(self, from_client=True, preface=True),
            self._responses: FrameReader(self, from_client=False),
        }
        self._hpack = {direction: HpackContext() for direction in Direction}
        self._blocks: dict[Direction, _Block] = {}
        self._streams: dict[int, _Stream] = {}  # in opening order
        self._first_stream = self._last_stream = 0  # stream ids whose request HEADERS were seen
        self._last_start_ns = -1
        self._direction = self._requests  # of the bytes being read
        # the bytes fed until the client's first ones tell what the connection began with
        self._first: list[tuple[Direction, bytes, int]] | None = []
        self._fed: set[Direction] = set()
        self._out: list[SessionOutput] = []
        self._handshake: Handshake | None = None
        self._http1: HTTP1Session | None = None  # an upgrade the server declined: HTTP/1 from then on
        self._errors = 0
        self.partial_messages = 0

    @property
    def parse_errors(self) -> int:  # type: ignore[override]
        errors = self._errors + sum(reader.parse_errors for reader in self._readers.values())
        return errors + (self._http1.parse_errors if self._http1 is not None else 0)

    @property
    def buffered(self) -> int:  # type: ignore[override]
        """Bytes held for unfinished frames, header blocks and the upgrade handshake."""
        held = sum(reader.buffered for reader in self._readers.values())
        held += sum(len(block.data or b"") for block in self._blocks.values())
        if self._handshake is not None:
            held += self._handshake.size
        return held + (self._http1.buffered if self._http1 is not None else 0)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # -- Session ---------------------------------------------------------------------------------

    def feed(self, direction: Direction, data: bytes, timestamp_ns: int) -> list[SessionOutput]:
        if self._http1 is not None:
            return self._http1.feed(direction, data, timestamp_ns)
        if self._first is not None:
            return self._begin(direction, data, timestamp_ns)
        if self._handshake is not None:
            return self._shake(direction, data, timestamp_ns, 0)
        self._fed.add(direction)
        self._direction = direction
        self._readers[direction].feed(data, timestamp_ns)
        return self._take()

    def feed_gap(self, direction: Direction, length: int, timestamp_ns: int) -> list[SessionOutput]:
        if self._first is not None:  # the bytes held are all there will be of the start
            return [*self._release_first(upgrade=False), *self.feed_gap(direction, length, timestamp_ns)]
        if self._http1 is not None:
            return self._http1.feed_gap(direction, length, timestamp_ns)
        if self._handshake is not None:
            return self._shake(direction, b"", timestamp_ns, length)
        self._direction = direction
        self._readers[direction].gap(length, timestamp_ns)
        return self._take()

    def close(self, timestamp_ns: int) -> list[SessionOutput]:
        if self._first is not None:
            return [*self._release_first(upgrade=False), *self.close(timestamp_ns)]
        if self._http1 is not None:
            return self._http1.close(timestamp_ns)
        if self._handshake is not None:
            return [*self._hand_over(), *self.close(timestamp_ns)]
        for stream in list(self._streams.values()):
            self._close_stream(stream, timestamp_ns)
        self._streams.clear()
        self._blocks.clear()
        for reader in self._readers.values():
            reader.close()
        return self._take()

    def _begin(self, direction: Direction, data: bytes, timestamp_ns: int) -> list[SessionOutput]:
        """The client's first bytes: the preface (or frames, mid-connection), or an HTTP/1.1
        request (``Upgrade: h2c``, or HTTP/1 after all); held while they could be either."""
        first = self._first
        assert first is not None
        first.append((direction, data, timestamp_ns))
        if direction is not self._requests:
            return self._release_first(upgrade=False)
        head = b"".join(chunk for chunk_direction, chunk, _ in first if chunk_direction is direction)
        request = None if len(head) < len(PREFACE) and PREFACE.startswith(head) else http1_request(head)
        return [] if request is None else self._release_first(upgrade=request)

    def _release_first(self, upgrade: bool) -> list[SessionOutput]:
        """What the connection began with is decided: feed what was held."""
        first, self._first = self._first or [], None
        if upgrade:
            self._handshake = Handshake()
        out: list[SessionOutput] = []
        for direction, chunk, timestamp_ns in first:
            out += self.feed(direction, chunk, timestamp_ns)
        return out

    def _take(self) -> list[SessionOutput]:
        out, self._out = self._out, []
        return out

    # -- the h2c upgrade --------------------------------------------------------------------------

    def _shake(self, direction: Direction, data: bytes, timestamp_ns: int, gap: int) -> list[SessionOutput]:
        """Bytes of a connection that began with an HTTP/1.1 request, before the server's answer."""
        handshake = self._handshake
        assert handshake is not None
        if not handshake.hold(direction, data, timestamp_ns, gap) or gap:
            return self._hand_over()
        if direction is self._requests:
            if handshake.add_request(data, timestamp_ns) is False:
                return self._hand_over()
            return self._announce_upgrade_request(handshake)
        status = handshake.add_response(data)
        if status is None:
            return []
        if status != 101 or not handshake.request_complete:
            return self._hand_over()
        return self._upgraded(handshake, timestamp_ns)

    def _announce_upgrade_request(self, handshake: Handshake) -> list[SessionOutput]:
        """The upgrade request's head is here: it starts now, whatever the server answers. Held
        until the answer, its start would come after the work its process does for it and after
        its peer's side on this node: neither could join its trace."""
        if handshake.parsed is None or handshake.announced_ns is not None:
            return []
        start = handshake.announced_ns = self._start_time(handshake.request_start_ns)
        return [RequestStart(self._requests, start, handshake.stream_headers(), 1)]

    def _upgraded(self, handshake: Handshake, timestamp_ns: int) -> list[SessionOutput]:
        """101 Switching Protocols: the upgrade request is stream 1's (announced when its head
        came), HTTP/2 frames follow."""
        self._handshake = None
        headers = handshake.stream_headers()
        self._connection_start()
        stream = self._open(1)
        start = handshake.announced_ns
        assert start is not None  # the request is complete: its head came, and was announced
        stream.request = half = _Half(start, headers, 0, _may_be_grpc(headers, 0))
        half.body, half.end_ns, half.ended = handshake.body_length, handshake.request_end_ns, True
        self._first_stream = self._last_stream = 1
        self._report_request(stream, None)
        request_rest, response_rest = handshake.leftovers()
        for direction, rest in ((self._responses, response_rest), (self._requests, request_rest)):
            if rest:
                self._direction = direction
                self._readers[direction].feed(rest, timestamp_ns)
        return self._take()

    def _hand_over(self) -> list[SessionOutput]:
        """Not an h2c upgrade after all: an HTTP/1 session takes the connection from its start."""
        handshake = self._handshake
        assert handshake is not None
        self._handshake = None
        self._http1 = http1 = HTTP1Session(self.role, self._genai)
        out: list[SessionOutput] = []
        for direction, data, timestamp_ns, gap in handshake.held:
            if data:
                out += http1.feed(direction, data, timestamp_ns)
            if gap:
                out += http1.feed_gap(direction, gap, timestamp_ns)
        announced = handshake.announced_ns
        if announced is None:
            return out
        # the upgrade request was announced when its head came: not again
        return [o for o in out if not (isinstance(o, RequestStart) and o.start_ns == announced)]

    # -- FrameSink: what the readers found ----------------------------------------------------------

    def on_preface(self) -> None:
        self._connection_start()

    def _connection_start(self) -> None:
        """The connection's first bytes are in the capture: every header block will be seen."""
        self._hpack = {direction: HpackContext(complete=True) for direction in Direction}
        if self._responses not in self._fed:
            self._readers[self._responses].assume_boundary()

    def knows_stream(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def plausible_stream(self, stream_id: int) -> bool:
        # Streams open in order: an id far past the last one seen is more likely a coincidence
        # of bytes. Before any is seen, ids up to _FRESH_STREAMS (about half a million requests).
        return stream_id in self._streams or stream_id <= max(self._last_stream, _FRESH_STREAMS) + MAX_STREAMS

    def on_frame(self, frame: Frame, start_ns: int, end_ns: int) -> None:
        if isinstance(frame, RstStreamFrame):
            stream = self._streams.get(frame.stream_id)
            if stream is not None:
                self._finish(stream, end_ns, reset=frame.error_code)
        elif isinstance(frame, SettingsFrame):
            size = frame.settings.get(SettingsFrame.MAX_FRAME_SIZE)
            if size is not None:  # what the sender accepts: what the other direction may send
                other = self._readers[self._direction.reverse()]
                other.max_frame = min(max(size, DEFAULT_MAX_FRAME_SIZE), MAX_FRAME_SIZE)
        elif isinstance(frame, GoAwayFrame) and self._direction is self._responses:
            # the server will not process streams above last_stream_id: they were refused
            for stream in [s for s in self._streams.values() if s.id > frame.last_stream_id and s.id & 1]:
                self._finish(stream, end_ns, reset=REFUSED_STREAM)

    def on_data(self, stream_id: int, payload: bytes, timestamp_ns: int) -> None:
        half = self._half(stream_id)
        if half is not None:
            if half.body is not None:
                half.body += len(payload)
            if half.counter is not None:
                half.counter.feed(payload)
            if half.tap is not None:
                half.tap.feed(payload, timestamp_ns)
            half.end_ns = timestamp_ns

    def on_data_gap(self, stream_id: int, length: int | None, timestamp_ns: int) -> None:
        half = self._half(stream_id)
        if half is not None:
            half.body = None if length is None or half.body is None else half.body + length
            if half.counter is not None:
                half.counter.skip(length)
            if half.tap is not None:
                half.tap.gap(length)
            half.end_ns = timestamp_ns

    def on_end_stream(self, stream_id: int, timestamp_ns: int) -> None:
        stream = self._streams.get(stream_id) or self._stream(stream_id)
        if stream is None:
            return
        if self._direction is self._requests:
            if stream.request is not None:
                stream.request.ended = True
                stream.request.end_ns = timestamp_ns
                self._report_request(stream, None)
        else:
            if stream.response is not None:
                stream.response.ended = True
                stream.response.end_ns = timestamp_ns
            self._finish(stream, timestamp_ns)

    def on_lost(self, timestamp_ns: int) -> None:
        direction = self._direction
        self._hpack[direction].lose()
        self._blocks.pop(direction, None)
        for stream in self._streams.values():
            half = stream.request if direction is self._requests else stream.response
            if half is None and direction is self._responses:
                stream.response_lost = True
            elif half is not None and not half.ended:
                half.body = None
                if half.counter is not None:
                    half.counter.lost = True
                if half.tap is not None:
                    half.tap.gap(None)
                half.lost_ns = timestamp_ns

    # -- header blocks ------------------------------------------------------------------------------

    def on_block(
        self, frame_type: int, stream_id: int, flags: int, fragment: bytes | None, start_ns: int, end_ns: int
    ) -> None:
        direction = self._direction
        if fragment is None:
            self._hpack[direction].lose()  # the block cannot be decoded, nor the table kept in step
        if frame_type == CONTINUATION:
            block = self._blocks.get(direction)
            if block is None or block.stream != stream_id:  # its HEADERS frame was not seen
                self._errors += 1
                self._hpack[direction].lose()
                return
            if block.data is not None:
                if fragment is None or len(block.data) + len(fragment) > MAX_HEADER_BLOCK:
                    block.data = None
                    self._hpack[direction].lose()
                else:
                    block.data += fragment  # a new bytes object: blocks of many fragments are rare
        else:
            if direction in self._blocks:  # the block before never ended: its fragments are lost
                self._errors += 1
                self._hpack[direction].lose()
                self._end_block(self._blocks[direction], start_ns, lost=True)
            block = _Block(stream_id, fragment, bool(flags & END_STREAM), start_ns, frame_type == PUSH_PROMISE)
            if not flags & END_HEADERS:
                self._blocks[direction] = block
                return
        if flags & END_HEADERS:
            self._end_block(block, end_ns)

    def _end_block(self, block: _Block, end_ns: int, lost: bool = False) -> None:
        """A whole header block (or one whose fragments were lost): decode it, act on it."""
        direction = self._direction
        self._blocks.pop(direction, None)
        decoded = None if lost or block.data is None else self._hpack[direction].decode(block.data)
        if decoded is None:
            if block.data is not None and not lost:
                self._errors += 1  # it did not decode
            fields: Headers = ()
            unknown = 1
        else:
            fields, unknown = decoded
        if block.push:
            return  # a pushed request: decoded only to keep the table in step
        if direction is self._requests:
            self._request_headers(block, fields, unknown, decoded is not None, end_ns)
        else:
            self._response_headers(block, fields, unknown, end_ns)

    def _request_headers(self, block: _Block, fields: Headers, unknown: int, seen: bool, end_ns: int) -> None:
        stream_id = block.stream
        stream = self._streams.get(stream_id)
        if stream is None:
            if not stream_id & 1:
                self._errors += 1  # clients open odd streams
                return
            if self._first_stream <= stream_id <= self._last_stream:
                return  # trailers of a stream already over
            stream = self._open(stream_id)
            if not unknown and pseudo(fields, ":method") is None:
                # no request's head: the trailers of a stream from before the capture
                if block.end_stream:
                    self._drop(stream, end_ns)
                return
            start = self._start_time(block.start_ns)
            stream.request = half = _Half(start, fields, unknown, _may_be_grpc(fields, unknown))
            if self._genai is not None and not unknown:
                half.tap = self._genai.request_body(pseudo(fields, ":method") or "", pseudo(fields, ":path") or "")
                stream.route = half.tap.route if half.tap is not None else None
            if not self._first_stream:
                self._first_stream = stream_id
            self._last_stream = max(self._last_stream, stream_id)
            if seen:
                self._out.append(RequestStart(self._requests, start, fields, stream_id))
        elif stream.request is None and pseudo(fields, ":method") is not None:
            # frames taken for this stream's before its HEADERS (a resynchronisation's guess)
            self._drop(stream, block.start_ns)
            self._request_headers(block, fields, unknown, seen, end_ns)
            return
        elif stream.request is None:
            return  # trailers of a stream whose HEADERS were not seen: it is reported dropped
        else:  # request trailers
            half = stream.request
            half.unknown += unknown
        half.end_ns = end_ns
        if block.end_stream:
            half.ended = True
            self._report_request(stream, None)

    def _response_headers(self, block: _Block, fields: Headers, unknown: int, end_ns: int) -> None:
        stream = self._stream(block.stream)
        if stream is None:
            return
        half = stream.response
        if half is None:
            status = _status(fields)
            if 100 <= status < 200 and not block.end_stream:
                return  # interim response
            grpc = stream.request is not None and stream.request.counter is not None
            stream.response = half = _Half(block.start_ns, fields, unknown, grpc)
            stream.status = status
            if stream.route is not None:
                half.tap = self._genai.response_body(stream.route, fields)  # type: ignore[union-attr]
        else:  # trailers
            half.trailers = fields
            half.unknown += unknown
        half.end_ns = end_ns
        if block.end_stream:
            half.ended = True
            self._finish(stream, end_ns)

    # -- streams ----------------------------------------------------------------------------------

    def _start_time(self, timestamp_ns: int) -> int:
        """A request's start time, unique on the connection (see the module doc)."""
        start = timestamp_ns if timestamp_ns > self._last_start_ns else self._last_start_ns + 1
        self._last_start_ns = start
        return start

    def _open(self, stream_id: int) -> _Stream:
        if len(self._streams) >= MAX_STREAMS:
            oldest = next(iter(self._streams.values()))
            self._drop(oldest, self._last_start_ns)
        stream = self._streams[stream_id] = _Stream(stream_id)
        return stream

    def _stream(self, stream_id: int) -> _Stream | None:
        """The open stream a frame other than request HEADERS belongs to; a new one for a stream
        whose HEADERS the capture missed; None for one that finished or was pushed."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            return stream
        if not stream_id & 1 or self._first_stream <= stream_id <= self._last_stream:
            return None
        return self._open(stream_id)

    def _half(self, stream_id: int) -> _Half | None:
        stream = self._streams.get(stream_id) or self._stream(stream_id)
        if stream is None:
            return None
        return stream.request if self._direction is self._requests else stream.response

    def _report_request(self, stream: _Stream, incomplete: str | None) -> None:
        half = stream.request
        if stream.reported or half is None:
            return
        stream.reported = True
        if half.unknown:
            self.partial_messages += 1
        end = half.end_ns if incomplete is None else half.last_ns()
        self._out.append(
            Request(
                self._requests,
                half.start_ns,
                end,
                stream.id,
                half.headers,
                half.unknown,
                half.body_size(),
                *half.messages(),
                incomplete,
                self._read_tap(half),
            )
        )

    def _read_tap(self, half: _Half) -> Any:
        """What the GenAI layer read of a finished half (``None`` for other requests)."""
        tap = half.tap
        if tap is None:
            return None
        half.tap = None
        found = tap.finish()
        self._errors += tap.errors
        return found

    def _finish(self, stream: _Stream, end_ns: int, reset: int | None = None, incomplete: str | None = None) -> None:
        """The stream is over: report its request (if not yet) and its response."""
        self._streams.pop(stream.id, None)
        if stream.request is None:
            self._drop(stream, end_ns)
            return
        request = stream.request
        self._report_request(stream, None if request.ended or incomplete is None else request.incomplete(incomplete))
        half = stream.response
        if half is None:
            self._out.append(
                Response(self._responses, end_ns, end_ns, stream.id, None, reset=reset, incomplete=incomplete)
            )
            return
        if half.unknown:
            self.partial_messages += 1
        end = max(half.end_ns, end_ns) if incomplete is None else half.last_ns()
        self._out.append(
            Response(
                self._responses,
                half.start_ns,
                end,
                stream.id,
                stream.status,
                half.headers,
                half.trailers,
                half.unknown,
                half.body_size(stream.status not in (204, 304) and pseudo(request.headers, ":method") != "HEAD"),
                *half.messages(),
                reset,
                incomplete,
                self._read_tap(half),
            )
        )

    def _close_stream(self, stream: _Stream, timestamp_ns: int) -> None:
        """The connection ended with the stream open."""
        if stream.request is None:
            self._drop(stream, timestamp_ns)
        elif stream.response is None and stream.response_lost:  # the capture, not the peer, lost it
            self._finish(stream, timestamp_ns, incomplete=CAPTURE_GAP)
        elif stream.response is None:  # unanswered: the stitcher reports it so
            request = stream.request
            self._report_request(stream, None if request.ended else request.incomplete(CONNECTION_CLOSED))
        else:
            self._finish(stream, timestamp_ns, incomplete=stream.response.incomplete(CONNECTION_CLOSED))

    def _drop(self, stream: _Stream, end_ns: int) -> None:
        self._streams.pop(stream.id, None)
        half = stream.request or stream.response
        start = end_ns if half is None else half.start_ns
        self._out.append(StreamDropped(self._requests, start, max(start, end_ns), stream.id))
