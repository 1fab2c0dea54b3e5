"""GPU calls become metrics, profiles by stack, and leak reports — a pure function of the calls.

:class:`GpuViews` takes decoded :class:`~otel_ebpf.gpu.calls.GpuCall` records in order and keeps:

- metric series per process (``cuda.*`` and ``nccl.*``, see :data:`INSTRUMENTS`),
- one :class:`~otel_ebpf.profiles.model.ProfileBuilder` per view (allocated bytes, in-use bytes,
  copies, waits, launches, collectives), each with explicit sample types and a ``period_type`` so
  that Pyroscope names them,
- the live allocations (:mod:`.memory`), from which in-use bytes and leak reports come.

What it cannot know by itself comes in through two callables: ``stack_of(call)`` turns a call's
raw stacks into frames (symbolization reads ELF files and process memory), ``resource_of(pid)``
gives a process's resource attributes. Tests pass plain functions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.metrics.export import ResourceMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import __version__
from ..pipeline.events import EXITED
from ..pipeline.metrics import ProcessMetrics
from ..profiles.model import Frame, FrameKind, Profile, ProfileBuilder, Stack, ValueType
from ..protocol import Attributes, AttributeValue, InstrumentKind, InstrumentSpec, MetricPoint
from ..selfmetrics import SelfMetrics
from .calls import MEMCPY_KINDS, NCCL_DATATYPES, GpuCall, Kind, Library, Memory, error_name
from .launches import GraphKernels, KernelNames
from .memory import Allocation, AllocationTable, LeakReport, LeakReporter
from .vmm import VirtualMemory

SCOPE = InstrumentationScope("otel_ebpf.gpu", __version__)
_BYTES_BUCKETS = tuple(float(4**i) for i in range(3, 17))  # 64 B .. 4 GiB
_SECONDS_BUCKETS = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
_H, _C, _U = InstrumentKind.HISTOGRAM, InstrumentKind.COUNTER, InstrumentKind.UP_DOWN_COUNTER
INSTRUMENTS: dict[str, InstrumentSpec] = {
    spec.name: spec
    for spec in (
        InstrumentSpec("cuda.api.calls", _C, "{call}", "Probed CUDA calls, by function and error"),
        InstrumentSpec("cuda.memory.allocated", _C, "By", "Memory allocated, by kind (device, managed, pinned host)"),
        InstrumentSpec("cuda.memory.freed", _C, "By", "Memory freed (of allocations the agent saw)"),
        InstrumentSpec("cuda.memory.allocations", _C, "{allocation}", "Successful memory allocations"),
        InstrumentSpec("cuda.memory.in_use", _U, "By", "Memory allocated and not yet freed, by kind"),
        InstrumentSpec("cuda.memory.mapped", _U, "By", "Physical memory (cuMemCreate) mapped into address ranges"),
        InstrumentSpec(
            "cuda.memory.address_reserved", _U, "By", "Virtual address space reserved (cuMemAddressReserve)"
        ),
        InstrumentSpec("cuda.memcpy.size", _H, "By", "Bytes per memory copy", _BYTES_BUCKETS),
        InstrumentSpec(
            "cuda.memcpy.duration", _H, "s", "Time in the copy call (the whole copy when synchronous)", _SECONDS_BUCKETS
        ),
        InstrumentSpec(
            "cuda.synchronize.duration", _H, "s", "Time the CPU waited in a synchronize call", _SECONDS_BUCKETS
        ),
        InstrumentSpec("cuda.kernel.launches", _C, "{launch}", "Kernel launches"),
        InstrumentSpec(
            "cuda.graph.launches", _C, "{launch}", "Graph launches, by the graph's kernel nodes where known"
        ),
        InstrumentSpec(
            "nccl.operation.size", _H, "By", "Bytes per NCCL operation (count x datatype size)", _BYTES_BUCKETS
        ),
        InstrumentSpec(
            "nccl.operation.duration", _H, "s", "Time to enqueue an NCCL operation (the call itself)", _SECONDS_BUCKETS
        ),
        InstrumentSpec("nccl.operations", _C, "{operation}", "NCCL calls, by operation, rank and error"),
    )
}

# Profile views: sample types, period type (Pyroscope names non-CPU profiles after it)
BYTES, COUNT, NANOS = "bytes", "count", "nanoseconds"
PROFILE_TYPES: dict[str, tuple[tuple[ValueType, ...], ValueType]] = {
    "allocated": (
        (ValueType("alloc_space", BYTES), ValueType("alloc_objects", COUNT)),
        ValueType("cuda_memory_allocated", BYTES),
    ),
    "in_use": (
        (ValueType("inuse_space", BYTES), ValueType("inuse_objects", COUNT)),
        ValueType("cuda_memory_in_use", BYTES),
    ),
    "copies": (
        (ValueType("memcpy_space", BYTES), ValueType("memcpy_time", NANOS), ValueType("memcpy_calls", COUNT)),
        ValueType("cuda_memcpy", BYTES),
    ),
    "waits": ((ValueType("wait_time", NANOS), ValueType("waits", COUNT)), ValueType("cuda_wait", NANOS)),
    "launches": ((ValueType("launches", COUNT),), ValueType("cuda_launch", COUNT)),
    "collectives": (
        (ValueType("nccl_space", BYTES), ValueType("nccl_enqueue_time", NANOS), ValueType("nccl_calls", COUNT)),
        ValueType("nccl", BYTES),
    ),
}

StackOf = Callable[[GpuCall], Stack]
ResourceOf = Callable[[int], Attributes]
KernelNameOf = Callable[[int, int], str | None]
MAX_THREADS = 65536  # per-thread current device remembered
MAX_COMMS = 4096  # NCCL communicators remembered
VMM = "vmm"  # the memory layer (cuda.api) of physical memory made by cuMemCreate
_VMM_KINDS = frozenset(
    (Kind.PHYSICAL_CREATE, Kind.PHYSICAL_RELEASE, Kind.ADDRESS_RESERVE, Kind.ADDRESS_FREE, Kind.MAP, Kind.UNMAP)
)
_HANDLE_KINDS = frozenset(
    (
        Kind.KERNEL_NAME,
        Kind.KERNEL_FUNCTION,
        Kind.GRAPH_CREATE,
        Kind.GRAPH_ADD_KERNEL,
        Kind.GRAPH_ADD_OPAQUE,
        Kind.GRAPH_INSTANTIATE,
        Kind.GRAPH_DESTROY,
        Kind.GRAPH_EXEC_DESTROY,
        Kind.CAPTURE_BEGIN,
    )
)
CU_MEM_LOCATION_TYPE_DEVICE = 1


@dataclass(frozen=True)
class GpuViewsConfig:
    leak_age_ns: int = 60_000_000_000
    leak_min_count: int = 2
    max_allocations: int = 1_000_000
    max_stacks: int = 10_000  # distinct stacks per profile view per interval
    max_leak_reports: int = 100  # log records per leak check


class GpuViews:
    """Aggregates GPU calls; see the module doc."""

    def __init__(
        self,
        stack_of: StackOf,
        resource_of: ResourceOf,
        selfmetrics: SelfMetrics,
        config: GpuViewsConfig = GpuViewsConfig(),
        delta_kinds: frozenset[InstrumentKind] = frozenset(),
        kernel_name_of: KernelNameOf | None = None,
    ) -> None:
        """``kernel_name_of(pid, address)``: the (demangled) name of the function at ``address`` in
        process ``pid``, None when no symbol is known: names a runtime launch's kernel (a driver
        launch's comes from the calls that made its handle, :mod:`.launches`)."""
        self._stack_of = stack_of
        self._kernel_name_of = kernel_name_of
        self._resource_of = resource_of
        self._selfmetrics = selfmetrics
        self.config = config
        self._delta_kinds = delta_kinds
        self.table = AllocationTable(config.max_allocations)
        self.vmm = VirtualMemory(config.max_allocations)
        self.kernel_names = KernelNames()
        self.graphs = GraphKernels()
        self._leaks = LeakReporter()
        self._metrics: dict[int, ProcessMetrics] = {}
        self._profiles = {
            name: ProfileBuilder(samples, period, 1, config.max_stacks)
            for name, (samples, period) in PROFILE_TYPES.items()
        }
        self._devices: OrderedDict[tuple[int, int], int] = OrderedDict()  # (pid, tid) -> current device
        self._comms: OrderedDict[tuple[int, int], tuple[int, int]] = OrderedDict()  # (pid, comm) -> (rank, n)
        self._reported_drops = {name: 0 for name in self._profiles}
        self._reported_table = (0, 0, 0, 0)
        self._reported_handles = (0, 0, 0, 0)
        self._now_ns = 0

    # ---- input -------------------------------------------------------------------------------

    def handle(self, call: GpuCall) -> None:
        self._now_ns = call.ts_ns  # metric series start at their first call
        spec = call.spec
        kind = spec.kind
        if kind is Kind.COLLECTIVE or kind is Kind.GROUP or kind is Kind.COMM_INIT or kind is Kind.COMM_DESTROY:
            self._nccl(call)
            return
        if not spec.usdt:
            attributes = {"cuda.function": spec.symbol, "cuda.api": spec.library.value}
            if not call.ok:
                attributes["error.type"] = error_name(spec.library, call.ret)
            self._record(call.pid, "cuda.api.calls", 1, attributes)
        if kind is Kind.ALLOC:
            self._alloc(call)
        elif kind is Kind.FREE:
            self._free(call)
        elif kind is Kind.CAPTURE_END:  # a failed one ends the capture too
            self.graphs.capture_ended(call.pid, call.arg(spec.stream_arg), call.out if call.ok else 0)
        elif not call.ok:
            return
        elif kind in _VMM_KINDS:
            self._vmm(call)
        elif kind is Kind.COPY:
            self._copy(call)
        elif kind is Kind.SYNC:
            self._record(call.pid, "cuda.synchronize.duration", call.duration_ns / 1e9, {"cuda.function": spec.symbol})
            self._profile("waits", call, (call.duration_ns, 1), {"cuda.function": spec.symbol})
        elif kind is Kind.LAUNCH:
            self._launch(call)
        elif kind is Kind.GRAPH_LAUNCH:
            self._graph_launch(call)
        elif kind in _HANDLE_KINDS:
            self._handle(call)
        elif kind is Kind.SET_DEVICE:
            self._remember(self._devices, (call.pid, call.tid), call.arg(spec.device_arg, signed32=True), MAX_THREADS)

    def processes_exited(self, pids: Collection[int], now_ns: int) -> list[Profile]:
        """Processes exited: their state at exit, now rather than at the end of the interval, then
        forgotten (their device memory died with them). That is each one's in-use view — what it
        still held, by the stack that allocated it: the leak report — with every sample labelled
        ``otel_ebpf.process.exited``, and its samples of the other views so far, labelled alike."""
        pids = frozenset(pids)
        held = self.table.remove_processes(pids)
        self.vmm.forget_processes(pids)
        self.kernel_names.table.forget_processes(pids)
        self.graphs.forget_processes(pids)
        self._leaks.forget_processes(pids)
        for mapping in (self._devices, self._comms):
            for key in [k for k in mapping if k[0] in pids]:
                del mapping[key]
        samples, period = PROFILE_TYPES["in_use"]
        at_exit = ProfileBuilder(samples, period, 1, self.config.max_stacks)
        profiles = []
        for pid in pids:
            resource = self._resource_of(pid)
            for alloc in held.get(pid, ()):
                at_exit.add(resource, alloc.stack, (alloc.size, 1), attributes={**EXITED, **_kind(alloc)})  # type: ignore[arg-type]
            for builder in self._profiles.values():
                profiles += builder.take_resource(resource, now_ns, EXITED)
        self._selfmetrics.add("otel_ebpf.gpu.stacks.dropped", at_exit.dropped, {"view": "in_use"})
        return (
            at_exit.take(now_ns, min((a.ts_ns for allocs in held.values() for a in allocs), default=now_ns)) + profiles
        )

    def image_replaced(self, pid: int) -> None:
        """``pid`` execed: its kernel and graph handles died with the old image (a new one may
        reuse their values)."""
        self.kernel_names.table.forget_processes((pid,))
        self.graphs.forget_processes((pid,))

    def rank_of(self, pid: int, comm: int) -> tuple[int, int] | None:
        """(rank, communicator size) of an NCCL communicator whose initialisation was seen."""
        return self._comms.get((pid, comm))

    def _device(self, call: GpuCall) -> int:
        spec = call.spec
        if spec.device_arg is not None and spec.kind is Kind.ALLOC:
            return call.arg(spec.device_arg, signed32=True)
        return self._devices.get((call.pid, call.tid), 0)  # CUDA's current device starts at 0 per thread

    def _alloc(self, call: GpuCall) -> None:
        spec = call.spec
        ptr = call.arg(spec.ptr_arg) if spec.usdt else call.out
        if call.ok and ptr:
            size, memory = call.arg(spec.size_arg), spec.memory.value
            self._allocated(
                call, Allocation(call.pid, spec.library.value, self._device(call), ptr, size, 0, None, memory)
            )

    def _allocated(self, call: GpuCall, alloc: Allocation) -> None:
        """``alloc`` made by ``call`` (its time and stack filled in here); ``alloc.ptr`` is what its
        release names (pointer or handle). Pinned host memory is attributed to the device current
        when it was allocated."""
        alloc.ts_ns, alloc.stack = call.ts_ns, self._stack_of(call)
        self.table.allocate(alloc)
        attributes = _memory_attributes(alloc)
        self._record(call.pid, "cuda.memory.allocated", alloc.size, attributes)
        self._record(call.pid, "cuda.memory.allocations", 1, attributes)
        self._record(call.pid, "cuda.memory.in_use", alloc.size, attributes)
        self._profile("allocated", call, (alloc.size, 1), _kind(alloc), alloc.stack)

    def _free(self, call: GpuCall) -> None:
        spec = call.spec
        ptr = call.arg(spec.ptr_arg)
        if call.ok and ptr:
            self._freed(call.pid, spec.library.value, ptr)

    def _freed(self, pid: int, layer: str, ptr: int) -> None:
        alloc = self.table.free(pid, layer, ptr)
        if alloc is None:
            return
        attributes = _memory_attributes(alloc)
        self._record(pid, "cuda.memory.freed", alloc.size, attributes)
        self._record(pid, "cuda.memory.in_use", -alloc.size, attributes)

    def _vmm(self, call: GpuCall) -> None:
        """The driver's virtual memory API (:mod:`.vmm`): physical memory is in use from its
        ``cuMemCreate`` until it is released and unmapped (layer ``vmm``, by the stack that created
        it); mapped bytes and reserved address space are their own series."""
        spec, pid, kind = call.spec, call.pid, call.spec.kind
        size = call.arg(spec.size_arg)
        if kind is Kind.PHYSICAL_CREATE:
            if call.out:
                location = call.arg(spec.location_arg)  # {type, id}: little-endian, type low
                alloc = Allocation(pid, VMM, location >> 32, call.out, size, 0, None)
                if location & 0xFFFFFFFF != CU_MEM_LOCATION_TYPE_DEVICE:  # a host location: pinned host memory
                    alloc.device, alloc.memory = self._device(call), Memory.PINNED_HOST.value
                self.vmm.create(pid, call.out, alloc.device)
                self._allocated(call, alloc)
        elif kind is Kind.PHYSICAL_RELEASE:
            handle = call.arg(spec.handle_arg)
            if self.vmm.release(pid, handle):
                self._freed(pid, VMM, handle)
        elif kind is Kind.MAP:
            mapped = self.vmm.map(pid, call.arg(spec.ptr_arg), size, call.arg(spec.handle_arg))
            if mapped is not None:  # the device of the mapped memory
                self._record(pid, "cuda.memory.mapped", size, {"cuda.device": mapped})
        elif kind is Kind.UNMAP:
            for unmapped in self.vmm.unmap(pid, call.arg(spec.ptr_arg), size):
                self._record(pid, "cuda.memory.mapped", -unmapped.size, {"cuda.device": unmapped.device})
                if unmapped.gone:
                    self._freed(pid, VMM, unmapped.handle)
        elif kind is Kind.ADDRESS_RESERVE:
            if call.out and self.vmm.reserve(pid, call.out, size):
                self._record(pid, "cuda.memory.address_reserved", size, {})
        elif kind is Kind.ADDRESS_FREE:
            reserved = self.vmm.address_free(pid, call.arg(spec.ptr_arg))
            if reserved:
                self._record(pid, "cuda.memory.address_reserved", -reserved, {})

    def _launch(self, call: GpuCall) -> None:
        """A launch, by kernel name where known: the runtime's ``cudaLaunchKernel`` names the
        kernel's host stub (its symbol is the kernel's name), a driver launch a handle whose name
        came with the call that made it. A launch on a stream being captured runs nothing now: it
        adds a kernel node to the graph, and is labelled ``cuda.launch.kind = captured``."""
        spec = call.spec
        name = None
        if spec.stub_arg is not None and self._kernel_name_of is not None:
            name = self._kernel_name_of(call.pid, call.arg(spec.stub_arg))
        elif spec.function_arg is not None:
            name = self.kernel_names.of(call.pid, call.arg(spec.function_arg))
        labels: dict[str, AttributeValue] = {"cuda.kernel.name": name} if name else {}
        if self.graphs.captured(call.pid, call.arg(spec.stream_arg)):
            labels["cuda.launch.kind"] = "captured"
        self._record(call.pid, "cuda.kernel.launches", 1, {"cuda.api": spec.library.value, **labels})
        self._profile("launches", call, (1,), labels or None)

    def _graph_launch(self, call: GpuCall) -> None:
        """One graph launch (one call that runs every node of the graph), with the graph's kernel
        nodes where its building or capture was seen. In the launches profile it is one launch, labelled
        ``cuda.launch.kind = graph``."""
        spec = call.spec
        kernels = self.graphs.kernels_of(call.pid, call.arg(spec.graph_arg))
        known: Attributes = {"cuda.graph.kernel_nodes": kernels} if kernels is not None else {}
        self._record(call.pid, "cuda.graph.launches", 1, {"cuda.api": spec.library.value, **known})
        self._profile("launches", call, (1,), {"cuda.launch.kind": "graph", **known})

    def _handle(self, call: GpuCall) -> None:
        """Calls that make or change the handles launches name: kernels and graphs."""
        spec, pid, kind = call.spec, call.pid, call.spec.kind
        if kind is Kind.KERNEL_NAME:
            self.kernel_names.named(pid, call.out, call.name)
        elif kind is Kind.KERNEL_FUNCTION:
            self.kernel_names.same_kernel(pid, call.out, call.arg(spec.function_arg))
        elif kind is Kind.GRAPH_CREATE:
            self.graphs.created(pid, call.out)
        elif kind is Kind.GRAPH_ADD_KERNEL:
            self.graphs.kernel_added(pid, call.arg(spec.graph_arg))
        elif kind is Kind.GRAPH_ADD_OPAQUE:
            self.graphs.opaque_added(pid, call.arg(spec.graph_arg))
        elif kind is Kind.GRAPH_INSTANTIATE:
            self.graphs.instantiated(pid, call.arg(spec.graph_arg), call.out)
        elif kind is Kind.GRAPH_DESTROY:
            self.graphs.destroyed(pid, call.arg(spec.graph_arg))
        elif kind is Kind.GRAPH_EXEC_DESTROY:
            self.graphs.exec_destroyed(pid, call.arg(spec.graph_arg))
        elif kind is Kind.CAPTURE_BEGIN:
            self.graphs.capture_began(pid, call.arg(spec.stream_arg))

    def _copy(self, call: GpuCall) -> None:
        spec = call.spec
        direction = spec.direction or MEMCPY_KINDS.get(call.arg(spec.kind_arg), "unknown")
        size = call.arg(spec.size_arg)
        attributes = {
            "cuda.api": spec.library.value,
            "cuda.memcpy.direction": direction,
            "cuda.memcpy.synchronous": not spec.asynchronous,
        }
        self._record(call.pid, "cuda.memcpy.size", size, attributes)
        self._record(call.pid, "cuda.memcpy.duration", call.duration_ns / 1e9, attributes)
        stack = self._stack_of(call)
        self._profile("copies", call, (size, call.duration_ns, 1), {"cuda.memcpy.direction": direction}, stack)
        if not spec.asynchronous:  # the CPU waited for the copy: part of the "GPU waits on CPU" view
            self._profile("waits", call, (call.duration_ns, 1), {"cuda.function": spec.symbol}, stack)

    def _nccl(self, call: GpuCall) -> None:
        spec = call.spec
        if spec.kind is Kind.COMM_INIT:
            if call.ok and call.out:
                rank = call.arg(spec.peer_arg, signed32=True)
                self._remember(
                    self._comms, (call.pid, call.out), (rank, call.arg(spec.size_arg, signed32=True)), MAX_COMMS
                )
            attributes: dict[str, AttributeValue] = {"nccl.operation": spec.symbol.removeprefix("nccl")}
            if call.ok:
                attributes["nccl.rank"] = call.arg(spec.peer_arg, signed32=True)
        elif spec.kind is Kind.COMM_DESTROY:
            self._comms.pop((call.pid, call.arg(spec.comm_arg)), None)
            attributes = {"nccl.operation": "CommDestroy"}
        else:
            attributes = {"nccl.operation": spec.symbol.removeprefix("nccl")}
            if spec.comm_arg is not None:
                known = self._comms.get((call.pid, call.arg(spec.comm_arg)))
                if known is not None:
                    attributes["nccl.rank"] = known[0]
                    attributes["nccl.comm.size"] = known[1]
        if not call.ok:
            attributes["error.type"] = error_name(Library.NCCL, call.ret)
        self._record(call.pid, "nccl.operations", 1, attributes)
        if spec.kind is not Kind.COLLECTIVE or not call.ok:
            return
        name, element = NCCL_DATATYPES.get(call.arg(spec.dtype_arg, signed32=True), ("unknown", 0))
        size = call.arg(spec.size_arg) * element
        attributes["nccl.datatype"] = name
        self._record(call.pid, "nccl.operation.size", size, attributes)
        self._record(call.pid, "nccl.operation.duration", call.duration_ns / 1e9, attributes)
        self._profile(
            "collectives", call, (size, call.duration_ns, 1), {"nccl.operation": attributes["nccl.operation"]}
        )

    @staticmethod
    def _remember(mapping: OrderedDict, key: Hashable, value: object, cap: int) -> None:
        mapping[key] = value
        mapping.move_to_end(key)
        if len(mapping) > cap:
            mapping.popitem(last=False)

    def _record(self, pid: int, instrument: str, value: float, attributes: Attributes) -> None:
        metrics = self._metrics.get(pid)
        if metrics is None:
            metrics = self._metrics[pid] = ProcessMetrics(Resource(dict(self._resource_of(pid))), INSTRUMENTS)
        metrics.record(SCOPE, MetricPoint(instrument, value, attributes), self._now_ns)

    def _profile(
        self,
        view: str,
        call: GpuCall,
        values: tuple[int, ...],
        attributes: Attributes | None = None,
        stack: Stack | None = None,
    ) -> None:
        self._profiles[view].add(
            self._resource_of(call.pid),
            stack if stack is not None else self._stack_of(call),
            values,
            attributes=attributes,
            timestamp_ns=call.ts_ns,
        )

    # ---- output ------------------------------------------------------------------------------

    def collect_metrics(self, now_ns: int) -> list[ResourceMetrics]:
        self._count_drops()
        collected = []
        for metrics in self._metrics.values():
            data = metrics.collect(now_ns, self._delta_kinds)
            if data is not None:
                collected.append(data)
        return collected

    def take_profiles(self, now_ns: int) -> list[Profile]:
        """Profiles since the last take; the in-use view is a snapshot of what is live now."""
        in_use = self._profiles["in_use"]
        for alloc in self.table.live():
            in_use.add(self._resource_of(alloc.pid), alloc.stack, (alloc.size, 1), attributes=_kind(alloc))  # type: ignore[arg-type]
        self._count_drops()
        profiles = []
        for builder in self._profiles.values():
            profiles.extend(builder.take(now_ns))
        return profiles

    def check_leaks(self, now_ns: int) -> list[ReadableLogRecord]:
        """Leak reports due now, as OTLP log records (one per process, layer, device and stack)."""
        reports = self._leaks.new(self.table.leaks(now_ns, self.config.leak_age_ns, self.config.leak_min_count))
        if len(reports) > self.config.max_leak_reports:
            self._selfmetrics.add("otel_ebpf.gpu.leaks.unreported", len(reports) - self.config.max_leak_reports)
            reports.sort(key=lambda r: r.bytes, reverse=True)
            reports = reports[: self.config.max_leak_reports]
        self._selfmetrics.add("otel_ebpf.gpu.leaks.reported", len(reports))
        return [self._leak_record(report, now_ns) for report in reports]

    def _leak_record(self, report: LeakReport, now_ns: int) -> ReadableLogRecord:
        stack = report.stack if isinstance(report.stack, tuple) else ()
        origin = _origin(stack)
        attributes: dict[str, AttributeValue] = {
            "cuda.api": report.layer,
            "cuda.device": report.device,
            "cuda.memory.leak.allocations": report.count,
            "cuda.memory.leak.size": report.bytes,
            "cuda.memory.leak.age": (now_ns - report.oldest_ns) / 1e9,
            "cuda.memory.in_use": report.in_use_bytes,
            "cuda.memory.in_use.growth": report.growth_bytes,
            "code.stacktrace": format_stack(stack),
        }
        if origin is not None:
            attributes["code.function.name"] = origin.function
            if origin.file:
                attributes["code.file.path"] = origin.file
            if origin.line:
                attributes["code.line.number"] = origin.line
        where = origin.label() if origin is not None else "an unknown stack"
        body = (
            f"CUDA memory leak suspected: {report.count} allocations ({report.bytes} bytes, {report.layer} "
            f"layer, device {report.device}) alive for more than {self.config.leak_age_ns / 1e9:g} s "
            f"while in-use memory grows, allocated by {where}"
        )
        record = LogRecord(
            timestamp=now_ns,
            observed_timestamp=now_ns,
            severity_text="WARN",
            severity_number=SeverityNumber.WARN,
            body=body,
            attributes=attributes,
            event_name="cuda.memory.leak",
        )
        return ReadableLogRecord(record, Resource(dict(self._resource_of(report.pid))), SCOPE)

    def _count_drops(self) -> None:
        for name, builder in self._profiles.items():
            if builder.dropped > self._reported_drops[name]:
                self._selfmetrics.add(
                    "otel_ebpf.gpu.stacks.dropped", builder.dropped - self._reported_drops[name], {"view": name}
                )
                self._reported_drops[name] = builder.dropped
        table = (self.table.evicted, self.table.unmatched_frees, self.table.replaced, self.vmm.untracked)
        reasons = ("evicted", "unmatched_free", "replaced", "vmm_table_full")
        for name, now, before in zip(reasons, table, self._reported_table, strict=True):
            self._selfmetrics.add("otel_ebpf.gpu.allocations.untracked", now - before, {"reason": name})
        self._reported_table = table
        handles = (
            self.kernel_names.table.evicted,
            self.graphs.graphs.evicted,
            self.graphs.execs.evicted,
            self.graphs.captures.evicted,
        )
        tables = ("kernel_names", "graphs", "graph_execs", "captures")
        for name, now, before in zip(tables, handles, self._reported_handles, strict=True):
            self._selfmetrics.add("otel_ebpf.gpu.handles.evicted", now - before, {"table": name})
        self._reported_handles = handles


