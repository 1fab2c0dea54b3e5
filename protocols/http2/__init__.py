"""HTTP/2 over TCP (cleartext h2c, and TLS when the pipeline hands over plaintext), with gRPC.

``frames`` splits each direction into frames (hyperframe) and resynchronises after capture gaps,
``hpack_context`` decodes header blocks (hpack) tolerantly, ``grpc_framing`` counts gRPC messages,
``upgrade`` follows the h2c upgrade handshake, ``session`` follows a connection's streams,
``stitcher`` pairs requests and responses by stream id, and ``types`` holds the messages and the
exchange, which a gRPC call describes with :mod:`otel_ebpf.protocols.grpc_semconv` and anything
else with :mod:`otel_ebpf.protocols.http_semconv` (the HTTP/1.x conventions, version ``2``).

How connections are recognised (:meth:`HTTP2.sniff`):

* the client connection preface ``PRI * HTTP/2.0`` (h2c with prior knowledge, and h2 over TLS),
  in either direction: which one tells the observed process's role;
* an HTTP/1.1 request asking ``Upgrade: h2c`` with ``HTTP2-Settings``. The session parses it as
  stream 1's request, then the server's ``101`` and the HTTP/2 frames that follow; a server that
  declines answers in HTTP/1.1, and the session hands the connection to the HTTP/1 plugin's
  session. The HTTP/1 plugin claims any HTTP/1 request line, so this plugin sniffs first
  (``sniff_order``); a ``protocols.enabled`` list that names ``http1`` before ``http2`` stops
  upgraded connections at the ``101``;
* for a connection that was open before the capture: two consecutive frame headers that pass
  strict checks (known type, defined flags, fixed lengths, stream id zero or not and of the
  sender's parity), or one complete HEADERS frame whose block decodes to pseudo-headers.

Known limits of a capture that starts mid-connection (the agent attached to a live connection,
or a gap swallowed a HEADERS frame): header fields compressed against HPACK table entries from
before the capture cannot be decoded. They are never guessed: static-table references, literals
and entries inserted since the capture (re)started are decoded, the rest is left out and the
message counted in ``otel_ebpf.messages.partial``. An unknown method becomes ``_OTHER`` (span
``HTTP``), an unknown path leaves ``url.path`` out, an unknown gRPC method gives the span name
``grpc`` with ``rpc.method`` ``_OTHER``, an unknown ``:status`` or ``grpc-status`` leaves the
status out (span status unset). gRPC clients such as grpcio index nearly every field after a
channel's first call, so calls on a channel opened before the agent typically show only
``:method``, ``:scheme``, ``:status`` and ``grpc-message``. Streams whose HEADERS were not seen at
all are counted in ``otel_ebpf.messages.unmatched``.

Options (``protocols.http2`` in the agent configuration):

``capture_headers``
    As for ``http1``: header names exported as ``http.request.header.<name>`` /
    ``http.response.header.<name>`` on HTTP spans, and as gRPC metadata
    (``rpc.grpc.request.metadata.<name>``, or ``rpc.request.metadata.<name>`` in the new
    conventions) on gRPC spans. Default: ``x-request-id``, ``x-correlation-id``.
``genai``
    How LLM calls are recognised and read, as for ``http1`` (see :mod:`otel_ebpf.protocols.genai`).
``semconv_stability_opt_in``
    Which RPC conventions gRPC spans and metrics follow, in the syntax of
    ``OTEL_SEMCONV_STABILITY_OPT_IN`` (``rpc``: the new set, ``rpc/dup``: both); defaults to that
    environment variable of the agent, read once here (see :mod:`..grpc_semconv`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from otel_ebpf.protocol import NEED_MORE, NO_MATCH, STREAMS, Direction, Protocol, Role, Sniff

from .. import grpc_semconv
from ..genai import GENAI_INSTRUMENTS, genai_option
from ..http_semconv import HTTP_INSTRUMENTS, capture_headers_option
from .frames import (
    DEFAULT_MAX_FRAME_SIZE,
    END_HEADERS,
    HEADER_SIZE,
    HEADERS,
    PREFACE,
    REQUEST_PSEUDO_HEADERS,
    RESPONSE_PSEUDO_HEADERS,
    frame_at,
    header_names,
)
from .session import HTTP2Session
from .stitcher import StreamStitcher
from .types import HTTP2Exchange, Request, Response, Settings, StreamDropped
from .upgrade import sniff_upgrade

__all__ = ["HTTP2", "HTTP2Exchange", "HTTP2Session", "Request", "Response", "StreamDropped", "StreamStitcher"]


class HTTP2(Protocol):
    name = "http2"
    transports = STREAMS
    sniff_order = 50  # before http1: an h2c upgrade request is an HTTP/1.1 request too

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        capture = options.pop("capture_headers", None)
        genai = options.pop("genai", None)
        opt_in = options.pop("semconv_stability_opt_in", os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN"))
        super().__init__(options)
        self.genai = genai_option(genai)
        if opt_in is not None and not isinstance(opt_in, str):
            raise ValueError("semconv_stability_opt_in: must be a string such as 'rpc' or 'rpc/dup'")
        semconv = grpc_semconv.semconv_from_opt_in(opt_in)
        self.settings = Settings(
            capture_headers_option(capture), semconv, self.genai.content_chars if self.genai else 0
        )
        self.instruments = (*HTTP_INSTRUMENTS, *grpc_semconv.instruments(semconv), *GENAI_INSTRUMENTS)

    def sniff(self, direction: Direction, data: bytes) -> Sniff:
        """The connection preface, an ``Upgrade: h2c`` request, or frames (see the module doc)."""
        if data.startswith(PREFACE):
            return Sniff(True, role=Role.CLIENT if direction is Direction.EGRESS else Role.SERVER)
        if PREFACE.startswith(data):
            return NEED_MORE
        if data[:1].isupper():  # an HTTP/1 request line, perhaps
            upgrade = sniff_upgrade(data)
            if upgrade is None:
                return NEED_MORE
            return Sniff(True, role=_role_of(direction, True)) if upgrade else NO_MATCH
        return _sniff_frames(direction, data)

    def new_session(self, role: Role) -> HTTP2Session:
        return HTTP2Session(role, self.genai)

    def new_stitcher(self, role: Role) -> StreamStitcher:
        return StreamStitcher(self.settings)


def _sniff_frames(direction: Direction, data: bytes) -> Sniff:
    """A capture that began mid-connection, at a frame boundary of this direction."""
    if len(data) < HEADER_SIZE:
        # the type and flags bytes can already rule it out
        return NO_MATCH if len(data) > 3 and (data[3] > 9) else NEED_MORE
    length = frame_at(data, 0, None, DEFAULT_MAX_FRAME_SIZE)
    if length < 0:
        return NO_MATCH
    following = HEADER_SIZE + length
    if following + HEADER_SIZE <= len(data):
        if frame_at(data, following, None) < 0:
            return NO_MATCH
        return Sniff(True, role=_role(direction, data, following))
    if following <= len(data) and data[3] == HEADERS and data[4] & END_HEADERS:
        role = _headers_role(direction, data[:following])
        if role is not None:
            return Sniff(True, role=role)
    return NEED_MORE


def _role(direction: Direction, data: bytes, following: int) -> Role | None:
    """The observed process's role, from what the two frames tell of their sender: a client's
    frames keep to odd streams; a HEADERS block may be a request or a response."""
    if frame_at(data, 0, True) < 0 or frame_at(data, following, True) < 0:
        return _role_of(direction, False)
    if data[3] == HEADERS and data[4] & END_HEADERS:
        return _headers_role(direction, data[:following])
    return None


def _headers_role(direction: Direction, frame: bytes) -> Role | None:
    """A request's pseudo-headers tell that a client sent the frame, ``:status`` a server."""
    names = header_names(frame)
    if names & REQUEST_PSEUDO_HEADERS:
        return _role_of(direction, True)
    if names & RESPONSE_PSEUDO_HEADERS:
        return _role_of(direction, False)
    return None


def _role_of(direction: Direction, from_client: bool) -> Role:
    return Role.CLIENT if (direction is Direction.EGRESS) == from_client else Role.SERVER
