"""Driver launches named by the calls that made their handles, graph launches with their kernel
counts (otel_ebpf/gpu/launches.py, through otel_ebpf/gpu/views.py), and the named return record
the probe decodes — from synthetic calls and records."""

from __future__ import annotations

import struct

from otel_ebpf.gpu.calls import BY_SYMBOL, GpuCall
from otel_ebpf.gpu.launches import GraphKernels, HandleTable, KernelNames
from otel_ebpf.gpu.views import GpuViews
from otel_ebpf.probes import gpu_records
from otel_ebpf.selfmetrics import SelfMetrics
from tests.gpu.test_views import PID, Calls, Clock, collected, resource_of, stack_of, value

FLASH = "_ZN5flash16flash_fwd_kernelEPKfS1_Pf"
FLASH_NAME = "flash::flash_fwd_kernel(float const*, float const*, float*)"


def _views() -> tuple[GpuViews, Calls, SelfMetrics, Clock]:
    metrics, clock = SelfMetrics(), Clock()
    views = GpuViews(stack_of, resource_of, metrics)
    return views, Calls(views, clock), metrics, clock


def _named(views: GpuViews, clock: Clock, symbol: str, handle: int, name: str, ret: int = 0) -> None:
    """A call that makes ``handle`` for the kernel ``name`` (its return record carried the name)."""
    args = (0xA0, 0, 0xB0, 0, 0, 0, 0)
    views.handle(GpuCall(clock.tick(), 1000, PID, PID, BY_SYMBOL[symbol].op, ret, args, handle, name=name))


def test_driver_launches_carry_the_demangled_name_their_handle_was_made_with() -> None:
    views, call, _, clock = _views()
    _named(views, clock, "cuModuleGetFunction", 0xF1, FLASH)
    _named(views, clock, "cuLibraryGetKernel", 0xC1, "triton_poi_fused_add_0")  # a C name stays as it is
    call("cuKernelGetFunction", 0, 0xC1, out=0xF2)  # a CUfunction for the named CUkernel
    call("cuKernelGetFunction", 0, 0xDEAD, out=0xF3)  # of a CUkernel never named: unnamed
    _named(views, clock, "cuModuleGetFunction", 0xF4, "_Zbogus")  # not a valid mangled name: kept
    _named(views, clock, "cuModuleGetFunction", 0, "_ZN1x1yEv", ret=500)  # failed: names nothing
    for handle in (0xF1, 0xF1, 0xC1, 0xF2, 0xF3, 0xF4, 0x999):
        call("cuLaunchKernel", handle)
    call("cuLaunchKernelEx", 0x7777, 0xF1)  # the CUfunction is the second argument
    points = collected(views, clock.tick())
    launches = {a.get("cuda.kernel.name"): v for a, v in points["cuda.kernel.launches"] if a["cuda.api"] == "driver"}
    assert launches == {FLASH_NAME: 3, "triton_poi_fused_add_0": 2, "_Zbogus": 1, None: 2}
    (profile,) = [p for p in views.take_profiles(clock.tick()) if p.period_type.type == "cuda_launch"]
    assert (
        sum(v[0] for k, v in profile.samples.items() if dict(k.attributes).get("cuda.kernel.name") == FLASH_NAME) == 3
    )


