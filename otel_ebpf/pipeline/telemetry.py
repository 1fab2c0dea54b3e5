"""Exchanges become OpenTelemetry spans and metric points, one resource per observed process.

Trace contexts come from :mod:`otel_ebpf.pipeline.assembly` (derived from each request's identity, not
drawn at random) and metric points are stamped with event times, so that replaying a recording
produces the very same telemetry (docs/architecture.md, "Deterministic after the ring buffer").
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.sdk.metrics.export import ResourceMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status

from .. import __version__, tcp_metrics
from ..pii import filter_content
from ..protocol import (
    AttributeValue,
    ConnectionInfo,
    Exchange,
    InstrumentKind,
    InstrumentSpec,
    MetricPoint,
    Protocol,
    SpanDescription,
    SpanKind,
    StatusCode,
)
from ..protocols.http_semconv import counted_duration
from ..redaction import redact_command_line
from ..sampling import SpanSampler
from ..selfmetrics import SelfMetrics
from .assembly import RequestContext
from .events import HttpRequestCounts, ProcessInfo, TcpHealthCounts
from .metrics import ProcessMetrics

_KINDS = {
    SpanKind.SERVER: trace.SpanKind.SERVER,
    SpanKind.CLIENT: trace.SpanKind.CLIENT,
    SpanKind.PRODUCER: trace.SpanKind.PRODUCER,
    SpanKind.CONSUMER: trace.SpanKind.CONSUMER,
    SpanKind.INTERNAL: trace.SpanKind.INTERNAL,
}
_STATUS = {
    StatusCode.UNSET: trace.StatusCode.UNSET,
    StatusCode.OK: trace.StatusCode.OK,
    StatusCode.ERROR: trace.StatusCode.ERROR,
}
SDK_ATTRIBUTES = {
    "telemetry.sdk.name": "otel-ebpf",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.version": __version__,
}
OVERFLOW_PID = -1
EXITED_GRACE_NS = 5_000_000_000
# Processes forgotten after their grace, kept so that kernel counts read even later (a loaded
# agent, the final read at stop) still land on their own resource, not on the overflow one.
FORGOTTEN_MAX = 256
# instruments whose points come from the kernel's counts, by protocol, when it counts
_KERNEL_COUNTED = {"http1": frozenset({"http.server.request.duration", "http.client.request.duration"})}
_PLAIN_STATUS = {code: Status(sdk_code) for code, sdk_code in _STATUS.items()}


def _status(code: StatusCode, description: str | None) -> Status:
    return Status(_STATUS[code], description) if description else _PLAIN_STATUS[code]


def parse_resource_attributes(text: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` syntax: ``k=v,k2=v2`` with percent-encoded values."""
    attributes: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    return attributes


