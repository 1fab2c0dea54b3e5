"""GPU calls -> metrics, profiles and leak log records (otel_ebpf/gpu/views.py), from synthetic calls."""

from __future__ import annotations

from typing import Any

import pytest

from otel_ebpf.gpu.calls import BY_SYMBOL, NCCL_DATATYPES, OPS, GpuCall, Kind, error_name
from otel_ebpf.gpu.views import PROFILE_TYPES, GpuViews, GpuViewsConfig, format_stack
from otel_ebpf.profiles.model import Frame, FrameKind
from otel_ebpf.protocol import InstrumentKind
from otel_ebpf.selfmetrics import SelfMetrics

PID = 42
S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 10 * S

    def tick(self, seconds: float = 0.01) -> int:
        self.ns += int(seconds * S)
        return self.ns


def py(function: str, file: str = "/srv/train.py", line: int = 1) -> Frame:
    return Frame(function, file=file, line=line, kind=FrameKind.PYTHON)


def stack_of(call: GpuCall) -> tuple:
    """Stacks in these tests: the calling Python function travels in user_stack[0] as an index."""
    names = ("main", "train_step", "leaky", "torch_empty")
    leaf = Frame(OPS[call.op].symbol, module="/lib/libcudart.so.12")
    frames = [leaf]
    if call.user_stack:
        if call.user_stack[0] == 3:  # a framework frame (torch) above the user's
            frames.append(py("empty", "/venv/lib/python3.11/site-packages/torch/_tensor.py", 7))
            frames.append(py("leaky"))
        else:
            frames.append(py(names[call.user_stack[0]]))
    frames.append(py("main"))
    return tuple(frames)


def resource_of(pid: int) -> dict[str, Any]:
    return {"service.name": "trainer", "process.pid": pid}


class Calls:
    """Builds GpuCall records the way the probe decodes them."""

    def __init__(self, views: GpuViews, clock: Clock) -> None:
        self.views, self.clock = views, clock

    def __call__(
        self,
        symbol: str,
        *args: int,
        ret: int = 0,
        out: int = 0,
        duration: float = 1e-5,
        tid: int = PID,
        where: int = 1,
    ) -> None:
        padded = tuple(args) + (0,) * (7 - len(args))
        self.views.handle(
            GpuCall(self.clock.tick(), int(duration * S), PID, tid, BY_SYMBOL[symbol].op, ret, padded, out, (where,))
        )