def test_graph_launches_carry_the_kernel_nodes_of_the_graph_at_instantiation() -> None:
    views, call, _, clock = _views()
    call("cudaGraphCreate", 0, out=0x61)
    for _ in range(3):
        call("cudaGraphAddKernelNode", 0, 0x61)
    call("cudaGraphAddKernelNode", 0, 0x61, ret=1)  # failed: no node
    call("cudaGraphInstantiate", 0, 0x61, out=0xE1)
    call("cudaGraphAddKernelNode", 0, 0x61)  # after instantiation: not in that exec
    call("cuGraphCreate", 0, out=0x62)
    call("cuGraphAddKernelNode_v2", 0, 0x62)
    call("cuGraphAddChildGraphNode", 0, 0x62)  # a child graph: its kernels are not counted
    call("cuGraphInstantiateWithFlags", 0, 0x62, out=0xE2)
    call("cudaGraphInstantiate", 0, 0x63, out=0xE3)  # a graph never seen created (stream capture)
    for graph_exec, times in ((0xE1, 4), (0xE2, 2), (0xE3, 1)):
        for _ in range(times):
            call("cudaGraphLaunch", graph_exec)
    call("cuGraphLaunch", 0xE1)
    points = collected(views, clock.tick())
    assert value(points, "cuda.graph.launches", **{"cuda.api": "runtime", "cuda.graph.kernel_nodes": 3}) == 4
    assert value(points, "cuda.graph.launches", **{"cuda.api": "driver", "cuda.graph.kernel_nodes": 3}) == 1
    assert value(points, "cuda.graph.launches", **{"cuda.api": "runtime"}) == 3
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime"}) is None  # not kernel launches
    (profile,) = [p for p in views.take_profiles(clock.tick()) if p.period_type.type == "cuda_launch"]
    kinds: dict[tuple, int] = {}
    for key, values in profile.samples.items():
        kinds[tuple(sorted(key.attributes))] = kinds.get(tuple(sorted(key.attributes)), 0) + values[0]
    assert kinds == {
        (("cuda.graph.kernel_nodes", 3), ("cuda.launch.kind", "graph")): 5,
        (("cuda.launch.kind", "graph"),): 3,
    }
    # a destroyed exec (or graph) is forgotten: a handle reused later is not taken for it
    call("cudaGraphExecDestroy", 0xE1)
    call("cudaGraphLaunch", 0xE1)
    call("cudaGraphDestroy", 0x61)
    call("cudaGraphInstantiate", 0, 0x61, out=0xE4)
    call("cudaGraphLaunch", 0xE4)
    points = collected(views, clock.tick())
    assert value(points, "cuda.graph.launches", **{"cuda.api": "runtime"}) == 5


def test_handle_tables_are_bounded_count_evictions_and_forget_exited_processes() -> None:
    names = KernelNames(capacity=2)
    for handle in (1, 2, 3):
        names.named(PID, handle, f"k{handle}")
    assert (names.of(PID, 1), names.of(PID, 3), names.table.evicted) == (None, "k3", 1)
    graphs = GraphKernels(capacity=1)
    graphs.created(PID, 10)
    graphs.created(PID, 11)  # 10 evicted: unknown from now on, never wrong
    graphs.kernel_added(PID, 10)
    graphs.instantiated(PID, 10, 20)
    assert (graphs.kernels_of(PID, 20), graphs.graphs.evicted) == (None, 1)
    table: HandleTable[int] = HandleTable()
    table.put((1, 5), 0)
    table.put((2, 5), 7)
    table.forget_processes({1})
    assert (table.get((1, 5)), table.get((2, 5)), len(table)) == (None, 7, 1)


def test_evictions_are_self_metrics_and_exit_forgets_handles() -> None:
    views, call, metrics, clock = _views()
    views.kernel_names = KernelNames(capacity=1)
    _named(views, clock, "cuModuleGetFunction", 0xF1, FLASH)
    _named(views, clock, "cuModuleGetFunction", 0xF2, FLASH)
    collected(views, clock.tick())
    assert metrics.total("otel_ebpf.gpu.handles.evicted") == 1
    call("cuGraphCreate", 0, out=0x61)
    call("cuGraphInstantiateWithFlags", 0, 0x61, out=0xE1)
    views.processes_exited([PID], clock.tick())
    assert views.kernel_names.of(PID, 0xF2) is None and views.graphs.kernels_of(PID, 0xE1) is None


