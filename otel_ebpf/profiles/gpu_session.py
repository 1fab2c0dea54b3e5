"""The live GPU views as the agent runs them: probe -> stacks -> :class:`~otel_ebpf.gpu.views.GpuViews`
-> sinks, the GPU counterpart of :mod:`.session`'s CPU profiling.

Kept out of ``agent.py`` so the agent's loop only calls :meth:`GpuMonitor.poll`,
:meth:`GpuMonitor.kernel_stats` and :meth:`GpuMonitor.close`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from .. import procfs
from ..config import AgentConfig
from ..containers import ContainerResolver
from ..exporters.logs import LogSink, build_log_sink
from ..gpu.calls import GpuCall, Library
from ..gpu.spans import collective_span
from ..gpu.views import GpuViews, GpuViewsConfig
from ..probes.gpu_discovery import RESCAN_S, maps_gpu_library
from ..probes.gpu_records import ProcessEvent
from ..resources import ProcessResources
from ..selfmetrics import SelfMetrics
from . import cpython, merge
from .exporter import ProfileSink, build_profile_sink
from .symbols import Symbolizer

log = logging.getLogger(__name__)

AUTO_FULL_RESCAN_S = 10.0  # gpu.enabled=auto: every process's maps this often, new processes every second
MAX_PENDING = 10_000  # NCCL calls waiting for trace assembly; past it they go unlinked-or-linked now


class StackCache:
    """Resolved stacks by their raw form, bounded (LRU): a training loop repeats few stacks."""

    def __init__(self, resolve: Callable[[GpuCall], tuple], capacity: int = 50_000) -> None:
        self._resolve = resolve
        self._cache: OrderedDict[tuple, tuple] = OrderedDict()
        self._capacity = capacity

    def __call__(self, call: GpuCall) -> tuple:
        key = (call.pid, call.user_stack, call.python_stack)
        stack = self._cache.get(key)
        if stack is None:
            stack = self._cache[key] = self._resolve(call)
            if len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return stack

    def forget(self, pid: int) -> None:
        for key in [k for k in self._cache if k[0] == pid]:
            del self._cache[key]


def native_stack(symbolizer: Symbolizer, call: GpuCall) -> tuple:
    """Frames of the native stack, leaf first (return addresses point after the call: minus one)."""
    frames = []
    for i, address in enumerate(call.user_stack):
        frames.append(symbolizer.user_frame(call.pid, address if i == 0 else address - 1))
    return tuple(frames)


@dataclass(frozen=True)
class _Running:
    """What exists once the probe is loaded: where the views' profiles and leak reports go."""

    profile_sink: ProfileSink
    owns_profile_sink: bool  # False: the CPU profiler's, shut down by it
    log_sink: LogSink


