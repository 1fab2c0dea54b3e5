"""What every protocol plugin's tests share: recordings as chunks (one per syscall), the ways a
capture changes them (direction, cap, splits, mutations), and a replay through a session and its
stitcher. The protocol helpers (``http1_replay``, ``http2_replay``) add what they compare."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from hypothesis import strategies as st

from otel_ebpf.protocol import Direction, Exchange, Message, Protocol, RequestStart, Role, Session, Stitcher

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Chunk:
    direction: Direction  # as seen from the observed process
    t_ns: int
    data: bytes
    gap: int = 0  # bytes that followed ``data`` in the same syscall but were not captured


def load(name: str) -> list[Chunk]:
    """The recording ``data/<name>.json`` as seen by the server process (requests INGRESS)."""
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


def every_split(chunks: Sequence[Chunk], longest: int = 4096) -> Iterable[list[Chunk]]:
    """:func:`split_everywhere` for each chunk of at most ``longest`` bytes (large bodies' chunks
    would only repeat what their first bytes show)."""
    for index, chunk in enumerate(chunks):
        if len(chunk.data) <= longest:
            yield from split_everywhere(chunks, index)


def byte_by_byte(chunks: Iterable[Chunk]) -> list[Chunk]:
    """Every byte its own syscall."""
    return [Chunk(c.direction, c.t_ns, c.data[i : i + 1]) for c in chunks for i in range(len(c.data))]


def rechunked(data: st.DataObject, chunks: Iterable[Chunk], max_cuts: int = 6) -> list[Chunk]:
    """Each syscall's bytes cut at up to ``max_cuts`` places that hypothesis draws."""
    return [
        Chunk(chunk.direction, chunk.t_ns, piece)
        for chunk in chunks
        for piece in cut(chunk.data, data.draw(st.sets(st.integers(1, len(chunk.data)), max_size=max_cuts)))
    ]


def mutate(draw: st.DrawFn, chunks: list[Chunk], tokens: Sequence[bytes] = ()) -> list[Chunk]:
    """1 to 6 mutations of a recording: a bit flipped, a syscall truncated, cut short by a gap,
    dropped or repeated, random bytes or one of ``tokens`` inserted."""
    kinds = ["flip", "truncate", "insert", "gap", "drop", "repeat"] + (["token"] if tokens else [])
    for _ in range(draw(st.integers(1, 6))):
        if not chunks:
            break
        index = draw(st.integers(0, len(chunks) - 1))
        chunk = chunks[index]
        data = bytearray(chunk.data)
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(kinds))
        gap = chunk.gap
        if kind == "flip" and data:
            data[min(at, len(data) - 1)] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=20))
        elif kind == "token":
            data[at:at] = draw(st.sampled_from(tokens))
        elif kind == "gap":
            gap = len(data) - at
            del data[at:]
        elif kind == "drop":
            chunks = chunks[:index] + chunks[index + 1 :]
            continue
        elif kind == "repeat":
            chunks = chunks[: index + 1] + chunks[index:]
            continue
        chunks = [*chunks[:index], Chunk(chunk.direction, chunk.t_ns, bytes(data), gap), *chunks[index + 1 :]]
    return chunks


@dataclass
class Replay:
    session: Session
    stitcher: Stitcher
    exchanges: list[Exchange] = field(default_factory=list)
    starts: list[RequestStart] = field(default_factory=list)
    max_buffered: int = 0


def replay(
    chunks: Sequence[Chunk],
    role: Role,
    protocol: Protocol,
    close: bool = True,
    check: Callable[[Replay], None] | None = None,
) -> Replay:
    """Feed ``chunks`` (and their gaps) to a session of ``protocol``, pair what it returns; with
    ``close``, close the connection, flush the stitcher and ``check`` the announcements."""
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
        if check is not None:
            check(run)
    return run