@pytest.fixture
def setup() -> tuple[GpuViews, Calls, SelfMetrics, Clock]:
    metrics = SelfMetrics()
    clock = Clock()
    views = GpuViews(stack_of, resource_of, metrics, GpuViewsConfig(leak_age_ns=S // 2))
    return views, Calls(views, clock), metrics, clock


def collected(views: GpuViews, now: int) -> dict[str, list[tuple[dict, Any]]]:
    out: dict[str, list[tuple[dict, Any]]] = {}
    for resource_metrics in views.collect_metrics(now):
        assert resource_metrics.resource.attributes["process.pid"] == PID
        for scope in resource_metrics.scope_metrics:
            assert scope.scope.name == "otel_ebpf.gpu"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = (point.count, point.sum) if hasattr(point, "bucket_counts") else point.value
                    out.setdefault(metric.name, []).append((dict(point.attributes), value))
    return out


def mem(api: str, device: int, kind: str = "device") -> dict[str, Any]:
    """The attributes of a memory series."""
    return {"cuda.api": api, "cuda.device": device, "cuda.memory.kind": kind}


def value(points: dict, name: str, **attributes: Any) -> Any:
    found = [v for a, v in points.get(name, []) if a == attributes]
    return found[0] if found else None


def test_op_table_and_bpf_program_agree() -> None:
    from importlib import resources

    source = resources.files("otel_ebpf.bpf").joinpath("gpu_trace.c").read_text()
    for spec in OPS.values():
        if not spec.usdt:
            assert f"CALL({spec.symbol}, {spec.op}," in source, spec.symbol
    assert "usdt_event(ctx, 9, n * 2)" in source and "usdt_event(ctx, 10, n * 2 + 1)" in source


def test_memory_pairs_per_layer_and_device(setup: tuple) -> None:
    views, call, _, clock = setup
    call("cudaMalloc", 0x7000, 1000, out=0xA)
    call("cudaSetDevice", 1, tid=7)
    call("cudaMalloc", 0x7000, 300, out=0xB, tid=7)  # thread 7 is on device 1
    call("cudaMallocAsync", 0x7000, 64, 0, out=0xC)
    call("cuMemAlloc_v2", 0x7000, 500, out=0xD)
    call("pytorch:malloc", 0xE, 1, 256, 0)  # USDT: (ptr, device, size, stream)
    call("cudaMalloc", 0x7000, 1 << 40, ret=2)  # failed: nothing allocated
    call("cudaFree", 0xA)
    call("cudaFreeAsync", 0xC, 0)
    call("cudaFree", 0xF)  # never seen allocated
    call("cudaFree", 0)  # cudaFree(NULL) is allowed and frees nothing
    call("pytorch:free", 0xE)
    points = collected(views, clock.tick())
    runtime0 = mem("runtime", 0)
    assert value(points, "cuda.memory.in_use", **runtime0) == 0
    assert value(points, "cuda.memory.allocated", **runtime0) == 1064
    assert value(points, "cuda.memory.freed", **runtime0) == 1064
    assert value(points, "cuda.memory.allocations", **runtime0) == 2
    assert value(points, "cuda.memory.in_use", **mem("runtime", 1)) == 300
    assert value(points, "cuda.memory.in_use", **mem("driver", 0)) == 500
    assert value(points, "cuda.memory.in_use", **mem("pytorch", 1)) == 0
    assert value(points, "cuda.memory.allocated", **mem("pytorch", 1)) == 256
    assert (
        value(
            points,
            "cuda.api.calls",
            **{"cuda.api": "runtime", "cuda.function": "cudaMalloc", "error.type": "cudaErrorMemoryAllocation"},
        )
        == 1
    )
    assert value(points, "cuda.api.calls", **{"cuda.api": "runtime", "cuda.function": "cudaMalloc"}) == 2
    assert views.table.unmatched_frees == 1


def location(device: int, kind: int = 1) -> int:
    """CUmemAllocationProp.location {type, id} as the probe reads it: 8 bytes, little-endian."""
    return (device << 32) | kind


def test_vmm_physical_memory_is_in_use_until_released_and_unmapped(setup: tuple) -> None:
    """PyTorch's expandable segments (unmap, then release) and CUDA's samples' idiom (release right
    after mapping: the memory lives until the unmap), one unmap spanning two mappings."""
    views, call, _, clock = setup
    mib = 1 << 20
    call("cuMemAddressReserve", 0x7000, 64 * mib, 0, 0, 0, out=0x10000000)
    for i, handle in enumerate((0xA1, 0xA2, 0xA3)):  # cuMemCreate(&handle, size, &prop, flags)
        call("cuMemCreate", 0x7000, 2 * mib, 0x7100, 0, 0, 0, location(0), out=handle, where=1)
        call("cuMemMap", 0x10000000 + i * 2 * mib, 2 * mib, 0, handle, 0)
    call("cuMemUnmap", 0x10000000 + 2 * mib, 4 * mib)  # the last two chunks at once
    call("cuMemRelease", 0xA2)
    call("cuMemRelease", 0xA3)
    call("cuMemCreate", 0x7000, 1 * mib, 0x7100, 0, 0, 0, location(1), out=0xB1, where=2)
    call("cuMemMap", 0x20000000, 1 * mib, 0, 0xB1, 0)
    call("cuMemRelease", 0xB1)  # still mapped: still in use
    call("cuMemCreate", 0x7000, 1 << 40, 0x7100, 0, 0, 0, location(0), ret=2)  # out of memory
    call("cuMemCreate", 0x7000, 4096, 0x7100, 0, 0, 0, location(0, kind=2), out=0xC1, where=0)  # on the host
    call("cuMemRelease", 0xD1)  # created before the agent attached
    call("cuMemUnmap", 0x30000000, 4096)  # mapped before the agent attached
    call("cuMemAddressReserve", 0x7000, 8 * mib, 0, 0, 0, out=0x40000000)
    call("cuMemAddressFree", 0x40000000, 8 * mib)
    points = collected(views, clock.tick())
    vmm0, vmm1 = mem("vmm", 0), mem("vmm", 1)
    assert value(points, "cuda.memory.allocated", **vmm0) == 6 * mib
    assert value(points, "cuda.memory.allocations", **vmm0) == 3
    assert value(points, "cuda.memory.freed", **vmm0) == 4 * mib
    assert value(points, "cuda.memory.in_use", **vmm0) == 2 * mib
    assert value(points, "cuda.memory.in_use", **vmm1) == 1 * mib
    assert value(points, "cuda.memory.in_use", **mem("vmm", 0, "pinned_host")) == 4096
    assert value(points, "cuda.memory.mapped", **{"cuda.device": 0}) == 2 * mib
    assert value(points, "cuda.memory.mapped", **{"cuda.device": 1}) == 1 * mib
    assert value(points, "cuda.memory.address_reserved") == 64 * mib
    assert (
        value(
            points,
            "cuda.api.calls",
            **{"cuda.api": "driver", "cuda.function": "cuMemCreate", "error.type": "CUDA_ERROR_OUT_OF_MEMORY"},
        )
        == 1
    )
    assert views.table.unmatched_frees == 1  # the handle made before the agent attached

    call("cuMemUnmap", 0x20000000, 1 * mib)  # its last mapping: the released handle's memory goes
    points = collected(views, clock.tick())
    assert value(points, "cuda.memory.in_use", **vmm1) == 0
    assert value(points, "cuda.memory.mapped", **{"cuda.device": 1}) == 0
    in_use = next(p for p in views.take_profiles(clock.tick()) if p.sample_types[0].type == "inuse_space")
    # the chunk still held, by the stack that created it; the host-located one apart
    assert sorted((key.stack[1].function, values) for key, values in in_use.samples.items()) == [
        ("main", [4096, 1]),
        ("train_step", [2 * mib, 1]),
    ]


def test_vmm_state_is_bounded_and_forgotten_at_exit(setup: tuple) -> None:
    views, call, metrics, clock = setup
    views.vmm.capacity = 1
    call("cuMemCreate", 0x7000, 100, 0x7100, 0, 0, 0, location(0), out=0xA1)
    call("cuMemCreate", 0x7000, 200, 0x7100, 0, 0, 0, location(0), out=0xA2)  # not tracked: table full
    call("cuMemMap", 0x1000, 200, 0, 0xA2, 0)  # nor its mapping (of an unknown handle)
    call("cuMemRelease", 0xA2)  # taken as gone at once
    points = collected(views, clock.tick())
    assert value(points, "cuda.memory.in_use", **mem("vmm", 0)) == 100
    assert value(points, "cuda.memory.mapped", **{"cuda.device": 0}) is None
    untracked = {tuple(o.attributes.items()): o.value for o in metrics.observe("otel_ebpf.gpu.allocations.untracked")}
    assert untracked[(("reason", "vmm_table_full"),)] == 1
    views.processes_exited([PID], clock.tick())
    call("cuMemRelease", 0xA1)  # a new process reusing the pid: nothing known of it
    assert views.table.unmatched_frees == 1


def test_managed_pinned_host_and_pool_memory(setup: tuple) -> None:
    """Managed and pinned host memory are kinds of their own (cuda.memory.kind), never summed into
    device memory; pool allocations are device memory, freed by cudaFreeAsync."""
    views, call, _, clock = setup
    call("cudaMallocManaged", 0x7000, 1000, 1, out=0xA)  # cudaMemAttachGlobal
    call("cudaMallocHost", 0x7000, 200, out=0xB)
    call("cudaSetDevice", 1)
    call("cudaHostAlloc", 0x7000, 300, 0, out=0xC)  # pinned host memory of device 1's context
    call("cuMemAllocManaged", 0x7000, 50, 1, out=0xD)
    call("cuMemHostAlloc", 0x7000, 60, 0, out=0xE)
    call("cuMemAllocHost_v2", 0x7000, 70, out=0xF)
    call("cudaMallocFromPoolAsync", 0x7000, 400, 0x99, 0, out=0x10)
    call("cuMemAllocFromPoolAsync", 0x7000, 80, 0x99, 0, out=0x11)
    call("cudaMallocHost", 0x7000, 1 << 40, ret=2)
    call("cudaFree", 0xA)  # managed memory is freed by cudaFree
    call("cudaFreeHost", 0xB)
    call("cuMemFreeHost", 0xE)
    call("cudaFreeAsync", 0x10, 0)
    points = collected(views, clock.tick())
    expected = {
        ("runtime", 0, "managed"): (1000, 0),
        ("runtime", 0, "pinned_host"): (200, 0),
        ("runtime", 1, "pinned_host"): (300, 300),
        ("driver", 1, "managed"): (50, 50),
        ("driver", 1, "pinned_host"): (130, 70),
        ("runtime", 1, "device"): (400, 0),
        ("driver", 1, "device"): (80, 80),
    }
    for (api, device, kind), (allocated, in_use) in expected.items():
        assert value(points, "cuda.memory.allocated", **mem(api, device, kind)) == allocated, (api, device, kind)
        assert value(points, "cuda.memory.in_use", **mem(api, device, kind)) == in_use, (api, device, kind)
    assert len(points["cuda.memory.in_use"]) == len(expected)
    in_use: dict[str, int] = {}
    for profile in views.take_profiles(clock.tick()):
        if profile.sample_types[0].type == "inuse_space":
            for key, values in profile.samples.items():
                kind = dict(key.attributes)["cuda.memory.kind"]
                in_use[kind] = in_use.get(kind, 0) + values[0]
    assert in_use == {"pinned_host": 370, "managed": 50, "device": 80}


def test_copies_by_direction_and_waits(setup: tuple) -> None:
    views, call, _, clock = setup
    for kind, size in ((0, 1), (1, 10), (2, 20), (3, 30), (4, 40)):
        call("cudaMemcpy", 0, 0, size, kind, duration=0.002)
    call("cudaMemcpyAsync", 0, 0, 50, 1, 0)
    call("cuMemcpyDtoH_v2", 0, 0, 60)
    call("cuMemcpyHtoDAsync_v2", 0, 0, 70, 0)
    call("cudaMemcpy", 0, 0, 99, 1, ret=1)  # failed: no bytes moved
    call("cudaStreamSynchronize", 0, duration=0.25)
    call("cudaDeviceSynchronize", duration=0.5)
    call("cudaLaunchKernel", 0x1234)
    call("cuLaunchKernelEx", 0, 0)
    call("cuLaunchKernel", 0, ret=400)  # failed launch: counted as a call with its error, not a launch
    points = collected(views, clock.tick())

    def copy(api: str, direction: str, sync: bool) -> Any:
        return value(
            points,
            "cuda.memcpy.size",
            **{"cuda.api": api, "cuda.memcpy.direction": direction, "cuda.memcpy.synchronous": sync},
        )

    assert copy("runtime", "host_to_host", True) == (1, 1)
    assert copy("runtime", "host_to_device", True) == (1, 10)
    assert copy("runtime", "device_to_host", True) == (1, 20)
    assert copy("runtime", "device_to_device", True) == (1, 30)
    assert copy("runtime", "default", True) == (1, 40)
    assert copy("runtime", "host_to_device", False) == (1, 50)
    assert copy("driver", "device_to_host", True) == (1, 60)
    assert copy("driver", "host_to_device", False) == (1, 70)
    assert value(
        points,
        "cuda.memcpy.duration",
        **{"cuda.api": "runtime", "cuda.memcpy.direction": "default", "cuda.memcpy.synchronous": True},
    ) == (1, 0.002)
    assert value(points, "cuda.synchronize.duration", **{"cuda.function": "cudaDeviceSynchronize"}) == (1, 0.5)
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime"}) == 1
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "driver"}) == 1
    assert (
        value(
            points,
            "cuda.api.calls",
            **{"cuda.api": "driver", "cuda.function": "cuLaunchKernel", "error.type": "CUDA_ERROR_INVALID_HANDLE"},
        )
        == 1
    )
    waits = {
        key.attributes: values
        for p in views.take_profiles(clock.tick())
        if p.sample_types[0].type == "wait_time"
        for key, values in p.samples.items()
    }
    # synchronous copies count as waits too (the CPU waited for them), asynchronous ones do not
    assert waits[(("cuda.function", "cudaDeviceSynchronize"),)] == [500_000_000, 1]
    assert waits[(("cuda.function", "cudaMemcpy"),)] == [5 * 2_000_000, 5]
    assert (("cuda.function", "cudaMemcpyAsync"),) not in waits


