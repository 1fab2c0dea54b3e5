"""The agent's main loop: an event source feeds the pipeline; spans and metrics go to the sink.

Two sources share this loop: the live socket probe and a recording being replayed. Configuration
is turned into objects here, at the edge; the pipeline behind it is pure.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.resources import Resource

from . import __version__
from .budget import CpuBudget, CpuCap
from .config import AgentConfig
from .containers import ContainerResolver
from .exporters import build_sink
from .exporters.prometheus import PrometheusMetricExporter
from .health import Health
from .httpserver import start_servers
from .idle_cpu import IdleAfterFloor
from .niceness import set_niceness
from .pii import build_scrubber
from .pipeline import Pipeline
from .pipeline.assembly import TraceAssembler
from .pipeline.connections import ConnectionTracker
from .pipeline.events import Event, HttpRequestCounts
from .pipeline.metrics import DELTA_KINDS, merged_by_resource
from .pipeline.reorder import EventReorderer
from .pipeline.telemetry import SDK_ATTRIBUTES, Telemetry
from .preflight import StartupError, exited, write_ready_file
from .protocol import load_protocols
from .recording import RecordingHeader, RecordingWriter
from .resources import ProcessResources
from .sampling import SpanSampler
from .selfmetrics import SelfMetrics

if TYPE_CHECKING:
    from .gpu.nvml import NvmlReader
    from .probes.model_guard import ModelGuard
    from .probes.roce import RoceProbe
    from .probes.verbs import VerbsMonitor
    from .profiles.gpu_session import GpuMonitor
    from .profiles.session import CpuProfiling

log = logging.getLogger("otel_ebpf")

POLL_MS = 100
# How long past the reorder window a live agent waits, in wall time, for events a busy CPU has
# not handed over yet, before releasing what it holds while traffic is quiet.
IDLE_RELEASE_NS = 1_000_000_000
# Net allocations of container objects between two collections of the youngest generation
# (CPython's default: 700). Reference counting frees what the agent makes per event, but a poll
# decodes up to MAX_POLL_RECORDS events at once: at 700, FastAPI under wrk set off a collection
# every ~150 requests, and 873 of them freed 414 objects (docs/performance.md, "The cyclic
# collector"). Cycles are still collected, after this many.
YOUNG_COLLECTION_THRESHOLD = 10_000
KERNEL_STATS_S = 1.0
# The longest one wait of the reader over its CPU budget (CpuCap) lasts: the loop's other readers
# (profiles, GPU, RDMA records) and the health beat go on at least this often.
MAX_PAUSE_S = 0.25
REPLAY_BATCH = 512


class StopSignal:
    """Set by SIGINT/SIGTERM or by the end of ``--duration``."""

    def __init__(self, duration_s: float | None) -> None:
        self._event = threading.Event()
        self._deadline = time.monotonic() + duration_s if duration_s else None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._event.set())

    @property
    def stopped(self) -> bool:
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self._event.set()
        return self._event.is_set()

    def wait(self, timeout_s: float) -> None:
        """Sleep ``timeout_s``, or less when a stop comes meanwhile."""
        self._event.wait(timeout_s)


class Agent:
    """Wires protocols, pipeline, telemetry and sink from a configuration."""

    def __init__(
        self,
        config: AgentConfig,
        clock: Callable[[], int],
        host_name: str | None = None,
        kernel_http_metrics: bool = False,
    ) -> None:
        """``clock`` stamps metric collections: wall time when live, event time when replaying.
        ``kernel_http_metrics``: the event stream carries the kernel's HTTP/1 counts."""
        self.config = config
        self.clock = clock
        self.host_name = host_name or socket.gethostname()
        self.selfmetrics = SelfMetrics()
        protocols = load_protocols(config.protocols.enabled, config.protocols.options)
        self.sink = build_sink(config, self.selfmetrics)
        self.telemetry = Telemetry(
            protocols,
            self.host_name,
            config.resource.attributes,
            self.selfmetrics,
            config.capture.max_processes,
            DELTA_KINDS[config.export.metric_temporality],
            kernel_http_metrics,
            SpanSampler(config.trace.sample_ratio, int(config.trace.keep_slower_than_ms * 1e6)),
            build_scrubber(config.pii.kinds, config.pii.patterns, self.selfmetrics).scrub
            if config.pii.enabled and (config.pii.kinds or config.pii.patterns)
            else None,
        )
        self.tracker = ConnectionTracker(protocols, self.selfmetrics, config.capture.max_connections)
        trace = config.trace
        assembler = TraceAssembler(
            self.selfmetrics, int(trace.inflight_timeout_s * 1e9), trace.max_inflight, trace.instrumented_clients
        )
        self._reorder_window_ns = trace.reorder_window_ms * 1_000_000
        reorderer = EventReorderer(self.selfmetrics, self._reorder_window_ns)
        self.pipeline = Pipeline(self.tracker, self.telemetry, self.selfmetrics, assembler, reorderer)
        self._self_reader = InMemoryMetricReader(preferred_temporality=self.sink.preferred_temporality)
        self._self_meters = MeterProvider(resource=self._agent_resource(), metric_readers=[self._self_reader])
        self.selfmetrics.register(self._self_meters.get_meter("otel_ebpf", __version__))
        self._next_metrics = time.monotonic() + config.export.metric_interval_s
        # Other sources of per-process metrics (the GPU views): called with the collection time.
        self.metric_sources: list[Callable[[int], list]] = []

    def _agent_resource(self) -> Resource:
        return Resource(
            {
                **self.config.resource.attributes,
                "service.name": self.config.agent.service_name,
                "service.version": __version__,
                "host.name": self.host_name,
                "process.pid": os.getpid(),
                **SDK_ATTRIBUTES,
            }
        )

    def process(self, events: list[Event], now_ns: int | None = None) -> None:
        """Run ``events`` through the pipeline and export what completed. ``now_ns`` (wall time,
        live only) lets events held for reordering go once no earlier event can still arrive."""
        self.pipeline.handle(events)
        if now_ns is not None:
            self.pipeline.advance(now_ns - self._reorder_window_ns - IDLE_RELEASE_NS)
        self._export_spans()
        if time.monotonic() >= self._next_metrics:
            self._export_metrics()

    def start_profiling(self) -> CpuProfiling:
        """Attach the CPU profiler (docs/profiling.md); its samples link to this agent's spans."""
        from .profiles.session import CpuProfiling  # noqa: PLC0415 — the CPU profiler loads bcc: only when profiling

        profiling = CpuProfiling(self.config, self.selfmetrics, self.host_name, self.pipeline.assembler.server_span_at)
        profiling.start()
        return profiling

    def record_kernel_stats(
        self, stats: Mapping[str, int], shed: Mapping[str, int], injections: Mapping[str, int] | None = None
    ) -> None:
        """The kernel side's own drop counters, the requests it shed and, with traceparent injection,
        the requests by what it did to them (totals since start)."""
        for reason, total in stats.items():
            self.selfmetrics.set("otel_ebpf.kernel.drops", total, {"reason": reason})
        for reason, total in shed.items():
            self.selfmetrics.set("otel_ebpf.spans.shed", total, {"reason": reason})
        for outcome, total in (injections or {}).items():
            self.selfmetrics.set("otel_ebpf.traceparent.requests", total, {"outcome": outcome})

    def _export_spans(self) -> None:
        spans = self.telemetry.take_spans()
        if spans:
            self.sink.export_spans(spans)

    def _export_metrics(self) -> None:
        self._next_metrics = time.monotonic() + self.config.export.metric_interval_s
        resource_metrics = self.telemetry.collect_metrics(self.clock())
        for source in self.metric_sources:
            resource_metrics += source(self.clock())
        self_data = self._self_reader.get_metrics_data()
        if self_data is not None:
            resource_metrics += self_data.resource_metrics
        self.sink.export_metrics(MetricsData(resource_metrics=merged_by_resource(resource_metrics)))

    def finish(self, timeout_s: float = 5.0) -> None:
        """Flush pending exchanges, spans and metrics, then shut the exporters down, within
        ``timeout_s`` even when a backend hangs (a stop must stay short).

        The last spans (those the reorder window still held) are exported, and the span exporters
        shut down, before the last metrics are taken, so that the final self-metrics account for
        every span: exported, kept in the spool, or lost with its reason."""
        self.pipeline.flush()
        self._export_spans()
        self.sink.shutdown_spans(timeout_s / 2)
        self._export_metrics()
        self.sink.shutdown(timeout_s / 2)
        self._self_meters.shutdown()