class GpuMonitor:
    """The GPU probe, stack resolution and :class:`~otel_ebpf.gpu.views.GpuViews`, as the agent
    drives them: ``poll`` often, ``collect_metrics`` / ``take_profiles`` / ``check_leaks`` on
    their intervals, ``close`` at the end.

    ``mode`` is ``gpu.enabled``: ``true`` loads the probe now; ``auto`` loads it once a target
    process maps a GPU library by name (so an agent on a machine without GPU work pays nothing).
    """

    def __init__(
        self,
        config: AgentConfig,
        selfmetrics: SelfMetrics,
        host_name: str,
        delta_kinds: frozenset = frozenset(),
        profile_sink: ProfileSink | None = None,
        link_for: Callable[[int, int, int], tuple[int, int] | None] | None = None,
        export_spans: Callable[[list], None] | None = None,
    ) -> None:
        """``profile_sink``: a :class:`~otel_ebpf.profiles.exporter.ProfileSink` to share (the CPU
        profiler's, which owns it); by default the monitor builds and owns its own.
        ``link_for(pid, tid, ts_ns)``: the (trace id, span id) of the request a thread served at
        that time (the trace assembler's); NCCL calls made under one become its child spans, handed to
        ``export_spans``."""
        from ..probes.gpu import GpuProbe  # noqa: PLC0415 -- the probe layer imports bcc

        self.config = config
        self.mode = config.gpu.enabled
        self._selfmetrics = selfmetrics
        self.probe = GpuProbe(
            config.targets,
            stacks=config.gpu.stacks,
            ring_buffer_kb=config.gpu.ring_buffer_kb,
            max_targets=config.capture.max_processes,
        )
        self._symbolizer = Symbolizer()
        self._code_resolver: cpython.CodeResolver | None = None
        self._pythons: dict[int, cpython.PythonProcess | None] = {}  # pid -> interpreter (None: not CPython)
        self._resources = ProcessResources(
            config.resource.attributes, host_name, ContainerResolver(str(config.resource.host_root))
        )
        self._stacks = StackCache(self._resolve_stack)
        views_config = GpuViewsConfig(
            leak_age_ns=int(config.gpu.leak_age_s * 1e9),
            leak_min_count=config.gpu.leak_min_allocations,
            max_allocations=config.gpu.max_allocations,
            max_stacks=config.gpu.max_stacks,
        )
        self.views = GpuViews(
            self._stacks, self._resources.of, selfmetrics, views_config, delta_kinds, self._kernel_name
        )
        self._running: _Running | None = None  # once the probe is loaded
        self._next_check = 0.0
        self._next_full_check = 0.0
        self._checked: set[int] = set()
        self._shared_profile_sink = profile_sink
        self._next_profiles = time.monotonic() + config.gpu.interval_s
        self._leak_check_s = max(0.1, min(config.gpu.interval_s, config.gpu.leak_age_s / 4))
        self._next_leak_check = time.monotonic() + self._leak_check_s
        self._next_stats = 0.0
        self._link_for = link_for
        self._export_spans = export_spans
        self._pending_nccl: deque[GpuCall] = deque()  # waiting for trace assembly to catch up

    def start(self) -> None:
        """Load now (``true``), or when a target maps a GPU library (``auto``)."""
        if self.mode == "true" or self._gpu_library_appeared():
            self._load()

    def _gpu_library_appeared(self) -> bool:
        """``auto``: whether a target maps a GPU library now. New processes are looked at every
        call, all of them every AUTO_FULL_RESCAN_S (a running job may import torch late)."""
        pids = self._candidate_pids()
        now = time.monotonic()
        if now >= self._next_full_check:
            self._next_full_check = now + AUTO_FULL_RESCAN_S
            fresh = pids
        else:
            fresh = pids - self._checked
        self._checked = pids
        return any(maps_gpu_library(pid) for pid in fresh)

    def _candidate_pids(self) -> set[int]:
        targets = self.config.targets
        if targets.pids or targets.executables:
            return procfs.selected_pids(targets.pids, targets.executables)
        return set(procfs.iter_pids()) - {os.getpid()}

    @property
    def started(self) -> bool:
        return self._running is not None

    def _load(self) -> None:
        self.probe.start()
        shared = self._shared_profile_sink
        self._running = _Running(
            shared if shared is not None else build_profile_sink(self.config, self._selfmetrics),
            shared is None,
            build_log_sink(self.config, self._selfmetrics),
        )
        log.info(
            "GPU probe attached (stacks: %s%s)",
            self.config.gpu.stacks,
            "" if self.probe.python_stacks or self.config.gpu.stacks != "python" else ", Python frames unavailable",
        )
        self._install_pythons()

    def poll(self, timeout_ms: int = 0, horizon_ns: int | None = None) -> int:
        """Handle what the kernel sent; returns the number of calls. ``horizon_ns``: how far (Unix
        time) trace assembly has seen socket events — NCCL calls after it wait, so that the
        request their thread was serving *then* is known (see ``link_for``)."""
        running = self._running
        if running is None:
            if self.mode == "auto" and time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + RESCAN_S
                if self._gpu_library_appeared():
                    self._load()
            return 0
        calls = 0
        exited: list[int] = []
        for event in self.probe.poll(timeout_ms):
            if isinstance(event, ProcessEvent):
                if event.exited:
                    exited.append(event.pid)
                else:  # a new image: what we knew of the pid is stale
                    self._forget(event.pid)
                    self.views.image_replaced(event.pid)
                continue
            calls += 1
            self.views.handle(event)
            if self._link_for is not None and event.spec.library is Library.NCCL:
                self._pending_nccl.append(event)
        self._selfmetrics.add("otel_ebpf.gpu.calls", calls)
        self._nccl_spans(horizon_ns)
        if exited:
            self._exported_at_exit(running, exited)
        self._install_pythons()
        self._periodic(running)
        return calls

    def _nccl_spans(self, horizon_ns: int | None) -> None:
        link_for, export_spans = self._link_for, self._export_spans
        if link_for is None or export_spans is None:  # then nothing is pending
            return
        spans = []
        unlinked = 0
        pending = self._pending_nccl
        while pending and (horizon_ns is None or pending[0].ts_ns <= horizon_ns or len(pending) > MAX_PENDING):
            call = pending.popleft()
            parent = link_for(call.pid, call.tid, call.ts_ns)
            if parent is None:
                unlinked += 1
                continue
            spec = call.spec
            rank = self.views.rank_of(call.pid, call.arg(spec.comm_arg)) if spec.comm_arg is not None else None
            span = collective_span(call, parent, self._resources.of(call.pid), rank)
            if span is not None:
                spans.append(span)
        if unlinked:
            self._selfmetrics.add("otel_ebpf.gpu.collectives.unlinked", unlinked)
        if spans:
            export_spans(spans)

    def _periodic(self, running: _Running, final: bool = False) -> None:
        now = time.monotonic()
        if final or now >= self._next_leak_check:
            self._next_leak_check = now + self._leak_check_s
            running.log_sink.export(self.views.check_leaks(time.time_ns()))
        if final or now >= self._next_profiles:
            self._next_profiles = now + self.config.gpu.interval_s
            running.profile_sink.export(self.views.take_profiles(time.time_ns()))
        if final or now >= self._next_stats:  # per-CPU map reads: not every poll
            self._next_stats = now + 1.0
            for reason, total in self.kernel_stats().items():
                self._selfmetrics.set("otel_ebpf.kernel.drops", total, {"reason": reason})

    def _exported_at_exit(self, running: _Running, pids: list[int]) -> None:
        """Exited processes' GPU state, exported now: a process that leaks and exits between two
        intervals would otherwise leave no in-use profile at all."""
        running.profile_sink.export(self.views.processes_exited(pids, time.time_ns()))
        for pid in pids:
            self._forget(pid)

    def _forget(self, pid: int) -> None:
        self._pythons.pop(pid, None)
        self._resources.pop(pid)
        self._stacks.forget(pid)
        self._symbolizer.forget(pid)
        if self._code_resolver is not None:
            self._code_resolver.forget(pid)

    def _install_pythons(self) -> None:
        """Python stacks need the interpreter's address and layout per process, in py_procs."""
        if not self.probe.python_stacks:
            return
        for pid in self.probe.gpu_pids - self._pythons.keys():
            process = cpython.detect(pid)
            self._pythons[pid] = process
            if process is None:
                continue
            cpython.install(self.probe.bpf["py_procs"], process)
            if process.layout.walker == cpython.PY_V310:
                for tid, tstate in cpython.thread_states(process).items():
                    self.probe.bpf["py_threads"][ctypes.c_uint32(tid)] = ctypes.c_uint64(tstate)

    def _kernel_name(self, pid: int, address: int) -> str | None:
        """What nvcc's host stub at ``address`` is named after: its kernel (demangled)."""
        frame = self._symbolizer.user_frame(pid, address)
        return frame.function if frame.resolved else None

    def _resolve_stack(self, call: GpuCall) -> tuple:
        native = native_stack(self._symbolizer, call)
        process = self._pythons.get(call.pid)
        if process is None or not call.python_stack:
            return native
        if self._code_resolver is None:
            self._code_resolver = cpython.CodeResolver()
        python, entries = self._code_resolver.frames(process, call.python_stack)
        return merge.merge((), native, python, entries, process.binary)

    def collect_metrics(self, now_ns: int) -> list:
        return self.views.collect_metrics(now_ns)

    def take_profiles(self, now_ns: int) -> list:
        return self.views.take_profiles(now_ns)

    def check_leaks(self, now_ns: int) -> list:
        return self.views.check_leaks(now_ns)

    def kernel_stats(self) -> dict[str, int]:
        if not self.started:
            return {}
        stats = self.probe.kernel_stats()
        for library, count in self.probe.libraries.by_library().items():
            self._selfmetrics.set("otel_ebpf.gpu.libraries", count, {"library": library})
        return stats

    def close(self, timeout_s: float = 5.0) -> None:
        """Take what the kernel still holds, export the last profiles and leak reports, detach."""
        running = self._running
        if running is not None:
            self.poll(0)
            self._nccl_spans(None)
            self._periodic(running, final=True)
            self.probe.close()
            running.log_sink.shutdown(timeout_s)
            if running.owns_profile_sink:
                running.profile_sink.shutdown(timeout_s)
