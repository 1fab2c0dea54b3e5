"""Incremental, sans-I/O HTTP/1.x parsers: one per direction of a connection.

A parser is a state machine in the style of h11: bytes in, :class:`Request` / :class:`Response`
messages out, resumable at any byte boundary. It differs from a server-side parser in what it must
survive rather than reject, because it watches traffic it cannot influence:

* the capture may start mid-stream, and bytes past the capture cap are reported only as a length
  (:meth:`_Parser.gap`); after either the parser *resynchronises* by skipping to the next thing
  that looks like a start line;
* once a message head is parsed, exactly one message is emitted for it, complete or marked
  ``incomplete``, so the request/response FIFOs on both sides stay aligned;
* every buffer is bounded (``MAX_HEAD``, ``MAX_LINE``), so hostile input cannot grow memory.

Byte-level work is done by ``bytes.find`` and compiled regular expressions, never Python loops
over bytes. A node sees the same start lines and header sections again and again (same clients,
same servers, same routes), so what they parse to is memoised (:mod:`..caching`): a message whose
head was seen before costs two cache hits instead of a parse.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from otel_ebpf.protocol import Direction, RequestStart, SessionOutput

from ..caching import memoize
from ..genai import GenAIOptions, RequestBody, ResponseBody, Route
from ..http_semconv import CAPTURE_GAP, CONNECTION_CLOSED, KNOWN_METHODS, Headers
from .types import MALFORMED, Request, Response

MAX_HEAD = 64 * 1024  # start line + header section, and the trailer section
MAX_LINE = 8 * 1024  # start line, chunk-size line
MAX_PENDING = 256  # requests awaiting a response, per connection
# A request awaiting its response: its method (a response to HEAD has no body whatever its headers
# say) and, for an LLM call, its GenAI route (how to read the response).
Pending = tuple[str, Route | None]

# states
_HEAD = 0  # at a message boundary: start line and header section
_SYNC = 1  # skipping bytes up to the next plausible start line
_LENGTH = 2  # Content-Length body
_CHUNK_SIZE = 3
_CHUNK_DATA = 4
_CHUNK_END = 5  # the CRLF after a chunk's data
_TRAILERS = 6
_UNTIL_CLOSE = 7  # response body delimited by the connection's end
_OPAQUE = 8  # no more HTTP/1 in this direction (tunnel, upgrade, closed)
_PEEK = 9  # response Content-Length body, unless it starts with the next status line
_LOST_CHUNKS = 10  # a chunked body whose framing a gap hid: held until its end shows (_lost_chunks)
_IN_BODY = frozenset({_LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE})

# what a head says about the body that follows
_NO_BODY, _INTERIM, _TUNNEL, _FIXED, _PEEK_FIXED, _CHUNKED, _TO_CLOSE, _INVALID = range(8)

_TCHARS = rb"!#$%&'*+.^_`|~0-9A-Za-z-"
_TARGET_CHARS = rb"\x21-\x7e\x80-\xff"
_REQUEST_LINE = re.compile(rb"([%s]{1,32}) ([%s]+) HTTP/1\.([01])\r?\n" % (_TCHARS, _TARGET_CHARS))
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?:[ \t]([^\r\n]*))?\r?\n")
_TCHAR = re.compile(rb"[%s]" % _TCHARS)
# a request line the capture cap cut in its target (a URL of several KiB): method and target prefix
_CUT_REQUEST_LINE = re.compile(rb"([%s]{1,32}) ([%s]+)\Z" % (_TCHARS, _TARGET_CHARS))
_BLANK = re.compile(rb"[\r\n]*")
_HEAD_END = re.compile(rb"\n\r?\n")
_CHUNK_LINE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r?\n")

# Resynchronisation accepts only upper-case methods, which is what real clients send; at a known
# message boundary any token is a method.
_VERSION_TAIL = re.compile(rb" HTTP/1\.[01]\r?\n")
_TARGET = re.compile(rb"[%s]+" % _TARGET_CHARS)
_METHOD_TAIL = re.compile(rb"[A-Z][A-Z_-]{0,31}\Z")
_STATUS_START = re.compile(rb"HTTP/1\.[01] [0-9]{3}[ \t\r\n]")
_STATUS_PREFIX = b"HTTP/1."
_LAST_CHUNK = b"0\r\n\r\n"  # size 0, no trailers
_BODY_END = b"\r\n" + _LAST_CHUNK  # the last data chunk's CRLF, then the last chunk
_KNOWN_METHODS_LONGEST_FIRST = sorted((m.encode() for m in KNOWN_METHODS), key=lambda m: (-len(m), m))


def parse_fields(block: bytes | bytearray) -> tuple[tuple[str, str], ...] | None:
    """Header (or trailer) lines, each ending in LF → ``(lower-case name, value)`` pairs;
    ``None`` if malformed.

    Values are decoded as Latin-1, which maps every byte, as RFC 9110 treats field octets.
    Lines of the usual shape take :func:`_field`; obsolete line folding (joined with a space, as
    RFC 9112 section 5.2 allows) and malformed lines send the whole block down the line-by-line
    path.

    A whole section is looked up in a cache first, then each of its lines: a new section is
    mostly lines seen before.
    """
    section = _parse_section(bytes(block))
    return None if section is None else section[0]


# A parsed header section: its fields, then what they say about the body (see _body_framing).
_Section = tuple[tuple[tuple[str, str], ...], bool | None, int]


@memoize
def _parse_section(block: bytes) -> _Section | None:
    """:func:`parse_fields`, with what the fields say about the body; ``None`` if malformed."""
    text = block.decode("latin-1")
    lines = text.split("\n")
    del lines[-1]  # what follows the last LF is not a whole line
    parsed = tuple(field for field in map(_field, lines) if field is not None)
    # folded or malformed: a folded line continues the field before it, which no line tells on its own
    fields = parsed if len(parsed) == len(lines) else _parse_fields_by_line(text)
    if fields is None:
        return None
    return (fields, *_body_framing(fields))


@memoize
def _field(line: str) -> tuple[str, str] | None:
    """``name:value`` (a line without its LF) → ``(lower-case name, value)`` without the spaces and
    tabs around the value and the CR of a CRLF; ``None`` for a folded or malformed line."""
    name, colon, value = line.partition(":")
    if not (colon and name) or " " in name or "\t" in name or "\r" in name:
        return None
    if value.endswith("\r"):
        value = value[:-1]
    return name.lower(), value.strip(" \t")


def _parse_fields_by_line(text: str) -> tuple[tuple[str, str], ...] | None:
    fields: list[tuple[str, str]] = []
    for line in text.split("\n"):
        if not line.rstrip("\r"):
            continue
        if line[0] in " \t":
            if not fields:
                return None
            name, value = fields[-1]
            more = line.rstrip("\r").strip(" \t")
            # a fold of an empty first line ("Connection:" then " close") adds no space
            fields[-1] = (name, f"{value} {more}" if value and more else value or more)
            continue
        field = _field(line)  # the fast path's rules, so both paths accept the same lines
        if field is None:
            return None
        fields.append(field)
    return tuple(fields)


def _content_length(values: list[str]) -> int:
    """The body length the Content-Length fields agree on; -1 when they are invalid or disagree."""
    found = -1
    for value in values:
        for item in value.split(","):
            item = item.strip(" \t")
            if not (item.isascii() and item.isdigit() and len(item) <= 18):
                return -1
            length = int(item)
            if found not in (-1, length):
                return -1
            found = length
    return found


def _body_framing(headers: Headers) -> tuple[bool | None, int]:
    """(chunked?, length) from Transfer-Encoding / Content-Length.

    ``chunked`` is ``None`` without Transfer-Encoding; ``length`` is -1 for an invalid
    Content-Length and -2 for none.
    """
    codings: list[str] = []
    lengths: list[str] = []
    for name, value in headers:
        if name == "transfer-encoding":
            codings.append(value)
        elif name == "content-length":
            lengths.append(value)
    chunked = None
    if codings:
        chunked = ",".join(codings).rsplit(",", 1)[-1].strip(" \t").lower() == "chunked"
    return chunked, (_content_length(lengths) if lengths else -2)


@memoize
def _request_line(line: bytes) -> tuple[str, str, str] | None:
    """A request line with its line ending → ``(method, target, version)``; ``None`` if invalid."""
    match = _REQUEST_LINE.fullmatch(line)
    if match is None:
        return None
    method, target, minor = match.groups()
    return method.decode("ascii"), _decode_target(target), "1.1" if minor == b"1" else "1.0"


@memoize
def _status_line(line: bytes) -> tuple[int, str, str] | None:
    """A status line with its line ending → ``(status, reason, version)``; ``None`` if invalid."""
    match = _STATUS_LINE.fullmatch(line)
    if match is None:
        return None
    minor, status, reason = match.groups()
    return int(status), (reason or b"").decode("latin-1"), "1.1" if minor == b"1" else "1.0"


def _chunked_ends(data: bytes) -> Iterator[int]:
    """Where a chunked body of unknown framing may end in a syscall's ``data``: past a last chunk
    written on its own (the syscall starts with it) or after a data chunk's CRLF."""
    if data.startswith(_LAST_CHUNK):
        yield len(_LAST_CHUNK)
    at = data.find(_BODY_END)
    while at != -1:
        yield at + len(_BODY_END)
        at = data.find(_BODY_END, at + 1)