def run_live(config: AgentConfig, record_to: IO[str] | None = None, export: bool = True) -> int:
    """Attach the probes and run until stopped. Returns the process exit code."""
    from .probes.socket import SocketProbe  # noqa: PLC0415 — the probe loads bcc: only for a live run, not replay

    stop = StopSignal(config.run.duration_s)
    stop.install()
    started_nice, nice = os.getpriority(os.PRIO_PROCESS, 0), config.capture.nice
    kernel_http_metrics = config.capture.kernel_http_metrics
    agent = Agent(config, time.time_ns, kernel_http_metrics=kernel_http_metrics) if export else None
    probe = SocketProbe(
        config.capture,
        config.targets,
        ContainerResolver(str(config.resource.host_root)),
        config.trace.inject_traceparent,
    )
    if agent is not None:
        agent.tracker.on_unknown = probe.ignore_connection
        agent.tracker.on_ciphertext = probe.tell_ciphertext
    header = RecordingHeader(socket.gethostname(), kernel_http_metrics=kernel_http_metrics)
    recorder = RecordingWriter(record_to, header) if record_to else None
    budget = CpuBudget(config.capture.cpu_budget)
    cap = CpuCap(config.capture.cpu_budget)
    health = Health()
    # Listening before the attach: a taken port fails at once, and /healthz answers while BPF compiles.
    servers = start_servers(config, health, agent.sink.metric_exporter(PrometheusMetricExporter) if agent else None)

    def take(events: list[Event], now_ns: int | None) -> None:
        if recorder is not None:
            recorder.write(events)
        if agent is not None:
            agent.process(events, now_ns)

    http_requests = 0  # HTTP/1 requests the kernel counted since start

    def kernel_summaries(now_ns: int | None) -> dict[str, int]:
        """What the kernel aggregated (HTTP/1 counts, TCP health, drops, shed requests), once a
        second; returns the requests shed since start, by reason."""
        nonlocal http_requests
        if kernel_http_metrics:
            counts = probe.http_counts()
            http_requests += sum(c.count for c in counts if isinstance(c, HttpRequestCounts))
            take(counts, now_ns)
        if config.capture.tcp_health:
            take(probe.tcp_health_counts(), now_ns)
        shed = probe.shed_requests()
        if agent is not None:
            agent.record_kernel_stats(probe.kernel_stats(), shed, probe.injections())
        return shed

    profiling: CpuProfiling | None = None
    gpu: GpuMonitor | None = None
    guard: ModelGuard | None = None
    roce: RoceProbe | None = None
    verbs: VerbsMonitor | None = None
    nvml: NvmlReader | None = None
    idle_reader: IdleAfterFloor | None = None
    try:
        if agent is not None and config.model_guard.mode != "off":
            guard = _start_model_guard(agent)
        probe.start()
        log.info("probes attached (payload cap %d bytes, sockets by %s)", probe.payload_cap, probe.socket_mode)
        if agent is not None and config.profiling.enabled:
            profiling = agent.start_profiling()
        if agent is not None:
            verbs = _start_rdma(agent)
        if agent is not None and config.gpu.enabled != "false":
            gpu = _start_gpu(agent, profiling, verbs)
        if agent is not None and config.roce.interfaces:
            roce = _start_roce(agent)
        if agent is not None and config.gpu.nvml:
            nvml = _start_nvml(agent)
        _check_targets_alive(config)
        # Nicer from here on, not during start-up: BCC's compiles are seconds of CPU once, which
        # at nice 10 on saturated CPUs would take minutes (a DaemonSet not ready for as long).
        if nice and nice != started_nice:
            if set_niceness(nice):
                log.info(
                    "scheduling: nice %d (capture.nice): the traced applications run first when CPUs are short", nice
                )
            else:
                log.warning("capture.nice: cannot go from nice %d to %d without CAP_SYS_NICE", started_nice, nice)
        floor = config.capture.cpu_floor
        if floor is not None and floor < config.capture.cpu_budget:
            idle_reader = IdleAfterFloor(floor)
            if idle_reader.start():
                log.info(
                    "scheduling: past %g of a core each second (capture.cpu_floor), the reader runs on CPU the "
                    "applications leave idle",
                    floor,
                )
            else:  # it said why: the reader stays at its niceness
                idle_reader = None
        settle_heap()
        if config.run.ready_file:
            write_ready_file(config.run.ready_file)
        next_kernel_stats = 0.0
        ready = False
        # What the budget weighs: the agent's CPU that grows with traffic, on every thread (reading
        # the ring and the pipeline here, encoding and sending on the exporters' threads), less this
        # thread's other work (profiles, GPU and RDMA records, map reads), which shedding could not
        # reduce. Start-up is before the first reading, which only sets the baseline.
        other_cpu = 0.0
        capped = False  # the cap has made the reader wait: said once
        paused = 0.0  # seconds it waited, since start
        while not stop.stopped:
            # Each iteration is bounded (at most MAX_POLL_RECORDS records): what user space cannot
            # take stays in the ring, where the kernel sheds new exchanges before it overflows. Over
            # the budget, the iteration waits instead, until the cap's debt is paid.
            pause = cap.pause(time.process_time() - other_cpu, time.monotonic())
            if pause:
                if not capped:
                    capped = True
                    log.warning(
                        "over the CPU budget (capture.cpu_budget: %g of a core) on traffic the kernel does not shed "
                        "(HTTP/2, gRPC, other protocols) or not yet: the ring buffer is read no faster than the "
                        "budget allows, and what overflows it is lost and counted (otel_ebpf.events.lost, "
                        "otel_ebpf.capture.paused)",
                        cap.cores,
                    )
                pause = min(pause, MAX_PAUSE_S)
                stop.wait(pause)
                paused += pause
                if agent is not None:
                    agent.selfmetrics.add("otel_ebpf.capture.paused", round(pause * 1000))
            else:
                take(probe.poll(POLL_MS), time.time_ns())
            captured = time.thread_time()
            if agent is not None:
                if profiling is not None:
                    profiling.poll(0, agent.pipeline.horizon_ns)
                if gpu is not None:
                    gpu.poll(0, agent.pipeline.horizon_ns)
                if guard is not None:
                    guard.poll(0)
                if verbs is not None:
                    verbs.poll(0)
            now = time.monotonic()
            if now >= next_kernel_stats:  # map reads are syscalls: not every poll
                next_kernel_stats = now + KERNEL_STATS_S
                shed = kernel_summaries(time.time_ns())
                cpu = time.process_time() - other_cpu
                keep = budget.update(cpu, now, http_requests, sum(shed.values()), paused)
                probe.keep_exchanges(keep)
                log.debug("cpu budget: %.3f s of CPU so far, copying %.4f of new HTTP/1 exchanges", cpu, keep)
            other_cpu += time.thread_time() - captured
            health.beat()
            if idle_reader is not None:
                idle_reader.turned()
            if not ready:  # probes attached and one turn of the pipeline done
                ready = True
                health.ready_now()
        health.stopping()
        if idle_reader is not None:  # the final drain and flush must not wait on the applications
            idle_reader.close()
        # The kernel's seconds of detaching overlap the final drain and flush.
        probe.detach()
        # The final drain and flush must not wait on the applications: back to the niceness it
        # was started with.
        if nice and nice != started_nice and not set_niceness(started_nice):
            log.debug("stopping at nice %d: going back to %d needs CAP_SYS_NICE", nice, started_nice)
        # What the kernel handed over before the stop still counts: the ring as it stands now, at
        # most its size (MiBs: about a second of HTTP/2 at most), however much traffic goes on.
        for events in probe.drain():
            take(events, None)
        kernel_summaries(None)
        # A recording has no self-metrics: this line is what says what the kernel lost meanwhile.
        log.info("kernel drop counters: %s, shed: %s", probe.kernel_stats(), probe.shed_requests())
    finally:
        if idle_reader is not None:
            idle_reader.close()
        # Detaching takes the kernel seconds (a grace period per probe): it goes on while the
        # pipeline flushes and the exporters send their last batches.
        detaching = threading.Thread(target=probe.close, name="detach")
        detaching.start()
        if guard is not None:
            guard.close()
        if gpu is not None:
            gpu.close()  # before the CPU profiler: they may share its profile sink
        if profiling is not None:
            profiling.close()
        if verbs is not None:
            verbs.close()
        if agent is not None:
            agent.finish()
            log.info("stopped: %s", _summary(agent.selfmetrics))
        if roce is not None:  # after the last metrics, which read its tables
            roce.close()
        if nvml is not None:
            nvml.close()
        detaching.join()
        for server in servers:
            server.close()
    return 0


