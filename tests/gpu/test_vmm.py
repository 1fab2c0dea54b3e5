"""The driver's virtual memory API bookkeeping (otel_ebpf/gpu/vmm.py): when physical memory goes."""

from __future__ import annotations

from otel_ebpf.gpu.vmm import Unmapped, VirtualMemory

PID = 7
CHUNK = 2 << 20


def test_memory_goes_when_released_and_unmapped_in_either_order() -> None:
    vmm = VirtualMemory()
    vmm.create(PID, 0xA, device=0)
    vmm.create(PID, 0xB, device=1)
    assert vmm.map(PID, 0x1000_0000, CHUNK, 0xA) == 0
    assert vmm.map(PID, 0x2000_0000, CHUNK, 0xB) == 1
    # PyTorch: unmap, then release
    assert vmm.unmap(PID, 0x1000_0000, CHUNK) == [Unmapped(0xA, CHUNK, 0, gone=False)]
    assert vmm.release(PID, 0xA)
    # CUDA's samples: release while mapped (kept alive), the unmap frees it
    assert not vmm.release(PID, 0xB)
    assert vmm.unmap(PID, 0x2000_0000, CHUNK) == [Unmapped(0xB, CHUNK, 1, gone=True)]


def test_one_handle_mapped_twice_lives_until_its_last_mapping() -> None:
    vmm = VirtualMemory()
    vmm.create(PID, 0xA, device=0)
    vmm.map(PID, 0x1000_0000, CHUNK, 0xA)
    vmm.map(PID, 0x3000_0000, CHUNK, 0xA)
    assert not vmm.release(PID, 0xA)
    assert [u.gone for u in vmm.unmap(PID, 0x1000_0000, CHUNK)] == [False]
    assert [u.gone for u in vmm.unmap(PID, 0x3000_0000, CHUNK)] == [True]


def test_an_unmap_spanning_contiguous_mappings_removes_each() -> None:
    vmm = VirtualMemory()
    for i, handle in enumerate((0xA, 0xB, 0xC)):
        vmm.create(PID, handle, device=0)
        vmm.map(PID, 0x1000_0000 + i * CHUNK, CHUNK, handle)
    removed = vmm.unmap(PID, 0x1000_0000 + CHUNK, 2 * CHUNK)
    assert [(u.handle, u.size) for u in removed] == [(0xB, CHUNK), (0xC, CHUNK)]
    assert vmm.unmap(PID, 0x1000_0000 + CHUNK, CHUNK) == []  # already gone
    assert vmm.unmap(PID, 0x5000_0000, CHUNK) == []  # mapped before the agent attached


def test_unknown_handles_and_processes_apart() -> None:
    vmm = VirtualMemory()
    assert vmm.release(PID, 0xD)  # created before the agent attached: gone at its release
    assert vmm.map(PID, 0x1000_0000, CHUNK, 0xD) is None  # its mappings are not counted
    vmm.create(PID, 0xA, device=0)
    assert vmm.map(PID + 1, 0x1000_0000, CHUNK, 0xA) is None  # another process's handle
    vmm.map(PID, 0x1000_0000, CHUNK, 0xA)
    vmm.forget_processes([PID])
    assert vmm.unmap(PID, 0x1000_0000, CHUNK) == []
    assert vmm.reserve(PID, 0x4000_0000, 1 << 30) and vmm.address_free(PID, 0x4000_0000) == 1 << 30
    assert vmm.address_free(PID, 0x4000_0000) == 0


def test_full_tables_refuse_and_count() -> None:
    vmm = VirtualMemory(capacity=1)
    vmm.create(PID, 0xA, device=0)
    vmm.create(PID, 0xB, device=0)  # not tracked
    assert vmm.map(PID, 0x1000_0000, CHUNK, 0xA) == 0
    vmm.create(PID, 0xC, device=0)
    assert vmm.reserve(PID, 0x4000_0000, CHUNK)
    assert not vmm.reserve(PID, 0x5000_0000, CHUNK)
    assert vmm.untracked == 3
