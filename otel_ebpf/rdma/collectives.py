"""NCCL collectives' spans, joined with the queue pairs the process posted work requests on.

NCCL does not post its work requests on the thread that calls the collective: ``ncclAllReduce``
enqueues the operation and returns, and the process's proxy thread posts the RDMA writes and
receives (``ibv_post_send`` / ``ibv_post_recv``) as the GPU fills the buffers — after the call
returned, for as long as the transfer lasts. So which thread posted tells nothing, and the call's
own window is too short. The heuristic: a collective's span names the queue pairs on which *any*
thread of its process posted from the call's entry until ``linger`` after its return
(``rdma.collective_linger_s``). Its limits, said in docs/rdma.md: a transfer that outlasts the
linger is named by its start; collectives whose windows overlap (several communicators or streams
at once, a CPU that enqueues ahead of the GPU) each name the queue pairs all of them posted on;
and any other verbs traffic of the process in the window counts too.

The kernel sends one record per post call only for the processes that map NCCL
(``post_pids``, bpf/verbs_trace.c); :class:`PostHistory` keeps the recent ones, bounded, and
:class:`CollectiveQueuePairs` holds each span until its window has passed and the posts in it
were read, then adds ``rdma.qp_pairs`` (sorted) and ``rdma.qp_pairs.bytes`` (the same order).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan

from ..selfmetrics import SelfMetrics

# struct post_record (bpf/verbs_trace.c): ts, bytes, pid, tid, qp_num, work_requests, receive
POST = struct.Struct("<QQIIIHH")
KEEP_NS = 10_000_000_000  # posts older than this are no use: a span reaches the join within seconds of its end
MAX_PAIRS = 64  # queue pairs named on one span; the rest are counted, not named
SKEW_NS = 1_000_000  # records of several CPUs reach the ring a little out of time order


@dataclass(frozen=True)
class Post:
    """One post call: its time (Unix ns), process, thread, queue pair, work requests, bytes sent."""

    ts_ns: int
    pid: int
    tid: int
    qp_num: int
    work_requests: int
    bytes: int
    receive: bool


def decode_post(raw: bytes, clock_offset_ns: int) -> Post | None:
    if len(raw) < POST.size:
        return None
    ts, size, pid, tid, qp_num, work_requests, receive = POST.unpack_from(raw)
    return Post(ts + clock_offset_ns, pid, tid, qp_num, work_requests, size, bool(receive))


class PostHistory:
    """The recent posts of each process, in arrival order (time order but for a little skew), at
    most ``capacity`` in all: past it the oldest go, counted
    (``otel_ebpf.rdma.collective_posts.dropped{reason="table_full"}``)."""

    def __init__(self, selfmetrics: SelfMetrics, capacity: int = 65536) -> None:
        self._selfmetrics = selfmetrics
        self._capacity = capacity
        self._by_pid: dict[int, deque[Post]] = {}
        self._arrivals: deque[int] = deque()  # the pid of every post kept, oldest first

    def __len__(self) -> int:
        return len(self._arrivals)

    def add(self, post: Post) -> None:
        self._by_pid.setdefault(post.pid, deque()).append(post)
        self._arrivals.append(post.pid)
        if len(self._arrivals) > self._capacity:
            self._pop_oldest()
            self._selfmetrics.add("otel_ebpf.rdma.collective_posts.dropped", 1, {"reason": "table_full"})

    def expire(self, before_ns: int) -> None:
        """Forget posts older than ``before_ns``."""
        while self._arrivals:
            posts = self._by_pid[self._arrivals[0]]
            if posts[0].ts_ns >= before_ns:
                return
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        pid = self._arrivals.popleft()
        posts = self._by_pid[pid]
        posts.popleft()
        if not posts:
            del self._by_pid[pid]

    def used(self, pid: int, start_ns: int, end_ns: int) -> dict[int, int]:
        """Queue pair number -> bytes sent, of the posts ``pid`` made from ``start_ns`` to ``end_ns``."""
        used: dict[int, int] = {}
        for post in reversed(self._by_pid.get(pid, ())):
            if post.ts_ns < start_ns - SKEW_NS:
                break
            if start_ns <= post.ts_ns <= end_ns:
                used[post.qp_num] = used.get(post.qp_num, 0) + post.bytes
        return used


class CollectiveQueuePairs:
    """Holds NCCL spans until their window (entry to return + ``linger_ns``) has passed, then hands
    them to ``export`` with the queue pairs their process posted on in it.

    ``pair_names(pid)``: the process's queue pairs' names by number (``mlx5_0/291->GID/1234``;
    a queue pair whose calls were not seen is named by its number alone); at most
    ``max_held`` spans wait (past it the oldest go at once, joined with what is known:
    ``otel_ebpf.rdma.collective_spans.early``)."""

    def __init__(
        self,
        export: Callable[[list[ReadableSpan]], None],
        pair_names: Callable[[int], Mapping[int, str]],
        selfmetrics: SelfMetrics,
        linger_ns: int,
        max_held: int = 10_000,
    ) -> None:
        self._export = export
        self._pair_names = pair_names
        self._selfmetrics = selfmetrics
        self._linger_ns = linger_ns
        self._max_held = max_held
        self.posts = PostHistory(selfmetrics)
        self._held: deque[ReadableSpan] = deque()

    def take(self, spans: list[ReadableSpan]) -> None:
        """The GPU monitor's NCCL spans (its ``export_spans``)."""
        self._held.extend(spans)
        early = []
        while len(self._held) > self._max_held:
            early.append(self._joined(self._held.popleft()))
        if early:
            self._selfmetrics.add("otel_ebpf.rdma.collective_spans.early", len(early))
            self._export(early)

    def flush(self, read_until_ns: int | None) -> None:
        """Export the spans whose window ended before ``read_until_ns`` (the time up to which the
        posts were read); all of them with None."""
        ready: list[ReadableSpan] = []
        waiting: deque[ReadableSpan] = deque()
        for span in self._held:
            due = read_until_ns is None or (span.end_time or 0) + self._linger_ns < read_until_ns
            (ready if due else waiting).append(span)
        self._held = waiting
        if ready:
            self._export([self._joined(span) for span in ready])
        if read_until_ns is not None:
            self.posts.expire(read_until_ns - KEEP_NS)

    def _joined(self, span: ReadableSpan) -> ReadableSpan:
        pid = span.resource.attributes.get("process.pid")
        if not isinstance(pid, int):
            return span
        used = self.posts.used(pid, span.start_time or 0, (span.end_time or 0) + self._linger_ns)
        if not used:
            return span
        names = self._pair_names(pid)
        named = sorted((names.get(qp_num, str(qp_num)), size) for qp_num, size in used.items())
        if len(named) > MAX_PAIRS:
            self._selfmetrics.add("otel_ebpf.rdma.collective_pairs.cut", len(named) - MAX_PAIRS)
            named = named[:MAX_PAIRS]
        attributes = {
            **(span.attributes or {}),
            "rdma.qp_pairs": [name for name, _ in named],
            "rdma.qp_pairs.bytes": [size for _, size in named],
        }
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=attributes,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )
