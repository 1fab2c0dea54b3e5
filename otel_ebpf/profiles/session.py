"""The live CPU profiler as the agent runs it: probe -> profiler -> sink, once per interval.

Kept out of ``agent.py`` so the agent's loop only calls :meth:`CpuProfiling.poll` and
:meth:`CpuProfiling.close`.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from otel_ebpf.config import AgentConfig
from otel_ebpf.containers import ContainerResolver
from otel_ebpf.pipeline.events import EXITED
from otel_ebpf.profiles.cpu import CpuProfiler, LinkFor, cpu_builder
from otel_ebpf.profiles.exporter import ProfileSink, build_profile_sink
from otel_ebpf.resources import ProcessResources
from otel_ebpf.selfmetrics import SelfMetrics

log = logging.getLogger(__name__)

MAX_PENDING = 65536  # samples held for span links; past it they go unlinked rather than wait


class CpuProfiling:
    """Owns the CPU probe, the profiler and the profile sink of a live agent."""

    def __init__(
        self,
        config: AgentConfig,
        selfmetrics: SelfMetrics,
        host_name: str,
        link_for: LinkFor | None = None,
        sink: ProfileSink | None = None,
    ) -> None:
        from otel_ebpf.probes.cpu import CpuProbe  # noqa: PLC0415 -- the probe layer imports bcc

        self.config = config
        self.metrics = selfmetrics
        self.host_name = host_name
        p = config.profiling
        self.probe = CpuProbe(p.frequency_hz, config.targets, python=p.python)
        self.resources = ProcessResources(
            config.resource.attributes, host_name, ContainerResolver(str(config.resource.host_root))
        )
        self.profiler = CpuProfiler(cpu_builder(p.frequency_hz, p.max_stacks), self.resources.of, link_for)
        self.sink = sink if sink is not None else build_profile_sink(config, selfmetrics)
        self._next_export = time.monotonic() + p.interval_s
        self._interval_start_ns = time.time_ns()
        self._dropped_reported = 0
        self._kernel_reported: dict[str, int] = {}
        self._pending: deque = deque()  # (sample, stack) waiting for the trace assembly to catch up

    def start(self) -> None:
        self.probe.start()
        log.info("CPU profiler attached at %d Hz per CPU", self.config.profiling.frequency_hz)

    def poll(self, timeout_ms: int = 0, horizon_ns: int | None = None) -> None:
        """Take what the kernel sampled; export when the interval is over.

        ``horizon_ns`` is how far (Unix time) the trace assembly has seen events: samples after it
        wait, so that a sample is linked to the request its thread was serving *at that time* (the
        assembler learns of a request's start, and of its end, only when the reorder window
        releases them)."""
        samples = self.probe.poll(timeout_ms)
        if samples:
            self.metrics.add("otel_ebpf.profiles.samples", len(samples))
            self._pending.extend(self.profiler.resolve(samples, self.probe.python))
        ready: list = []
        pending = self._pending
        while pending and (
            horizon_ns is None or pending[0][0].timestamp_ns <= horizon_ns or len(pending) > MAX_PENDING
        ):
            ready.append(pending.popleft())
        if ready:
            self.profiler.add_resolved(ready)
        if self.probe.exited:  # after this poll's samples were resolved: their maps are still known
            self._export_at_exit(set(self.probe.exited))
            self.probe.exited.clear()
        if time.monotonic() >= self._next_export:
            self.export()

    def _export_at_exit(self, pids: set[int]) -> None:
        """Exited processes' samples so far, exported now (labelled ``otel_ebpf.process.exited``)
        rather than at the end of the interval; their samples still held for span links go in
        first. One pass over the held samples for all the processes that exited."""
        if any(sample.pid in pids for sample, _, _ in self._pending):
            held = [entry for entry in self._pending if entry[0].pid in pids]
            self._pending = deque(entry for entry in self._pending if entry[0].pid not in pids)
            self.profiler.add_resolved(held)
        now = time.time_ns()
        profiles = []
        for pid in pids:
            resource = self.resources.pop(pid)
            if resource is not None:
                profiles += self.profiler.builder.take_resource(resource, now, EXITED)
            self.profiler.forget(pid)
        for profile in profiles:
            profile.start_ns = self._interval_start_ns
        if profiles:
            self.sink.export(profiles)

    def export(self) -> None:
        self._next_export = time.monotonic() + self.config.profiling.interval_s
        now = time.time_ns()
        profiles = self.profiler.take(now)
        for profile in profiles:
            profile.start_ns = self._interval_start_ns
        self._interval_start_ns = now
        self._count_drops()
        self.sink.export(profiles)

    def _count_drops(self) -> None:
        dropped = self.profiler.builder.dropped
        self.metrics.add(
            "otel_ebpf.profiles.samples.dropped", dropped - self._dropped_reported, {"reason": "max_stacks"}
        )
        self._dropped_reported = dropped
        stats = self.probe.kernel_stats()
        for reason, metric in (
            ("ringbuf_full", "otel_ebpf.profiles.samples.dropped"),
            ("python_truncated", "otel_ebpf.profiles.stacks.truncated"),
            ("python_table_full", "otel_ebpf.profiles.stacks.truncated"),
        ):
            total = stats.get(reason, 0)
            self.metrics.add(metric, total - self._kernel_reported.get(reason, 0), {"reason": reason})
            self._kernel_reported[reason] = total

    def close(self, timeout_s: float = 10.0) -> None:
        """Last samples, last export, then detach."""
        try:
            self.poll(0)
            self.profiler.add_resolved(self._pending)
            self._pending.clear()
            self.export()
        finally:
            self.probe.close()
            self.sink.shutdown(timeout_s)
