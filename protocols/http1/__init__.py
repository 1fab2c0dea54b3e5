"""HTTP/1.0 and HTTP/1.1 over TCP (and over TLS, when the pipeline hands over plaintext).

``types`` holds the messages and the exchange, ``parser`` the per-direction state machines,
``session`` a connection's pair of parsers, ``stitcher`` the FIFO pairing; HTTP semantics shared
with other HTTP versions live in :mod:`otel_ebpf.protocols.http_semconv`.

Options (``protocols.http1`` in the agent configuration):

``capture_headers``
    List of header names exported as ``http.request.header.<name>`` /
    ``http.response.header.<name>`` (default: the correlation headers ``x-request-id`` and
    ``x-correlation-id``; an empty list captures none). Credential-bearing headers are exported as
    ``REDACTED`` even when listed.
``genai``
    How LLM calls (OpenAI-compatible, Ollama, TGI) are recognised and read: see
    :mod:`otel_ebpf.protocols.genai`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from otel_ebpf.protocol import NEED_MORE, NO_MATCH, STREAMS, Direction, Protocol, Role, Sniff

from ..genai import GENAI_INSTRUMENTS, genai_option
from ..http_semconv import HTTP_INSTRUMENTS, capture_headers_option
from .parser import MAX_LINE
from .session import HTTP1Session
from .stitcher import FifoStitcher
from .types import HTTP1Exchange, Request, Response

__all__ = ["HTTP1", "FifoStitcher", "HTTP1Exchange", "HTTP1Session", "Request", "Response"]

_REQUEST_LINE = re.compile(rb"[A-Z][A-Z_-]{0,31} [\x21-\x7e\x80-\xff]+ HTTP/1\.[01]\r?\n")
# A prefix of a request line, for "not enough bytes yet".
_REQUEST_PREFIX = re.compile(
    rb"[A-Z][A-Z_-]{0,31}(?: [\x21-\x7e\x80-\xff]*"
    rb"(?: (?:H(?:T(?:T(?:P(?:/(?:1(?:\.(?:[01]\r?)?)?)?)?)?)?)?)?)?)?\Z"
)
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] [0-9]{3}[ \t\r\n]")
_STATUS_EXAMPLE = b"HTTP/1.1 200 "  # completes a short prefix for the "could it still be" check


class HTTP1(Protocol):
    name = "http1"
    transports = STREAMS
    instruments = HTTP_INSTRUMENTS + GENAI_INSTRUMENTS

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        capture = options.pop("capture_headers", None)
        genai = options.pop("genai", None)
        super().__init__(options)
        self.capture_headers: frozenset[str] = capture_headers_option(capture)
        self.genai = genai_option(genai)

    def sniff(self, direction: Direction, data: bytes) -> Sniff:
        """A request line or status line at the very start; checked by regex, nothing parsed."""
        if _STATUS_LINE.match(data):
            return Sniff(True, role=Role.SERVER if direction is Direction.EGRESS else Role.CLIENT)
        eol = data.find(b"\n", 0, MAX_LINE)
        if eol != -1:
            if _REQUEST_LINE.fullmatch(data, 0, eol + 1):
                return Sniff(True, role=Role.SERVER if direction is Direction.INGRESS else Role.CLIENT)
            return NO_MATCH
        if len(data) < len(_STATUS_EXAMPLE) and _STATUS_LINE.match(data + _STATUS_EXAMPLE[len(data) :]):
            return NEED_MORE
        if len(data) < MAX_LINE and _REQUEST_PREFIX.match(data):
            return NEED_MORE
        return NO_MATCH

    def new_session(self, role: Role) -> HTTP1Session:
        return HTTP1Session(role, self.genai)

    def new_stitcher(self, role: Role) -> FifoStitcher:
        return FifoStitcher(self.capture_headers, content_chars=self.genai.content_chars if self.genai else 0)