@pytest.mark.parametrize(
    "symbol",
    ["ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter", "ncclSend", "ncclRecv"],
)
def test_collective_bytes_are_count_times_datatype_size(setup: tuple, symbol: str) -> None:
    views, call, _, clock = setup
    call("ncclCommInitRank", 0x5000, 8, 3, out=0xC0)  # rank 3 of 8: the id is passed in memory
    spec = BY_SYMBOL[symbol]
    for dtype in NCCL_DATATYPES:
        args = [0] * 7
        args[spec.size_arg] = 1000 + dtype
        args[spec.dtype_arg] = dtype
        args[spec.comm_arg] = 0xC0
        call(symbol, *args)
    points = collected(views, clock.tick())
    operation = symbol.removeprefix("nccl")
    for dtype, (name, size) in NCCL_DATATYPES.items():
        attrs = {"nccl.operation": operation, "nccl.datatype": name, "nccl.rank": 3, "nccl.comm.size": 8}
        assert value(points, "nccl.operation.size", **attrs) == (1, (1000 + dtype) * size), name
    assert value(
        points, "nccl.operations", **{"nccl.operation": operation, "nccl.rank": 3, "nccl.comm.size": 8}
    ) == len(NCCL_DATATYPES)
    assert value(points, "nccl.operations", **{"nccl.operation": "CommInitRank", "nccl.rank": 3}) == 1


