"""A "training loop" over the stand-in CUDA, NCCL and PyTorch-allocator libraries (no GPU needed).

It loads ``libcudart.so.12``, ``libcuda.so.1``, ``libnccl.so.2`` and ``libc10_cuda.so`` built from
``tests/gpu/standin/*.c`` through ctypes, prints ``ready``, waits for a line on stdin (so an agent
can attach first), runs a known pattern of allocations, copies, launches and collectives — with
one deliberate leak, in :func:`leaky_batch_cache` — prints a JSON line with exactly what it did,
and keeps its memory until stdin closes (or a second line arrives), so that leaks stay alive.

    python examples/gpu_training_standin.py [--steps N] [--step-ms MS] [--no-wait]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.gpu.standin.build import build

KIB = 1024
MIB = 1024 * KIB
LEAK_SIZE = 1 * MIB
DTYPE_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}
NCCL_OPS = ("AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "Send", "Recv")
# the kernels' host stubs in libstandin_kernels.so: mangled symbol -> the name c++filt gives it
KERNELS = {
    "_ZN2at6native29vectorized_elementwise_kernelIfEEviPT_": (
        "void at::native::vectorized_elementwise_kernel<float>(int, float*)"
    ),
    "_ZN5flash16flash_fwd_kernelEPKfS1_Pf": "flash::flash_fwd_kernel(float const*, float const*, float*)",
    "plain_c_kernel": "plain_c_kernel",
}


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemAllocationProp(ctypes.Structure):  # cuda.h: CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", MemLocation),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", ctypes.c_ubyte * 8),
    ]


class Gpu:
    """The stand-in libraries, and a ledger of every call made through them."""

    def __init__(self, libdir: Path) -> None:
        mode = ctypes.RTLD_GLOBAL
        self.driver = ctypes.CDLL(str(libdir / "libcuda.so.1"), mode=mode)
        self.rt = ctypes.CDLL(str(libdir / "libcudart.so.12"), mode=mode)
        self.nccl = ctypes.CDLL(str(libdir / "libnccl.so.2"), mode=mode)
        self.c10 = ctypes.CDLL(str(libdir / "libc10_cuda.so"), mode=mode)
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self.rt.cudaMalloc.argtypes = (ctypes.POINTER(vp), sz)
        self.rt.cudaFree.argtypes = (vp,)
        self.rt.cudaMallocAsync.argtypes = (ctypes.POINTER(vp), sz, vp)
        self.rt.cudaFreeAsync.argtypes = (vp, vp)
        self.rt.cudaMemcpy.argtypes = (vp, vp, sz, ctypes.c_int)
        self.rt.cudaMemcpyAsync.argtypes = (vp, vp, sz, ctypes.c_int, vp)
        self.rt.cudaLaunchKernel.argtypes = (vp, Dim3, Dim3, ctypes.POINTER(vp), sz, vp)
        self.rt.cudaStreamSynchronize.argtypes = (vp,)
        self.driver.cuMemAlloc_v2.argtypes = (ctypes.POINTER(ctypes.c_uint64), sz)
        self.driver.cuMemFree_v2.argtypes = (ctypes.c_uint64,)
        self.driver.cuMemcpyHtoD_v2.argtypes = (ctypes.c_uint64, vp, sz)
        self.driver.cuMemcpyDtoH_v2.argtypes = (vp, ctypes.c_uint64, sz)
        self.driver.cuMemcpyDtoD_v2.argtypes = (ctypes.c_uint64, ctypes.c_uint64, sz)
        self.driver.cuLaunchKernel.argtypes = (vp, *[ctypes.c_uint] * 7, vp, ctypes.POINTER(vp), ctypes.POINTER(vp))
        self.driver.cuLaunchKernelEx.argtypes = (vp, vp, ctypes.POINTER(vp), ctypes.POINTER(vp))
        u64, ull = ctypes.c_uint64, ctypes.c_ulonglong
        self.driver.cuMemCreate.argtypes = (ctypes.POINTER(ull), sz, ctypes.POINTER(MemAllocationProp), ull)
        self.driver.cuMemRelease.argtypes = (ull,)
        self.driver.cuMemAddressReserve.argtypes = (ctypes.POINTER(u64), sz, sz, u64, ull)
        self.driver.cuMemAddressFree.argtypes = (u64, sz)
        self.driver.cuMemMap.argtypes = (u64, sz, sz, ull, ull)
        self.driver.cuMemUnmap.argtypes = (u64, sz)
        pp, uint = ctypes.POINTER(vp), ctypes.c_uint
        self.rt.cudaMallocManaged.argtypes = (pp, sz, uint)
        self.rt.cudaMallocHost.argtypes = (pp, sz)
        self.rt.cudaHostAlloc.argtypes = (pp, sz, uint)
        self.rt.cudaFreeHost.argtypes = (vp,)
        self.rt.cudaMallocFromPoolAsync.argtypes = (pp, sz, vp, vp)
        self.driver.cuMemAllocManaged.argtypes = (pp, sz, uint)
        self.driver.cuMemAllocHost_v2.argtypes = (pp, sz)
        self.driver.cuMemHostAlloc.argtypes = (pp, sz, uint)
        self.driver.cuMemFreeHost.argtypes = (vp,)
        self.c10.c10_cuda_alloc.argtypes = (sz, ctypes.c_int, vp)
        self.c10.c10_cuda_alloc.restype = vp
        self.c10.c10_cuda_free.argtypes = (vp,)
        n = self.nccl
        n.ncclAllReduce.argtypes = (vp, vp, sz, ctypes.c_int, ctypes.c_int, vp, vp)
        n.ncclBroadcast.argtypes = (vp, vp, sz, ctypes.c_int, ctypes.c_int, vp, vp)
        n.ncclReduce.argtypes = (vp, vp, sz, ctypes.c_int, ctypes.c_int, ctypes.c_int, vp, vp)
        n.ncclAllGather.argtypes = (vp, vp, sz, ctypes.c_int, vp, vp)
        n.ncclReduceScatter.argtypes = (vp, vp, sz, ctypes.c_int, ctypes.c_int, vp, vp)
        n.ncclSend.argtypes = (vp, sz, ctypes.c_int, ctypes.c_int, vp, vp)
        n.ncclRecv.argtypes = (vp, sz, ctypes.c_int, ctypes.c_int, vp, vp)
        self.kernel = ctypes.cast(self.rt.cudaGetErrorString, vp)  # any host function stands for a kernel
        stubs = ctypes.CDLL(str(libdir / "libstandin_kernels.so"))
        self.stubs = [(ctypes.cast(stubs[symbol], vp), name) for symbol, name in KERNELS.items()]
        self.ledger: Counter[str] = Counter()
        self.device = 0

    # -- memory --
    def set_device(self, device: int) -> None:
        assert self.rt.cudaSetDevice(device) == 0
        self.device = device

    def malloc(self, size: int, asynchronous: bool = False) -> int:
        ptr = ctypes.c_void_p()
        err = (
            self.rt.cudaMallocAsync(ctypes.byref(ptr), size, None)
            if asynchronous
            else self.rt.cudaMalloc(ctypes.byref(ptr), size)
        )
        if err:
            self.ledger[f"error runtime {'cudaMallocAsync' if asynchronous else 'cudaMalloc'} {err}"] += 1
            return 0
        self.ledger[f"alloc runtime {self.device}"] += size
        self.ledger[f"allocs runtime {self.device}"] += 1
        self.ledger[f"in_use runtime {self.device}"] += size
        return ptr.value

    def free(self, ptr: int, size: int, device: int, asynchronous: bool = False) -> None:
        assert (self.rt.cudaFreeAsync(ptr, None) if asynchronous else self.rt.cudaFree(ptr)) == 0
        self.ledger[f"in_use runtime {device}"] -= size

    def driver_malloc(self, size: int) -> int:
        ptr = ctypes.c_uint64()
        assert self.driver.cuMemAlloc_v2(ctypes.byref(ptr), size) == 0
        self.ledger[f"alloc driver {self.device}"] += size
        self.ledger[f"in_use driver {self.device}"] += size
        return ptr.value

    def driver_free(self, ptr: int, size: int, device: int) -> None:
        assert self.driver.cuMemFree_v2(ptr) == 0
        self.ledger[f"in_use driver {device}"] -= size

    def tensor(self, size: int, device: int) -> int:
        ptr = self.c10.c10_cuda_alloc(size, device, None)
        self.ledger[f"alloc pytorch {device}"] += size
        self.ledger[f"in_use pytorch {device}"] += size
        return ptr

    def tensor_free(self, ptr: int, size: int, device: int) -> None:
        self.c10.c10_cuda_free(ptr)
        self.ledger[f"in_use pytorch {device}"] -= size

    # -- managed and pinned host memory, pools: ledger keys "<what> <layer> <device> <kind>" --
    def allocate(self, layer: str, function: str, size: int, *args: object, kind: str) -> int:
        ptr = ctypes.c_void_p()
        library = self.rt if layer == "runtime" else self.driver
        assert getattr(library, function)(ctypes.byref(ptr), size, *args) == 0, function
        suffix = "" if kind == "device" else f" {kind}"
        self.ledger[f"alloc {layer} {self.device}{suffix}"] += size
        self.ledger[f"allocs {layer} {self.device}{suffix}"] += 1
        self.ledger[f"in_use {layer} {self.device}{suffix}"] += size
        return ptr.value

    def deallocate(self, layer: str, function: str, ptr: int, size: int, *args: object, kind: str) -> None:
        library = self.rt if layer == "runtime" else self.driver
        assert getattr(library, function)(ptr, *args) == 0, function
        self.ledger[f"in_use {layer} {self.device}{'' if kind == 'device' else f' {kind}'}"] -= size

    # -- the driver's virtual memory API: the ledger's "in_use vmm" is physical memory created and
    # not yet gone (released and unmapped); the callers say when it goes --
    def reserve(self, size: int) -> int:
        va = ctypes.c_uint64()
        assert self.driver.cuMemAddressReserve(ctypes.byref(va), size, 0, 0, 0) == 0
        self.ledger["address_reserved"] += size
        return va.value

    def address_free(self, va: int, size: int) -> None:
        assert self.driver.cuMemAddressFree(va, size) == 0
        self.ledger["address_reserved"] -= size

    def create(self, size: int, device: int) -> int:
        handle = ctypes.c_ulonglong()
        prop = MemAllocationProp(type=1, location=MemLocation(type=1, id=device))  # pinned, on the device
        assert self.driver.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0) == 0
        self.ledger[f"alloc vmm {device}"] += size
        self.ledger[f"allocs vmm {device}"] += 1
        self.ledger[f"in_use vmm {device}"] += size
        return handle.value

    def release(self, handle: int, size: int, device: int, gone: bool) -> None:
        assert self.driver.cuMemRelease(handle) == 0
        if gone:
            self.ledger[f"in_use vmm {device}"] -= size

    def map(self, va: int, size: int, handle: int, device: int) -> None:
        assert self.driver.cuMemMap(va, size, 0, handle, 0) == 0
        self.ledger[f"mapped {device}"] += size

    def unmap(self, va: int, size: int, device: int, gone: int = 0) -> None:
        """``gone``: bytes of released handles whose last mapping this was."""
        assert self.driver.cuMemUnmap(va, size) == 0
        self.ledger[f"mapped {device}"] -= size
        self.ledger[f"in_use vmm {device}"] -= gone

    # -- copies, launches, waits --
    def memcpy(self, dst: int, src: int, size: int, kind: int, asynchronous: bool = False) -> None:
        err = (
            self.rt.cudaMemcpyAsync(dst, src, size, kind, None)
            if asynchronous
            else self.rt.cudaMemcpy(dst, src, size, kind)
        )
        assert err == 0
        direction = ("host_to_host", "host_to_device", "device_to_host", "device_to_device", "default")[kind]
        self.ledger[f"copy runtime {direction} {'async' if asynchronous else 'sync'}"] += size
        self.ledger[f"copies runtime {direction} {'async' if asynchronous else 'sync'}"] += 1

    def driver_copies(self, dev: int, host: int, size: int) -> None:
        assert self.driver.cuMemcpyHtoD_v2(dev, host, size) == 0
        assert self.driver.cuMemcpyDtoH_v2(host, dev, size * 2 // 3) == 0
        assert self.driver.cuMemcpyDtoD_v2(dev + size // 2, dev, size // 4) == 0
        self.ledger["copy driver host_to_device sync"] += size
        self.ledger["copy driver device_to_host sync"] += size * 2 // 3
        self.ledger["copy driver device_to_device sync"] += size // 4
        for direction in ("host_to_device", "device_to_host", "device_to_device"):
            self.ledger[f"copies driver {direction} sync"] += 1

    def launch(self) -> None:
        """A runtime launch of the next kernel in turn, by its host stub."""
        stub, name = self.stubs[self.ledger["launch runtime"] % len(self.stubs)]
        assert self.rt.cudaLaunchKernel(stub, Dim3(128, 1, 1), Dim3(256, 1, 1), None, 0, None) == 0
        self.ledger["launch runtime"] += 1
        self.ledger[f"launch kernel {name}"] += 1

    def driver_launch(self, ex: bool) -> None:
        if ex:
            config = (ctypes.c_uint * 16)(1, 1, 1, 32, 1, 1, 0)
            assert self.driver.cuLaunchKernelEx(ctypes.addressof(config), self.kernel, None, None) == 0
        else:
            assert self.driver.cuLaunchKernel(self.kernel, 1, 1, 1, 32, 1, 1, 0, None, None, None) == 0
        self.ledger["launch driver"] += 1

    def synchronize(self) -> None:
        assert self.rt.cudaStreamSynchronize(None) == 0
        assert self.rt.cudaDeviceSynchronize() == 0
        self.ledger["sync cudaStreamSynchronize"] += 1
        self.ledger["sync cudaDeviceSynchronize"] += 1

    # -- NCCL --
    def comm(self, nranks: int, rank: int) -> int:
        uid = (ctypes.c_char * 128)()
        assert self.nccl.ncclGetUniqueId(uid) == 0
        comm = ctypes.c_void_p()
        # ncclUniqueId is a 128-byte struct passed by value
        self.nccl.ncclCommInitRank.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int)
        assert self.nccl.ncclCommInitRank(ctypes.byref(comm), nranks, UniqueId(), rank) == 0
        self.ledger[f"nccl CommInitRank rank {rank}"] += 1
        return comm.value

    def collective(self, op: str, comm: int, send: int, recv: int, count: int, dtype: int, rank: int) -> None:
        n = self.nccl
        if op == "AllReduce":
            err = n.ncclAllReduce(send, recv, count, dtype, 0, comm, None)
        elif op == "Broadcast":
            err = n.ncclBroadcast(send, recv, count, dtype, 0, comm, None)
        elif op == "Reduce":
            err = n.ncclReduce(send, recv, count, dtype, 0, 0, comm, None)
        elif op == "AllGather":
            err = n.ncclAllGather(send, recv, count, dtype, comm, None)
        elif op == "ReduceScatter":
            err = n.ncclReduceScatter(send, recv, count, dtype, 0, comm, None)
        elif op == "Send":
            err = n.ncclSend(send, count, dtype, 0, comm, None)
        else:
            err = n.ncclRecv(recv, count, dtype, 0, comm, None)
        if err:
            self.ledger[f"nccl error {op} {err}"] += 1
            return
        self.ledger[f"nccl bytes {op} {dtype} rank {rank}"] += count * DTYPE_SIZES[dtype]
        self.ledger[f"nccl calls {op} {dtype} rank {rank}"] += 1


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


# ---- the training loop ------------------------------------------------------------------------

_leaked: list[int] = []


def leaky_batch_cache(gpu: Gpu) -> None:
    """The deliberate leak: a "cache" of device buffers that is never trimmed. It calls
    cudaMalloc itself (no wrapper in between), so it is the Python function that made the leak."""
    ptr = ctypes.c_void_p()
    assert gpu.rt.cudaMalloc(ctypes.byref(ptr), LEAK_SIZE) == 0
    _leaked.append(ptr.value)
    gpu.ledger["alloc runtime 0"] += LEAK_SIZE
    gpu.ledger["allocs runtime 0"] += 1
    gpu.ledger["in_use runtime 0"] += LEAK_SIZE


def train_step(gpu: Gpu, comm: int, host: ctypes.Array, rank: int) -> None:
    activations = gpu.malloc(4 * MIB)
    scratch = gpu.malloc(256 * KIB, asynchronous=True)
    gpu.memcpy(activations, ctypes.addressof(host), 64 * KIB, 1)  # batch in
    for _ in range(3):
        gpu.launch()
    gpu.driver_launch(ex=False)
    gpu.driver_launch(ex=True)
    gpu.memcpy(ctypes.addressof(host), activations, 4 * KIB, 2, asynchronous=True)  # loss out
    gpu.memcpy(scratch, activations, 8 * KIB, 3)
    gpu.memcpy(scratch, activations, 512, 4)
    gpu.synchronize()
    gpu.set_device(1)
    tensor = gpu.tensor(256 * KIB, 1)
    gpu.tensor_free(tensor, 256 * KIB, 1)
    gpu.set_device(0)
    gpu.collective("AllReduce", comm, activations, activations, 1000, 7, rank)  # fp32 gradients
    gpu.free(scratch, 256 * KIB, 0, asynchronous=True)
    gpu.free(activations, 4 * MIB, 0)


def collectives_tour(gpu: Gpu, comm: int, rank: int) -> None:
    """Every NCCL operation with every datatype, distinct counts, inside a group."""
    buf = gpu.malloc(1 * MIB)
    assert gpu.nccl.ncclGroupStart() == 0
    for i, op in enumerate(NCCL_OPS):
        for dtype in DTYPE_SIZES:
            gpu.collective(op, comm, buf, buf, 100 + 10 * i + dtype, dtype, rank)
    assert gpu.nccl.ncclGroupEnd() == 0
    gpu.ledger["nccl GroupStart"] += 1
    gpu.ledger["nccl GroupEnd"] += 1
    gpu.collective("AllReduce", comm, buf, buf, 10, 99, rank)  # an invalid datatype: ncclInvalidArgument
    gpu.free(buf, 1 * MIB, 0)


CHUNK = 2 * MIB  # PyTorch's expandable segments grow by 2 MiB pages (small pools)


def grow_segment(gpu: Gpu, segment: int, chunks: list[int], more: int) -> None:
    """An expandable segment grows: physical chunks created and mapped at its end."""
    for _ in range(more):
        handle = gpu.create(CHUNK, 0)
        gpu.map(segment + len(chunks) * CHUNK, CHUNK, handle, 0)
        chunks.append(handle)


def expandable_segment(gpu: Gpu) -> None:
    """PyTorch's ``expandable_segments:True``: one big reservation, grown chunk by chunk, shrunk by
    unmapping and then releasing chunks at its end (one unmap of two contiguous chunks, then one of
    one); four chunks stay mapped and held."""
    segment = gpu.reserve(64 * MIB)
    chunks: list[int] = []
    grow_segment(gpu, segment, chunks, 4)
    grow_segment(gpu, segment, chunks, 3)
    gpu.unmap(segment + 5 * CHUNK, 2 * CHUNK, 0)
    gpu.unmap(segment + 4 * CHUNK, CHUNK, 0)
    for handle in chunks[4:]:
        gpu.release(handle, CHUNK, 0, gone=True)


def map_then_release(gpu: Gpu) -> None:
    """CUDA's samples' idiom, on device 1: the handle is released right after mapping; the memory
    lives until its unmap. One chunk is unmapped (gone), one stays (in use). The reservation of a
    third range is freed again."""
    va = gpu.reserve(2 * CHUNK)
    for i in range(2):
        handle = gpu.create(CHUNK, 1)
        gpu.map(va + i * CHUNK, CHUNK, handle, 1)
        gpu.release(handle, CHUNK, 1, gone=False)
    gpu.unmap(va + CHUNK, CHUNK, 1, gone=CHUNK)
    gpu.address_free(gpu.reserve(8 * MIB), 8 * MIB)


def host_and_managed_memory(gpu: Gpu) -> None:
    """Managed and pinned host memory through the runtime and the driver, and pool allocations;
    of each, one freed and one kept."""
    pool = ctypes.c_void_p(0x1)  # the stand-in runtime takes any non-null cudaMemPool_t
    gpu.allocate("runtime", "cudaMallocManaged", 3 * MIB, 1, kind="managed")  # cudaMemAttachGlobal
    gone = gpu.allocate("runtime", "cudaMallocManaged", 1 * MIB, 1, kind="managed")
    gpu.deallocate("runtime", "cudaFree", gone, 1 * MIB, kind="managed")
    gpu.allocate("runtime", "cudaMallocHost", 512 * KIB, kind="pinned_host")  # a staging buffer
    gone = gpu.allocate("runtime", "cudaHostAlloc", 256 * KIB, 0, kind="pinned_host")
    gpu.deallocate("runtime", "cudaFreeHost", gone, 256 * KIB, kind="pinned_host")
    gpu.allocate("driver", "cuMemAllocManaged", 128 * KIB, 1, kind="managed")
    gpu.allocate("driver", "cuMemHostAlloc", 64 * KIB, 0, kind="pinned_host")
    gone = gpu.allocate("driver", "cuMemAllocHost_v2", 32 * KIB, kind="pinned_host")
    gpu.deallocate("driver", "cuMemFreeHost", gone, 32 * KIB, kind="pinned_host")
    gpu.allocate("runtime", "cudaMallocFromPoolAsync", 384 * KIB, pool, None, kind="device")
    gone = gpu.allocate("runtime", "cudaMallocFromPoolAsync", 768 * KIB, pool, None, kind="device")
    gpu.deallocate("runtime", "cudaFreeAsync", gone, 768 * KIB, None, kind="device")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for go / exit lines")
    parser.add_argument("--libdir", type=Path, default=None)
    args = parser.parse_args()
    gpu = Gpu(args.libdir or build())
    before = gpu.malloc(2 * MIB)  # allocated before the agent attaches: its free is unmatched
    gpu.ledger.clear()
    host = (ctypes.c_char * (256 * KIB))()
    print("ready", flush=True)
    if not args.no_wait:
        sys.stdin.readline()
    weights = gpu.malloc(16 * MIB)  # long-lived, allocated once: not a leak
    driver_buffer = gpu.driver_malloc(3 * MIB)
    device1 = 0
    gpu.set_device(1)
    device1 = gpu.malloc(512 * KIB)  # stays on device 1
    gpu.set_device(0)
    comm = gpu.comm(2, 1)
    gpu.free(before, 2 * MIB, 0)
    gpu.ledger["in_use runtime 0"] += 2 * MIB  # never counted in: its free is not subtracted either
    too_big = gpu.malloc(1 << 40)  # fails: cudaErrorMemoryAllocation
    assert too_big == 0
    for _ in range(args.steps):
        train_step(gpu, comm, host, 1)
        leaky_batch_cache(gpu)
        time.sleep(args.step_ms / 1000)
    gpu.driver_copies(driver_buffer, ctypes.addressof(host), 3000)
    expandable_segment(gpu)
    map_then_release(gpu)
    host_and_managed_memory(gpu)
    collectives_tour(gpu, comm, 1)
    print(
        json.dumps(
            {
                "pid": __import__("os").getpid(),
                "ledger": dict(gpu.ledger),
                "leaks": len(_leaked),
                "leak_size": LEAK_SIZE,
            }
        ),
        flush=True,
    )
    if not args.no_wait:
        sys.stdin.readline()
    del weights, device1
    return 0


if __name__ == "__main__":
    sys.exit(main())
