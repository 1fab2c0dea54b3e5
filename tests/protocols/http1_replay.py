"""Helpers for the HTTP/1 tests: load recordings, replay chunks through a session and stitcher."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from otel_ebpf.protocol import Direction, Message, RequestStart, Role
from otel_ebpf.protocols.http1 import HTTP1, FifoStitcher, HTTP1Exchange, HTTP1Session

DATA = Path(__file__).parent / "data"
RECORDINGS = sorted(path.stem for path in DATA.glob("*.json"))


@dataclass(frozen=True)
class Chunk:
    direction: Direction  # as seen from the observed process
    t_ns: int
    data: bytes
    gap: int = 0  # bytes that followed ``data`` in the same syscall but were not captured


def load(name: str) -> list[Chunk]:
    """A recording as seen by the server process (requests INGRESS)."""
    document = json.loads((DATA / f"{name}.json").read_text())
    return [
        Chunk(Direction[chunk["direction"].upper()], chunk["t_ns"], base64.b64decode(chunk["data"]))
        for chunk in document["chunks"]
    ]


def as_client(chunks: Iterable[Chunk]) -> list[Chunk]:
    """The same bytes as the client process saw them (requests EGRESS)."""
    return [Chunk(c.direction.reverse(), c.t_ns, c.data, c.gap) for c in chunks]


def capped(chunks: Iterable[Chunk], cap: int) -> list[Chunk]:
    """What a capture that copies at most ``cap`` bytes per syscall delivers."""
    return [Chunk(c.direction, c.t_ns, c.data[:cap], max(0, len(c.data) - cap)) for c in chunks]


@dataclass
class Replay:
    session: HTTP1Session
    stitcher: FifoStitcher
    exchanges: list[HTTP1Exchange] = field(default_factory=list)
    starts: list[RequestStart] = field(default_factory=list)
    max_buffered: int = 0


def replay(
    chunks: Sequence[Chunk],
    role: Role = Role.SERVER,
    protocol: HTTP1 | None = None,
    close: bool = True,
) -> Replay:
    protocol = protocol or HTTP1()
    run = Replay(protocol.new_session(role), protocol.new_stitcher(role))

    def take(outputs: Iterable[Message | RequestStart]) -> None:
        for output in outputs:
            if isinstance(output, RequestStart):
                run.starts.append(output)
            else:
                run.exchanges.extend(run.stitcher.add(output))

    for chunk in chunks:
        take(run.session.feed(chunk.direction, chunk.data, chunk.t_ns))
        if chunk.gap:
            take(run.session.feed_gap(chunk.direction, chunk.gap, chunk.t_ns))
        run.max_buffered = max(run.max_buffered, run.session.buffered)
    if close:
        end = (chunks[-1].t_ns if chunks else 0) + 1
        take(run.session.close(end))
        run.exchanges.extend(run.stitcher.flush(end))
        check_starts(run)
    return run


def check_starts(run: Replay) -> None:
    """Every request whose head was seen whole was announced by a RequestStart, with the same
    start time and header fields; no start announced a request that never came."""
    requests = [e.request for e in run.exchanges]
    announced = [(s.start_ns, s.carrier) for s in run.starts]
    assert announced == [(r.start_ns, r.headers) for r in requests if (r.start_ns, r.headers) in announced]
    assert all((r.start_ns, r.headers) in announced for r in requests if r.incomplete is None)
    assert all(s.direction is run.session._requests.direction for s in run.starts)


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


def cut(data: bytes, offsets: Iterable[int]) -> list[bytes]:
    """``data`` cut at ``offsets`` (those outside it ignored), without empty pieces."""
    bounds = sorted({0, len(data), *(i for i in offsets if 0 < i < len(data))})
    return [data[a:b] for a, b in pairwise(bounds)]


def split_everywhere(chunks: Sequence[Chunk], index: int) -> Iterable[list[Chunk]]:
    """``chunks`` with chunk ``index`` split in two at every inner byte boundary."""
    chunk = chunks[index]
    for cut in range(1, len(chunk.data)):
        yield [
            *chunks[:index],
            Chunk(chunk.direction, chunk.t_ns, chunk.data[:cut]),
            Chunk(chunk.direction, chunk.t_ns, chunk.data[cut:], chunk.gap),
            *chunks[index + 1 :],
        ]