def test_nccl_errors_groups_and_unknown_communicators(setup: tuple) -> None:
    views, call, _, clock = setup
    call("ncclGroupStart")
    call("ncclAllReduce", 0, 0, 10, 7, 0, 0xDEAD)  # a communicator initialised before the agent: no rank
    call("ncclAllReduce", 0, 0, 10, 99, 0, 0xDEAD, ret=4)
    call("ncclGroupEnd")
    call("ncclCommInitRank", 0x5000, 2, 0, ret=1)
    call("ncclCommInitRank", 0x5000, 2, 1, out=0xC1)
    call("ncclCommDestroy", 0xC1)
    call("ncclSend", 0, 5, 7, 1, 0xC1)  # after destroy: rank no longer known
    points = collected(views, clock.tick())
    assert value(points, "nccl.operation.size", **{"nccl.operation": "AllReduce", "nccl.datatype": "float32"}) == (
        1,
        40,
    )
    assert value(points, "nccl.operations", **{"nccl.operation": "AllReduce", "error.type": "ncclInvalidArgument"}) == 1
    assert value(points, "nccl.operations", **{"nccl.operation": "GroupStart"}) == 1
    assert (
        value(points, "nccl.operations", **{"nccl.operation": "CommInitRank", "error.type": "ncclUnhandledCudaError"})
        == 1
    )
    assert value(points, "nccl.operations", **{"nccl.operation": "CommDestroy"}) == 1
    assert value(points, "nccl.operation.size", **{"nccl.operation": "Send", "nccl.datatype": "float32"}) == (1, 20)


