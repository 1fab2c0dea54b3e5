"""Kernel side of CPU profiling: perf-event sampling (bpf/cpu_profile.c) on every CPU.

``poll`` returns :class:`RawSample` records — addresses and code-object references, nothing
symbolized — in ring-buffer order. The probe also keeps the BPF frame walker fed: every process
it samples is checked once for a CPython interpreter (:func:`otel_ebpf.profiles.cpython.detect`)
and, when it is one, its offsets go into ``py_procs``; 3.10 thread states go into ``py_threads``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from otel_ebpf import procfs
from otel_ebpf.config import TargetsConfig
from otel_ebpf.probes.loading import (
    SET_AGENT_TGID,
    SET_FILTER_PIDS,
    TargetTable,
    close_program,
    load_program,
    ring_buffer_pages,
)
from otel_ebpf.profiles import cpython
from otel_ebpf.profiles.cpython import PythonProcess

log = logging.getLogger(__name__)

USER_FRAMES = 64
KERNEL_FRAMES = 32
PY_MAX_FRAMES = 64
PY_MAX_PROCS = 1024  # Python processes walked at once (py_procs entries)
DROP_NAMES = ("ringbuf_full", "python_truncated")
TARGET_SCAN_S = 1.0  # how often children and --exe matches are looked for
THREAD_REFRESH_S = 1.0  # 3.10: at most this often per process
MAX_TARGETS = 4096
MAX_PROCESSES = 4096  # processes remembered (Python or not)


class _Sample(ctypes.Structure):
    _fields_ = [
        ("ts", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("user_len", ctypes.c_int32),
        ("kern_len", ctypes.c_int32),
        ("_pad", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
        ("user", ctypes.c_uint64 * USER_FRAMES),
        ("kern", ctypes.c_uint64 * KERNEL_FRAMES),
        ("py", cpython.py_stack_type(PY_MAX_FRAMES)),
    ]


@dataclass(frozen=True, slots=True)
class RawSample:
    """One perf-event sample, as the kernel saw it. Stacks are leaf first."""

    timestamp_ns: int  # Unix time
    pid: int
    tid: int
    cpu: int
    comm: str
    user: tuple[int, ...]
    kernel: tuple[int, ...]
    py_status: int
    py_frames: tuple[cpython.RawPyFrame, ...]  # (code object, instruction, flags) as the walker read them


def sample_from_bytes(raw: bytes, clock_offset_ns: int) -> RawSample:
    s = _Sample.from_buffer_copy(raw)
    user = tuple(s.user[: max(0, s.user_len) // 8])
    kernel = tuple(s.kern[: max(0, s.kern_len) // 8])
    depth = min(s.py.depth, PY_MAX_FRAMES)
    frames = tuple((f.code, f.instr, f.flags) for f in s.py.frames[:depth])
    return RawSample(
        s.ts + clock_offset_ns, s.pid, s.tid, s.cpu, s.comm.decode(errors="replace"), user, kernel, s.py.status, frames
    )


class CpuProbe:
    """Samples on-CPU stacks of the target processes at ``frequency_hz`` per CPU."""

    def __init__(
        self, frequency_hz: int, targets: TargetsConfig, ring_buffer_kb: int = 1024, python: bool = True
    ) -> None:
        self.frequency_hz = frequency_hz
        self.targets = targets
        self.ring_buffer_kb = ring_buffer_kb
        self.python_enabled = python
        self._bpf: Any = None  # the BPF program (bcc.BPF, untyped: see loading.compile_program) once started
        self._samples: list[RawSample] = []
        self.python: dict[int, PythonProcess | None] = {}  # pid -> interpreter (None: not Python)
        self._thread_refresh: dict[int, float] = {}
        self.exited: list[int] = []  # pids forgotten since the caller last emptied this
        self.python_table_full = 0  # Python processes py_procs had no room for (walked without frames)
        self._targets: TargetTable  # the program's targets map: start() makes it
        self._next_scan = 0.0
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()

    def start(self) -> None:
        """Compile, configure, attach. Raises RuntimeError with BCC's message on failure."""
        from bcc import PerfSWConfig, PerfType  # noqa: PLC0415 — only the probe layer needs bcc

        self._bpf = load_program(
            ["cpu_profile.c"],
            "CPU profiler",
            defines={
                "USER_FRAMES": USER_FRAMES,
                "KERNEL_FRAMES": KERNEL_FRAMES,
                "PY_MAX_FRAMES": PY_MAX_FRAMES,
                "PY_MAX_PROCS": PY_MAX_PROCS,
                "MAX_TARGETS": MAX_TARGETS,
                "RINGBUF_PAGES": ring_buffer_pages(self.ring_buffer_kb),
            },
            settings={SET_AGENT_TGID: os.getpid(), SET_FILTER_PIDS: self.targets.selects_processes},
        )
        self._targets = TargetTable(self._bpf["targets"])
        self._scan_targets()
        self._bpf["samples"].open_ring_buffer(self._on_sample)
        try:
            self._bpf.attach_perf_event(
                ev_type=PerfType.SOFTWARE,
                ev_config=PerfSWConfig.CPU_CLOCK,
                fn_name="on_sample",
                sample_freq=self.frequency_hz,
            )
        except Exception as exc:
            raise RuntimeError(f"cannot attach the CPU profiler's perf events: {exc}") from exc

    def close(self) -> None:
        if self._bpf is not None:
            close_program(self._bpf)
            self._bpf = None

    # ---- targets and interpreters --------------------------------------------------------------

    def _scan_targets(self) -> None:
        """Targets named by pid, their children, and --exe matches (also processes started since)."""
        self._next_scan = time.monotonic() + TARGET_SCAN_S
        for pid in [p for p in self.python if not os.path.exists(f"/proc/{p}")]:
            self.forget(pid)  # its pid may be reused by a process of another kind
        if not self.targets.selects_processes:
            return
        wanted = procfs.selected_pids(self.targets.pids, self.targets.executables)
        for pid in wanted - self._targets.pids:
            if len(self._targets) >= MAX_TARGETS:
                break
            self._targets.add(pid)
            self._check_python(pid)
        for pid in self._targets.pids - wanted:
            if not os.path.exists(f"/proc/{pid}"):
                self._targets.discard(pid)
                self.forget(pid)

    def _check_python(self, pid: int) -> PythonProcess | None:
        if pid in self.python:
            return self.python[pid]
        if len(self.python) >= MAX_PROCESSES:
            self.forget(next(iter(self.python)))
        try:
            process = cpython.register(self._bpf, pid) if self.python_enabled else None
        except Exception as exc:  # noqa: BLE001 -- BCC raises bare Exception when py_procs is full
            log.warning("pid %d: Python frames unavailable (%s)", pid, exc)
            self.python_table_full += 1
            process = None
        self.python[pid] = process
        if process is not None:
            self._thread_refresh[pid] = time.monotonic() + THREAD_REFRESH_S
            log.info("pid %d: CPython %d.%d (%s)", pid, *process.version, process.binary)
        return process

    def _refresh_threads(self, process: PythonProcess) -> None:
        """3.10: a sampled thread had no thread state: new threads since the last look."""
        now = time.monotonic()
        if now >= self._thread_refresh.get(process.pid, 0.0):
            self._thread_refresh[process.pid] = now + THREAD_REFRESH_S
            cpython.load_thread_states(self._bpf, process)

    def forget(self, pid: int) -> None:
        """``pid`` exited: its interpreter entry goes; ``exited`` tells the profiler's caches."""
        self.exited.append(pid)
        process = self.python.pop(pid, None)
        self._thread_refresh.pop(pid, None)
        if process is not None and self._bpf is not None:
            cpython.uninstall(self._bpf["py_procs"], pid)

    # ---- samples ---------------------------------------------------------------------------------

    def _on_sample(self, _ctx: int, data: int, size: int) -> None:
        self._samples.append(sample_from_bytes(ctypes.string_at(data, size), self.clock_offset_ns))

    def poll(self, timeout_ms: int) -> list[RawSample]:
        """Wait up to ``timeout_ms`` for samples; return what arrived."""
        self._bpf.ring_buffer_poll(timeout_ms)
        self._bpf.ring_buffer_consume()
        samples, self._samples = self._samples, []
        for sample in samples:
            if sample.pid not in self.python:
                self._check_python(sample.pid)
            elif sample.py_status == cpython.STATUS_NO_THREAD:
                process = self.python[sample.pid]
                if process is not None:
                    self._refresh_threads(process)
        if time.monotonic() >= self._next_scan:
            self._scan_targets()
        return samples

    def kernel_stats(self) -> dict[str, int]:
        """Totals of the kernel's per-CPU drop counters since start."""
        table = self._bpf["drops"]
        stats = {name: sum(table[ctypes.c_int(i)]) for i, name in enumerate(DROP_NAMES)}
        stats["python_table_full"] = self.python_table_full
        return stats