def _check_targets_alive(config: AgentConfig) -> None:
    """The ``--pid`` targets existed before the probes attached (preflight); one may have exited
    since. With none left and no other target nothing could ever be traced: stop rather than
    report ready."""
    gone = exited(config.targets.pids)
    if not gone:
        return
    if len(gone) == len(config.targets.pids) and not config.targets.executables:
        raise StartupError(f"targets.pids (--pid): exited while the agent started: {', '.join(map(str, gone))}")
    log.warning("target process(es) %s exited while the agent started", ", ".join(map(str, gone)))


def _start_gpu(agent: Agent, profiling: CpuProfiling | None, verbs: VerbsMonitor | None) -> GpuMonitor:
    """The GPU views (docs/gpu.md), attached now or once a GPU library shows up (``gpu.enabled``).
    With the verbs probe, NCCL spans pass through it: it adds the queue pairs they used."""
    from .profiles.gpu_session import GpuMonitor  # noqa: PLC0415 — the GPU monitor loads bcc: only when GPU tracing is on

    gpu = GpuMonitor(
        agent.config,
        agent.selfmetrics,
        agent.host_name,
        DELTA_KINDS[agent.config.export.metric_temporality],
        profile_sink=getattr(profiling, "sink", None),
        link_for=agent.pipeline.assembler.server_span_at,
        export_spans=agent.sink.export_spans if verbs is None else verbs.join_collectives(agent.sink.export_spans),
    )
    gpu.start()
    agent.metric_sources.append(gpu.collect_metrics)
    return gpu


