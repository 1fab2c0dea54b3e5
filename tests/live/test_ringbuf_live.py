"""Live BPF: the ring buffer read through its own mapping, in bounded batches, in order, with nothing
lost or read twice, and its consumer position written whole (otel_ebpf/probes/ringbuf.py)."""

from __future__ import annotations

import ctypes
import os
import struct
import time
from typing import Any

import pytest

from otel_ebpf.probes.ringbuf import RingBufferReader

pytestmark = pytest.mark.bpf

PAGES = 4
# Each getppid() by the owner process puts a record of a growing size (8..64 bytes) holding its
# number; first it reads the consumer position as producers do, counting each read that finds it
# lower than the one before (positions only grow: a lower one was caught half written).
PROGRAM = r"""
struct record {
    u64 words[8];
};
BPF_RINGBUF_OUTPUT(records, PAGES);
BPF_ARRAY_OF_MAPS(records_ref, "records", 1);
BPF_ARRAY(counter, u64, 1);
BPF_ARRAY(owner, u32, 1);
BPF_ARRAY(consumer, u64, 2);  // the latest position read; how many reads went back
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    u32 zero = 0, one = 1;
    u32 *pid = owner.lookup(&zero);
    if (!pid || *pid != bpf_get_current_pid_tgid() >> 32)
        return 0;
    void *ring = records_ref.lookup(&zero);
    u64 *latest = consumer.lookup(&zero), *went_back = consumer.lookup(&one);
    if (ring && latest && went_back) {
        u64 position = bpf_ringbuf_query(ring, BPF_RB_CONS_POS);
        if (position < *latest)
            *went_back += 1;
        else
            *latest = position;
    }
    u64 *n = counter.lookup(&zero);
    if (!n)
        return 0;
    struct record r = {};
    r.words[0] = *n;
    u32 size = 8 * (1 + (*n & 7));
    *n += 1;
    records.ringbuf_output(&r, size, 0);
    return 0;
}
"""


@pytest.fixture
def loaded():
    """The program, owned by this process, and a reader of its ring."""
    from bcc import BPF

    bpf = BPF(text=PROGRAM.replace("PAGES", str(PAGES)))
    bpf["owner"][ctypes.c_int(0)] = ctypes.c_uint32(os.getpid())
    bpf["records_ref"][ctypes.c_int(0)] = ctypes.c_int(bpf["records"].map_fd)
    reader = RingBufferReader(bpf["records"].map_fd, PAGES * os.sysconf("SC_PAGE_SIZE"))
    yield bpf, reader
    reader.close()
    bpf.cleanup()


@pytest.fixture
def ring(loaded: tuple[Any, RingBufferReader]) -> RingBufferReader:
    return loaded[1]


def _read(reader: RingBufferReader, max_records: int, max_bytes: int | None = None) -> list[tuple[int, int]]:
    """(number, size) of each record of one batch."""
    batch = reader.records(max_records, max_bytes)
    return [(struct.unpack_from("<Q", reader.data, offset)[0], size) for offset, size in batch]


def test_batches_are_bounded_ordered_and_complete(ring: RingBufferReader) -> None:
    for _ in range(100):
        os.getppid()
    assert ring.backlog() > 0
    first = _read(ring, 30)
    assert [n for n, _ in first] == list(range(30))
    assert [size for _, size in first] == [8 * (1 + (n & 7)) for n in range(30)]
    rest = _read(ring, 1000)
    assert [n for n, _ in rest] == list(range(30, 100))
    assert ring.backlog() == 0
    assert _read(ring, 1000) == []


def test_a_batch_ends_with_the_record_that_reaches_its_byte_bound(ring: RingBufferReader) -> None:
    """Records 0-3 take 16, 24, 32 and 40 bytes of the ring (an 8-byte header each): with a bound
    of 100 the fourth, which starts at 72, is the last of the batch; the next batch goes on."""
    for _ in range(20):
        os.getppid()
    assert [n for n, _ in _read(ring, 1000, max_bytes=100)] == [0, 1, 2, 3]
    assert [n for n, _ in _read(ring, 1000, max_bytes=1)] == [4]  # a batch takes at least one record
    assert [n for n, _ in _read(ring, 1000)] == list(range(5, 20))


def test_the_ring_wraps_many_times_without_losing_a_record(ring: RingBufferReader) -> None:
    """Records cross the end of the data area many times over (the area is mapped twice in a row)."""
    seen: list[int] = []
    for _ in range(40):
        for _ in range(300):
            os.getppid()
        seen += [n for n, _ in _read(ring, 10_000)]
    assert seen == list(range(12_000))


def test_wait_returns_at_once_when_records_are_waiting(ring: RingBufferReader) -> None:
    os.getppid()
    ring.wait(10_000)  # would block for 10 s if it did not see the backlog
    assert _read(ring, 10) == [(0, 8)]


def test_producers_never_read_a_consumer_position_half_written(loaded: tuple[Any, RingBufferReader]) -> None:
    """A child produces records as fast as it can while this process reads them in batches, each
    batch writing the consumer position back: every position the producer's program reads is at
    least the one it read before. One caught mid-write (struct.pack_into zero-fills first) would
    have made the ring look full to the kernel, and an event would have been lost."""
    bpf, ring = loaded
    child = os.fork()
    if child == 0:  # the producer
        end = time.monotonic() + 2
        while time.monotonic() < end:
            for _ in range(1000):
                os.getppid()
        os._exit(0)
    bpf["owner"][ctypes.c_int(0)] = ctypes.c_uint32(child)
    batches = records = 0
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        records += sum(1 for _ in ring.records(64))  # each batch ends by writing the position back
        batches += 1
    read, went_back = bpf["consumer"][ctypes.c_int(0)].value, bpf["consumer"][ctypes.c_int(1)].value
    assert read > 10 * PAGES * os.sysconf("SC_PAGE_SIZE")  # the ring wrapped many times over
    assert batches > 10_000 and records > 10_000
    assert went_back == 0
