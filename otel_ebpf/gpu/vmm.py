"""The driver's virtual memory management (VMM) API: physical memory by handle, mapped ranges,
reserved address space — what PyTorch's expandable segments (and NCCL's cuMem buffers) use.

``cuMemCreate`` makes physical memory and returns a handle; ``cuMemMap`` maps (part of) it into an
address range reserved with ``cuMemAddressReserve``; ``cuMemUnmap`` and ``cuMemRelease`` undo the
two. The physical memory lives until its handle is released *and* every mapping of it is unmapped:
PyTorch unmaps a chunk, then releases it; CUDA's samples release the handle right after mapping, and
the memory lives on until the unmap. So a handle holds references: its own until released, one per
mapping; the memory is gone when the last goes. :class:`VirtualMemory` keeps those references and
says when; the bytes and the stacks stay in the :class:`~otel_ebpf.gpu.memory.AllocationTable`.

Bounded: when a table is full, new handles, mappings or reservations are not tracked and counted
(``untracked``) — a handle not tracked is taken as gone at its release, as one created before the
agent attached.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(slots=True)
class _Handle:
    device: int
    held: bool = True  # not yet released
    mappings: int = 0


@dataclass(frozen=True, slots=True)
class Unmapped:
    """One mapping an unmap removed."""

    handle: int
    size: int
    device: int
    gone: bool  # the handle's physical memory went with it (released before, no mapping left)


class VirtualMemory:
    """Handles, mappings and reservations by (pid, handle or address)."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity  # per table
        self._handles: dict[tuple[int, int], _Handle] = {}
        self._mappings: dict[tuple[int, int], tuple[int, int, int]] = {}  # (pid, address) -> (size, handle, device)
        self._reserved: dict[tuple[int, int], int] = {}  # (pid, address) -> size
        self.untracked = 0  # handles, mappings or reservations not kept: a table was full

    def create(self, pid: int, handle: int, device: int) -> None:
        if len(self._handles) >= self.capacity:
            self.untracked += 1
            return
        self._handles[(pid, handle)] = _Handle(device)

    def release(self, pid: int, handle: int) -> bool:
        """Whether the handle's physical memory is gone now (no mapping keeps it alive)."""
        known = self._handles.get((pid, handle))
        if known is None:
            return True
        known.held = False
        if known.mappings:
            return False
        del self._handles[(pid, handle)]
        return True

    def map(self, pid: int, address: int, size: int, handle: int) -> int | None:
        """The device of the memory now mapped at ``address``; None for a handle not tracked."""
        known = self._handles.get((pid, handle))
        if known is None:
            return None
        if len(self._mappings) >= self.capacity:
            self.untracked += 1
            return None
        self._mappings[(pid, address)] = (size, handle, known.device)
        known.mappings += 1
        return known.device

    def unmap(self, pid: int, address: int, size: int) -> list[Unmapped]:
        """The mappings the range [address, address + size) held: contiguous ones, from its start
        (the driver unmaps whole mappings only)."""
        removed = []
        end = address + size
        while address < end:
            mapping = self._mappings.pop((pid, address), None)
            if mapping is None:
                break
            mapped, handle, device = mapping
            known = self._handles.get((pid, handle))
            gone = False
            if known is not None and known.mappings:  # none: made again under this value since
                known.mappings -= 1
                gone = not known.held and not known.mappings
                if gone:
                    del self._handles[(pid, handle)]
            removed.append(Unmapped(handle, mapped, device, gone))
            address += mapped
        return removed

    def reserve(self, pid: int, address: int, size: int) -> bool:
        """Whether the reservation is tracked (a table has room)."""
        if len(self._reserved) >= self.capacity:
            self.untracked += 1
            return False
        self._reserved[(pid, address)] = size
        return True

    def address_free(self, pid: int, address: int) -> int:
        """The size of the reservation freed at ``address``; 0 when it was not tracked."""
        return self._reserved.pop((pid, address), 0)

    def forget_processes(self, pids: Collection[int]) -> None:
        for table in (self._handles, self._mappings, self._reserved):
            for key in [k for k in table if k[0] in pids]:
                del table[key]
