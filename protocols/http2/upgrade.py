"""The h2c upgrade handshake (RFC 9113 section 3.2 of RFC 7540, kept by servers that speak h2c).

A client may open a cleartext connection with an HTTP/1.1 request carrying ``Upgrade: h2c`` and
``HTTP2-Settings``. A server that agrees answers ``101 Switching Protocols`` and sends the
response to that request as HTTP/2 stream 1; the client sends the connection preface after the
101. A server that does not answers in HTTP/1.1, and the connection stays HTTP/1.1.

:class:`Handshake` holds both directions' bytes until the server's answer tells which: the
session then continues with HTTP/2 frames after the two heads, or hands everything it held to
the HTTP/1 plugin's session. The request itself starts when its head is here, whichever the
answer: the session announces it then (stream 1's request, if the server agrees).
"""

from __future__ import annotations

import re

from otel_ebpf.protocol import Direction

from ..http1.parser import parse_fields
from ..http_semconv import KNOWN_METHODS, Headers, first_header

MAX_HANDSHAKE = 64 * 1024  # bytes held, both directions, before giving up on an upgrade
MAX_REQUEST_LINE = 8 * 1024

_REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) ([\x21-\x7e]+) HTTP/1\.1\r?\n")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})[^\r\n]*\r?\n")
_HEAD_END = re.compile(rb"\r?\n\r?\n")


def upgrade_request(head: bytes) -> tuple[str, str, Headers] | None:
    """``(method, target, fields)`` of an HTTP/1.1 request head (through its blank line) that
    asks for h2c: ``Upgrade`` naming ``h2c`` and an ``HTTP2-Settings`` field; else ``None``."""
    lowered = head.lower()
    if b"h2c" not in lowered or b"http2-settings" not in lowered:
        return None  # every plain HTTP/1 connection's first request: no need to parse its fields
    line = _REQUEST_LINE.match(head)
    if line is None or line.group(1).decode("ascii") not in KNOWN_METHODS:
        return None  # an unusual method: more likely a request line cut by the capture's start
    fields = parse_fields(head[line.end() :])
    if not fields:
        return None
    upgrade = first_header(fields, "upgrade") or ""
    if "h2c" not in (token.strip().lower() for token in upgrade.split(",")):
        return None
    if first_header(fields, "http2-settings") is None:
        return None
    return line.group(1).decode("ascii"), line.group(2).decode("ascii"), fields


def http1_request(data: bytes) -> bool | None:
    """Whether ``data`` begins with an HTTP/1.1 request line; None while the line is incomplete."""
    line_end = data.find(b"\n", 0, MAX_REQUEST_LINE)
    if line_end == -1:
        return None if len(data) < MAX_REQUEST_LINE else False
    return _REQUEST_LINE.fullmatch(data, 0, line_end + 1) is not None


def sniff_upgrade(data: bytes) -> bool | None:
    """Whether ``data`` begins with an h2c upgrade request; None while its head is incomplete."""
    end = head_end(data)
    if end != -1:
        return upgrade_request(data[:end]) is not None
    return None if http1_request(data) is not False else False


def head_end(buf: bytes | bytearray) -> int:
    """Offset just past the blank line ending an HTTP/1 head, or -1."""
    found = _HEAD_END.search(buf)
    return -1 if found is None else found.end()


class Handshake:
    """Both directions of a connection that began with an HTTP/1.1 request, until the answer."""

    def __init__(self) -> None:
        self.held: list[tuple[Direction, bytes, int, int]] = []  # (direction, data, ts, gap) as fed
        self.size = 0
        self.request = bytearray()
        self.response = bytearray()
        self.request_start_ns = self.request_end_ns = 0
        self.parsed: tuple[str, str, Headers] | None = None
        self.head_length = 0  # of the request
        self.body_length = 0  # its Content-Length
        self.announced_ns: int | None = None  # the start time the request was announced with

    def hold(self, direction: Direction, data: bytes, timestamp_ns: int, gap: int = 0) -> bool:
        """Keep what was fed (for a hand-over to HTTP/1); False once past :data:`MAX_HANDSHAKE`."""
        self.held.append((direction, data, timestamp_ns, gap))
        self.size += len(data)
        return self.size <= MAX_HANDSHAKE

    def add_request(self, data: bytes, timestamp_ns: int) -> bool | None:
        """Request bytes. True once the whole upgrade request (head and Content-Length body) is
        here, False if it is not an upgrade request, None while undecided."""
        if not self.request:
            self.request_start_ns = timestamp_ns
        if not self.request_complete:
            self.request_end_ns = timestamp_ns
        self.request += data
        if self.parsed is None:
            end = head_end(self.request)
            if end == -1:
                return None
            self.parsed = upgrade_request(bytes(self.request[:end]))
            if self.parsed is None:
                return False
            self.head_length = end
            length = first_header(self.parsed[2], "content-length") or "0"
            if not length.isdigit() or first_header(self.parsed[2], "transfer-encoding") is not None:
                return False  # a chunked upgrade request: rare enough to leave to HTTP/1
            self.body_length = int(length)
        return self.request_complete

    @property
    def request_complete(self) -> bool:
        """The whole upgrade request (head and Content-Length body) is here."""
        return self.parsed is not None and len(self.request) >= self.head_length + self.body_length

    def stream_headers(self) -> Headers:
        """The parsed upgrade request as stream 1's header fields: pseudo-header fields first."""
        assert self.parsed is not None
        method, target, fields = self.parsed
        authority = next((value for name, value in fields if name == "host"), "")
        return ((":method", method), (":path", target), (":scheme", "http"), (":authority", authority), *fields)

    def add_response(self, data: bytes) -> int | None:
        """Response bytes: the final status once its head is here (interim 1xx other than 101
        skipped), else None."""
        self.response += data
        while True:
            end = head_end(self.response)
            if end == -1:
                return None
            status = _STATUS_LINE.match(self.response)
            if status is None:
                return 0  # not an HTTP/1 response: let HTTP/1 make of it what it can
            code = int(status.group(1))
            if code == 101 or code >= 200:
                return code
            del self.response[:end]

    def leftovers(self) -> tuple[bytes, bytes]:
        """What followed the two heads (and the request's body): the first HTTP/2 bytes."""
        request_end = self.head_length + self.body_length
        return bytes(self.request[request_end:]), bytes(self.response[head_end(self.response) :])