def process_resource_attributes(info: ProcessInfo, host_name: str) -> dict[str, AttributeValue]:
    """Resource of an observed process; its own OTel variables win over what the agent infers or
    reads from its container's runtime. Without a service name of its own, a process in a
    Kubernetes pod is named after its container (the conventions' last resort for pods: the
    kubelet's state gives no owner), any other after its executable: every Python service on a
    node would otherwise be ``python3.11``."""
    executable_name = os.path.basename(info.executable) or info.command_line.split(" ", 1)[0]
    own = parse_resource_attributes(info.environment.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    service_name = (
        info.environment.get("OTEL_SERVICE_NAME")
        or own.get("service.name")
        or info.container.get("k8s.container.name")
        or executable_name
        or "unknown"
    )
    attributes: dict[str, AttributeValue] = {
        "host.name": host_name,
        "process.pid": info.pid,
        "process.executable.name": executable_name,
        "process.executable.path": info.executable,
        "process.command_line": redact_command_line(info.command_line),
        "service.instance.id": f"{host_name}/{info.pid}",
    }
    attributes.update(info.container)
    attributes.update(own)
    attributes["service.name"] = service_name
    return attributes


class _ProtocolScope(InstrumentationScope):
    """A protocol's scope, which keys its metric series on every exchange: hashed once, not per
    lookup (the SDK's hashes a new tuple each time)."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(name, version)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class Telemetry:
    """Turns exchanges into spans (collected by ``take_spans``) and metric points (``collect_metrics``)."""

    def __init__(
        self,
        protocols: Sequence[Protocol],
        host_name: str,
        extra_resource_attributes: Mapping[str, str],
        selfmetrics: SelfMetrics,
        max_processes: int = 1024,
        delta_kinds: frozenset[InstrumentKind] = frozenset(),
        kernel_http_metrics: bool = False,
        sampler: SpanSampler | None = None,
        content_filter: Callable[[str], str] | None = None,
    ) -> None:
        """``kernel_http_metrics``: HTTP/1 request durations come from the kernel's exact counts
        (:meth:`http_counts`), not from the exchanges, which may have been shed. ``content_filter``
        rewrites captured content (GenAI messages, headers, metadata) before it is exported: the
        PII scrubber (:mod:`otel_ebpf.pii`)."""
        self._specs: dict[str, InstrumentSpec] = {
            spec.name: spec for protocol in protocols for spec in protocol.instruments
        }
        self._specs.update((spec.name, spec) for spec in tcp_metrics.INSTRUMENTS)
        self._tcp_scope = InstrumentationScope("otel_ebpf.tcp", __version__)
        self._scopes = {p.name: _ProtocolScope(f"otel_ebpf.protocols.{p.name}", __version__) for p in protocols}
        self._host_name = host_name
        self._extra = dict(extra_resource_attributes)
        self._selfmetrics = selfmetrics
        self._max_processes = max_processes
        self._delta_kinds = delta_kinds
        self._processes: dict[int, ProcessMetrics] = {}
        self._exited: dict[int, int] = {}  # pid -> when it exited (event time)
        self._forgotten: OrderedDict[int, ProcessMetrics] = OrderedDict()  # oldest first, FORGOTTEN_MAX
        # last points of images replaced by exec (or of a reused pid), for the next collection
        self._retired: list[ResourceMetrics] = []
        self._pending_spans: list[ReadableSpan] = []
        self._kernel_counted = _KERNEL_COUNTED if kernel_http_metrics else {}
        self._sampler = sampler or SpanSampler()
        self._sampling = not self._sampler.keeps_everything
        self._content_filter = content_filter

    # ---- processes -------------------------------------------------------------------------------

    def process_info(self, info: ProcessInfo) -> None:
        """A process (or a new image of it, after exec) gets its own resource from now on."""
        if info.pid not in self._processes and self._full():
            self._selfmetrics.add("otel_ebpf.resources.overflow")
            return
        attributes = {**self._extra, **process_resource_attributes(info, self._host_name), **SDK_ATTRIBUTES}
        previous = self._processes.get(info.pid)
        if previous is not None:  # its points so far belong to the old identity: keep them
            retired = previous.collect(info.timestamp_ns, self._delta_kinds)
            if retired is not None:
                self._retired.append(retired)
            self._selfmetrics.add("otel_ebpf.metrics.overflow", previous.overflowed)
        self._processes[info.pid] = ProcessMetrics(Resource(attributes), self._specs)
        self._exited.pop(info.pid, None)
        self._forgotten.pop(info.pid, None)  # a reused pid: not that process

    def process_exit(self, pid: int, timestamp_ns: int) -> None:
        """Keep the process until its last metrics were collected, then forget it: at the first
        collection ``EXITED_GRACE_NS`` after its exit, as the kernel's last counts of its requests
        come with its next once-a-second read."""
        if pid in self._processes:
            self._exited[pid] = timestamp_ns

    def _full(self) -> bool:
        """Every slot taken (the overflow resource takes none)."""
        return len(self._processes) - (OVERFLOW_PID in self._processes) >= self._max_processes

    def _process(self, pid: int) -> ProcessMetrics:
        process = self._processes.get(pid)
        if process is None and pid in self._forgotten and not self._full():
            # counts of an exited process read after its grace: back for one more collection
            process = self._processes[pid] = self._forgotten.pop(pid)
            self._exited[pid] = 0
        if process is None:
            # No identity event (lost, or past max_processes): fold into one overflow resource.
            process = self._processes.get(OVERFLOW_PID)
            if process is None:
                attributes = {**self._extra, "service.name": "unknown_process", "host.name": self._host_name}
                process = ProcessMetrics(Resource({**attributes, **SDK_ATTRIBUTES}), self._specs)
                self._processes[OVERFLOW_PID] = process
        return process

    # ---- exchanges -------------------------------------------------------------------------------

    def exchange(
        self,
        protocol: str,
        pid: int,
        exchange: Exchange,
        description: SpanDescription,
        conn: ConnectionInfo,
        context: RequestContext,
    ) -> None:
        """Record one completed exchange of process ``pid``: its span (unless an instrumented
        program's own span stands for it) and its metric points."""
        process = self._process(pid)
        scope = self._scopes[protocol]
        if (
            context.emit
            and self._sampling
            and not self._sampler.keep(
                context.trace_id, description.status is StatusCode.ERROR, description.end_ns - description.start_ns
            )
        ):
            self._selfmetrics.add("otel_ebpf.spans.shed", 1, {"reason": "sampled"})
        elif context.emit:
            attributes, status_description = description.attributes, description.status_description
            if self._content_filter is not None:
                attributes = filter_content(attributes, self._content_filter)
                if status_description:  # a server's error message may quote what it was sent
                    status_description = self._content_filter(status_description)
            self._pending_spans.append(
                ReadableSpan(
                    name=description.name,
                    context=context.span_context(),
                    parent=context.parent,
                    resource=process.resource,
                    attributes=attributes,
                    links=context.links,
                    kind=_KINDS[description.kind],
                    status=_status(description.status, status_description),
                    start_time=description.start_ns,
                    end_time=description.end_ns,
                    instrumentation_scope=scope,
                )
            )
        process.record_all(
            scope, exchange.metric_points(conn), description.end_ns, self._kernel_counted.get(protocol, ())
        )

    def http_counts(self, counts: HttpRequestCounts) -> None:
        """HTTP/1 requests the kernel counted (bpf/http1_summary.h), into their process's histograms."""
        scope = self._scopes.get("http1")
        if scope is None:  # the plugin is disabled: nobody asked for HTTP/1 metrics
            return
        instrument, attributes = counted_duration(
            counts.role,
            counts.method,
            counts.status,
            counts.version,
            counts.tls,
            counts.server_address,
            counts.server_port,
        )
        self._process(counts.pid).merge_histogram(
            scope,
            instrument,
            attributes,
            counts.count,
            counts.sum_ns / 1e9,
            counts.buckets,
            counts.min_ns / 1e9,
            counts.max_ns / 1e9,
            counts.timestamp_ns,
        )

    def tcp_health(self, counts: TcpHealthCounts) -> None:
        """TCP health the kernel counted (bpf/tcp_health.c), into its process's series."""
        process = self._process(counts.pid)
        scope, now = self._tcp_scope, counts.timestamp_ns
        attributes = tcp_metrics.series_attributes(counts)
        if counts.retransmissions:
            process.record(scope, MetricPoint(tcp_metrics.RETRANSMISSIONS, counts.retransmissions, attributes), now)
        for direction, resets in (("transmit", counts.resets_sent), ("receive", counts.resets_received)):
            if resets:
                point = MetricPoint(tcp_metrics.RESETS, resets, {**attributes, "network.io.direction": direction})
                process.record(scope, point, now)
        for reason, packets in counts.drops:
            point = MetricPoint(tcp_metrics.DROPS, packets, {**attributes, tcp_metrics.DROP_REASON: reason})
            process.record(scope, point, now)
        for flow in counts.flows:
            of_cgroup = {**attributes, tcp_metrics.CGROUP: flow.cgroup} if flow.cgroup else attributes
            for direction, moved, packets in (
                ("transmit", flow.bytes_sent, flow.packets_sent),
                ("receive", flow.bytes_received, flow.packets_received),
            ):
                if packets:
                    each_way = {**of_cgroup, "network.io.direction": direction}
                    process.record(scope, MetricPoint(tcp_metrics.IO, moved, each_way), now)
                    process.record(scope, MetricPoint(tcp_metrics.PACKETS, packets, each_way), now)
        if counts.rtt_count:
            process.merge_histogram(
                scope,
                tcp_metrics.RTT,
                attributes,
                counts.rtt_count,
                counts.rtt_sum_us / 1e6,
                counts.rtt_buckets,
                counts.rtt_min_us / 1e6,
                counts.rtt_max_us / 1e6,
                now,
            )

    def metric_points(
        self, protocol: str, pid: int, exchange: Exchange, conn: ConnectionInfo, timestamp_ns: int
    ) -> None:
        """Record the metric points of an exchange that stands for no span (control traffic)."""
        process = self._process(pid)
        scope = self._scopes[protocol]
        process.record_all(scope, exchange.metric_points(conn), timestamp_ns)

    def take_spans(self) -> list[ReadableSpan]:
        spans, self._pending_spans = self._pending_spans, []
        return spans

    def collect_metrics(self, now_ns: int) -> list[ResourceMetrics]:
        """Every process's points as of ``now_ns``; forgets processes that exited."""
        resource_metrics, self._retired = self._retired, []
        for pid, process in list(self._processes.items()):
            collected = process.collect(now_ns, self._delta_kinds)
            if collected is not None:
                resource_metrics.append(collected)
            self._selfmetrics.add("otel_ebpf.metrics.overflow", process.overflowed)
            process.overflowed = 0
            if pid in self._exited and now_ns - self._exited[pid] >= EXITED_GRACE_NS:
                self._forgotten[pid] = self._processes.pop(pid)
                del self._exited[pid]
                if len(self._forgotten) > FORGOTTEN_MAX:
                    self._forgotten.popitem(last=False)
        return resource_metrics
