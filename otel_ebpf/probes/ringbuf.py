"""Reading a BPF ring buffer in bulk, from Python, without a callback per record.

libbpf's consumer calls back into Python through ctypes for every record and, under sustained
load, does not return while producers keep refilling the ring. Here the ring is mapped into the
agent (as libbpf does it: the consumer page read-write, the producer page and the data pages,
mapped twice in a row so that no record wraps, read-only) and read in batches of a bounded size;
the consumer position is written back after each batch, which frees the space for the kernel.

Layout (kernel ``bpf_ringbuf``): page 0 holds ``consumer_pos``, page 1 ``producer_pos``; each record
is an 8-byte header (``u32 len`` with BUSY and DISCARD bits, ``u32 pg_off``), its data, padding to
8 bytes. ``producer_pos`` advances when space is reserved, before the data is written; a record
whose BUSY bit is still set ends the batch. x86-64 and arm64 order these loads as the kernel's
release/acquire pairs need, for reads made in this order by one thread.

Every word shared with the kernel is read and written whole, through a ``memoryview`` cast to
its type (one aligned load or store), never with ``struct``: ``struct.pack_into`` zero-fills its
destination before writing the value byte by byte, so a producer on another CPU could read a
consumer position of 0 (or half written) and find the ring full when it was all but empty
(``tests/live/test_ringbuf_live.py`` catches it).
"""

from __future__ import annotations

import mmap
import select
from collections.abc import Iterator

_BUSY = 1 << 31
_DISCARD = 1 << 30
HEADER_SIZE = 8


class RingBufferReader:
    """The consumer side of one BPF ring buffer map (``BPF_MAP_TYPE_RINGBUF``)."""

    def __init__(self, map_fd: int, data_size: int) -> None:
        if data_size <= 0 or data_size & (data_size - 1):
            raise ValueError(f"ring buffer size must be a power of two, not {data_size}")
        self._page = mmap.PAGESIZE
        self._mask = data_size - 1
        self.size = data_size
        self._consumer = mmap.mmap(map_fd, self._page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._producer = mmap.mmap(
            map_fd, self._page + 2 * data_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=self._page
        )
        # the positions (u64, first in their pages) and the records' headers (u32 length first),
        # as the kernel's words
        self._consumer_pos = memoryview(self._consumer).cast("Q")
        self._producer_pos = memoryview(self._producer)[:8].cast("Q")
        self._words = memoryview(self._producer).cast("I")
        self._epoll = select.epoll()
        self._epoll.register(map_fd, select.EPOLLIN)
        self.consumed = self._consumer_pos[0]

    @property
    def data(self) -> mmap.mmap:
        """The mapping records are read from: a record at ``offset`` is ``data[offset:offset+size]``."""
        return self._producer

    @property
    def produced(self) -> int:
        """Bytes the kernel has reserved so far (records being written included)."""
        return self._producer_pos[0]

    def backlog(self) -> int:
        """Bytes written by the kernel and not yet consumed."""
        return self.produced - self.consumed

    def wait(self, timeout_ms: int) -> None:
        """Block until the kernel signals new data, or ``timeout_ms`` passes (0: do not block)."""
        if timeout_ms and not self.backlog():
            try:
                self._epoll.poll(timeout_ms / 1000)
            except InterruptedError:
                pass  # a signal (SIGTERM): the caller checks why

    def records(self, max_records: int, max_bytes: int | None = None) -> Iterator[tuple[int, int]]:
        """``(offset, size)`` in :attr:`data` of up to ``max_records`` records, oldest first, and
        (given ``max_bytes``) none past the first that ends ``max_bytes`` of the ring after where
        the batch began.

        Each record's space goes back to the kernel only when the batch has been read (when the
        iterator ends), so the data stays valid while the caller decodes it."""
        producer = self._producer_pos[0]
        position, words, page, mask = self.consumed, self._words, self._page, self._mask
        if max_bytes is not None:
            producer = min(producer, position + max_bytes)
        read = 0
        try:
            while position < producer and read < max_records:
                offset = page + (position & mask)  # a multiple of 8
                length = words[offset >> 2]
                if length & _BUSY:
                    break
                size = length & ~_DISCARD
                position += (size + HEADER_SIZE + 7) & ~7
                if not length & _DISCARD:
                    read += 1
                    yield offset + HEADER_SIZE, size
        finally:
            self.consumed = position
            self._consumer_pos[0] = position

    def close(self) -> None:
        for view in (self._consumer_pos, self._producer_pos, self._words):
            view.release()  # a mapping with views on it cannot be closed
        self._epoll.close()
        self._producer.close()
        self._consumer.close()