def test_profiles_have_explicit_types_and_in_use_is_a_snapshot(setup: tuple) -> None:
    views, call, _, clock = setup
    call("cudaMalloc", 0, 100, out=0xA, where=1)
    call("cudaMalloc", 0, 40, out=0xB, where=2)
    call("cudaFree", 0xA)
    call("cudaLaunchKernel", 0, where=1)
    call("cudaLaunchKernel", 0, where=1)
    profiles = views.take_profiles(clock.tick())
    types = {p.period_type.type: p for p in profiles}
    assert set(types) == {"cuda_memory_allocated", "cuda_memory_in_use", "cuda_launch"}
    for name, (samples, period) in PROFILE_TYPES.items():
        assert period.unit and all(v.unit in ("bytes", "count", "nanoseconds") for v in samples), name
    allocated = types["cuda_memory_allocated"]
    assert allocated.sample_types == PROFILE_TYPES["allocated"][0] and allocated.total(0) == 140
    in_use = types["cuda_memory_in_use"]
    assert [(key.stack[1].function, values) for key, values in in_use.samples.items()] == [("leaky", [40, 1])]
    assert types["cuda_launch"].total(0) == 2
    again = {p.period_type.type: p for p in views.take_profiles(clock.tick())}
    assert set(again) == {"cuda_memory_in_use"}  # only what is still live