def _start_roce(agent: Agent) -> RoceProbe:
    """RoCEv2 counts on the named interfaces (docs/roce.md), metrics of the node's resource."""
    from .probes.roce import RoceProbe  # noqa: PLC0415 — loads bcc: only when roce.interfaces names some

    resource = {**agent.config.resource.attributes, "host.name": agent.host_name, **SDK_ATTRIBUTES}
    roce = RoceProbe(
        agent.config.roce, agent.selfmetrics, resource, DELTA_KINDS[agent.config.export.metric_temporality]
    )
    try:
        roce.start()  # RuntimeError (TcError among them) saying what failed
    except BaseException:
        roce.close()
        raise
    agent.metric_sources.append(roce.collect_metrics)
    return roce


def _start_rdma(agent: Agent) -> VerbsMonitor | None:
    """RDMA port counters (a metric source, where there are devices) and, with ``rdma.verbs``,
    the verbs probe (docs/rdma.md)."""
    from .rdma.ports import port_counter_source  # noqa: PLC0415

    config = agent.config.rdma
    delta = DELTA_KINDS[agent.config.export.metric_temporality]
    if config.port_counters:
        node = {**agent.config.resource.attributes, "host.name": agent.host_name, **SDK_ATTRIBUTES}
        source = port_counter_source(Path(config.sysfs_root), node, delta)
        if source is not None:
            agent.metric_sources.append(source)
        log.info("RDMA port counters: %s", f"from {config.sysfs_root}" if source else f"none (no {config.sysfs_root})")
    if not config.verbs:
        return None
    from .probes.verbs import VerbsMonitor  # noqa: PLC0415 — loads bcc: only with rdma.verbs

    verbs = VerbsMonitor(agent.config, agent.selfmetrics, agent.host_name, delta)
    try:
        verbs.start()  # RuntimeError saying what failed
    except BaseException:
        verbs.close()
        raise
    agent.metric_sources.append(verbs.collect_metrics)
    return verbs


