"""The test half of the plugin kit: record real byte streams, change them the ways a capture does,
replay them through a plugin's session and stitcher, and compare.

Every protocol plugin, built-in or third-party, is tested the same way (docs/plugins.md, "Testing
a plugin"): a :class:`TeeProxy` between a real client and a real server records each ``recv`` as a
:class:`Chunk` (one syscall's bytes) into a JSON file; the tests load it, feed it at every split
point, byte by byte, cut by a capture cap or a gap, as the server and as the client, and assert the
exchanges are exact. The assertion helpers are plain functions that raise ``AssertionError`` naming
the variant that failed, so any test runner can use them; only :func:`rechunked` and :func:`mutate`
need ``hypothesis`` (imported when called).

A recording file looks like::

    {"name": ..., "description": ...,
     "chunks": [{"direction": "ingress", "t_ns": 0, "data": "<base64>"}, ...]}

with directions seen from the server (``ingress`` carries requests) and ``t_ns`` relative to the
first chunk.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_ebpf.protocol import (
    Direction,
    Exchange,
    Message,
    Protocol,
    RequestStart,
    Role,
    Session,
    Stitcher,
)

if TYPE_CHECKING:
    from hypothesis import strategies as st


@dataclass(frozen=True)
class Chunk:
    direction: Direction  # as seen from the observed process
    t_ns: int
    data: bytes
    gap: int = 0  # bytes that followed ``data`` in the same syscall but were not captured


# ---- recording -------------------------------------------------------------------------------------


class TeeProxy:
    """Relays one client connection to ``upstream`` on loopback and records both directions, one
    chunk per ``recv`` (what a capture of the server's syscalls sees too). Point the client at
    ``port``, run it, then :meth:`wait` for the connection to close."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.chunks: list[tuple[str, int, bytes]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.upstream)
        pumps = [
            threading.Thread(target=self._pump, args=(client, server, "ingress")),
            threading.Thread(target=self._pump, args=(server, client, "egress")),
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        client.close()
        server.close()
        self._done.set()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            with self._lock:
                self.chunks.append((direction, time.monotonic_ns(), data))
            sink.sendall(data)

    def wait(self, timeout: float = 20) -> list[tuple[str, int, bytes]]:
        if not self._done.wait(timeout):
            raise TimeoutError("the recorded connection did not close")
        self.listener.close()
        return self.chunks


def save_recording(path: Path, name: str, description: str, chunks: list[tuple[str, int, bytes]]) -> None:
    """Save what a :class:`TeeProxy` relayed, times relative to the first chunk."""
    t0 = chunks[0][1]
    document = {
        "name": name,
        "description": description,
        "chunks": [
            {"direction": direction, "t_ns": t - t0, "data": base64.b64encode(data).decode("ascii")}
            for direction, t, data in chunks
        ],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{name}: {len(chunks)} chunks, {sum(len(c[2]) for c in chunks)} bytes")


def load_recording(path: Path) -> list[Chunk]:
    """A recording file as seen by the server process (requests INGRESS)."""
    try:
        document = json.loads(Path(path).read_text())
        return [
            Chunk(Direction[chunk["direction"].upper()], int(chunk["t_ns"]), base64.b64decode(chunk["data"]))
            for chunk in document["chunks"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a recording ({exc!r})") from None


# ---- what a capture does to a stream --------------------------------------------------------------


def as_client(chunks: Iterable[Chunk]) -> list[Chunk]:
    """The same bytes as the client process saw them (requests EGRESS)."""
    return [Chunk(c.direction.reverse(), c.t_ns, c.data, c.gap) for c in chunks]


def as_role(chunks: Iterable[Chunk], role: Role) -> list[Chunk]:
    """A recording (as the server saw it) as seen by the process of ``role``."""
    return list(chunks) if role is Role.SERVER else as_client(chunks)


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
    for at in range(1, len(chunk.data)):
        yield [
            *chunks[:index],
            Chunk(chunk.direction, chunk.t_ns, chunk.data[:at]),
            Chunk(chunk.direction, chunk.t_ns, chunk.data[at:], chunk.gap),
            *chunks[index + 1 :],
        ]


def every_split(chunks: Sequence[Chunk], longest: int = 4096) -> Iterable[list[Chunk]]:
    """:func:`split_everywhere` for each chunk of at most ``longest`` bytes (large bodies' chunks
    would only repeat what their first bytes show)."""
    for index, chunk in enumerate(chunks):
        if len(chunk.data) <= longest:
            yield from split_everywhere(chunks, index)


def every_gap(chunks: Sequence[Chunk], longest: int = 4096) -> Iterable[tuple[int, int, list[Chunk]]]:
    """``(index, at, chunks)`` with chunk ``index`` captured only up to byte ``at`` and the rest
    lost as a gap, for every chunk of at most ``longest`` bytes and every ``at`` before its end."""
    for index, chunk in enumerate(chunks):
        if len(chunk.data) <= longest:
            for at in range(len(chunk.data)):
                lost = Chunk(chunk.direction, chunk.t_ns, chunk.data[:at], len(chunk.data) - at + chunk.gap)
                yield index, at, [*chunks[:index], lost, *chunks[index + 1 :]]


def byte_by_byte(chunks: Iterable[Chunk]) -> list[Chunk]:
    """Every byte its own syscall."""
    return [Chunk(c.direction, c.t_ns, c.data[i : i + 1]) for c in chunks for i in range(len(c.data))]


def rechunked(data: st.DataObject, chunks: Iterable[Chunk], max_cuts: int = 6) -> list[Chunk]:
    """Each syscall's bytes cut at up to ``max_cuts`` places that hypothesis draws."""
    from hypothesis import strategies as st  # noqa: PLC0415 — hypothesis only for the callers that draw

    return [
        Chunk(chunk.direction, chunk.t_ns, piece)
        for chunk in chunks
        for piece in cut(chunk.data, data.draw(st.sets(st.integers(1, len(chunk.data)), max_size=max_cuts)))
    ]


def mutate(draw: st.DrawFn, chunks: list[Chunk], tokens: Sequence[bytes] = ()) -> list[Chunk]:
    """1 to 6 mutations of a recording: a bit flipped, a syscall truncated, cut short by a gap,
    dropped or repeated, random bytes or one of ``tokens`` inserted."""
    from hypothesis import strategies as st  # noqa: PLC0415 — as in rechunked

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


# ---- replay ---------------------------------------------------------------------------------------


@dataclass
class Replay:
    session: Session
    stitcher: Stitcher
    exchanges: list[Exchange] = field(default_factory=list)
    starts: list[RequestStart] = field(default_factory=list)
    max_buffered: int = 0  # the most bytes the session held at once (Session.buffered)


def replay(
    chunks: Sequence[Chunk],
    role: Role,
    protocol: Protocol,
    close: bool = True,
    check: Callable[[Replay], None] | None = None,
) -> Replay:
    """Feed ``chunks`` (and their gaps) to a session of ``protocol``, pair what it returns, as the
    pipeline does; with ``close``, close the connection, flush the stitcher and ``check`` the run."""
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


# ---- assertions -----------------------------------------------------------------------------------

Summarize = Callable[[Exchange], Any]


def assert_replays(
    chunks: Sequence[Chunk],
    role: Role,
    protocol: Protocol,
    summarize: Summarize,
    expected: Sequence[Any],
    what: str = "the recording",
    check: Callable[[Replay], None] | None = None,
) -> Replay:
    """Replay ``chunks`` and compare ``summarize`` of each exchange with ``expected``; also require
    a clean parse (no parse errors, no unmatched messages). Raises AssertionError naming ``what``."""
    run = replay(chunks, role, protocol, check=check)
    got = [summarize(e) for e in run.exchanges]
    if got != list(expected):
        raise AssertionError(f"{what} as {role.value}: got {got!r}, expected {list(expected)!r}")
    if run.session.parse_errors or run.stitcher.unmatched:
        raise AssertionError(
            f"{what} as {role.value}: {run.session.parse_errors} parse errors, "
            f"{run.stitcher.unmatched} unmatched messages in a clean recording"
        )
    return run


def assert_every_split(
    chunks: Sequence[Chunk],
    protocol: Protocol,
    summarize: Summarize,
    expected: Sequence[Any],
    roles: Iterable[Role] = (Role.SERVER, Role.CLIENT),
    check: Callable[[Replay], None] | None = None,
    longest: int = 4096,
) -> None:
    """The same exchanges whatever the syscall boundaries: the recording whole, with each syscall
    of at most ``longest`` bytes split in two at every byte, and one byte per syscall, as each of
    ``roles``."""
    for role in roles:
        seen = as_role(chunks, role)
        assert_replays(seen, role, protocol, summarize, expected, check=check)
        for index, chunk in enumerate(seen):
            if len(chunk.data) > longest:
                continue
            for at, split in enumerate(split_everywhere(seen, index), start=1):
                assert_replays(split, role, protocol, summarize, expected, f"chunk {index} split at byte {at}", check)
        assert_replays(byte_by_byte(seen), role, protocol, summarize, expected, "one byte per syscall", check)


def assert_survives_gaps(
    chunks: Sequence[Chunk],
    protocol: Protocol,
    max_buffered: int,
    roles: Iterable[Role] = (Role.SERVER, Role.CLIENT),
    check: Callable[[int, int, Role, Replay], None] | None = None,
) -> None:
    """Each syscall's bytes cut short at every byte by a gap (the capture lost the rest), as each
    of ``roles``: the session never raises, never holds more than ``max_buffered`` bytes, and
    ``check(index, at, role, run)`` (the plugin's own expectations) holds."""
    for role in roles:
        for index, at, gapped in every_gap(as_role(chunks, role)):
            try:
                run = replay(gapped, role, protocol)
            except Exception as exc:
                raise AssertionError(f"chunk {index} lost from byte {at} as {role.value}: raised {exc!r}") from exc
            if run.max_buffered > max_buffered:
                raise AssertionError(
                    f"chunk {index} lost from byte {at} as {role.value}: "
                    f"held {run.max_buffered} bytes (bound {max_buffered})"
                )
            if check is not None:
                check(index, at, role, run)
