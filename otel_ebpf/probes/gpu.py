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
from importlib import resources
from typing import Any

from .. import procfs
from ..config import TargetsConfig
from ..gpu.calls import OPS, GpuCall
from .compiler_memory import release_compiler_memory
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
    inline_headers,
    pid_namespace_flags,
    ring_buffer_pages,
    write_settings,
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
        self._target_pids: set[int] = set()
        self.gpu_pids: set[int] = set()  # processes that map a hooked library (their stacks matter)
        self._pairing = CallPairing()
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()

    def start(self) -> None:
        """Compile, configure, attach to what target processes map now. Raises RuntimeError."""
        from bcc import BPF  # noqa: PLC0415

        bpf_dir = resources.files("otel_ebpf.bpf")
        source = inline_headers(bpf_dir.joinpath("gpu_trace.c").read_text())
        pages = ring_buffer_pages(self.ring_buffer_kb)
        cflags = [
            f"-DRINGBUF_PAGES={pages}",
            f"-DUSER_FRAMES={USER_FRAMES}",
            f"-DKERNEL_NAME_LEN={KERNEL_NAME_LEN}",
            f"-DMAX_TARGETS={self.max_targets}",
            "-Wno-macro-redefined",
            *pid_namespace_flags(),
        ]
        attempts = [True, False] if self.stacks == "python" else [False]
        error: Exception | None = None
        for python in attempts:
            try:
                bpf = BPF(text=source, cflags=cflags + (["-DPYTHON_STACKS"] if python else []))
                bpf.load_func(b"enter_cudaMalloc", BPF.KPROBE)  # the verifier's verdict, now
                bpf.load_func(b"usdt_torch_malloc_0", BPF.KPROBE)
            except Exception as exc:  # noqa: BLE001 — BCC raises bare Exception with the compiler's or verifier's verdict
                error = exc
                if python:
                    log.warning(
                        "GPU: Python stacks unavailable (python_stack.h did not load: %s); native stacks only",
                        str(exc).splitlines()[0] if str(exc) else exc,
                    )
                continue
            self._bpf, self.python_stacks = bpf, python
            self._py_frames = PY_MAX_FRAMES if python else 0
            break
        if self._bpf is None:
            raise RuntimeError(f"cannot load the GPU probe: {error} (run `otel-ebpf doctor`)") from error
        release_compiler_memory()
        mode = {"none": 0, "native": STACKS_NATIVE, "python": STACKS_NATIVE | STACKS_PYTHON}[self.stacks]
        write_settings(
            self._bpf, {SET_AGENT_TGID: os.getpid(), SET_FILTER_PIDS: self.targets.selects_processes, SET_STACKS: mode}
        )
        for pid in {*self.targets.pids, *procfs.matching_pids(self.targets.executables)}:
            self.add_target(pid)
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
            return {pid for pid in self._target_pids if os.path.exists(f"/proc/{pid}")}
        return set(procfs.iter_pids()) - {os.getpid()}

    def add_target(self, pid: int) -> None:
        self._target_pids.add(pid)
        self._bpf["targets"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

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
            self._bpf.cleanup()
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
                    self.add_target(pid)
        if self._attacher.scan_due():
            self.gpu_pids = self._attacher.scan(self._scan_pids())
        elif execs:
            # A fresh image maps its libraries at once; dlopen-ed ones come with the next rescan.
            self.gpu_pids |= self._attacher.scan(
                execs & self._target_pids if self.targets.selects_processes else execs, False
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