def _start_nvml(agent: Agent) -> NvmlReader | None:
    """GPU device state (docs/gpu.md, "Device state"), read at each metrics collection; None, said
    once, where there is no NVIDIA driver or device."""
    from .gpu.nvml import NvmlMetrics, open_reader  # noqa: PLC0415 — nvidia-ml-py only where asked

    config = agent.config
    reader, why = open_reader(config.gpu.nvml_library or None, agent.selfmetrics)
    log.info("GPU device state: %s", why if reader is not None else f"none ({why})")
    if reader is None:
        return None
    node = {**config.resource.attributes, "host.name": agent.host_name, **SDK_ATTRIBUTES}
    processes = ProcessResources(
        config.resource.attributes, agent.host_name, ContainerResolver(str(config.resource.host_root))
    )
    metrics = NvmlMetrics(node, processes.of)
    delta = DELTA_KINDS[config.export.metric_temporality]

    def collect(now_ns: int) -> list:
        metrics.record(reader.read(), now_ns)
        return metrics.collect(now_ns, delta)

    agent.metric_sources.append(collect)
    return reader


def _start_model_guard(agent: Agent) -> ModelGuard:
    """The model-file guard (docs/model-guard.md): its reports go out as log records."""
    from .exporters.logs import build_log_sink  # noqa: PLC0415 — with the guard only
    from .probes.model_guard import ModelGuard  # noqa: PLC0415 — loads bcc: only when the guard is on

    resource = Resource(
        {
            **agent.config.resource.attributes,
            "service.name": agent.config.agent.service_name,
            "host.name": agent.host_name,
        }
    )
    guard = ModelGuard(
        agent.config.model_guard, agent.selfmetrics, build_log_sink(agent.config, agent.selfmetrics), resource
    )
    guard.start()
    return guard