class _Parser(ABC):
    """The state machine shared by both directions; subclasses know their start line and framing."""

    KEEP_TAIL = 0  # bytes kept while resynchronising: the longest prefix of a start line to look for

    def __init__(self, direction: Direction, methods: deque[Pending], genai: GenAIOptions | None = None) -> None:
        self.direction = direction
        self._genai = genai  # recognises LLM calls; None: every message is plain HTTP
        self.parse_errors = 0
        # requests whose final response has not been parsed, shared by both parsers
        self._methods = methods
        # the GenAI layer's reader of the current message's content, for LLM calls only
        self._tap: RequestBody | ResponseBody | None = None
        self._state = _HEAD
        self._buf = bytearray()  # unconsumed bytes; empty in body states
        self._base = 0  # stream offset of _buf[0]
        self._marks: list[tuple[int, int]] = []  # (stream offset, timestamp) of feeds still in _buf
        self._scan = 0  # stream offset where the search for the end of a header section resumes
        self._last_ts = 0
        # the message being parsed
        self._line: tuple = ()  # parsed start line; empty until it is valid
        self._headers: Headers = ()
        self._start_ns = 0
        self._head_ns = 0  # timestamp of the head's last byte
        self._remaining = 0  # bytes left in a Content-Length body or chunk
        self._body = 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def opaque(self) -> bool:
        return self._state == _OPAQUE

    def stop(self) -> None:
        """The connection stopped speaking HTTP/1 in this direction (upgrade, tunnel)."""
        self._state = _OPAQUE
        self._buf = bytearray()
        self._marks = []

    def switch(self) -> list[SessionOutput]:
        """The other direction switched the connection to another protocol (101, 2xx to CONNECT):
        a message still in its body ends with the bytes seen so far, as what follows belongs to
        the new protocol, and nothing after is HTTP/1."""
        out: list[SessionOutput] = []
        self._settle_peek()
        if self._state in _IN_BODY:
            self._emit(self._last_ts, out, self._body)
        out += self.end_lost()
        self.stop()
        return out

    def feed(self, data: bytes, timestamp_ns: int) -> list[SessionOutput]:
        if not data or self._state == _OPAQUE:
            return []
        if self._state == _LOST_CHUNKS:
            return self._lost_chunks(data, timestamp_ns)
        self._last_ts = timestamp_ns
        if not self._buf:
            # Large bodies arrive here: count them without copying.
            if self._state == _UNTIL_CLOSE:
                self._body += len(data)
                if self._tap is not None:
                    self._tap.feed(data, timestamp_ns)
                return []
            if self._state in (_LENGTH, _CHUNK_DATA) and len(data) < self._remaining:
                self._remaining -= len(data)
                self._body += len(data)
                if self._tap is not None:
                    self._tap.feed(data, timestamp_ns)
                return []
            self._marks = [(self._base, timestamp_ns)]
            buf: bytes | bytearray = data
            out: list[SessionOutput] = []
            # The common case: a syscall that starts with a whole message head.
            pos = self._whole_head(data, timestamp_ns, out) if self._state == _HEAD and not self._line else 0
        else:
            self._marks.append((self._base + len(self._buf), timestamp_ns))
            self._buf += data
            buf = self._buf
            out = []
            pos = 0
        if pos < len(buf):  # no whole head, or bytes after it (a body, the next message)
            pos = self._run(buf, timestamp_ns, out, pos)
        if self._state == _OPAQUE:
            self.stop()
            return out
        if buf is data:
            if pos < len(data):
                self._buf = bytearray(data[pos:])
        else:
            del self._buf[:pos]
        self._base += pos
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= self._base:
            del marks[0]
        return out

    def gap(self, length: int, timestamp_ns: int) -> list[SessionOutput]:
        """``length`` bytes moved right after the last feed but were not captured."""
        if length <= 0 or self._state == _OPAQUE:
            return []
        self._last_ts = timestamp_ns
        out: list[SessionOutput] = []
        self._settle_peek()
        state = self._state
        if state == _LOST_CHUNKS:
            return out
        data = self._hidden_data_of_last_chunk(length)
        if data is not None:
            if self._tap is not None and data:
                self._tap.gap(data)
            self._emit(timestamp_ns, out, self._body + data)
            return out
        if self._tap is not None and state in (_UNTIL_CLOSE, _LENGTH, _CHUNK_DATA):
            self._tap.gap(length)
        if state == _UNTIL_CLOSE:
            self._body += length
            return out
        if state in (_LENGTH, _CHUNK_DATA) and length <= self._remaining:
            self._remaining -= length
            self._body += length
            if self._remaining == 0:
                if state == _LENGTH:
                    self._emit(timestamp_ns, out, self._body)
                else:
                    self._state = _CHUNK_END
            return out
        if state == _CHUNK_DATA and length <= self._remaining + 2:
            # The chunk's data and its CRLF (or CR) after it, which valid framing puts there: a
            # writer that writes each chunk whole (Python's, Node.js's) past the cap.
            self._body += self._remaining
            self._state = _CHUNK_SIZE if length == self._remaining + 2 else _CHUNK_END
            self._remaining = 0
            return out
        if state in (_CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END):
            self._lose_chunks()
            return out
        # The gap hides framing: finish what can be finished, then look for the next message.
        if state == _LENGTH:
            self._emit(timestamp_ns, out, self._body + self._remaining)
        elif state == _HEAD:
            self._salvage_head(CAPTURE_GAP, timestamp_ns, out)
        elif state != _SYNC:
            self._emit(timestamp_ns, out, self._body if state == _TRAILERS else None, CAPTURE_GAP)
        if self._state != _OPAQUE:
            self._state = _SYNC
        self._buf = bytearray()
        self._marks = []
        return out

    def _lose_chunks(self) -> None:
        """A gap hid the chunk framing of the body in progress: where it ends is no longer known
        from its chunk sizes. The message is held, not reported at the gap (a large chunked
        download read several chunks at a time would end there, its tail still to come), until
        its end shows: a last chunk ending a syscall (:meth:`_lost_chunks`), bytes moving the
        other way (:meth:`end_lost`), or the connection's end. Its body size stays unknown."""
        self._state = _LOST_CHUNKS
        self._buf = bytearray()
        self._marks = []
        if self._tap is not None:  # what follows mixes data and chunk-size lines
            self._tap.gap(None)

    def _lost_chunks(self, data: bytes, timestamp_ns: int) -> list[SessionOutput]:
        """Bytes of a body whose chunk framing was lost: it ends at a last chunk that ends the
        syscall or is followed by the next message's start line, or before a syscall that starts
        with one (pipelined responses)."""
        out: list[SessionOutput] = []
        eol = data.find(b"\n", 0, MAX_LINE)
        if eol > 0 and self._parse_start_line(data[: eol + 1]) is not None:
            self._emit(self._last_ts, out, None, CAPTURE_GAP)
            return out + self.feed(data, timestamp_ns)
        self._last_ts = timestamp_ns
        for end in _chunked_ends(data):
            if end == len(data) or self._find_start(data, end) == end:
                self._emit(timestamp_ns, out, None, CAPTURE_GAP)
                return out + self.feed(data[end:], timestamp_ns) if end < len(data) else out
        return out

    @property
    def lost(self) -> bool:
        """Whether a message whose end is no longer known from its framing is held (_lose_chunks)."""
        return self._state == _LOST_CHUNKS

    def end_lost(self) -> list[SessionOutput]:
        """Bytes moved the other way: the held message (:attr:`lost`) ended with this direction's
        last syscall (a client writes its next request once the response is read; a server
        answers once it read the request). What comes next is looked for as after any lost
        framing: a server that answered early leaves the rest of an upload to skip."""
        if self._state != _LOST_CHUNKS:
            return []
        out: list[SessionOutput] = []
        self._emit(self._last_ts, out, None, CAPTURE_GAP)
        self._state = _SYNC
        return out

    def _hidden_data_of_last_chunk(self, length: int) -> int | None:
        """The body bytes a gap of ``length`` hid when it is exactly the rest of a chunked body
        ended by a bare last chunk (no trailers), else ``None``.

        A large chunked download ends with a read past the capture cap whose hidden tail is the
        last chunk's data and the terminator (CRLF, then ``0`` CRLF CRLF), as the sender wrote them
        together. Any other continuation of that exact size would need a chunk whose size line
        and data are cut right there; then the next bytes do not start a message, and are counted
        malformed as any other framing the capture broke.
        """
        if self._buf:  # part of a line is held: the framing ahead is not where it seems
            return None
        state = self._state
        if state == _CHUNK_DATA:  # the data, its CRLF, the last chunk
            data, framing = self._remaining, 2 + len(_LAST_CHUNK)
        elif state == _CHUNK_END:
            data, framing = 0, 2 + len(_LAST_CHUNK)
        elif state == _CHUNK_SIZE:
            data, framing = 0, len(_LAST_CHUNK)
        else:
            return None
        return data if length == data + framing else None

    def close(self) -> list[SessionOutput]:
        """The connection ended: finish a body delimited by close, report a cut-off message."""
        out: list[SessionOutput] = []
        self._settle_peek()
        state = self._state
        if state == _UNTIL_CLOSE:
            self._emit(self._last_ts, out, self._body)
        elif state == _LOST_CHUNKS:
            out = self.end_lost()
        elif state == _HEAD:
            self._salvage_head(CONNECTION_CLOSED, self._last_ts, out)
        elif state not in (_SYNC, _OPAQUE):
            self._emit(self._last_ts, out, self._body, CONNECTION_CLOSED)
        self.stop()
        return out

    def _settle_peek(self) -> None:
        """More bytes moved (a gap) or none will (close): the bytes held for a peek are body."""
        if self._state == _PEEK:
            self._remaining -= len(self._buf)
            self._body += len(self._buf)
            self._buf = bytearray()
            self._state = _LENGTH

    # -- the state machine --------------------------------------------------------------------

    def _run(self, buf: bytes | bytearray, ts: int, out: list[SessionOutput], pos: int = 0) -> int:
        """Consume ``buf`` from ``pos`` as far as possible; return how many bytes were consumed."""
        end = len(buf)
        while pos < end:
            state = self._state
            if state in (_LENGTH, _CHUNK_DATA):
                take = min(self._remaining, end - pos)
                new = pos + take
                self._remaining -= take
                self._body += take
                if self._tap is not None:
                    self._tap.feed(bytes(buf[pos:new]), self._ts_at(pos))
                if self._remaining == 0:
                    if state == _LENGTH:
                        self._emit(ts, out, self._body)
                    else:
                        self._state = _CHUNK_END
            elif state == _HEAD:
                new = self._head(buf, pos, ts, out)
            elif state == _CHUNK_SIZE:
                new = self._chunk_size(buf, pos, ts, out)
            elif state == _CHUNK_END:
                new = self._chunk_end(buf, pos, ts, out)
            elif state == _TRAILERS:
                new = self._trailers(buf, pos, ts, out)
            elif state == _SYNC:
                found = self._find_start(buf, pos)
                if found == -1:
                    new = max(pos, end - self.KEEP_TAIL)
                else:
                    new = found
                    self._state = _HEAD
            elif state == _UNTIL_CLOSE:
                self._body += end - pos
                new = end
                if self._tap is not None:
                    self._tap.feed(bytes(buf[pos:end]), self._ts_at(pos))
            elif state == _PEEK:
                new = pos
                want = min(len(_STATUS_PREFIX), self._remaining)
                if end - pos >= want:
                    if buf.startswith(_STATUS_PREFIX[:want], pos):
                        self._emit(self._head_ns, out, 0)
                    else:
                        self._state = _LENGTH
            else:  # _OPAQUE
                return end
            if new == pos and self._state == state:
                break
            pos = new
        return pos

    def _ts_at(self, offset: int) -> int:
        """Timestamp of the feed that carried ``_buf``-relative byte ``offset``."""
        target = self._base + offset
        for mark, ts in reversed(self._marks):
            if mark <= target:
                return ts
        return self._last_ts

    def _resync(self, pos: int) -> int:
        """Malformed input at ``pos``: count it once, then skip to the next plausible start line."""
        self.parse_errors += 1
        self._line = ()
        self._state = _SYNC
        return pos + 1

    def _whole_head(self, data: bytes, ts: int, out: list[SessionOutput]) -> int:
        """The head at the start of a new feed ``data``, parsed in one go when ``data`` holds all
        of it: where it ends, or 0 when it is not all there or not valid, for :meth:`_head` to
        take it line by line (and count what is wrong with it).

        What :meth:`_head` does at a message boundary with nothing buffered, minus what that case
        never needs: leading blank lines, a start line parsed by an earlier feed, the timestamp
        of a byte that another feed carried.
        """
        eol = data.find(b"\n", 0, MAX_LINE)
        if eol <= 0:
            return 0
        found = _HEAD_END.search(data, eol)
        if found is None:
            return 0
        line = self._parse_start_line(data[: eol + 1])
        if line is None:
            return 0
        section = _parse_section(data[eol + 1 : found.start() + 1])
        if section is None:
            return 0
        self._line = line
        self._start_ns = ts
        return self._head_done(section, ts, out, found.end())

    def _head(self, buf: bytes | bytearray, pos: int, ts: int, out: list[SessionOutput]) -> int:
        end = len(buf)
        if buf[pos] in b"\r\n":  # blank lines before a message are skipped (RFC 9112 section 2.2)
            pos = _BLANK.match(buf, pos).end()  # type: ignore[union-attr]  # always matches
            if pos == end:
                return pos
        if self._line:  # parsed by an earlier feed, which did not hold the end of the head
            eol = buf.find(b"\n", pos)
            scan = max(pos, self._scan - self._base)
        else:
            eol = buf.find(b"\n", pos, pos + MAX_LINE)
            if eol == -1:
                if end - pos >= MAX_LINE or not self._could_start(buf, pos):
                    return self._resync(pos)
                return pos
            line = self._parse_start_line(bytes(buf[pos : eol + 1]))
            if line is None:
                return self._resync(pos)
            self._line = line
            self._start_ns = self._ts_at(pos)
            scan = eol
        # A valid start line followed by a bad header section is skipped whole: resuming inside
        # it would find its own tail ("ET /a HTTP/1.1") and fail again.
        found = _HEAD_END.search(buf, scan)
        if found is None:
            if end - pos > MAX_HEAD:
                return self._resync(eol)
            self._scan = self._base + max(pos, end - 2)
            return pos
        section = _parse_section(bytes(buf[eol + 1 : found.start() + 1]))
        if section is None:
            return self._resync(eol)
        return self._head_done(section, ts, out, found.end())

    def _head_done(self, section: _Section, ts: int, out: list[SessionOutput], head_end: int) -> int:
        """The head ending at ``head_end`` (past its blank line) parsed to ``section``: set up
        for its body, or emit it; return where parsing resumes."""
        self._headers, chunked, length = section
        self._head_ns = ts
        self._head_parsed(out)
        framing = self._framing(chunked, length)
        if framing == _INTERIM:
            self._line = ()
        elif framing in (_NO_BODY, _TUNNEL) or (framing in (_FIXED, _PEEK_FIXED) and self._remaining == 0):
            self._emit(ts, out, 0)
            if framing == _TUNNEL:
                self._state = _OPAQUE
        elif framing == _FIXED:
            self._state = _LENGTH
        elif framing == _PEEK_FIXED:
            self._state = _PEEK
        elif framing == _CHUNKED:
            self._state = _CHUNK_SIZE
        elif framing == _TO_CLOSE:
            self._state = _UNTIL_CLOSE
        else:
            self._emit(ts, out, None, MALFORMED)
            return self._resync(head_end - 1)
        return head_end

    def _chunk_size(self, buf: bytes | bytearray, pos: int, ts: int, out: list[SessionOutput]) -> int:
        eol = buf.find(b"\n", pos, pos + MAX_LINE)
        if eol == -1:
            return self._malformed(pos, ts, out) if len(buf) - pos >= MAX_LINE else pos
        match = _CHUNK_LINE.fullmatch(buf, pos, eol + 1)
        if match is None:
            return self._malformed(pos, ts, out)
        size = int(match.group(1), 16)
        if size:
            self._remaining = size
            self._state = _CHUNK_DATA
        else:
            self._scan = self._base + eol + 1
            self._state = _TRAILERS
        return eol + 1

    def _chunk_end(self, buf: bytes | bytearray, pos: int, ts: int, out: list[SessionOutput]) -> int:
        if buf.startswith(b"\n", pos):
            self._state = _CHUNK_SIZE
            return pos + 1
        if buf.startswith(b"\r\n", pos):
            self._state = _CHUNK_SIZE
            return pos + 2
        if len(buf) - pos == 1 and buf[pos] == 13:
            return pos
        return self._malformed(pos, ts, out)

    def _trailers(self, buf: bytes | bytearray, pos: int, ts: int, out: list[SessionOutput]) -> int:
        if buf.startswith(b"\n", pos):
            end = pos + 1
        elif buf.startswith(b"\r\n", pos):
            end = pos + 2
        elif len(buf) - pos == 1 and buf[pos] == 13:
            return pos
        else:
            found = _HEAD_END.search(buf, max(pos, self._scan - self._base))
            if found is None:
                if len(buf) - pos > MAX_HEAD:
                    return self._malformed(pos, ts, out, self._body)
                self._scan = self._base + max(pos, len(buf) - 2)
                return pos
            end = found.end()
        self._emit(ts, out, self._body)
        return end

    def _malformed(self, pos: int, ts: int, out: list[SessionOutput], body_size: int | None = None) -> int:
        """The body's framing broke: report the message as far as it went and resynchronise."""
        self._emit(ts, out, body_size, MALFORMED)
        return self._resync(pos)

    def _salvage_head(self, reason: str, ts: int, out: list[SessionOutput]) -> None:
        """Report a message whose head was cut off, with the header lines seen so far (or, when
        the capture cut its start line, with what that line tells: a peer that closed there sent
        no request)."""
        buf = self._buf
        if not self._line:
            self._line = self._cut_start_line(buf) if reason == CAPTURE_GAP else ()
            if not self._line:
                return
            self._start_ns = self._ts_at(0)
        first = buf.find(b"\n")
        last = buf.rfind(b"\n")
        self._headers = parse_fields(buf[first + 1 : last + 1]) or ()
        framing = self._framing(*_body_framing(self._headers))
        if framing != _INTERIM:
            self._emit(ts, out, None, reason)
        if framing == _TUNNEL:
            self._state = _OPAQUE

    def _emit(
        self, end_ns: int, out: list[SessionOutput], body_size: int | None, incomplete: str | None = None
    ) -> None:
        tap, self._tap = self._tap, None
        genai = None
        if tap is not None:
            genai = tap.finish()
            self.parse_errors += tap.errors
        out.append(self._message(end_ns, body_size, incomplete, genai))
        self._line = ()
        self._headers = ()
        self._body = 0
        self._remaining = 0
        self._state = _HEAD

    # -- what differs between requests and responses ------------------------------------------

    @abstractmethod
    def _could_start(self, buf: bytes | bytearray, pos: int) -> bool:
        """Whether the bytes at ``pos``, not yet a whole line, may still begin a start line."""

    # The start line (ending in LF) as a tuple, or ``None`` if invalid: each parser's line function.
    _parse_start_line: Callable[[bytes], tuple | None]

    def _cut_start_line(self, buf: bytes | bytearray) -> tuple:
        """The start line of a head a gap cut before its line ending, as far as it can be told
        (empty: not at all)."""
        return ()

    @abstractmethod
    def _find_start(self, buf: bytes | bytearray, pos: int) -> int:
        """Offset of the first plausible start line at or after ``pos``, or -1."""

    def _head_parsed(self, out: list[SessionOutput]) -> None:  # noqa: B027 — optional hook
        """The head of the current message is complete (its body may follow)."""

    @abstractmethod
    def _framing(self, chunked: bool | None, length: int) -> int:
        """Classify the body of the message whose head was just parsed (sets ``_remaining``),
        given what its header fields say about it (see :func:`_body_framing`)."""

    @abstractmethod
    def _message(self, end_ns: int, body_size: int | None, incomplete: str | None, genai: Any) -> Request | Response:
        """The message parsed so far, ending at ``end_ns``; ``genai`` is what its tap found."""


