"""The GPU library calls the agent hooks, and the decoded form of one call.

One table, :data:`OPS`, names every hooked function: its operation id (the ``op`` the BPF program
``bpf/gpu_trace.c`` stamps on each event — keep the two in step), the library it belongs to, what
kind of work it does, and where its interesting arguments are. Everything downstream (pairing,
metrics, profiles) works from :class:`GpuCall` records and this table only, so it is a pure
function of the event stream (docs/architecture.md, "Deterministic after the ring buffer") and
testable without a GPU or root.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Library(str, enum.Enum):
    RUNTIME = "runtime"  # libcudart (shared or linked statically into any ELF)
    DRIVER = "driver"  # libcuda.so.1
    NCCL = "nccl"  # libnccl.so.2
    PYTORCH = "pytorch"  # USDT probes of PyTorch's CUDA caching allocator (libc10_cuda.so)


class Kind(str, enum.Enum):
    ALLOC = "alloc"
    FREE = "free"
    COPY = "copy"
    SYNC = "sync"
    LAUNCH = "launch"
    SET_DEVICE = "set_device"
    COLLECTIVE = "collective"  # an NCCL operation that moves data
    GROUP = "group"  # ncclGroupStart / ncclGroupEnd
    COMM_INIT = "comm_init"
    COMM_DESTROY = "comm_destroy"
    # the driver's virtual memory management (memory.vmm): physical memory by handle, mapped into
    # reserved address ranges
    PHYSICAL_CREATE = "physical_create"
    PHYSICAL_RELEASE = "physical_release"
    ADDRESS_RESERVE = "address_reserve"
    ADDRESS_FREE = "address_free"
    MAP = "map"
    UNMAP = "unmap"
    # kernel names and graphs (launches.py)
    KERNEL_NAME = "kernel_name"  # a handle for the kernel of this name (cuModuleGetFunction, ...)
    KERNEL_FUNCTION = "kernel_function"  # a CUfunction for a named CUkernel (cuKernelGetFunction)
    GRAPH_CREATE = "graph_create"
    GRAPH_ADD_KERNEL = "graph_add_kernel"  # one kernel node
    GRAPH_ADD_OPAQUE = "graph_add_opaque"  # a node whose kernels are not counted (a child graph, ...)
    GRAPH_INSTANTIATE = "graph_instantiate"
    GRAPH_LAUNCH = "graph_launch"
    GRAPH_DESTROY = "graph_destroy"
    GRAPH_EXEC_DESTROY = "graph_exec_destroy"
    CAPTURE_BEGIN = "capture_begin"  # stream capture: launches on the stream become kernel nodes
    CAPTURE_END = "capture_end"  # ... of the graph it returns


class Memory(str, enum.Enum):
    """What an allocation is (``cuda.memory.kind``): only ``device`` is device memory."""

    DEVICE = "device"
    MANAGED = "managed"  # unified memory: migrates between host and devices on demand
    PINNED_HOST = "pinned_host"  # page-locked host memory the devices reach directly


@dataclass(frozen=True)
class OpSpec:
    """One hooked function. Argument positions index :attr:`GpuCall.args` (0 = first argument)."""

    op: int
    symbol: str
    library: Library
    kind: Kind
    size_arg: int | None = None  # bytes (ALLOC, COPY) or element count (COLLECTIVE)
    ptr_arg: int | None = None  # the device pointer a FREE releases, the address a MAP / UNMAP names
    handle_arg: int | None = None  # the CUmemGenericAllocationHandle a RELEASE / MAP names
    location_arg: int | None = None  # the CUmemLocation {type, id} the probe read from cuMemCreate's prop
    direction: str | None = None  # COPY: fixed direction, or None when a cudaMemcpyKind argument says
    kind_arg: int | None = None  # COPY: the cudaMemcpyKind argument
    asynchronous: bool = False
    memory: Memory = Memory.DEVICE  # ALLOC: what it allocates
    dtype_arg: int | None = None  # COLLECTIVE: ncclDataType_t
    comm_arg: int | None = None  # COLLECTIVE: ncclComm_t
    peer_arg: int | None = None  # COLLECTIVE: root or peer rank
    device_arg: int | None = None  # the device, when the call names it (USDT malloc)
    stub_arg: int | None = None  # LAUNCH: the kernel's host stub, whose symbol is its name (runtime)
    function_arg: int | None = None  # LAUNCH: the CUfunction / CUkernel handle (driver); KERNEL_FUNCTION: the CUkernel
    graph_arg: int | None = None  # the cudaGraph_t / CUgraph (GRAPH_*), or the graph exec a launch or destroy names
    stream_arg: int | None = None  # LAUNCH, CAPTURE_*: the stream (args[6]: read by the probe where it lies deeper)
    usdt: bool = False  # a USDT probe of ``library`` (provider:name in ``symbol``), no return


_SPECS = (
    OpSpec(1, "cudaMalloc", Library.RUNTIME, Kind.ALLOC, size_arg=1),
    OpSpec(2, "cudaFree", Library.RUNTIME, Kind.FREE, ptr_arg=0),
    OpSpec(3, "cudaMallocAsync", Library.RUNTIME, Kind.ALLOC, size_arg=1, asynchronous=True),
    OpSpec(4, "cudaFreeAsync", Library.RUNTIME, Kind.FREE, ptr_arg=0, asynchronous=True),
    OpSpec(5, "cuMemAlloc_v2", Library.DRIVER, Kind.ALLOC, size_arg=1),
    OpSpec(6, "cuMemFree_v2", Library.DRIVER, Kind.FREE, ptr_arg=0),
    OpSpec(7, "cuMemAllocAsync", Library.DRIVER, Kind.ALLOC, size_arg=1, asynchronous=True),
    OpSpec(8, "cuMemFreeAsync", Library.DRIVER, Kind.FREE, ptr_arg=0, asynchronous=True),
    # cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
    # unsigned long long flags): the handle comes back through the out-pointer; the probe reads
    # prop->location into args[6] (ARG6_PROP_LOCATION)
    OpSpec(11, "cuMemCreate", Library.DRIVER, Kind.PHYSICAL_CREATE, size_arg=1, location_arg=6),
    OpSpec(12, "cuMemRelease", Library.DRIVER, Kind.PHYSICAL_RELEASE, handle_arg=0),
    # cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, flags)
    OpSpec(13, "cuMemAddressReserve", Library.DRIVER, Kind.ADDRESS_RESERVE, size_arg=1),
    OpSpec(14, "cuMemAddressFree", Library.DRIVER, Kind.ADDRESS_FREE, ptr_arg=0, size_arg=1),
    # cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, handle, flags), cuMemUnmap(ptr, size)
    OpSpec(15, "cuMemMap", Library.DRIVER, Kind.MAP, ptr_arg=0, size_arg=1, handle_arg=3),
    OpSpec(16, "cuMemUnmap", Library.DRIVER, Kind.UNMAP, ptr_arg=0, size_arg=1),
    # pytorch:malloc(devPtr, device, size, stream), pytorch:free(devPtr)
    OpSpec(9, "pytorch:malloc", Library.PYTORCH, Kind.ALLOC, size_arg=2, ptr_arg=0, device_arg=1, usdt=True),
    OpSpec(10, "pytorch:free", Library.PYTORCH, Kind.FREE, ptr_arg=0, usdt=True),
    # cudaMallocManaged(void **devPtr, size_t size, unsigned int flags), cudaMallocHost(void **ptr,
    # size_t size), cudaHostAlloc(void **pHost, size_t size, unsigned int flags), cudaFreeHost(ptr);
    # the driver's: cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags),
    # cuMemAllocHost_v2(void **pp, size_t bytesize), cuMemHostAlloc(void **pp, size_t bytesize,
    # unsigned int Flags), cuMemFreeHost(void *p). Managed memory is freed by cudaFree / cuMemFree_v2.
    OpSpec(80, "cudaMallocManaged", Library.RUNTIME, Kind.ALLOC, size_arg=1, memory=Memory.MANAGED),
    OpSpec(81, "cudaMallocHost", Library.RUNTIME, Kind.ALLOC, size_arg=1, memory=Memory.PINNED_HOST),
    OpSpec(82, "cudaHostAlloc", Library.RUNTIME, Kind.ALLOC, size_arg=1, memory=Memory.PINNED_HOST),
    OpSpec(83, "cudaFreeHost", Library.RUNTIME, Kind.FREE, ptr_arg=0),
    OpSpec(84, "cuMemAllocManaged", Library.DRIVER, Kind.ALLOC, size_arg=1, memory=Memory.MANAGED),
    OpSpec(85, "cuMemAllocHost_v2", Library.DRIVER, Kind.ALLOC, size_arg=1, memory=Memory.PINNED_HOST),
    OpSpec(86, "cuMemHostAlloc", Library.DRIVER, Kind.ALLOC, size_arg=1, memory=Memory.PINNED_HOST),
    OpSpec(87, "cuMemFreeHost", Library.DRIVER, Kind.FREE, ptr_arg=0),
    # cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream),
    # cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream):
    # freed by cudaFreeAsync / cuMemFreeAsync
    OpSpec(88, "cudaMallocFromPoolAsync", Library.RUNTIME, Kind.ALLOC, size_arg=1, asynchronous=True),
    OpSpec(89, "cuMemAllocFromPoolAsync", Library.DRIVER, Kind.ALLOC, size_arg=1, asynchronous=True),
    OpSpec(20, "cudaMemcpy", Library.RUNTIME, Kind.COPY, size_arg=2, kind_arg=3),
    OpSpec(21, "cudaMemcpyAsync", Library.RUNTIME, Kind.COPY, size_arg=2, kind_arg=3, asynchronous=True),
    OpSpec(22, "cuMemcpyHtoD_v2", Library.DRIVER, Kind.COPY, size_arg=2, direction="host_to_device"),
    OpSpec(23, "cuMemcpyDtoH_v2", Library.DRIVER, Kind.COPY, size_arg=2, direction="device_to_host"),
    OpSpec(24, "cuMemcpyDtoD_v2", Library.DRIVER, Kind.COPY, size_arg=2, direction="device_to_device"),
    OpSpec(
        25, "cuMemcpyHtoDAsync_v2", Library.DRIVER, Kind.COPY, size_arg=2, direction="host_to_device", asynchronous=True
    ),
    OpSpec(
        26, "cuMemcpyDtoHAsync_v2", Library.DRIVER, Kind.COPY, size_arg=2, direction="device_to_host", asynchronous=True
    ),
    OpSpec(27, "cuMemcpy", Library.DRIVER, Kind.COPY, size_arg=2, direction="default"),
    OpSpec(28, "cuMemcpyAsync", Library.DRIVER, Kind.COPY, size_arg=2, direction="default", asynchronous=True),
    OpSpec(30, "cudaDeviceSynchronize", Library.RUNTIME, Kind.SYNC),
    OpSpec(31, "cudaStreamSynchronize", Library.RUNTIME, Kind.SYNC),
    OpSpec(32, "cuCtxSynchronize", Library.DRIVER, Kind.SYNC),
    OpSpec(33, "cuStreamSynchronize", Library.DRIVER, Kind.SYNC),
    # cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, stream):
    # each dim3 is passed in two registers, so the stream is the second stack argument
    OpSpec(40, "cudaLaunchKernel", Library.RUNTIME, Kind.LAUNCH, stub_arg=0, stream_arg=6),
    # cuLaunchKernel(CUfunction f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
    # sharedMemBytes, CUstream hStream, void **kernelParams, void **extra), cuLaunchKernelEx(const
    # CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra): the probe reads the
    # stream (the 9th argument; config->hStream); a CUkernel may stand for the CUfunction
    OpSpec(41, "cuLaunchKernel", Library.DRIVER, Kind.LAUNCH, function_arg=0, stream_arg=6),
    OpSpec(42, "cuLaunchKernelEx", Library.DRIVER, Kind.LAUNCH, function_arg=1, stream_arg=6),
    # cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name), cuLibraryGetKernel(
    # CUkernel *pKernel, CUlibrary library, const char *name): the handle through the out-pointer,
    # the name read by the probe (RET_OUT_NAME); cuKernelGetFunction(CUfunction *pFunc, CUkernel k)
    OpSpec(43, "cuModuleGetFunction", Library.DRIVER, Kind.KERNEL_NAME),
    OpSpec(44, "cuLibraryGetKernel", Library.DRIVER, Kind.KERNEL_NAME),
    OpSpec(45, "cuKernelGetFunction", Library.DRIVER, Kind.KERNEL_FUNCTION, function_arg=1),
    # graphs: cudaGraphCreate(cudaGraph_t *pGraph, unsigned flags), cuGraphCreate(CUgraph *phGraph,
    # unsigned flags); nodes are added as (node *out, graph, dependencies, ...): the graph is the
    # second argument of every cudaGraphAdd*Node / cuGraphAdd*Node
    OpSpec(90, "cudaGraphCreate", Library.RUNTIME, Kind.GRAPH_CREATE),
    OpSpec(91, "cuGraphCreate", Library.DRIVER, Kind.GRAPH_CREATE),
    OpSpec(92, "cudaGraphAddKernelNode", Library.RUNTIME, Kind.GRAPH_ADD_KERNEL, graph_arg=1),
    OpSpec(93, "cuGraphAddKernelNode", Library.DRIVER, Kind.GRAPH_ADD_KERNEL, graph_arg=1),
    OpSpec(94, "cuGraphAddKernelNode_v2", Library.DRIVER, Kind.GRAPH_ADD_KERNEL, graph_arg=1),
    OpSpec(95, "cudaGraphAddChildGraphNode", Library.RUNTIME, Kind.GRAPH_ADD_OPAQUE, graph_arg=1),
    OpSpec(96, "cuGraphAddChildGraphNode", Library.DRIVER, Kind.GRAPH_ADD_OPAQUE, graph_arg=1),
    # the generic forms (CUDA 12.2+): the node's type is inside its parameters, not read
    OpSpec(97, "cudaGraphAddNode", Library.RUNTIME, Kind.GRAPH_ADD_OPAQUE, graph_arg=1),
    OpSpec(98, "cuGraphAddNode", Library.DRIVER, Kind.GRAPH_ADD_OPAQUE, graph_arg=1),
    OpSpec(99, "cuGraphAddNode_v2", Library.DRIVER, Kind.GRAPH_ADD_OPAQUE, graph_arg=1),
    OpSpec(117, "cudaGraphAddNode_v2", Library.RUNTIME, Kind.GRAPH_ADD_OPAQUE, graph_arg=1),
    # (graph exec *out, graph, ...) in every form: CUDA 12's cuGraphInstantiate is
    # cuGraphInstantiateWithFlags, CUDA 11's cuGraphInstantiate_v2
    OpSpec(100, "cudaGraphInstantiate", Library.RUNTIME, Kind.GRAPH_INSTANTIATE, graph_arg=1),
    OpSpec(101, "cudaGraphInstantiateWithFlags", Library.RUNTIME, Kind.GRAPH_INSTANTIATE, graph_arg=1),
    OpSpec(102, "cudaGraphInstantiateWithParams", Library.RUNTIME, Kind.GRAPH_INSTANTIATE, graph_arg=1),
    OpSpec(103, "cuGraphInstantiateWithFlags", Library.DRIVER, Kind.GRAPH_INSTANTIATE, graph_arg=1),
    OpSpec(104, "cuGraphInstantiate_v2", Library.DRIVER, Kind.GRAPH_INSTANTIATE, graph_arg=1),
    OpSpec(105, "cuGraphInstantiateWithParams", Library.DRIVER, Kind.GRAPH_INSTANTIATE, graph_arg=1),
    # cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream), cuGraphLaunch(CUgraphExec, CUstream)
    OpSpec(106, "cudaGraphLaunch", Library.RUNTIME, Kind.GRAPH_LAUNCH, graph_arg=0),
    OpSpec(107, "cuGraphLaunch", Library.DRIVER, Kind.GRAPH_LAUNCH, graph_arg=0),
    OpSpec(108, "cudaGraphDestroy", Library.RUNTIME, Kind.GRAPH_DESTROY, graph_arg=0),
    OpSpec(109, "cuGraphDestroy", Library.DRIVER, Kind.GRAPH_DESTROY, graph_arg=0),
    OpSpec(110, "cudaGraphExecDestroy", Library.RUNTIME, Kind.GRAPH_EXEC_DESTROY, graph_arg=0),
    OpSpec(111, "cuGraphExecDestroy", Library.DRIVER, Kind.GRAPH_EXEC_DESTROY, graph_arg=0),
    # cudaStreamBeginCapture(cudaStream_t stream, mode), cuStreamBeginCapture_v2(CUstream, mode)
    # (CUDA 10.0's cuStreamBeginCapture(CUstream)); cudaStreamEndCapture(cudaStream_t stream,
    # cudaGraph_t *pGraph), cuStreamEndCapture(CUstream, CUgraph *): the graph through the second
    # argument (RET_OUT_2ND)
    OpSpec(112, "cudaStreamBeginCapture", Library.RUNTIME, Kind.CAPTURE_BEGIN, stream_arg=0),
    OpSpec(113, "cuStreamBeginCapture", Library.DRIVER, Kind.CAPTURE_BEGIN, stream_arg=0),
    OpSpec(114, "cuStreamBeginCapture_v2", Library.DRIVER, Kind.CAPTURE_BEGIN, stream_arg=0),
    OpSpec(115, "cudaStreamEndCapture", Library.RUNTIME, Kind.CAPTURE_END, stream_arg=0),
    OpSpec(116, "cuStreamEndCapture", Library.DRIVER, Kind.CAPTURE_END, stream_arg=0),
    OpSpec(50, "cudaSetDevice", Library.RUNTIME, Kind.SET_DEVICE, device_arg=0),
    # ncclAllReduce(sbuf, rbuf, count, dtype, op, comm, stream)
    OpSpec(60, "ncclAllReduce", Library.NCCL, Kind.COLLECTIVE, size_arg=2, dtype_arg=3, comm_arg=5),
    # ncclBroadcast(sbuf, rbuf, count, dtype, root, comm, stream)
    OpSpec(61, "ncclBroadcast", Library.NCCL, Kind.COLLECTIVE, size_arg=2, dtype_arg=3, peer_arg=4, comm_arg=5),
    # ncclReduce(sbuf, rbuf, count, dtype, op, root, comm, stream): comm is the 7th argument
    OpSpec(62, "ncclReduce", Library.NCCL, Kind.COLLECTIVE, size_arg=2, dtype_arg=3, peer_arg=5, comm_arg=6),
    # ncclAllGather(sbuf, rbuf, sendcount, dtype, comm, stream)
    OpSpec(63, "ncclAllGather", Library.NCCL, Kind.COLLECTIVE, size_arg=2, dtype_arg=3, comm_arg=4),
    # ncclReduceScatter(sbuf, rbuf, recvcount, dtype, op, comm, stream)
    OpSpec(64, "ncclReduceScatter", Library.NCCL, Kind.COLLECTIVE, size_arg=2, dtype_arg=3, comm_arg=5),
    # ncclSend(sbuf, count, dtype, peer, comm, stream), ncclRecv(rbuf, count, dtype, peer, comm, stream)
    OpSpec(65, "ncclSend", Library.NCCL, Kind.COLLECTIVE, size_arg=1, dtype_arg=2, peer_arg=3, comm_arg=4),
    OpSpec(66, "ncclRecv", Library.NCCL, Kind.COLLECTIVE, size_arg=1, dtype_arg=2, peer_arg=3, comm_arg=4),
    OpSpec(67, "ncclGroupStart", Library.NCCL, Kind.GROUP),
    OpSpec(68, "ncclGroupEnd", Library.NCCL, Kind.GROUP),
    # ncclCommInitRank(comm *, nranks, ncclUniqueId id, rank): the 128-byte id is passed in memory,
    # so rank is the third register argument; the communicator comes back through the out-pointer.
    OpSpec(69, "ncclCommInitRank", Library.NCCL, Kind.COMM_INIT, size_arg=1, peer_arg=2),
    OpSpec(70, "ncclCommInitRankConfig", Library.NCCL, Kind.COMM_INIT, size_arg=1, peer_arg=2),
    OpSpec(71, "ncclCommDestroy", Library.NCCL, Kind.COMM_DESTROY, comm_arg=0),
)
OPS: dict[int, OpSpec] = {spec.op: spec for spec in _SPECS}
BY_SYMBOL: dict[str, OpSpec] = {spec.symbol: spec for spec in _SPECS}
FUNCTION_SYMBOLS: tuple[str, ...] = tuple(spec.symbol for spec in _SPECS if not spec.usdt)
USDT_PROBES: dict[tuple[str, str], OpSpec] = {
    (provider, name): spec for spec in _SPECS if spec.usdt for provider, name in [spec.symbol.split(":", 1)]
}

MEMCPY_KINDS = {0: "host_to_host", 1: "host_to_device", 2: "device_to_host", 3: "device_to_device", 4: "default"}

# ncclDataType_t -> (name, bytes per element)
NCCL_DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1),
    1: ("uint8", 1),
    2: ("int32", 4),
    3: ("uint32", 4),
    4: ("int64", 8),
    5: ("uint64", 8),
    6: ("float16", 2),
    7: ("float32", 4),
    8: ("float64", 8),
    9: ("bfloat16", 2),
    10: ("float8e4m3", 1),
    11: ("float8e5m2", 1),
}

# Error names for the codes a caller most often meets (cudaError_t, CUresult, ncclResult_t).
CUDA_ERRORS = {
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    4: "cudaErrorCudartUnloading",
    35: "cudaErrorInsufficientDriver",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
    209: "cudaErrorNoKernelImageForDevice",
    400: "cudaErrorInvalidResourceHandle",
    700: "cudaErrorIllegalAddress",
    999: "cudaErrorUnknown",
}
DRIVER_ERRORS = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    400: "CUDA_ERROR_INVALID_HANDLE",
    999: "CUDA_ERROR_UNKNOWN",
}
NCCL_ERRORS = {
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
_ERRORS = {Library.RUNTIME: CUDA_ERRORS, Library.DRIVER: DRIVER_ERRORS, Library.NCCL: NCCL_ERRORS}


def error_name(library: Library, code: int) -> str:
    """The enum name of ``code`` for ``library``, or the number as text when not in our table."""
    return _ERRORS.get(library, {}).get(code, str(code))


PythonFrameRef = tuple[int, int, int]  # (code object, instruction pointer, flags) as python_stack.h reads them


@dataclass(frozen=True, slots=True)
class GpuCall:
    """One completed call (or one USDT probe hit), as decoded from the ring buffer."""

    ts_ns: int  # Unix time of the call's entry
    duration_ns: int
    pid: int
    tid: int
    op: int
    ret: int  # 0 = success
    args: tuple[int, ...]  # raw 64-bit arguments as passed
    out: int = 0  # what the out-pointer held after a successful call (device pointer, communicator)
    user_stack: tuple[int, ...] = ()  # native return addresses, leaf first
    python_stack: tuple[PythonFrameRef, ...] = ()  # leaf first
    python_status: int = 0  # PY_STATUS_* of python_stack.h
    name: str = ""  # the kernel name a KERNEL_NAME call was given (as passed: mangled)

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    def arg(self, index: int | None, signed32: bool = False) -> int:
        """Argument ``index`` (0 when None); ``signed32`` reads it as a C ``int``."""
        if index is None:
            return 0
        value = self.args[index]
        if signed32:
            value &= 0xFFFFFFFF
            return value - (1 << 32) if value & 0x80000000 else value
        return value

    @property
    def ok(self) -> bool:
        return self.ret == 0