def test_leak_reports_name_the_program_frame_not_the_framework(setup: tuple) -> None:
    views, call, metrics, clock = setup
    call("cudaMalloc", 0, 1 << 20, out=0x1, where=0)  # "weights": once
    records = []
    for i in range(12):
        call("cudaMalloc", 0, 4096, out=0x100 + i, where=3)  # leaky -> torch empty -> cudaMalloc
        clock.tick(0.1)
        records += views.check_leaks(clock.ns)
    assert records
    last = records[-1]
    attributes = dict(last.log_record.attributes)
    assert attributes["code.function.name"] == "leaky" and attributes["code.file.path"] == "/srv/train.py"
    assert attributes["cuda.memory.leak.allocations"] == len(records) + 1
    assert attributes["cuda.memory.leak.size"] == attributes["cuda.memory.leak.allocations"] * 4096
    assert attributes["cuda.api"] == "runtime" and attributes["cuda.device"] == 0
    assert "torch/_tensor.py" in attributes["code.stacktrace"]
    assert last.log_record.event_name == "cuda.memory.leak" and last.log_record.severity_text == "WARN"
    assert "leaky (/srv/train.py:1)" in last.log_record.body
    assert last.resource.attributes["process.pid"] == PID
    assert metrics.total("otel_ebpf.gpu.leaks.reported") == len(records)


def test_process_exit_gives_its_state_at_exit_then_forgets_it(setup: tuple) -> None:
    """What an exiting process still held is its leak report: exported at exit, labelled, with the
    allocating stacks; its samples of the other views come along; nothing is left for the interval."""
    views, call, _, clock = setup
    call("cudaMalloc", 0, 100, out=0xA, where=3)
    call("cudaMalloc", 0, 300, out=0xB, where=3)
    call("cudaMalloc", 0, 50, out=0xC, where=0)
    call("cudaFree", 0xC)
    call("cudaLaunchKernel", 0)
    profiles = views.processes_exited([PID], clock.tick())
    by_view = {p.period_type.type: p for p in profiles}
    assert set(by_view) == {"cuda_memory_in_use", "cuda_memory_allocated", "cuda_launch"}
    in_use = by_view["cuda_memory_in_use"]
    assert in_use.total(0) == 400 and in_use.total(1) == 2
    ((key, values),) = in_use.samples.items()
    assert dict(key.attributes) == {"otel_ebpf.process.exited": True, "cuda.memory.kind": "device"}
    assert values == [400, 2]
    assert "leaky" in [f.function for f in key.stack]
    assert in_use.resource["process.pid"] == PID
    assert by_view["cuda_memory_allocated"].total(0) == 450
    assert len(views.table) == 0
    assert views.take_profiles(clock.tick()) == []  # flushed at exit: nothing twice


def test_delta_temporality_restarts_counters(setup: tuple) -> None:
    views = GpuViews(
        stack_of,
        resource_of,
        SelfMetrics(),
        GpuViewsConfig(),
        frozenset({InstrumentKind.COUNTER, InstrumentKind.HISTOGRAM}),
    )
    clock = Clock()
    call = Calls(views, clock)
    call("cudaLaunchKernel", 0)
    assert value(collected(views, clock.tick()), "cuda.kernel.launches", **{"cuda.api": "runtime"}) == 1
    call("cudaMalloc", 0, 10, out=0xA)
    points = collected(views, clock.tick())
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime"}) is None
    assert value(points, "cuda.memory.in_use", **mem("runtime", 0)) == 10


