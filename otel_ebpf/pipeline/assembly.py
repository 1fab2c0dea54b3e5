"""Trace assembly: every request gets its trace id, span id and parent when it *starts*.

Deciding at the start (docs/architecture.md, "Trace assembly") is what lets work done on
behalf of a request inherit its trace: an outgoing call made while an incoming request is being
served starts after that request did and completes before it does. The rules, in order:

1. *Same node.* An incoming request whose connection mirrors an outgoing request of another
   observed process (its peer is their local end and the reverse), still in flight, is that
   request's child, in the same trace.
2. *Propagated context.* An incoming request carrying ``traceparent`` or B3 joins that trace, the
   caller's span as parent (``tracestate`` kept). An outgoing request that carries the very context
   an incoming request its process is serving brought was forwarded (a proxy passes the header on):
   it is that request's child. Any other outgoing request that carries one comes from an
   instrumented program, whose own span already stands for it: by default the agent emits no span
   for it (``instrumented_clients="skip"``), or with ``"child"`` one under the program's span.
3. *Correlation id.* An outgoing request that carries the ``x-request-id`` (or
   ``x-correlation-id``) of exactly one incoming request its process is serving is that request's
   child: the program forwarded the id, whichever thread ended up writing the call (gRPC's core
   writes on threads of its own; an event loop serves many requests on one).
4. *Thread causality.* Otherwise, an outgoing request made on a thread that is serving exactly one
   incoming request is that request's child.
5. *Ambiguity.* A thread serving several incoming requests at once (an event loop) gives no
   parent: the outgoing request starts a trace of its own, with links to the candidates, counted.
6. Otherwise the request starts a new trace.

With ``traceparent`` injection (``trace.inject_traceparent``) the kernel decides some ids itself
(:class:`~otel_ebpf.pipeline.events.KernelTrace`), and they win, because they are what went on the wire: an
outgoing request it inserted a ``traceparent`` into takes that header's trace and span ids, and as
parent the request its thread serves in that trace, if any; an incoming request without a
propagated context takes the trace the kernel gave its thread (so the thread's calls continue it).

Messaging (a :class:`RequestStart` with ``message_id``, e.g. RTPS's (writer GUID, sequence
number)) replaces rules 1–3: an outgoing message (PRODUCER, CLIENT request) takes its parent by
rules 4–5 and is remembered under its id; an incoming one with the same id (CONSUMER, SERVER) is
its child, in the same trace (same node). A received message then stays its thread's context for
``consume_window_ns`` or until the thread receives the next one: what the thread sends meanwhile
(a subscriber publishing while it processes a sample) continues the trace when no request is
being served on it (rule 4 first).

Ids are derived from the request's identity (connection, start time), never drawn at random, so a
replay of a recording assembles the very same traces; a request whose state was evicted gets the
same span id when it completes, so its children still point at it.

All state is bounded: contexts live from their request's start until its exchange completes, at
most ``inflight_timeout_ns`` and at most ``max_inflight`` of them; evictions are counted. Past
that, the last few requests each thread served are remembered (``SERVED_PER_THREAD`` for each of
the ``SERVED_THREADS`` threads that served last): records from other rings — CPU samples, NCCL
calls — are linked once assembly has caught up with their time, when their request may be done.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TypeVar

from opentelemetry.trace import Link, SpanContext, TraceFlags, TraceState

from ..protocol import ConnectionInfo, Direction, Endpoint, RequestStart, Role
from ..selfmetrics import SelfMetrics
from .events import ConnKey, KernelTrace
from .propagation import PropagatedContext, read_carrier

SKIP, CHILD = "skip", "child"
INSTRUMENTED_CLIENT_MODES = (SKIP, CHILD)
MAX_LINKS = 8  # candidate parents linked from an ambiguous request
MAX_PER_THREAD = 256  # incoming requests in flight on one thread (an event loop's connections)
SERVED_PER_THREAD = 4  # completed incoming requests remembered per thread, for server_span_at
SERVED_THREADS = 4096  # threads whose completed requests are remembered, least recent forgotten
# How long a received message stays its thread's context: processing a camera frame takes
# milliseconds to seconds; a thread idle longer than this has moved on.
CONSUME_WINDOW_NS = 10 * 10**9

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_AMBIGUOUS_LINK = {"otel_ebpf.link.reason": "ambiguous_parent"}
_MESSAGE = "message"  # tags _started slots of message-keyed starts

Thread = tuple[int, int]  # (pid, tid)
K = TypeVar("K", bound=Hashable)
# (client address, client port, server address, server port, stream): plain values, hashed in C;
# a unix socket's identity stands for the port it does not have (its path is shared by connections)
Pair = tuple[str, int, str, int, "int | None"]
Received = tuple[int, int, int]  # (pid, trace id, caller's span id) an incoming request brought


def _pair(client: Endpoint, server: Endpoint, stream: int | None) -> Pair:
    return client.address, client.port or client.socket_id, server.address, server.port or server.socket_id, stream


def request_ids(key: ConnKey, start_ns: int, ordinal: int) -> tuple[int, int]:
    """(trace id if it starts a trace, span id) of the request that started at ``start_ns`` on
    connection ``key`` (``ordinal``: its place among requests that started in the same syscall)."""
    digest = hashlib.blake2b(b"%d/%d/%d/%d/%d" % (*key, start_ns, ordinal), digest_size=24).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1


@dataclass(slots=True, eq=False)
class RequestContext:
    """The trace context decided for one request, and where it is registered while in flight."""

    trace_id: int
    span_id: int
    flags: TraceFlags
    parent: SpanContext | None = None
    trace_state: TraceState | None = None
    links: tuple[Link, ...] = ()
    emit: bool = True  # False: an instrumented program's own span stands for this request
    # registration while in flight
    start_ns: int = 0
    started: tuple | None = None  # key into TraceAssembler._started: (ConnKey, start) or a message slot
    thread: Thread | None = None  # serving thread, for an incoming request
    correlation: tuple[int, str] | None = None  # (pid, correlation id), for an incoming request
    received: Received | None = None  # the context an incoming request brought
    pair: Pair | None = None  # its connection's ends, for an outgoing request
    done: bool = False
    _span_context: SpanContext | None = field(default=None, repr=False)

    def span_context(self) -> SpanContext:
        if self._span_context is None:
            self._span_context = SpanContext(
                self.trace_id, self.span_id, is_remote=False, trace_flags=self.flags, trace_state=self.trace_state
            )
        return self._span_context


class TraceAssembler:
    """Decides each request's context at its start and hands it back when its exchange completes."""

    def __init__(
        self,
        selfmetrics: SelfMetrics,
        inflight_timeout_ns: int = 300 * 10**9,
        max_inflight: int = 65536,
        instrumented_clients: str = SKIP,
    ) -> None:
        if instrumented_clients not in INSTRUMENTED_CLIENT_MODES:
            raise ValueError(f"instrumented_clients: must be one of {', '.join(INSTRUMENTED_CLIENT_MODES)}")
        self._metrics = selfmetrics
        self._timeout_ns = inflight_timeout_ns
        self._max_inflight = max_inflight
        self._skip_instrumented = instrumented_clients == SKIP
        # requests announced and not yet completed, by (connection, start time)
        self._started: dict[tuple, list[RequestContext]] = {}
        self._order: deque[RequestContext] = deque()  # the same, in announcement order (with done ones)
        self._live = 0
        self._threads: dict[Thread, list[RequestContext]] = {}  # incoming requests being served
        # incoming requests completed, with their end time, by the thread that served them
        self._served: OrderedDict[Thread, deque[tuple[int, RequestContext]]] = OrderedDict()
        self._pairs: dict[Pair, deque[RequestContext]] = {}  # outgoing requests by connection ends
        self._correlated: dict[tuple[int, str], list[RequestContext]] = {}  # incoming, by (pid, id)
        self._received: dict[Received, list[RequestContext]] = {}  # incoming, by the context they brought
        # messaging: sent messages by id (LRU, bounded like the in-flight table) and, per thread,
        # the message it received last
        self._sent: OrderedDict[Hashable, RequestContext] = OrderedDict()
        self._consuming: OrderedDict[Thread, RequestContext] = OrderedDict()
        self.consume_window_ns = CONSUME_WINDOW_NS
        # ids the kernel decided, by (connection, start) of the request they are for, until it starts
        self._kernel: OrderedDict[tuple[ConnKey, int], KernelTrace] = OrderedDict()

    @property
    def inflight(self) -> int:
        return self._live

    def server_span_at(self, pid: int, tid: int, ts_ns: int) -> tuple[int, int] | None:
        """(trace id, span id) of the one incoming request thread ``tid`` of ``pid`` was serving at
        ``ts_ns`` (event time assembly has caught up with), or None: none, or several (an event
        loop — which one a CPU sample belongs to is unknown, so no link rather than a guess), or
        one completed too long ago to be remembered. CPU samples and NCCL calls link to it."""
        thread = (pid, tid)
        found = [c for c in self._threads.get(thread, ()) if c.start_ns <= ts_ns]
        for end_ns, context in self._served.get(thread, ()):
            if context.start_ns <= ts_ns <= end_ns:
                found.append(context)
        if len(found) != 1 or not found[0].emit:
            return None
        return found[0].trace_id, found[0].span_id

    # ---- the two events of a request's life ----------------------------------------------------

    def kernel_decided(self, ids: KernelTrace) -> None:
        """The kernel decided the ids of a request that is about to start (it is reported just
        before the request's bytes): its :meth:`start` uses them."""
        self._kernel[(ids.key, ids.start_ns)] = ids
        if len(self._kernel) > self._max_inflight:
            self._kernel.popitem(last=False)
            self._metrics.add("otel_ebpf.trace.inflight_evicted", 1, {"reason": "kernel_ids"})

    def start(self, key: ConnKey, conn: ConnectionInfo, request: RequestStart, tid: int) -> None:
        """A request began on connection ``key``, announced by a syscall of thread ``tid``."""
        start_ns, stream = request.start_ns, request.stream
        if request.message_id is not None:
            self._start_message(key, request, tid)
            return
        slot = (key, start_ns)
        announced = self._started.get(slot)
        ordinal = len(announced) if announced else 0
        propagated, correlation = read_carrier(request.carrier) if request.carrier else (None, None)
        kernel = self._kernel.pop(slot, None) if self._kernel and not ordinal else None
        context = self._decide(key, conn, start_ns, ordinal, propagated, correlation, stream, tid, kernel)
        self._announce(slot, start_ns, context)
        if conn.role is Role.SERVER:
            self._serve_on((key[0], tid), context)
            if correlation is not None:
                context.correlation = (key[0], correlation)
                self._correlated.setdefault(context.correlation, []).append(context)
            if propagated is not None:
                context.received = (key[0], propagated.trace_id, propagated.span_id)
                self._received.setdefault(context.received, []).append(context)
        elif conn.local is not None and conn.peer is not None:
            context.pair = _pair(conn.local, conn.peer, stream)
            self._pairs.setdefault(context.pair, deque()).append(context)
        if self._live > self._max_inflight:
            self._evict_oldest()

    def finish(
        self,
        key: ConnKey,
        conn: ConnectionInfo,
        start_ns: int,
        tid: int,
        message_start: tuple[Direction, Hashable] | None = None,
        end_ns: int | None = None,
    ) -> RequestContext:
        """The exchange of the request that started at ``start_ns`` completed (at ``end_ns``, when
        known): its context. ``message_start``: the (direction, message id) it was announced with
        instead."""
        if message_start is not None:
            return self._finish_message(key, start_ns, tid, message_start)
        announced = self._started.get((key, start_ns))
        if announced:
            context = announced[0]
            thread = context.thread
            self._forget(context)
            if thread is not None and end_ns is not None:
                self._remember_served(thread, end_ns, context)
            return context
        # Never announced (the plugin does not announce, or the head was cut off) or evicted:
        # decided now, from what is still known.
        return self._decide(key, conn, start_ns, 0, None, None, None, tid)

    def expire(self, now_ns: int) -> None:
        """Forget requests that started more than the timeout before ``now_ns`` (event time)."""
        order, horizon = self._order, now_ns - self._timeout_ns
        kernel = self._kernel
        while kernel and next(iter(kernel.values())).start_ns < horizon:  # their request never started
            kernel.popitem(last=False)
            self._metrics.add("otel_ebpf.trace.inflight_evicted", 1, {"reason": "kernel_ids"})
        while order and (order[0].done or order[0].start_ns < horizon):
            context = order.popleft()
            if not context.done:
                self._forget(context)
                self._metrics.add("otel_ebpf.trace.inflight_evicted", 1, {"reason": "timeout"})
        if len(order) > 2 * self._max_inflight:  # done entries queued behind a long request
            self._order = deque(c for c in order if not c.done)
        # Messages: a consumer finds its producer, a thread its last sample, within the window.
        recent = now_ns - self.consume_window_ns
        for index in (self._sent, self._consuming):
            while index and next(iter(index.values())).start_ns < recent:
                index.popitem(last=False)
        self._metrics.set("otel_ebpf.trace.inflight", self._live)

    # ---- decisions -------------------------------------------------------------------------------

    def _decide(
        self,
        key: ConnKey,
        conn: ConnectionInfo,
        start_ns: int,
        ordinal: int,
        propagated: PropagatedContext | None,
        correlation: str | None,
        stream: int | None,
        tid: int,
        kernel: KernelTrace | None = None,
    ) -> RequestContext:
        trace_id, span_id = request_ids(key, start_ns, ordinal)
        if conn.role is Role.SERVER:
            caller = self._caller(conn, stream, start_ns)
            if caller is not None and (propagated is None or propagated.trace_id == caller.trace_id):
                self._metrics.add("otel_ebpf.trace.same_node_parents")
                return self._child(caller, span_id)
            if propagated is not None:
                self._metrics.add("otel_ebpf.trace.propagated", 1, {"format": propagated.format, "side": "server"})
                return _under_propagated(propagated, span_id)
            if kernel is not None:  # the trace the kernel gave the thread: its calls carry it
                return RequestContext(kernel.trace_id, span_id, _SAMPLED if kernel.sampled else _NOT_SAMPLED)
            return RequestContext(trace_id, span_id, _SAMPLED)
        if kernel is not None and kernel.span_id:
            return self._injected((key[0], tid), kernel)
        if propagated is not None:
            self._metrics.add("otel_ebpf.trace.propagated", 1, {"format": propagated.format, "side": "client"})
            receivers = self._received.get((key[0], propagated.trace_id, propagated.span_id))
            if receivers:
                # Forwarded, not made: no span of the program stands for this call. Requests
                # served with the same context are siblings; the latest is as good a parent.
                self._metrics.add("otel_ebpf.trace.forwarded_contexts")
                return self._child(receivers[-1], span_id)
            if self._skip_instrumented:
                # The program's span (named by the header) stands in for ours: a same-node server
                # that finds this context links to it.
                flags = _SAMPLED if propagated.sampled else _NOT_SAMPLED
                return RequestContext(
                    propagated.trace_id, propagated.span_id, flags, trace_state=propagated.trace_state, emit=False
                )
            return _under_propagated(propagated, span_id)
        forwarded = self._correlated.get((key[0], correlation)) if correlation is not None else None
        if forwarded is not None and len(forwarded) == 1:
            self._metrics.add("otel_ebpf.trace.correlated_parents")
            return self._child(forwarded[0], span_id)
        return self._on_thread((key[0], tid), start_ns, trace_id, span_id)

    def _injected(self, thread: Thread, kernel: KernelTrace) -> RequestContext:
        """An outgoing request the kernel inserted a ``traceparent`` into: the ids on the wire, and as
        parent the request its thread serves in that trace (the kernel continued the trace of the
        last request the thread read), else none."""
        flags = _SAMPLED if kernel.sampled else _NOT_SAMPLED
        for serving in reversed(self._threads.get(thread, ())):
            if serving.trace_id == kernel.trace_id:
                return RequestContext(
                    kernel.trace_id,
                    kernel.span_id,
                    flags,
                    parent=serving.span_context(),
                    trace_state=serving.trace_state,
                )
        return RequestContext(kernel.trace_id, kernel.span_id, flags)

    def _on_thread(self, thread: Thread, start_ns: int, trace_id: int, span_id: int) -> RequestContext:
        """Thread causality for an outgoing request or message (rules 4 and 5, then the message
        the thread is processing)."""
        serving = self._threads.get(thread, ())  # unregistered as they complete
        if len(serving) == 1:
            return self._child(serving[0], span_id)
        if serving:
            self._metrics.add("otel_ebpf.trace.ambiguous_parents")
            links = tuple(Link(c.span_context(), _AMBIGUOUS_LINK) for c in serving[-MAX_LINKS:])
            return RequestContext(trace_id, span_id, _SAMPLED, links=links)
        consumed = self._consuming.get(thread)
        if consumed is not None and 0 <= start_ns - consumed.start_ns <= self.consume_window_ns:
            return self._child(consumed, span_id)
        return RequestContext(trace_id, span_id, _SAMPLED)

    # ---- messaging (RequestStart.message_id) ---------------------------------------------------

    def _start_message(self, key: ConnKey, request: RequestStart, tid: int) -> None:
        direction, message_id = request.direction, request.message_id
        slot = (_MESSAGE, key[0], direction, message_id)
        announced = self._started.get(slot)
        context = self._decide_message(
            key, request.start_ns, len(announced) if announced else 0, direction, message_id, tid
        )
        self._announce(slot, request.start_ns, context)
        if direction is Direction.EGRESS:
            evicted = _put_last(self._sent, message_id, context, self._max_inflight)
        else:
            evicted = _put_last(self._consuming, (key[0], tid), context, self._max_inflight)
        if evicted:
            self._metrics.add("otel_ebpf.trace.inflight_evicted", 1, {"reason": "messages"})
        if self._live > self._max_inflight:
            self._evict_oldest()

    def _announce(self, slot: tuple, start_ns: int, context: RequestContext) -> None:
        """Register a started request in flight under ``slot``."""
        context.start_ns, context.started = start_ns, slot
        self._started.setdefault(slot, []).append(context)
        self._order.append(context)
        self._live += 1

    def _finish_message(
        self, key: ConnKey, start_ns: int, tid: int, message_start: tuple[Direction, Hashable]
    ) -> RequestContext:
        direction, message_id = message_start
        announced = self._started.get((_MESSAGE, key[0], direction, message_id))
        if announced:
            context = announced[0]
            self._forget(context)
            return context
        return self._decide_message(key, start_ns, 0, direction, message_id, tid)

    def _decide_message(
        self, key: ConnKey, start_ns: int, ordinal: int, direction: Direction, message_id: Hashable, tid: int
    ) -> RequestContext:
        trace_id, span_id = request_ids(key, start_ns, ordinal)
        if direction is Direction.INGRESS:
            sender = self._sent.get(message_id)
            if sender is not None:  # sent by an observed process on this node
                self._metrics.add("otel_ebpf.trace.same_node_parents")
                return self._child(sender, span_id)
            return RequestContext(trace_id, span_id, _SAMPLED)
        return self._on_thread((key[0], tid), start_ns, trace_id, span_id)

    @staticmethod
    def _child(parent: RequestContext, span_id: int) -> RequestContext:
        return RequestContext(
            parent.trace_id, span_id, parent.flags, parent=parent.span_context(), trace_state=parent.trace_state
        )

    def _caller(self, conn: ConnectionInfo, stream: int | None, start_ns: int) -> RequestContext | None:
        """The outgoing request of an observed process on the node that this incoming request is."""
        if conn.local is None or conn.peer is None:
            return None
        pair = _pair(conn.peer, conn.local, stream)
        waiting = self._pairs.get(pair)
        if not waiting or waiting[0].start_ns > start_ns:
            return None
        caller = waiting.popleft()
        caller.pair = None
        if not waiting:
            del self._pairs[pair]
        return caller

    # ---- registration ----------------------------------------------------------------------------

    def _serve_on(self, thread: Thread, context: RequestContext) -> None:
        serving = self._threads.get(thread)
        if serving is None:
            self._threads[thread] = [context]
            context.thread = thread
            return
        if len(serving) >= MAX_PER_THREAD:
            oldest = serving[0]
            self._forget(oldest)
            self._metrics.add("otel_ebpf.trace.inflight_evicted", 1, {"reason": "thread_capacity"})
        serving.append(context)
        context.thread = thread

    def _remember_served(self, thread: Thread, end_ns: int, context: RequestContext) -> None:
        served = self._served.get(thread)
        if served is None:
            served = self._served[thread] = deque(maxlen=SERVED_PER_THREAD)
            if len(self._served) > SERVED_THREADS:
                self._served.popitem(last=False)
        else:
            self._served.move_to_end(thread)
        served.append((end_ns, context))

    def _evict_oldest(self) -> None:
        while self._order:
            context = self._order.popleft()
            if not context.done:
                self._forget(context)
                self._metrics.add("otel_ebpf.trace.inflight_evicted", 1, {"reason": "capacity"})
                return

    def _forget(self, context: RequestContext) -> None:
        """Unregister a request (completed or evicted) from every index."""
        if context.done:
            return
        context.done = True
        self._live -= 1
        _unregister(self._started, context.started, context)
        _unregister(self._threads, context.thread, context)
        _unregister(self._correlated, context.correlation, context)
        _unregister(self._received, context.received, context)
        _unregister(self._pairs, context.pair, context)
        context.thread = context.correlation = context.received = context.pair = None


def _unregister(index: dict, key: object, context: RequestContext) -> None:
    """Take ``context`` out of ``index[key]`` (a list or deque), and the key out when empty."""
    entries = index.get(key) if key is not None else None
    if entries is not None:
        entries.remove(context)
        if not entries:
            del index[key]


def _under_propagated(propagated: PropagatedContext, span_id: int) -> RequestContext:
    flags = _SAMPLED if propagated.sampled else _NOT_SAMPLED
    parent = SpanContext(
        propagated.trace_id,
        propagated.span_id,
        is_remote=True,
        trace_flags=flags,
        trace_state=propagated.trace_state,
    )
    return RequestContext(propagated.trace_id, span_id, flags, parent=parent, trace_state=propagated.trace_state)


def _put_last(index: OrderedDict[K, RequestContext], entry: K, context: RequestContext, limit: int) -> bool:
    """Put ``context`` newest in ``index``; past ``limit`` entries the oldest goes (True then)."""
    index[entry] = context
    index.move_to_end(entry)
    if len(index) > limit:
        index.popitem(last=False)
        return True
    return False