class RequestParser(_Parser):
    KEEP_TAIL = MAX_LINE + 16

    def _could_start(self, buf: bytes | bytearray, pos: int) -> bool:
        return _TCHAR.match(buf, pos) is not None

    _parse_start_line = staticmethod(_request_line)

    def _cut_start_line(self, buf: bytes | bytearray) -> tuple:
        # The method and the target's first bytes: the path is whole when its query began in them.
        # The version is not known; the response's stands for it on the span.
        match = _CUT_REQUEST_LINE.fullmatch(buf)
        return () if match is None else (match[1].decode("ascii"), _decode_target(match[2]), "1.1")

    def _find_start(self, buf: bytes | bytearray, pos: int) -> int:
        # Anchor on " HTTP/1.x" (a fast find), then walk back over the target and the method.
        at = buf.find(b" HTTP/1.", pos)
        while at != -1:
            if _VERSION_TAIL.match(buf, at):
                space = buf.rfind(b" ", max(pos, at - MAX_LINE), at)
                if space > pos and _TARGET.fullmatch(buf, space + 1, at):
                    method = _METHOD_TAIL.search(buf, max(pos, space - 32), space)
                    if method is not None:
                        return _known_method_start(bytes(buf[method.start() : space]), space)
            at = buf.find(b" HTTP/1.", at + 1)
        return -1

    def _head_parsed(self, out: list[SessionOutput]) -> None:
        out.append(RequestStart(self.direction, self._start_ns, self._headers))

    def _framing(self, chunked: bool | None, length: int) -> int:
        method = self._line[0]
        tap = self._genai.request_body(method, self._line[1]) if self._genai is not None else None
        self._tap = tap
        self._methods.append((method, tap.route if tap is not None else None))
        if method == "CONNECT":
            # RFC 9110 section 9.3.6: CONNECT has no content, whatever its fields say; what follows
            # is the tunnel's (after a 2xx) or the next request (after a refusal).
            return _NO_BODY
        if chunked is not None:
            return _CHUNKED if chunked else _INVALID
        if length == -1:
            return _INVALID
        self._remaining = max(length, 0)
        return _FIXED

    def _message(self, end_ns: int, body_size: int | None, incomplete: str | None, genai: Any) -> Request:
        method, target, version = self._line
        # positional, in field order: keywords would make this per-message call a third slower
        return Request(
            self.direction,
            self._start_ns,
            end_ns,
            method,
            target,
            version,
            self._headers,
            body_size,
            incomplete,
            genai,
        )


