"""A persistent on-disk :class:`~.batches.BatchQueue`: export batches that survive the agent.

Layout of one signal's spool directory (``otlp.spool_dir/<signal>/``)::

    LOCK                      flock()ed while an agent uses the spool (two agents never share one)
    HEAD                      "<segment> <offset>": the first record not yet acknowledged
    00000000000000000042.seg  segments, oldest first, each a run of records

A record is a 24-byte header — magic ``OEB1``, body length (u32), item count (u32), creation time
(f64, Unix seconds), CRC-32 of the other header fields and the body (u32), little-endian — then the
body: a serialized OTLP ``Export*ServiceRequest``, exactly the bytes a transport sends.

Every batch goes through the spool (it *is* the queue, as in the Collector's persistent queue), so
nothing depends on an orderly stop: a killed agent leaves its queue on disk, and the next agent on
the same directory sends it first, in order. A record is written with one ``write`` call; a record
the agent was killed in the middle of (or any record whose checksum fails) is detected when the
segment is read back, counted (``otel_ebpf.export.spool.corrupt``) and skipped with the rest of its
segment, whose offsets can no longer be trusted.

Bounded by bytes: when a new record would take the segment files past ``max_bytes``, the oldest
segment is deleted and its unsent records are counted as lost (``spool_full``).

fsync policy: records and HEAD are not fsynced one by one — what was written is in the page cache
and survives the agent being killed; a segment is fsynced when it is closed (rolled or at stop).
A machine crash can therefore lose the newest records (their checksums catch a torn tail) and
resend batches acknowledged since the last HEAD that reached the disk: delivery is at least once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from otel_ebpf.exporters.appendfile import AppendOnlyFile
from otel_ebpf.exporters.batches import Batch, BatchQueue
from otel_ebpf.exporters.errors import ExporterSetupError

_logger = logging.getLogger(__name__)

MAGIC = b"OEB1"
_HEADER = struct.Struct("<4sIIdI")  # magic, length, count, created, crc32
HEADER_SIZE = _HEADER.size
_CHECKED = struct.Struct("<Id")  # the header fields the checksum covers besides length
MAX_RECORD_BYTES = 1 << 30
MIN_SEGMENT_BYTES = 64 * 1024
SEGMENTS_PER_SPOOL = 8  # dropping a whole segment loses at most about 1/8 of a full spool
_SUFFIX = ".seg"


def encode_record(body: bytes, count: int, created: float) -> bytes:
    """One record, header and body, as written to a segment."""
    crc = zlib.crc32(body, zlib.crc32(struct.pack("<I", len(body)) + _CHECKED.pack(count, created)))
    return _HEADER.pack(MAGIC, len(body), count, created, crc) + body


def decode_header(header: bytes) -> tuple[int, int, float, int] | None:
    """(length, count, created, crc) of a record header; None if it is not one."""
    if len(header) < HEADER_SIZE:
        return None
    magic, length, count, created, crc = _HEADER.unpack_from(header)
    if magic != MAGIC or length > MAX_RECORD_BYTES:
        return None
    return length, count, created, crc


def body_matches(length: int, count: int, created: float, crc: int, body: bytes) -> bool:
    return (
        len(body) == length
        and zlib.crc32(body, zlib.crc32(struct.pack("<I", length) + _CHECKED.pack(count, created))) == crc
    )


@dataclass(frozen=True)
class _Entry:
    segment: int
    offset: int
    length: int
    count: int
    created: float


class Spool(BatchQueue):
    """One signal's on-disk queue (see the module doc); thread-safe."""

    drop_reason = "spool_full"
    durable = True

    def __init__(self, directory: Path, max_bytes: int, on_corrupt: Callable[[int], None]) -> None:
        if max_bytes < HEADER_SIZE + 1:
            raise ValueError(f"a spool needs at least {HEADER_SIZE + 1} bytes")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = max(MIN_SEGMENT_BYTES, max_bytes // SEGMENTS_PER_SPOOL)
        self._on_corrupt = on_corrupt
        self._lock = threading.Lock()
        self._entries: deque[_Entry] = deque()
        self._sizes: dict[int, int] = {}  # segment -> file bytes, oldest first
        self._head_written: tuple[int, int] | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_file = (self.directory / "LOCK").open("a")
        except OSError as exc:
            raise ExporterSetupError(f"spool {self.directory}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise ExporterSetupError(f"spool {self.directory} is in use by another agent") from None
        self._recover()
        # Appends always go to a fresh segment (put() rolls first): an old tail may end in a torn record.
        self._tail = max(self._sizes, default=0)
        self._tail_file: AppendOnlyFile | None = None

    # --- start-up ---

    def _segment_path(self, segment: int) -> Path:
        return self.directory / f"{segment:020d}{_SUFFIX}"

    def _recover(self) -> None:
        head = self._read_head()
        segments = sorted(int(p.stem) for p in self.directory.glob(f"*{_SUFFIX}") if p.stem.isdigit())
        for segment in segments:
            path = self._segment_path(segment)
            if head is not None and segment < head[0]:
                path.unlink(missing_ok=True)  # acknowledged before the last stop
                continue
            start = head[1] if head is not None and segment == head[0] else 0
            entries = self._scan(segment, path, start)
            if entries:
                self._entries.extend(entries)
                self._sizes[segment] = path.stat().st_size
            else:
                path.unlink(missing_ok=True)
        if self._entries:
            _logger.info(
                "spool %s: %d batches (%d items) left by an earlier run are sent first",
                self.directory,
                len(self._entries),
                sum(e.count for e in self._entries),
            )

    def _read_head(self) -> tuple[int, int] | None:
        try:
            segment, offset = (self.directory / "HEAD").read_text().split()
            return int(segment), int(offset)
        except (OSError, ValueError):
            return None

    def _scan(self, segment: int, path: Path, start: int) -> list[_Entry]:
        entries = []
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            offset = start
            file.seek(offset)
            while offset < size:
                fields = decode_header(file.read(HEADER_SIZE))
                body = file.read(fields[0]) if fields is not None else b""
                if fields is None or len(body) != fields[0]:
                    # Torn (killed mid-write) or unreadable: nothing after it can be trusted.
                    _logger.warning(
                        "spool %s: torn or corrupt record at byte %d, rest of the segment skipped", path, offset
                    )
                    self._on_corrupt(1)
                    break
                length, count, created, crc = fields
                if body_matches(length, count, created, crc, body):
                    entries.append(_Entry(segment, offset, length, count, created))
                else:  # damaged in place; its length still leads to the next record: skip it alone
                    _logger.warning("spool %s: corrupt record at byte %d skipped", path, offset)
                    self._on_corrupt(1)
                offset += HEADER_SIZE + length
        return entries

    # --- the queue ---

    def put(self, batch: Batch) -> list[Batch]:
        record = encode_record(batch.body, batch.count, batch.created)
        with self._lock:
            if len(record) > self.max_bytes:
                return [batch]
            dropped = self._make_room(len(record))
            tail = self._tail_file
            if tail is None or tail.size + len(record) > self.segment_bytes:
                tail = self._roll()
            offset = tail.size
            try:
                tail.append(record)
            except OSError as exc:
                _logger.warning("spool %s: cannot write (%s); batch dropped", self.directory, exc.strerror or exc)
                return [*dropped, batch]
            self._sizes[self._tail] = tail.size
            self._entries.append(_Entry(self._tail, offset, len(batch.body), batch.count, batch.created))
            return dropped

    def _make_room(self, size: int) -> list[Batch]:
        dropped: list[Batch] = []
        while self._sizes and sum(self._sizes.values()) + size > self.max_bytes:
            oldest = next(iter(self._sizes))
            if oldest == self._tail:
                self._close_tail()
            while self._entries and self._entries[0].segment == oldest:
                entry = self._entries.popleft()
                dropped.append(Batch(b"", entry.count, entry.created))
            self._forget_segment(oldest)
        if dropped:
            self._write_head()
        return dropped

    def _roll(self) -> AppendOnlyFile:
        self._close_tail()
        self._tail = max([*self._sizes, self._tail]) + 1
        self._tail_file = AppendOnlyFile(self._segment_path(self._tail))
        self._sizes[self._tail] = 0
        return self._tail_file

    def _close_tail(self) -> None:
        if self._tail_file is not None:
            try:
                self._tail_file.sync()
            except OSError:
                pass  # nothing more to do for a disk that refuses; the checksums catch what it lost
            self._tail_file.close()
            self._tail_file = None
            if not (self._entries and self._entries[-1].segment == self._tail):
                self._forget_segment(self._tail)  # every record of it was already sent

    def _forget_segment(self, segment: int) -> None:
        self._sizes.pop(segment, None)
        self._segment_path(segment).unlink(missing_ok=True)

    def peek(self) -> Batch | None:
        while True:
            with self._lock:
                if not self._entries:
                    return None
                entry = self._entries[0]
                body = self._read_body(entry)
                if body is not None:
                    return _SpooledBatch(body, entry.count, entry.created, entry)
                # Damaged on disk since it was written: count it and move on.
                self._on_corrupt(1)
                self._pop_head(entry)

    def _read_body(self, entry: _Entry) -> bytes | None:
        try:
            with self._segment_path(entry.segment).open("rb") as file:
                file.seek(entry.offset)
                fields = decode_header(file.read(HEADER_SIZE))
                body = file.read(entry.length)
        except OSError:
            return None
        return body if fields is not None and body_matches(*fields, body) else None

    def ack(self, batch: Batch) -> bool:
        with self._lock:
            entry = getattr(batch, "entry", None)
            if not self._entries or self._entries[0] is not entry:
                return False
            self._pop_head(entry)
            return True

    def _pop_head(self, entry: _Entry) -> None:
        self._entries.popleft()
        consumed = not (self._entries and self._entries[0].segment == entry.segment)
        if consumed and not (entry.segment == self._tail and self._tail_file is not None):
            self._forget_segment(entry.segment)
        self._write_head()

    def _write_head(self) -> None:
        head = (
            (self._entries[0].segment, self._entries[0].offset)
            if self._entries
            else (self._tail, self._sizes.get(self._tail, 0))
        )
        if head == self._head_written:
            return
        temporary = self.directory / "HEAD.tmp"
        try:
            temporary.write_text(f"{head[0]} {head[1]}\n")
            os.replace(temporary, self.directory / "HEAD")
            self._head_written = head
        except OSError as exc:  # the batch went out; at worst a restart sends it again
            _logger.debug("spool %s: cannot write HEAD: %s", self.directory, exc)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    @property
    def items(self) -> int:
        with self._lock:
            return sum(entry.count for entry in self._entries)

    def close(self) -> None:
        with self._lock:
            self._close_tail()
            self._lock_file.close()


class _SpooledBatch(Batch):
    def __init__(self, body: bytes, count: int, created: float, entry: _Entry) -> None:
        super().__init__(body, count, created)
        self.entry = entry