def test_error_names_and_stack_text() -> None:
    from otel_ebpf.gpu.calls import Library

    assert error_name(Library.RUNTIME, 35) == "cudaErrorInsufficientDriver"
    assert error_name(Library.DRIVER, 2) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert error_name(Library.NCCL, 4) == "ncclInvalidArgument"
    assert error_name(Library.NCCL, 12345) == "12345"
    text = format_stack((Frame("cudaMalloc", module="/lib/libcudart.so.12"), py("leaky", line=9)))
    assert text == "  at cudaMalloc /lib/libcudart.so.12\n  at leaky (/srv/train.py:9)"
    assert all(spec.kind in Kind for spec in OPS.values())


def test_collectives_under_a_request_become_child_spans() -> None:
    from otel_ebpf.gpu.spans import collective_span

    def nccl(symbol: str, *args: int, ret: int = 0) -> GpuCall:
        return GpuCall(5 * S, 2000, PID, 7, BY_SYMBOL[symbol].op, ret, tuple(args) + (0,) * (7 - len(args)))

    span = collective_span(nccl("ncclAllReduce", 0, 0, 512, 9, 0, 0xC0), (0xABC, 0xDEF), resource_of(PID), (1, 4))
    assert span.name == "nccl AllReduce" and span.parent.span_id == 0xDEF
    assert span.context.trace_id == 0xABC and span.context.span_id not in (0, 0xDEF)
    assert (span.start_time, span.end_time) == (5 * S, 5 * S + 2000)
    assert dict(span.attributes) == {
        "nccl.operation": "AllReduce",
        "nccl.datatype": "bfloat16",
        "nccl.operation.size": 1024,
        "nccl.rank": 1,
        "nccl.comm.size": 4,
        "thread.id": 7,
    }
    again = collective_span(nccl("ncclAllReduce", 0, 0, 512, 9, 0, 0xC0), (0xABC, 0xDEF), resource_of(PID))
    assert again.context.span_id == span.context.span_id  # derived from the call: replays agree
    failed = collective_span(nccl("ncclSend", 0, 5, 99, 1, 0xC0, ret=4), (1, 2), resource_of(PID))
    assert failed.status.status_code.name == "ERROR" and failed.attributes["error.type"] == "ncclInvalidArgument"
    assert collective_span(nccl("ncclGroupEnd"), (1, 2), resource_of(PID)).name == "nccl GroupEnd"
    assert collective_span(nccl("ncclCommInitRank", 0, 2, 0), (1, 2), resource_of(PID)) is None
    assert collective_span(nccl("cudaMalloc", 0, 2), (1, 2), resource_of(PID)) is None


def test_runtime_launches_are_named_after_the_kernel_their_host_stub_is_named_after() -> None:
    stubs = {0x1000: "void at::native::vectorized_elementwise_kernel<float>(int, float*)", 0x2000: "gemm(float*)"}
    asked: list[tuple[int, int]] = []

    def kernel_name_of(pid: int, address: int) -> str | None:
        asked.append((pid, address))
        return stubs.get(address)

    clock = Clock()
    views = GpuViews(stack_of, resource_of, SelfMetrics(), kernel_name_of=kernel_name_of)
    call = Calls(views, clock)
    for address in (0x1000, 0x1000, 0x2000, 0x3000):  # 0x3000: no symbol there
        call("cudaLaunchKernel", address)
    call("cuLaunchKernel", 0x1000)  # a driver launch names a CUfunction handle, not a stub
    assert asked == [(PID, 0x1000), (PID, 0x1000), (PID, 0x2000), (PID, 0x3000)]
    points = collected(views, clock.tick())
    elementwise, gemm = stubs[0x1000], stubs[0x2000]
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime", "cuda.kernel.name": elementwise}) == 2
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime", "cuda.kernel.name": gemm}) == 1
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime"}) == 1
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "driver"}) == 1
    (launches,) = [p for p in views.take_profiles(clock.tick()) if p.period_type.type == "cuda_launch"]
    by_name: dict[str | None, int] = {}
    for key, values in launches.samples.items():
        name = dict(key.attributes).get("cuda.kernel.name")
        by_name[name] = by_name.get(name, 0) + values[0]
    assert by_name == {elementwise: 2, gemm: 1, None: 2}
