"""The agent's own counters: every loss and drop, exported as metrics, never hidden.

Counters are monotonic (``add``); gauges hold the latest value (``set``). Both are keyed by a name
from :data:`DESCRIPTIONS` plus optional attributes, and are cheap enough for the event path (a dict
update under a lock). :func:`register` exposes them as observable instruments on a meter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Meter, Observation

# name -> (unit, description, is_gauge)
DESCRIPTIONS: dict[str, tuple[str, str, bool]] = {
    "otel_ebpf.events.received": ("{event}", "Events decoded from the kernel ring buffer", False),
    "otel_ebpf.events.lost": ("{event}", "Events the kernel could not hand over (ring buffer full)", False),
    "otel_ebpf.payload.not_captured": ("By", "Payload bytes beyond the capture cap, counted not copied", False),
    "otel_ebpf.parse.errors": ("{error}", "Malformed protocol input skipped by a parser", False),
    "otel_ebpf.messages.partial": (
        "{message}",
        "Messages reported with parts unknown (e.g. header compression state from before the capture)",
        False,
    ),
    "otel_ebpf.messages.unmatched": ("{message}", "Messages that found no request/response partner", False),
    "otel_ebpf.connections.tracked": ("{connection}", "Connections in the connection table", True),
    "otel_ebpf.connections.opened": (
        "{connection}",
        "Connections the agent started tracking (at their first copied bytes: none whose exchanges were all shed)",
        False,
    ),
    "otel_ebpf.connections.evicted": ("{connection}", "Connections evicted from the full table", False),
    "otel_ebpf.connections.without_tuple": (
        "{connection}",
        "Connections whose ends the agent could not learn (closed before /proc was read)",
        False,
    ),
    "otel_ebpf.connections.tls": ("{connection}", "Connections read as TLS plaintext from the SSL probes", False),
    "otel_ebpf.connections.unknown_protocol": ("{connection}", "Connections no protocol plugin claimed", False),
    "otel_ebpf.connections.tls_ciphertext": (
        "{connection}",
        "Connections given up on (at the sniff budget, or closed first) whose bytes were TLS records with no "
        "plaintext from the SSL probes: a TLS library the agent does not hook, or one hooked after they began "
        "(not those the probes knew that closed after their handshake, as health checks do)",
        False,
    ),
    "otel_ebpf.spans.exported": ("{span}", "Spans handed to an exporter successfully", False),
    "otel_ebpf.spans.dropped": (
        "{span}",
        "Spans dropped, by reason: queue_full, export_failed (file, console), shutdown; and for OTLP "
        "spool_full, non_retryable, expired, encode_failed",
        False,
    ),
    "otel_ebpf.spans.shed": (
        "{request}",
        "Requests that got no span, by reason: HTTP/1 exchanges the kernel did not copy because user "
        "space was behind (backlog) or over its CPU budget (cpu_budget) or an event of it was lost (ring_full), "
        "all still in the HTTP metrics; spans left out by trace.sample_ratio (sampled); requests still "
        "waiting for a response when the agent stopped (in_flight_at_stop) or when their connection "
        "closed, on a socket that moved bytes through io_uring or splice, where the response may have "
        "gone unseen (response_unseen); requests waiting on a connection evicted from the full connection "
        "table (evicted)",
        False,
    ),
    "otel_ebpf.metrics.export.failed": ("{export}", "Metric exports that failed", False),
    "otel_ebpf.metrics.overflow": ("{point}", "Metric points folded into the overflow series (cardinality cap)", False),
    "otel_ebpf.resources.overflow": ("{process}", "Processes folded into the overflow resource", False),
    "otel_ebpf.capture.paused": (
        "ms",
        "Time the agent waited before reading the ring buffer, over its CPU budget on traffic the kernel "
        "cannot shed whole (capture.cpu_budget)",
        False,
    ),
    "otel_ebpf.kernel.drops": (
        "{item}",
        "What the BPF side dropped or could not attribute, by reason (ring buffer full, syscall table "
        "full, iovec bytes past the cap, sendmmsg/recvmmsg messages not copied, TLS calls without a socket, "
        "socket reads and sends made through io_uring or splice, HTTP/1 requests unanswered when such a "
        "socket closed, "
        "RoCEv2 packets not counted by flow because a table was full)",
        False,
    ),
    "otel_ebpf.events.late": (
        "{event}",
        "Events that arrived after the reorder window and were handled out of order",
        False,
    ),
    "otel_ebpf.events.reorder_overflow": (
        "{event}",
        "Events released before their reorder window closed (reorder buffer full)",
        False,
    ),
    "otel_ebpf.trace.inflight": ("{request}", "Requests in flight tracked for trace assembly", True),
    "otel_ebpf.trace.inflight_evicted": (
        "{request}",
        "In-flight requests forgotten before they completed (timeout or capacity)",
        False,
    ),
    "otel_ebpf.trace.ambiguous_parents": (
        "{request}",
        "Outgoing requests left without a parent: several incoming requests shared their thread",
        False,
    ),
    "otel_ebpf.trace.correlated_parents": (
        "{request}",
        "Outgoing requests parented through the x-request-id/x-correlation-id they forwarded",
        False,
    ),
    "otel_ebpf.trace.forwarded_contexts": (
        "{request}",
        "Outgoing requests that passed on the trace context of a request their process serves (a proxy)",
        False,
    ),
    "otel_ebpf.trace.same_node_parents": (
        "{request}",
        "Incoming requests parented by an outgoing request of another process on the node",
        False,
    ),
    "otel_ebpf.trace.propagated": ("{request}", "Requests that carried a trace context (traceparent, b3)", False),
    "otel_ebpf.traceparent.requests": (
        "{request}",
        "HTTP/1 requests the kernel looked at for traceparent injection, by outcome: injected, "
        "already_present, or why it refused (tls, request_line, head_split, head_too_long, kernel, not_watched)",
        False,
    ),
    "otel_ebpf.profiles.samples": ("{sample}", "CPU profile samples received from the kernel", False),
    "otel_ebpf.profiles.samples.dropped": (
        "{sample}",
        "CPU profile samples lost, by reason (ring buffer full, per-interval stack cap)",
        False,
    ),
    "otel_ebpf.profiles.stacks.truncated": (
        "{item}",
        "Python stacks cut short, by reason: samples deeper than the BPF walker's frame limit "
        "(python_truncated), Python processes the walker's table had no room for (python_table_full)",
        False,
    ),
    "otel_ebpf.profiles.invalid": (
        "{item}",
        "Profile parts with a number out of range for its OTLP/pprof field, by action: frames kept with "
        "address or line 0, unknown (frame_replaced), samples dropped (sample_dropped), links dropped "
        "(link_dropped), profiles with a bad period or time dropped (profile_dropped)",
        False,
    ),
    "otel_ebpf.profiles.export.failed": ("{export}", "Profile exports that failed or were dropped, by exporter", False),
    "otel_ebpf.protocol.drops": (
        "{item}",
        "What a plugin's shared state dropped or could not resolve, by protocol and reason (RTPS: "
        "discovery entries evicted, samples of unknown writers, sample and call table evictions)",
        False,
    ),
    "otel_ebpf.protocol.failures": (
        "{connection}",
        "Connections given up because their protocol plugin raised on their bytes, by protocol "
        '("sniff" when no plugin had claimed the connection yet)',
        False,
    ),
    "otel_ebpf.gpu.calls": ("{call}", "GPU library calls decoded from the kernel (CUDA, NCCL, PyTorch USDT)", False),
    "otel_ebpf.gpu.collectives.unlinked": (
        "{call}",
        "NCCL calls made while their thread served no single traced request (a training step, an "
        "event loop serving several): no span, still counted in the GPU metrics",
        False,
    ),
    "otel_ebpf.gpu.libraries": (
        "{file}",
        "GPU library files hooked, by library (runtime, driver, nccl, pytorch)",
        True,
    ),
    "otel_ebpf.gpu.allocations.untracked": (
        "{allocation}",
        "Allocations the agent could not pair: evicted from the full table, frees of unknown "
        "pointers (allocated before attach), allocations over a live pointer",
        False,
    ),
    "otel_ebpf.gpu.handles.evicted": (
        "{handle}",
        "Kernel and graph handles forgotten to keep their tables bounded (kernel_names, graphs, "
        "graph_execs, captures): their launches go without a kernel name or kernel count",
        False,
    ),
    "otel_ebpf.gpu.stacks.dropped": ("{sample}", "GPU profile samples lost to the per-interval stack cap", False),
    "otel_ebpf.gpu.leaks.reported": ("{report}", "Leak reports emitted as log records", False),
    "otel_ebpf.gpu.leaks.unreported": ("{report}", "Leak reports past the per-check cap, not emitted", False),
    "otel_ebpf.rdma.calls": ("{call}", "RDMA verbs calls decoded from the kernel (libibverbs control path)", False),
    "otel_ebpf.rdma.libraries": ("{file}", "libibverbs files hooked", True),
    "otel_ebpf.rdma.provider_functions": (
        "{function}",
        "RDMA provider data-path functions hooked (post_send, post_recv, poll_cq of each provider file)",
        True,
    ),
    "otel_ebpf.rdma.objects.untracked": (
        "{object}",
        "Verbs objects not followed, by reason: destroyed but made before the agent attached "
        "(made_before_attach), forgotten when rdma.max_objects were followed (table_full)",
        False,
    ),
    "otel_ebpf.rdma.collective_posts.dropped": (
        "{post}",
        "Post calls of NCCL processes forgotten before the collectives' spans were joined with them (table_full)",
        False,
    ),
    "otel_ebpf.rdma.collective_spans.early": (
        "{span}",
        "NCCL spans joined with their queue pairs before their window passed: too many were waiting",
        False,
    ),
    "otel_ebpf.rdma.collective_pairs.cut": (
        "{pair}",
        "Queue pairs a collective used but its span does not name: more than 64",
        False,
    ),
    "otel_ebpf.model_guard.opens": (
        "{open}",
        "Opens of model files the guard matched, by decision (allowed, denied with EPERM)",
        False,
    ),
    "otel_ebpf.model_guard.records.lost": (
        "{open}",
        "Model-file opens decided but not reported: the guard's ring buffer was full",
        False,
    ),
    "otel_ebpf.model_guard.fail_open": (
        "{open}",
        "Opens the guard let through because it could not decide: a kernel read failed (read_failed) "
        "or a directory rule's path did not resolve (path_failed)",
        False,
    ),
    "otel_ebpf.pii.scrubbed": ("{value}", "Personal data and secrets replaced in captured content, by kind", False),
    "otel_ebpf.logs.exported": ("{log_record}", "Log records handed to an exporter successfully", False),
    "otel_ebpf.logs.dropped": ("{log_record}", "Log records dropped: export queue full or export failed", False),
    "otel_ebpf.metrics.points.dropped": (
        "{point}",
        "Metric points the OTLP exporter lost, by reason (queue_full, spool_full, non_retryable, expired, "
        "encode_failed, shutdown)",
        False,
    ),
    "otel_ebpf.profiles.samples.unexported": (
        "{sample}",
        "Profile samples the OTLP exporter lost, by reason (as for metric points)",
        False,
    ),
    "otel_ebpf.export.attempts.failed": (
        "{attempt}",
        "OTLP export attempts that failed, by signal and reason (http_503, grpc_unavailable, "
        "connection_error, ...); retryable ones are tried again",
        False,
    ),
    "otel_ebpf.export.spool.corrupt": (
        "{record}",
        "Spool records found torn or corrupt (agent killed mid-write, disk damage) and skipped",
        False,
    ),
    "otel_ebpf.export.queue.batches": ("{batch}", "Encoded batches waiting for the OTLP backend, by signal", True),
    "otel_ebpf.export.queue.bytes": ("By", "Bytes of the OTLP export queue (the spool's file bytes), by signal", True),
    "otel_ebpf.prometheus.series": ("{series}", "Series the Prometheus exporter holds for /metrics", True),
    "otel_ebpf.prometheus.series.dropped": (
        "{series}",
        "Series the Prometheus exporter forgot or refused, by reason: not updated for "
        "prometheus.series_ttl_s (stale), past prometheus.max_series (max_series), a name seen as two kinds "
        "(type_conflict), exponential histograms (unsupported)",
        False,
    ),
}


def _key(attributes: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(attributes.items())) if attributes else ()


class SelfMetrics:
    """Thread-safe named counters and gauges with attributes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], int]] = {n: {} for n in DESCRIPTIONS}

    def add(self, name: str, amount: int = 1, attributes: Mapping[str, str] | None = None) -> None:
        if amount == 0:
            return
        key = _key(attributes)
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0) + amount

    def set(self, name: str, value: int, attributes: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._values[name][_key(attributes)] = value

    def total(self, name: str) -> int:
        with self._lock:
            return sum(self._values[name].values())

    def snapshot(self) -> dict[str, int]:
        """Totals per name, for summaries and logs."""
        with self._lock:
            return {name: sum(series.values()) for name, series in self._values.items()}

    def observe(self, name: str) -> Iterable[Observation]:
        """One observation per attribute set of counter or gauge ``name``."""
        with self._lock:
            items = list(self._values[name].items())
        return [Observation(value, dict(key)) for key, value in items]

    def register(self, meter: Meter) -> None:
        """Expose every counter and gauge as an observable instrument on ``meter``."""
        for name, (unit, description, is_gauge) in DESCRIPTIONS.items():

            def callback(_options: CallbackOptions, name: str = name) -> Iterable[Observation]:
                return self.observe(name)

            create = meter.create_observable_gauge if is_gauge else meter.create_observable_counter
            create(name, callbacks=[callback], unit=unit, description=description)
