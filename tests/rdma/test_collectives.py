"""NCCL spans joined with the queue pairs their process posted on (no BPF): the window (entry to
return + linger, any thread of the process), the names and bytes, the bounds and what they count."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from otel_ebpf.rdma.collectives import MAX_PAIRS, POST, CollectiveQueuePairs, Post, PostHistory, decode_post
from otel_ebpf.rdma.views import QueuePair
from otel_ebpf.selfmetrics import SelfMetrics

PID = 4242
MS = 1_000_000
LINGER = 10 * MS
NAMES = {1: "mlx5_0/1->0000:0000:0000:0000:0000:ffff:0a00:0002/11", 2: "mlx5_1/2->lid:7/12"}


def _span(start_ms: int, end_ms: int, pid: int = PID, span_id: int = 1) -> ReadableSpan:
    return ReadableSpan(
        name="nccl AllReduce",
        context=SpanContext(7, span_id, False),
        resource=Resource({"process.pid": pid}),
        attributes={"nccl.operation": "AllReduce"},
        start_time=start_ms * MS,
        end_time=end_ms * MS,
    )


def _post(ts_ms: float, qp_num: int, size: int = 100, pid: int = PID, tid: int = 1, receive: bool = False) -> Post:
    return Post(int(ts_ms * MS), pid, tid, qp_num, 1, size, receive)


def _join(max_held: int = 100) -> tuple[CollectiveQueuePairs, list[ReadableSpan], SelfMetrics]:
    exported: list[ReadableSpan] = []
    selfmetrics = SelfMetrics()
    join = CollectiveQueuePairs(exported.extend, lambda pid: NAMES if pid == PID else {}, selfmetrics, LINGER, max_held)
    return join, exported, selfmetrics


def test_decode_post_reads_the_kernel_record() -> None:
    raw = POST.pack(5 * MS, 4096, PID, 77, 291, 3, 1)
    assert decode_post(raw, 1000) == Post(5 * MS + 1000, PID, 77, 291, 3, 4096, True)
    assert decode_post(raw[:-1], 0) is None


def test_a_span_names_the_pairs_posted_on_in_its_window_by_any_thread() -> None:
    join, exported, _ = _join()
    for post in (
        _post(99, 3),  # before the call: not its
        _post(100, 1, 1000, tid=1),  # the caller
        _post(105, 2, 300, tid=2),  # another thread (NCCL's proxy), inside the call
        _post(115, 2, 200, tid=2),  # after the return, within the linger
        _post(116, 2, receive=True, size=0),  # a receive: the pair is used, nothing sent
        _post(105, 1, 5, pid=PID + 1),  # another process
        _post(121, 3),  # past the linger
    ):
        join.posts.add(post)
    join.take([_span(100, 110)])
    join.flush(119 * MS)  # its window (to 120 ms) has not passed: held
    assert exported == []
    join.flush(121 * MS)
    (span,) = exported
    assert span.attributes == {
        "nccl.operation": "AllReduce",
        "rdma.qp_pairs": [NAMES[1], NAMES[2]],
        "rdma.qp_pairs.bytes": [1000, 500],
    }
    assert (span.context, span.start_time, span.end_time, span.resource) == (
        SpanContext(7, 1, False),
        100 * MS,
        110 * MS,
        Resource({"process.pid": PID}),
    )


def test_unknown_queue_pairs_go_by_number_and_a_span_without_posts_is_unchanged() -> None:
    join, exported, _ = _join()
    join.posts.add(_post(100, 77))
    quiet = _span(200, 210, span_id=2)
    join.take([_span(100, 101), quiet])
    join.flush(None)
    assert exported[0].attributes["rdma.qp_pairs"] == ["77"]
    assert exported[1] is quiet


def test_overlapping_windows_each_name_what_was_posted_in_them() -> None:
    join, exported, _ = _join()
    join.posts.add(_post(105, 1))
    join.posts.add(_post(125, 2))
    join.take([_span(100, 110, span_id=1), _span(104, 120, span_id=2)])
    join.flush(None)
    assert [s.attributes["rdma.qp_pairs"] for s in exported] == [[NAMES[1]], [NAMES[1], NAMES[2]]]


def test_the_history_is_bounded_and_counts_what_it_forgets() -> None:
    selfmetrics = SelfMetrics()
    history = PostHistory(selfmetrics, capacity=3)
    for i in range(5):
        history.add(_post(100 + i, i, pid=PID + i % 2))
    assert len(history) == 3
    assert selfmetrics.total("otel_ebpf.rdma.collective_posts.dropped") == 2
    assert history.used(PID, 0, 200 * MS) == {2: 100, 4: 100}
    history.expire(104 * MS)
    assert len(history) == 1 and history.used(PID + 1, 0, 200 * MS) == {}


def test_too_many_spans_waiting_go_early_counted_and_pairs_past_the_cap_are_counted() -> None:
    join, exported, selfmetrics = _join(max_held=2)
    join.take([_span(100, 110, span_id=i) for i in range(1, 4)])
    assert [s.context.span_id for s in exported] == [1]
    assert selfmetrics.total("otel_ebpf.rdma.collective_spans.early") == 1
    for qp_num in range(MAX_PAIRS + 5):
        join.posts.add(_post(300, 1000 + qp_num))
    join.take([_span(300, 301, span_id=9)])
    join.flush(None)
    assert len(exported[-1].attributes["rdma.qp_pairs"]) == MAX_PAIRS
    assert selfmetrics.total("otel_ebpf.rdma.collective_pairs.cut") == 5


def test_a_queue_pair_is_named_by_its_device_number_and_peer() -> None:
    qp = QueuePair("mlx5_0", 291, 2)
    assert qp.pair_name == "mlx5_0/291"
    qp.remote_num, qp.remote_lid = 1234, 7
    assert qp.pair_name == "mlx5_0/291->lid:7/1234"
    qp.remote_gid = "0000:0000:0000:0000:0000:ffff:0a00:0002"
    assert qp.pair_name == "mlx5_0/291->0000:0000:0000:0000:0000:ffff:0a00:0002/1234"
