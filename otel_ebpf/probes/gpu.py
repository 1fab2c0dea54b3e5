"""GPU probe: hooks the CUDA, NCCL and PyTorch libraries that target processes map (found by
:mod:`.gpu_discovery`) with ``bpf/gpu_trace.c``, and yields the decoded records
(:mod:`.gpu_records`): :class:`~otel_ebpf.gpu.calls.GpuCall` and :class:`ProcessEvent`.

PyTorch's allocator probes are USDT probes (:mod:`.usdt`): each of a few slots has its own BPF
programs and argument locations (``usdt_specs``), so libraries built differently can be hooked
side by side. :class:`~otel_ebpf.profiles.gpu_session.GpuMonitor` drives this probe from the
agent's loop.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from typing import Any

from .. import procfs
from ..config import TargetsConfig
from ..gpu.calls import OPS, GpuCall
from .gpu_discovery import GpuAttacher, GpuLibraries, gpu_symbols
from .gpu_records import (
    KERNEL_NAME_LEN,
    PY_MAX_FRAMES,
    USER_FRAMES,
    CallPairing,
    CallReturn,
    ProcessEvent,
    decode,
)
from .loading import (
    SET_AGENT_TGID,
    SET_FILTER_PIDS,
    TargetTable,
    close_program,
    load_program,
    ring_buffer_pages,
)
from .usdt import UsdtProbe, attach_usdt, read_usdt_probes

log = logging.getLogger(__name__)

USDT_SLOTS = 8  # programs usdt_torch_{malloc,free}_N in gpu_trace.c
SET_STACKS = 2  # after targets.h's two
STACKS_NATIVE, STACKS_PYTHON = 1, 2
STAT_NAMES = ("gpu_ringbuf_full", "gpu_nested_calls", "gpu_returns_without_entry", "gpu_python_stack_truncated")


class GpuProbe:
    """Kernel side of the GPU views. ``poll`` returns decoded calls and process events."""

    def __init__(
        self, targets: TargetsConfig, *, stacks: str = "python", ring_buffer_kb: int = 4096, max_targets: int = 1024
    ) -> None:
        self.targets = targets
        self.stacks = stacks  # "none", "native", "python" (native + Python)
        self.ring_buffer_kb = ring_buffer_kb
        self.max_targets = max_targets
        self.python_stacks = False  # whether the loaded program walks Python frames
        self._py_frames = 0
        self._bpf: Any = None  # the BPF program (bcc.BPF, untyped: see loading.compile_program) once started
        self._attacher = GpuAttacher(gpu_symbols, read_usdt_probes, self._attach_function, self._attach_usdt)
        self._usdt_slots: dict[tuple[int, int], int] = {}  # (dev, ino) of a file -> slot
        self._out: list[GpuCall | ProcessEvent] = []
        self._targets: TargetTable  # the program's targets map: start() makes it
        self.gpu_pids: set[int] = set()  # processes that map a hooked library (their stacks matter)
        self._pairing = CallPairing()
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()

    def start(self) -> None:
        """Compile, configure, attach to what target processes map now. Raises RuntimeError."""
        mode = {"none": 0, "native": STACKS_NATIVE, "python": STACKS_NATIVE | STACKS_PYTHON}[self.stacks]
        settings = {SET_AGENT_TGID: os.getpid(), SET_FILTER_PIDS: self.targets.selects_processes, SET_STACKS: mode}
        targets = procfs.selected_pids(self.targets.pids, self.targets.executables)
        defines = {
            "RINGBUF_PAGES": ring_buffer_pages(self.ring_buffer_kb),
            "USER_FRAMES": USER_FRAMES,
            "KERNEL_NAME_LEN": KERNEL_NAME_LEN,
            "MAX_TARGETS": self.max_targets,
        }
        for python in [True, False] if self.stacks == "python" else [False]:
            try:
                self._bpf = load_program(
                    ["gpu_trace.c"],
                    "GPU probe",
                    defines={**defines, "PYTHON_STACKS": python},
                    verify=["enter_cudaMalloc", "usdt_torch_malloc_0"],
                    settings=settings,
                    targets=targets,
                )
            except RuntimeError as exc:
                if not python:
                    raise
                cause = str(exc.__cause__)
                log.warning(
                    "GPU: Python stacks unavailable (python_stack.h did not load: %s); native stacks only",
                    cause.splitlines()[0] if cause else exc.__cause__,
                )
                continue
            self.python_stacks = python
            self._py_frames = PY_MAX_FRAMES if python else 0
            break
        self._targets = TargetTable(self._bpf["targets"], targets)
        self._bpf["gpu_events"].open_ring_buffer(self._on_event)
        self.gpu_pids |= self._attacher.scan(self._scan_pids())

    @property
    def bpf(self) -> Any:
        """The loaded BPF object (its ``py_procs`` / ``py_threads`` maps are filled by the
        CPython stack support)."""
        return self._bpf

    @property
    def libraries(self) -> GpuLibraries:
        return self._attacher.libraries

    def _scan_pids(self) -> set[int]:
        if self.targets.selects_processes:
            return {pid for pid in self._targets.pids if os.path.exists(f"/proc/{pid}")}
        return set(procfs.iter_pids()) - {os.getpid()}

    def _attach_function(self, path: str, symbol: str) -> None:
        self._bpf.attach_uprobe(name=path, sym=symbol, fn_name=f"enter_{symbol}")
        self._bpf.attach_uretprobe(name=path, sym=symbol, fn_name=f"return_{symbol}")

    def _attach_usdt(self, path: str, probe: UsdtProbe) -> None:
        st = os.stat(path)
        slot = self._usdt_slots.get((st.st_dev, st.st_ino))
        if slot is None:
            if len(self._usdt_slots) >= USDT_SLOTS:
                raise RuntimeError(f"more than {USDT_SLOTS} differently built PyTorch libraries; {path} not hooked")
            slot = self._usdt_slots[(st.st_dev, st.st_ino)] = len(self._usdt_slots)
        is_free = probe.name == "free"
        spec = self._bpf["usdt_specs"].Leaf()
        for i, arg in enumerate(probe.args[:4]):
            spec.args[i].kind, spec.args[i].reg, spec.args[i].value = arg.kind, arg.reg, arg.value
        self._bpf["usdt_specs"][ctypes.c_int(slot * 2 + int(is_free))] = spec
        program = f"usdt_torch_{probe.name}_{slot}"
        attach_usdt(self._bpf, program, path, probe.offset, probe.semaphore_offset)

    def close(self) -> None:
        if self._bpf is not None:
            close_program(self._bpf)
            self._bpf = None

    def poll(self, timeout_ms: int) -> list[GpuCall | ProcessEvent]:
        """Wait up to ``timeout_ms`` for events; return what arrived. Rescans maps when due."""
        self._bpf.ring_buffer_poll(timeout_ms)
        self._bpf.ring_buffer_consume()
        out, self._out = self._out, []
        execs = {e.pid for e in out if isinstance(e, ProcessEvent) and not e.exited}
        if execs and self.targets.executables:
            for pid in execs:
                if procfs.executable_matches(pid, self.targets.executables):
                    self._targets.add(pid)
        if self._attacher.scan_due():
            self.gpu_pids = self._attacher.scan(self._scan_pids())
        elif execs:
            # A fresh image maps its libraries at once; dlopen-ed ones come with the next rescan.
            self.gpu_pids |= self._attacher.scan(
                execs & self._targets.pids if self.targets.selects_processes else execs, False
            )
        return out

    def _on_event(self, _ctx: int, data: int, size: int) -> None:
        event = decode(ctypes.string_at(data, size), self.clock_offset_ns, self._py_frames)
        if isinstance(event, CallReturn):
            event = self._pairing.complete(event)
        elif isinstance(event, GpuCall) and not OPS[event.op].usdt:
            self._pairing.entry(event)  # completed by its return record
            return
        if event is not None:
            self._out.append(event)

    def kernel_stats(self) -> dict[str, int]:
        table = self._bpf["stats"]
        stats = {name: sum(table[ctypes.c_int(i)]) for i, name in enumerate(STAT_NAMES)}
        stats["gpu_entries_without_return"] = self._pairing.entries_unpaired
        stats["gpu_returns_unpaired"] = self._pairing.returns_unpaired
        return stats