def settle_heap() -> None:
    """Once start-up is over: its garbage collected, what it keeps (BCC's objects, the plugins, the
    exporters: tens of thousands) moved out of the cyclic collector's way for good, so that a full
    collection under load traverses only what the traffic made, and the youngest generation
    collected less often (``YOUNG_COLLECTION_THRESHOLD``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


def replay(config: AgentConfig, header: RecordingHeader, events: Iterable[Event]) -> None:
    """Run the pipeline over recorded events, as the live agent on ``header.host_name`` did.

    A bad line raises ``RecordingError`` from ``events``; what was read before it is still
    processed and exported first.
    """

    def pipeline_time() -> int:
        return agent.pipeline.last_timestamp_ns

    agent = Agent(
        config, pipeline_time, host_name=header.host_name or None, kernel_http_metrics=header.kernel_http_metrics
    )
    batch: list[Event] = []
    try:
        for event in events:
            batch.append(event)
            if len(batch) >= REPLAY_BATCH:
                agent.process(batch)
                batch = []
    finally:
        agent.process(batch)
        agent.finish()
        log.info("replayed: %s", _summary(agent.selfmetrics))


def _summary(metrics: SelfMetrics) -> str:
    totals = metrics.snapshot()
    keys = (
        "events.received",
        "events.lost",
        "spans.exported",
        "spans.dropped",
        "parse.errors",
        "connections.opened",
        "connections.evicted",
        "payload.not_captured",
    )
    return ", ".join(f"{k}={totals['otel_ebpf.' + k]}" for k in keys)