class ResponseParser(_Parser):
    KEEP_TAIL = 12  # len(b"HTTP/1.1 200")

    def _could_start(self, buf: bytes | bytearray, pos: int) -> bool:
        prefix = bytes(buf[pos : pos + 7])
        return b"HTTP/1.".startswith(prefix)

    _parse_start_line = staticmethod(_status_line)

    def _find_start(self, buf: bytes | bytearray, pos: int) -> int:
        at = buf.find(b"HTTP/1.", pos)
        while at != -1 and not _STATUS_START.match(buf, at):
            at = buf.find(b"HTTP/1.", at + 1)
        return at

    def _framing(self, chunked: bool | None, length: int) -> int:
        status = self._line[0]
        if status < 200 and status != 101:
            return _INTERIM  # 100 Continue, 103 Early Hints: the final response follows
        # Responses come in request order; an empty FIFO means the request was not captured.
        method, route = self._methods.popleft() if self._methods else (None, None)
        if status == 101 or (method == "CONNECT" and status < 300):
            return _TUNNEL
        if route is not None:
            self._tap = self._genai.response_body(route, self._headers)  # type: ignore[union-attr]
        if method == "HEAD" or status in (204, 304):
            return _NO_BODY
        if chunked is not None:
            return _CHUNKED if chunked else _TO_CLOSE
        if length == -2:
            return _TO_CLOSE
        if length == -1:
            return _INVALID
        self._remaining = length
        if method in KNOWN_METHODS:
            return _FIXED
        # Unsure what was asked: the request was not captured, or the capture began inside its
        # method ("EAD"). A "body" that starts with a status line is the next response, and
        # this one answered a HEAD request.
        return _PEEK_FIXED

    def _message(self, end_ns: int, body_size: int | None, incomplete: str | None, genai: Any) -> Response:
        status, reason, version = self._line
        # positional, in field order: keywords would make this per-message call a third slower
        return Response(
            self.direction,
            self._start_ns,
            end_ns,
            status,
            reason,
            version,
            self._headers,
            body_size,
            incomplete,
            genai,
        )


def _decode_target(raw: bytes) -> str:
    """Targets are ASCII on the wire; stray non-ASCII bytes are shown as UTF-8 where they are."""
    return raw.decode("ascii") if raw.isascii() else raw.decode("utf-8", "replace")


def _known_method_start(token: bytes, end: int) -> int:
    """Where a resynchronised method starts: bytes glued before a known method are garbage."""
    for method in _KNOWN_METHODS_LONGEST_FIRST:
        if token.endswith(method):
            return end - len(method)
    return end - len(token)
