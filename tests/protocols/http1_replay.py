"""Helpers for the HTTP/1 tests: what they compare, on top of the shared ones (the plugin kit,
otel_ebpf.protocol_testing)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from otel_ebpf.protocol import Direction, Message, RequestStart, Role

# the shared helpers, for the HTTP/1 tests to import from here
from otel_ebpf.protocol_testing import (  # noqa: F401
    Chunk,
    Replay,
    as_client,
    capped,
    cut,
    load_recording,
)
from otel_ebpf.protocol_testing import replay as replay_with
from otel_ebpf.protocols.http1 import HTTP1, HTTP1Exchange, HTTP1Session

DATA = Path(__file__).parent / "data"
RECORDINGS = sorted(path.stem for path in DATA.glob("*.json"))


def load(name: str) -> list[Chunk]:
    """The recording ``data/<name>.json`` as seen by the server process (requests INGRESS)."""
    return load_recording(DATA / f"{name}.json")


def replay(
    chunks: Sequence[Chunk],
    role: Role = Role.SERVER,
    protocol: HTTP1 | None = None,
    close: bool = True,
) -> Replay:
    return replay_with(chunks, role, protocol or HTTP1(), close, check_starts)


def check_starts(run: Replay) -> None:
    """Every request whose head was seen whole was announced by a RequestStart, with the same
    start time and header fields; no start announced a request that never came."""
    requests = [e.request for e in run.exchanges]
    announced = [(s.start_ns, s.carrier) for s in run.starts]
    assert announced == [(r.start_ns, r.headers) for r in requests if (r.start_ns, r.headers) in announced]
    assert all((r.start_ns, r.headers) in announced for r in requests if r.incomplete is None)
    assert all(s.direction is run.session._requests.direction for s in run.starts)  # noqa: SLF001


def messages(session: HTTP1Session, direction: Direction, data: bytes, timestamp_ns: int) -> list[Message]:
    """What one feed returns, without the RequestStart announcements."""
    return [m for m in session.feed(direction, data, timestamp_ns) if not isinstance(m, RequestStart)]


def summary(exchange: HTTP1Exchange) -> tuple:
    """What the tests compare: everything the parser decided about one exchange."""
    request, response = exchange.request, exchange.response
    return (
        request.method,
        request.target,
        request.body_size,
        request.incomplete,
        request.start_ns,
        request.end_ns,
        None
        if response is None
        else (
            response.status,
            response.body_size,
            response.incomplete,
            response.start_ns,
            response.end_ns,
        ),
        exchange.end_ns,
    )