def _memory_attributes(alloc: Allocation) -> Attributes:
    return {"cuda.api": alloc.layer, "cuda.device": alloc.device, "cuda.memory.kind": alloc.memory}


def _kind(alloc: Allocation) -> Attributes:
    """The allocated and in-use profiles' sample attributes."""
    return {"cuda.memory.kind": alloc.memory}


def _origin(stack: tuple) -> Frame | None:
    """The frame to name a leak after: the innermost Python frame of the program itself (not of
    torch or the standard library), else the innermost Python frame, else the innermost resolved
    native frame outside the GPU libraries themselves."""
    frames = [f for f in stack if isinstance(f, Frame)]
    python = [f for f in frames if f.kind is FrameKind.PYTHON]
    for frame in python:
        if frame.in_program:
            return frame
    if python:
        return python[0]
    for frame in frames:
        if frame.resolved and not _is_gpu_library(frame.module):
            return frame
    return frames[0] if frames else None


def _is_gpu_library(module: str) -> bool:
    name = module.rsplit("/", 1)[-1]
    return name.startswith(("libcudart", "libcuda.", "libnccl", "libc10_cuda", "libffi", "_ctypes"))


def format_stack(stack: tuple) -> str:
    """One frame a line, leaf first, as ``code.stacktrace`` carries it."""
    lines = []
    for frame in stack:
        if not isinstance(frame, Frame):
            continue
        where = f" {frame.module}" if frame.kind is not FrameKind.PYTHON and frame.module else ""
        lines.append(f"  at {frame.label()}{where}")
    return "\n".join(lines)