def test_a_named_return_record_decodes_with_its_name() -> None:
    header = struct.pack(
        "<QQIIIiIiQ", 1_000, 250, 10, 11, 43, 0, gpu_records.FLAG_RETURN | gpu_records.FLAG_NAME, 0, 0xF1
    )
    name = FLASH.encode() + b"\0" + b"\xff" * (gpu_records.KERNEL_NAME_LEN - len(FLASH) - 1)  # after the NUL: junk
    ret = gpu_records.decode(header + name, 5_000, 4)
    assert ret == gpu_records.CallReturn(6_000, 10, 11, 43, 0, 250, 0xF1, FLASH)
    pairing = gpu_records.CallPairing()
    entry = gpu_records.decode(
        struct.pack("<QQIIIiIi", 1_000, 0, 10, 11, 43, 0, gpu_records.FLAG_ENTRY, 0)
        + struct.pack("<7QQ", *[0] * 8)
        + b"\0" * (8 * gpu_records.USER_FRAMES)
        + struct.pack("<II", 0, 0),
        5_000,
        4,
    )
    pairing.entry(entry)
    assert pairing.complete(ret).name == FLASH
    # a plain return record of the same call (it failed: no name was read) has none
    plain = struct.pack("<QQIIIiIiQ", 1_000, 250, 10, 11, 43, 500, gpu_records.FLAG_RETURN, 0, 0)
    assert gpu_records.decode(plain, 0, 4).name == ""


def test_kernels_launched_on_a_capturing_stream_become_the_captured_graphs_kernel_nodes() -> None:
    views, call, _, clock = _views()
    stream, other = 0x5157, 0x0711
    call("cudaStreamBeginCapture", stream)
    for _ in range(2):  # the stream is cudaLaunchKernel's 8th argument, read into args[6]
        call("cudaLaunchKernel", 0x1000, 0, 0, 0, 0, 0, stream)
    call("cuLaunchKernelEx", 0, 0xF1, 0, 0, 0, 0, stream)
    call("cuLaunchKernel", 0xF1, 0, 0, 0, 0, 0, other)  # another stream: runs now
    call("cudaStreamEndCapture", stream, out=0x61)
    call("cudaLaunchKernel", 0x1000, 0, 0, 0, 0, 0, stream)  # after the capture: runs now
    call("cudaGraphInstantiate", 0, 0x61, out=0xE1)
    call("cudaGraphLaunch", 0xE1)
    # a capture that failed (invalidated) makes no graph, and ends
    call("cuStreamBeginCapture_v2", stream)
    call("cuStreamEndCapture", stream, ret=901)
    call("cuLaunchKernel", 0xF1, 0, 0, 0, 0, 0, stream)
    # a capture begun before the agent attached: its graph's count is unknown
    call("cuStreamEndCapture", other, out=0x62)
    call("cuGraphInstantiateWithFlags", 0, 0x62, out=0xE2)
    call("cuGraphLaunch", 0xE2)
    points = collected(views, clock.tick())
    captured = {"cuda.launch.kind": "captured"}
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime", **captured}) == 2
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "driver", **captured}) == 1
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "runtime"}) == 1
    assert value(points, "cuda.kernel.launches", **{"cuda.api": "driver"}) == 2
    assert value(points, "cuda.graph.launches", **{"cuda.api": "runtime", "cuda.graph.kernel_nodes": 3}) == 1
    assert value(points, "cuda.graph.launches", **{"cuda.api": "driver"}) == 1


def test_an_exec_forgets_the_old_images_handles() -> None:
    views, call, _, clock = _views()
    _named(views, clock, "cuModuleGetFunction", 0xF1, FLASH)
    call("cuGraphCreate", 0, out=0x61)
    call("cuGraphInstantiateWithFlags", 0, 0x61, out=0xE1)
    views.image_replaced(PID)
    assert views.kernel_names.of(PID, 0xF1) is None and views.graphs.kernels_of(PID, 0xE1) is None
