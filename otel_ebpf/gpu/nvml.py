"""GPU device state from NVML (``nvidia-ml-py``), on nodes with NVIDIA GPUs: utilisation, memory,
power, clocks, ECC errors and XID events per device, and the device memory each process holds.

The hooks (docs/gpu.md) see what programs ask of CUDA; NVML says what the devices are doing: busy
or idle, how full, how hot on power, whether they report errors. :class:`NvmlReader` does the
library calls and returns :class:`DeviceReading` values; :class:`NvmlMetrics` turns readings into
series and knows nothing of NVML, so it is tested without a GPU. A node without the NVIDIA driver
(no ``libnvidia-ml.so.1``) or without devices has nothing to report: :func:`open_reader` says why
once and the agent goes on without it.

Names follow the OpenTelemetry hardware conventions where they exist (``hw.gpu.utilization``,
``hw.gpu.memory.usage``/``limit``, ``hw.power``, ``hw.errors``; devices by ``hw.id`` = UUID,
``hw.name``, ``hw.vendor``); clocks and per-process memory have none and are ``otel_ebpf.gpu.*``.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import ResourceMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import __version__
from ..pipeline.metrics import ProcessMetrics
from ..protocol import AttributeValue, InstrumentKind, InstrumentSpec, MetricPoint
from ..selfmetrics import SelfMetrics

_logger = logging.getLogger(__name__)

SCOPE = InstrumentationScope("otel_ebpf.gpu.nvml", __version__)
_G, _UD, _C = InstrumentKind.GAUGE, InstrumentKind.UP_DOWN_COUNTER, InstrumentKind.COUNTER
INSTRUMENTS = {
    spec.name: spec
    for spec in (
        InstrumentSpec("hw.gpu.utilization", _G, "1", "Share of the last sample period a kernel ran on the GPU"),
        InstrumentSpec("hw.gpu.memory.utilization", _G, "1", "Share of the last sample period memory was accessed"),
        InstrumentSpec("hw.gpu.memory.usage", _UD, "By", "Device memory in use"),
        InstrumentSpec("hw.gpu.memory.limit", _UD, "By", "Device memory in all"),
        InstrumentSpec("hw.power", _G, "W", "Power the device draws"),
        InstrumentSpec("otel_ebpf.gpu.clock.frequency", _G, "Hz", "Current clock of a clock domain"),
        InstrumentSpec("hw.errors", _C, "{error}", "ECC errors (corrected, uncorrected) and XID events"),
        InstrumentSpec("otel_ebpf.gpu.process.memory.usage", _UD, "By", "Device memory a process holds (NVML)"),
    )
}
CLOCKS = {"sm": 1, "memory": 2}  # NVML_CLOCK_SM, NVML_CLOCK_MEM
ECC_TYPES = {"ecc_corrected": 0, "ecc_uncorrected": 1}  # nvmlMemoryErrorType_t
VOLATILE_ECC = 0  # counts since the driver loaded
XID_EVENTS = 0x8  # nvmlEventTypeXidCriticalError
MAX_XIDS_PER_READ = 64


@dataclass(frozen=True)
class DeviceReading:
    """One device, as one read of NVML found it; None (or empty) where the device does not say."""

    index: int
    uuid: str
    name: str
    utilization: tuple[int, int] | None = None  # gpu %, memory %
    memory: tuple[int, int] | None = None  # used, total bytes
    power_mw: int | None = None
    clocks_mhz: Mapping[str, int] = field(default_factory=dict)  # by CLOCKS name
    ecc_totals: Mapping[str, int] = field(default_factory=dict)  # by ECC_TYPES name, since the driver loaded
    processes: tuple[tuple[int, int], ...] = ()  # (pid, device bytes)
    xids: tuple[int, ...] = ()  # XID codes reported since the last read


class NvmlMetrics:
    """Readings -> the node's device series and each process's device memory."""

    def __init__(
        self, node_resource: Mapping[str, AttributeValue], resource_of: Callable[[int], Mapping[str, Any]]
    ) -> None:
        self._node = ProcessMetrics(Resource(dict(node_resource)), INSTRUMENTS)
        self._resource_of = resource_of
        self._processes: dict[int, ProcessMetrics] = {}
        self._ecc_seen: dict[tuple[str, str], int] = {}  # (uuid, type) -> last total

    def record(self, readings: Iterable[DeviceReading], now_ns: int) -> None:
        holding: set[int] = set()
        for device in readings:
            attributes: dict[str, AttributeValue] = {
                "hw.id": device.uuid,
                "hw.name": device.name,
                "hw.vendor": "NVIDIA",
            }
            self._device(device, attributes, now_ns)
            for pid, used in device.processes:
                holding.add(pid)
                process = self._processes.get(pid)
                if process is None:
                    process = self._processes[pid] = ProcessMetrics(Resource(dict(self._resource_of(pid))), INSTRUMENTS)
                process.observe(SCOPE, "otel_ebpf.gpu.process.memory.usage", {"hw.id": device.uuid}, used, now_ns)
        for pid in [pid for pid in self._processes if pid not in holding]:
            del self._processes[pid]  # it let go of the device (or exited): its series end

    def _device(self, device: DeviceReading, attributes: dict[str, AttributeValue], now_ns: int) -> None:
        node = self._node
        if device.utilization is not None:
            node.observe(SCOPE, "hw.gpu.utilization", attributes, device.utilization[0] / 100, now_ns)
            node.observe(SCOPE, "hw.gpu.memory.utilization", attributes, device.utilization[1] / 100, now_ns)
        if device.memory is not None:
            node.observe(SCOPE, "hw.gpu.memory.usage", attributes, device.memory[0], now_ns)
            node.observe(SCOPE, "hw.gpu.memory.limit", attributes, device.memory[1], now_ns)
        if device.power_mw is not None:
            node.observe(SCOPE, "hw.power", attributes, device.power_mw / 1000, now_ns)
        for domain, mhz in device.clocks_mhz.items():
            node.observe(
                SCOPE, "otel_ebpf.gpu.clock.frequency", {**attributes, "hw.gpu.clock": domain}, mhz * 1e6, now_ns
            )
        for kind, total in device.ecc_totals.items():
            # NVML counts since the driver loaded: what grew since the last read (all of it, first)
            grown = total - self._ecc_seen.get((device.uuid, kind), 0)
            self._ecc_seen[(device.uuid, kind)] = total
            if grown > 0:
                node.record(SCOPE, MetricPoint("hw.errors", grown, {**attributes, "error.type": kind}), now_ns)
        for xid in device.xids:
            node.record(SCOPE, MetricPoint("hw.errors", 1, {**attributes, "error.type": f"xid_{xid}"}), now_ns)

    def collect(self, now_ns: int, delta: frozenset[InstrumentKind]) -> list[ResourceMetrics]:
        collected = [metrics.collect(now_ns, delta) for metrics in (self._node, *self._processes.values())]
        return [c for c in collected if c is not None]


class NvmlReader:
    """The devices NVML knows, read on demand; XID events are polled without waiting."""

    def __init__(self, nvml: Any, selfmetrics: SelfMetrics) -> None:
        self._nvml = nvml
        self._selfmetrics = selfmetrics
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._identity = [(_text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h))) for h in self._handles]
        self._events = None
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in self._handles:
                nvml.nvmlDeviceRegisterEvents(handle, XID_EVENTS, events)
            self._events = events
        except nvml.NVMLError as exc:
            _logger.info("NVML: XID events not available (%s)", exc)

    @property
    def devices(self) -> list[tuple[str, str]]:
        """(UUID, name) of each device, by index."""
        return list(self._identity)

    def read(self) -> list[DeviceReading]:
        xids = self._xids()
        return [self._device(i, handle, xids.get(i, ())) for i, handle in enumerate(self._handles)]

    def close(self) -> None:
        try:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            _logger.info("NVML: shutdown: %s", exc)

    def _device(self, index: int, handle: Any, xids: tuple[int, ...]) -> DeviceReading:
        nvml = self._nvml
        uuid, name = self._identity[index]
        utilization = self._ask(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._ask(nvml.nvmlDeviceGetMemoryInfo, handle)
        clocks = {domain: self._ask(nvml.nvmlDeviceGetClockInfo, handle, code) for domain, code in CLOCKS.items()}
        ecc = {
            kind: self._ask(nvml.nvmlDeviceGetTotalEccErrors, handle, code, VOLATILE_ECC)
            for kind, code in ECC_TYPES.items()
        }
        processes = self._ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return DeviceReading(
            index,
            uuid,
            name,
            (utilization.gpu, utilization.memory) if utilization is not None else None,
            (memory.used, memory.total) if memory is not None else None,
            self._ask(nvml.nvmlDeviceGetPowerUsage, handle),
            {domain: mhz for domain, mhz in clocks.items() if mhz is not None},
            {kind: total for kind, total in ecc.items() if total is not None},
            tuple((p.pid, p.usedGpuMemory) for p in processes if p.usedGpuMemory is not None),
            xids,
        )

    def _ask(self, query: Callable[..., Any], *args: Any) -> Any:
        """``query(*args)``, or None where the device does not support it (or failed: counted)."""
        try:
            return query(*args)
        except self._nvml.NVMLError_NotSupported:
            return None
        except self._nvml.NVMLError as exc:
            self._selfmetrics.add("otel_ebpf.gpu.nvml.errors", 1, {"error.type": type(exc).__name__})
            return None

    def _xids(self) -> dict[int, tuple[int, ...]]:
        """XID codes by device index, of the events that arrived since the last read."""
        found: dict[int, list[int]] = {}
        if self._events is None:
            return {}
        by_handle = {ctypes.cast(h, ctypes.c_void_p).value: i for i, h in enumerate(self._handles)}
        for _ in range(MAX_XIDS_PER_READ):
            try:
                event = self._nvml.nvmlEventSetWait(self._events, 0)
            except self._nvml.NVMLError_Timeout:
                break
            except self._nvml.NVMLError as exc:
                self._selfmetrics.add("otel_ebpf.gpu.nvml.errors", 1, {"error.type": type(exc).__name__})
                break
            index = by_handle.get(ctypes.cast(event.device, ctypes.c_void_p).value)
            if index is not None and event.eventType & XID_EVENTS:
                found.setdefault(index, []).append(int(event.eventData))
        return {index: tuple(codes) for index, codes in found.items()}


def open_reader(library: str | None, selfmetrics: SelfMetrics) -> tuple[NvmlReader | None, str]:
    """The reader, or None and why not (no driver library, no device, an NVML error).

    ``library``: a path to ``libnvidia-ml.so.1`` outside the loader's search path (the host's
    driver mounted into the agent's container); loaded first, NVML's own ``dlopen`` of the soname
    then finds it."""
    try:
        import pynvml  # noqa: PLC0415 — nvidia-ml-py: only where GPU device state is read
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        if library:
            ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
        pynvml.nvmlInit()
    except OSError as exc:
        return None, f"cannot load {library}: {exc}"
    except pynvml.NVMLError as exc:
        return None, f"NVML: {exc}"
    try:
        reader = NvmlReader(pynvml, selfmetrics)
    except pynvml.NVMLError as exc:
        pynvml.nvmlShutdown()
        return None, f"NVML: {exc}"
    if not reader.devices:
        reader.close()
        return None, "NVML reports no device"
    return reader, f"NVML: {len(reader.devices)} device(s): " + ", ".join(name for _, name in reader.devices)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
