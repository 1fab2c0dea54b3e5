"""Exporters that ride out outages: retry with backoff, in order, bounded queues, an on-disk spool
that survives a killed agent and a torn record, a bounded stop against a hung backend, and file
exporters that keep whole lines on a full disk. Real pieces only: the OTLP receiver on loopback,
real processes killed with SIGKILL, a real tmpfs filled to the last byte."""

from __future__ import annotations

import email.utils
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.protobuf.any_pb2 import Any as AnyProto
from google.rpc import error_details_pb2, status_pb2

from otel_ebpf.config import AgentConfig, load_config
from otel_ebpf.exporters import ExporterSetupError
from otel_ebpf.exporters.batches import Batch, MemoryQueue
from otel_ebpf.exporters.file import METRICS_FILE, TRACES_FILE
from otel_ebpf.exporters.retry import Backoff, classify_grpc, classify_http, parse_retry_after
from otel_ebpf.exporters.sink import build_sink
from otel_ebpf.exporters.spool import HEADER_SIZE, Spool
from otel_ebpf.selfmetrics import SelfMetrics
from tests.conftest import REPO
from tests.otlp_receiver import OTLPReceiver, load_file_metrics, load_file_spans
from tests.test_exporters import counters, make_metrics, named_spans

PROTOCOLS = {"grpc": "grpc_endpoint", "http/protobuf": "http_endpoint"}
FAST_RETRY = {
    "OTEL_EBPF_OTLP_RETRY_INITIAL": "0.05",
    "OTEL_EBPF_OTLP_RETRY_MAX": "0.3",
    "OTEL_BSP_SCHEDULE_DELAY": "20",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "2000",
}


def otlp_config(rx: OTLPReceiver, protocol: str, tmp_path: Path, **env: Any) -> AgentConfig:
    return load_config(
        {
            "exporter": ["otlp"],
            "otlp_endpoint": getattr(rx, PROTOCOLS[protocol]),
            "otlp_protocol": protocol,
            "output": str(tmp_path / "out"),
        },
        {**FAST_RETRY, **{key: str(value) for key, value in env.items()}},
    )


def dropped(selfmetrics: SelfMetrics, name: str = "otel_ebpf.spans.dropped") -> dict[str, int]:
    values: dict[str, int] = {}
    for (metric, attributes), value in counters(selfmetrics).items():
        if metric == name:
            reason = dict(attributes)["reason"]
            values[reason] = values.get(reason, 0) + value
    return values


def names(rx: OTLPReceiver) -> list[str]:
    return [span["name"] for span in rx.spans()]


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as rx:
        yield rx


# --- what an answer means (sans-I/O) ---


def test_http_answers_are_classified_as_the_otlp_specification_says() -> None:
    assert classify_http(200, {}).ok
    for status in (429, 502, 503, 504):
        result = classify_http(status, {})
        assert result.retryable and result.reason == f"http_{status}" and result.retry_after_s is None
    for status in (400, 401, 404, 413, 500):
        result = classify_http(status, {})
        assert not result.ok and not result.retryable and result.reason == f"http_{status}"
    assert classify_http(503, {"retry-after": "7"}).retry_after_s == 7.0
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert classify_http(429, {"retry-after": date}, now=now).retry_after_s == pytest.approx(30.0)
    assert parse_retry_after("soon") is None and parse_retry_after("") is None


def _retry_info(seconds: int) -> tuple[tuple[str, bytes], ...]:
    detail = AnyProto()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds)))
    status = status_pb2.Status(code=8, details=[detail])
    return (("grpc-status-details-bin", status.SerializeToString()),)


def test_grpc_statuses_are_classified_as_the_otlp_specification_says() -> None:
    assert classify_grpc("OK").ok
    for code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "ABORTED", "OUT_OF_RANGE", "DATA_LOSS"):
        assert classify_grpc(code).retryable, code
    for code in ("INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED", "INTERNAL"):
        result = classify_grpc(code)
        assert not result.retryable and result.reason == f"grpc_{code.lower()}"
    # RESOURCE_EXHAUSTED only when the server says it will recover.
    assert not classify_grpc("RESOURCE_EXHAUSTED").retryable
    throttled = classify_grpc("RESOURCE_EXHAUSTED", _retry_info(4))
    assert throttled.retryable and throttled.retry_after_s == 4.0
    assert classify_grpc("UNAVAILABLE", (("grpc-status-details-bin", b"\xff garbage"),)).retry_after_s is None


def test_backoff_grows_exponentially_with_jitter_and_caps_the_server_delay() -> None:
    low = Backoff(1.0, 30.0, rng=lambda: 0.0)
    high = Backoff(1.0, 30.0, rng=lambda: 1.0)
    assert [low.delay(n) for n in range(7)] == [0.5, 1, 2, 4, 8, 15, 15]
    assert [high.delay(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert high.delay(1000) == 30  # no overflow after a long outage
    assert low.delay(0, server_delay_s=12) == 12 and low.delay(0, server_delay_s=3600) == 30
    with pytest.raises(ValueError):
        Backoff(5.0, 1.0)


def test_memory_queue_is_bounded_in_batches_and_bytes() -> None:
    queue = MemoryQueue(max_batches=2, max_bytes=10)
    first, second, third = Batch(b"12345", 1, 0), Batch(b"123", 2, 0), Batch(b"1", 3, 0)
    assert queue.put(first) == [] and queue.put(second) == []
    assert queue.put(third) == [third]  # third batch: over the batch bound
    assert queue.ack(second) is False and queue.ack(first) is True  # only the head leaves
    assert queue.put(Batch(b"12345678", 4, 0))[0].count == 4  # over the byte bound
    assert queue.nbytes == 3 and len(queue) == 1


# --- outages on a real receiver ---


OUTAGES = {
    "stopped": {},
    "503_retry_after": {"http_status": 503, "grpc_code": grpc.StatusCode.UNAVAILABLE, "retry_after_s": 1},
    "429_throttled": {"http_status": 429, "grpc_code": grpc.StatusCode.RESOURCE_EXHAUSTED, "retry_after_s": 1},
    "hang": {"hang_s": 0.6},
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("outage", OUTAGES)
def test_an_outage_window_loses_nothing_and_export_resumes_in_order(
    tmp_path: Path, receiver: OTLPReceiver, protocol: str, outage: str
) -> None:
    selfmetrics = SelfMetrics()
    sink = build_sink(otlp_config(receiver, protocol, tmp_path, OTEL_EXPORTER_OTLP_TIMEOUT="300"), selfmetrics)
    spans = named_spans(60)
    sink.export_spans(spans[:10])
    assert receiver.wait_for(lambda r: len(r.spans()) == 10, timeout=15)
    deadline = time.monotonic() + 15  # and acknowledged (else the stop cancels the answer: sent twice)
    while selfmetrics.total("otel_ebpf.spans.exported") < 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    if outage == "stopped":
        receiver.stop()
    else:
        receiver.answer(**OUTAGES[outage])
    for start in range(10, 50, 10):  # spans keep coming during the outage
        sink.export_spans(spans[start : start + 10])
        time.sleep(0.2)
    deadline = time.monotonic() + 15
    while selfmetrics.total("otel_ebpf.export.attempts.failed") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    if outage == "stopped":
        receiver.start()  # back on the same port
    else:
        receiver.answer()
    sink.export_spans(spans[50:])
    assert receiver.wait_for(lambda r: len(r.spans()) == 60, timeout=20), len(receiver.spans())
    sink.shutdown(5)
    assert names(receiver) == [span.name for span in spans]  # all of them, once, in order
    assert selfmetrics.total("otel_ebpf.spans.exported") == 60
    assert dropped(selfmetrics) == {}
    failed = {
        dict(attributes)["reason"]
        for (name, attributes) in counters(selfmetrics)
        if name == "otel_ebpf.export.attempts.failed"
    }
    assert failed and all(reason.startswith(("http_", "grpc_", "connection", "timeout")) for reason in failed)


def test_retry_after_is_honoured(tmp_path: Path, receiver: OTLPReceiver) -> None:
    sink = build_sink(otlp_config(receiver, "http/protobuf", tmp_path), SelfMetrics())
    receiver.answer(http_status=503, retry_after_s=2)
    sink.export_spans(named_spans(1))
    assert receiver.wait_for(lambda r: r.rejected.get("traces", 0) == 1, timeout=10)
    refused_at = time.monotonic()
    receiver.answer()
    assert receiver.wait_for(lambda r: len(r.spans()) == 1, timeout=15)
    # Retry-After: 2 (capped at otlp.retry_max_s = 0.3 here) rather than the 0.05 s first backoff.
    assert time.monotonic() - refused_at >= 0.2
    sink.shutdown(2)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_rejected_batch_is_dropped_and_counted_and_the_next_one_goes_through(
    tmp_path: Path, receiver: OTLPReceiver, protocol: str
) -> None:
    selfmetrics = SelfMetrics()
    sink = build_sink(otlp_config(receiver, protocol, tmp_path), selfmetrics)
    receiver.answer(http_status=400, grpc_code=grpc.StatusCode.INVALID_ARGUMENT)
    sink.export_spans(named_spans(5, "bad"))
    assert receiver.wait_for(lambda r: r.rejected.get("traces", 0) == 1, timeout=10)
    time.sleep(0.5)  # no retry of a batch the backend rejected for good
    assert receiver.rejected["traces"] == 1
    receiver.answer()
    sink.export_spans(named_spans(3, "good"))
    assert receiver.wait_for(lambda r: len(r.spans()) == 3, timeout=10)
    sink.shutdown(2)
    assert dropped(selfmetrics) == {"non_retryable": 5}
    reason = "http_400" if protocol == "http/protobuf" else "grpc_invalid_argument"
    assert (
        counters(selfmetrics)[
            ("otel_ebpf.export.attempts.failed", frozenset({("signal", "traces"), ("reason", reason)}))
        ]
        == 1
    )


def test_a_full_queue_and_an_expired_batch_are_counted_in_their_unit(tmp_path: Path, receiver: OTLPReceiver) -> None:
    selfmetrics = SelfMetrics()
    sink = build_sink(
        otlp_config(
            receiver, "grpc", tmp_path, OTEL_EBPF_OTLP_QUEUE_MAX_BATCHES=2, OTEL_EBPF_OTLP_RETRY_MAX_ELAPSED=1.5
        ),
        selfmetrics,
    )
    receiver.stop()
    for start in range(0, 50, 10):
        sink.export_spans(named_spans(10, f"b{start}-"))
        time.sleep(0.1)
    sink.export_metrics(make_metrics())
    deadline = time.monotonic() + 15
    while sum(dropped(selfmetrics).values()) < 50 and time.monotonic() < deadline:
        time.sleep(0.1)
    sink.shutdown(1)
    losses = dropped(selfmetrics)
    assert losses["queue_full"] == 30 and losses["expired"] == 20  # two batches waited, then expired
    assert sum(losses.values()) == 50
    points = dropped(selfmetrics, "otel_ebpf.metrics.points.dropped")
    assert sum(points.values()) > 0 and set(points) <= {"queue_full", "expired", "shutdown"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_stop_is_bounded_against_a_hung_backend_and_counts_everything(
    tmp_path: Path, receiver: OTLPReceiver, protocol: str
) -> None:
    selfmetrics = SelfMetrics()
    sink = build_sink(otlp_config(receiver, protocol, tmp_path, OTEL_EXPORTER_OTLP_TIMEOUT="30000"), selfmetrics)
    receiver.answer(hang_s=6)
    sink.export_spans(named_spans(25))
    time.sleep(0.5)  # the first attempt is now hanging
    start = time.monotonic()
    sink.shutdown(2.0)
    assert time.monotonic() - start < 3.0
    assert dropped(selfmetrics) == {"shutdown": 25}


# --- the spool ---


def spool_config(receiver: OTLPReceiver, tmp_path: Path, **env: Any) -> AgentConfig:
    return otlp_config(receiver, "grpc", tmp_path, OTEL_EBPF_OTLP_SPOOL_DIR=tmp_path / "spool", **env)


_CHILD = """
import sys, time
from otel_ebpf.config import load_config
from otel_ebpf.exporters.sink import build_sink
from otel_ebpf.selfmetrics import SelfMetrics
from tests.test_exporters import named_spans
config = load_config({"exporter": ["otlp"], "otlp_endpoint": sys.argv[1]},
                     {"OTEL_EBPF_OTLP_SPOOL_DIR": sys.argv[2], "OTEL_BSP_SCHEDULE_DELAY": "20",
                      "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10", "OTEL_EBPF_OTLP_RETRY_INITIAL": "0.05"})
sink = build_sink(config, SelfMetrics())
sink.export_spans(named_spans(40))
sink.force_flush(5)  # into the spool: the backend is down
print("spooled", flush=True)
time.sleep(60)
"""


def test_the_spool_survives_a_killed_agent_and_the_next_one_sends_it_first(
    tmp_path: Path, receiver: OTLPReceiver
) -> None:
    endpoint = receiver.grpc_endpoint
    receiver.stop()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, endpoint, str(tmp_path / "spool" / "")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "spooled"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert list((tmp_path / "spool" / "traces").glob("*.seg"))
    receiver.start()
    selfmetrics = SelfMetrics()
    sink = build_sink(spool_config(receiver, tmp_path), selfmetrics)
    sink.export_spans(named_spans(5, "new"))
    assert receiver.wait_for(lambda r: len(r.spans()) == 45, timeout=20), len(receiver.spans())
    sink.shutdown(3)
    assert names(receiver) == [f"s{i}" for i in range(40)] + [f"new{i}" for i in range(5)]
    assert dropped(selfmetrics) == {} and selfmetrics.total("otel_ebpf.export.spool.corrupt") == 0
    # Everything acknowledged: a third start sends nothing again.
    receiver.clear()
    sink = build_sink(spool_config(receiver, tmp_path), SelfMetrics())
    assert not receiver.wait_for(lambda r: r.spans(), timeout=1)
    sink.shutdown(1)


def test_a_spool_stopped_with_the_backend_down_keeps_its_batches(tmp_path: Path, receiver: OTLPReceiver) -> None:
    receiver.stop()
    first = SelfMetrics()
    sink = build_sink(spool_config(receiver, tmp_path), first)
    sink.export_spans(named_spans(30))
    start = time.monotonic()
    sink.shutdown(3)
    assert time.monotonic() - start < 3.5
    assert dropped(first) == {}  # kept, not lost
    receiver.start()
    sink = build_sink(spool_config(receiver, tmp_path), SelfMetrics())
    assert receiver.wait_for(lambda r: len(r.spans()) == 30, timeout=20)
    sink.shutdown(2)
    assert names(receiver) == [f"s{i}" for i in range(30)]


def test_two_agents_cannot_share_a_spool(tmp_path: Path, receiver: OTLPReceiver) -> None:
    sink = build_sink(spool_config(receiver, tmp_path), SelfMetrics())
    try:
        with pytest.raises(ExporterSetupError, match="in use by another agent"):
            build_sink(spool_config(receiver, tmp_path), SelfMetrics())
    finally:
        sink.shutdown(1)


def _fill(spool: Spool, count: int, size: int = 100) -> None:
    for i in range(count):
        assert spool.put(Batch(bytes([i % 256]) * size, i + 1, time.time())) == []


def test_a_torn_tail_and_a_corrupt_record_are_counted_and_skipped(tmp_path: Path) -> None:
    corrupt: list[int] = []
    spool = Spool(tmp_path, 1 << 20, corrupt.append)
    _fill(spool, 5)
    spool.close()
    segment = max(tmp_path.glob("*.seg"))
    with segment.open("ab") as file:  # killed in the middle of the sixth record
        file.write(b"OEB1" + b"\x64\x00\x00\x00" + b"\x00" * 10)
    spool = Spool(tmp_path, 1 << 20, corrupt.append)
    assert corrupt == [1] and len(spool) == 5  # the torn record, counted once; the five before it kept
    first = spool.peek()
    assert first is not None and first.count == 1 and spool.ack(first)
    _fill(spool, 2)  # appends go to a fresh segment, never after the torn bytes
    spool.close()
    # Disk damage inside a record: its checksum fails, it alone is counted and skipped.
    record = 100 + HEADER_SIZE
    data = bytearray(segment.read_bytes())
    data[2 * record + HEADER_SIZE + 5] ^= 0xFF  # the third record's body
    segment.write_bytes(bytes(data))
    spool = Spool(tmp_path, 1 << 20, corrupt.append)
    assert sum(corrupt) == 3  # the torn tail again, and the damaged record
    counts = []
    while (batch := spool.peek()) is not None:
        counts.append(batch.count)
        spool.ack(batch)
    assert counts == [2, 4, 5, 1, 2]  # in order, without the acknowledged one and the damaged one
    spool.close()
    assert not list(tmp_path.glob("*.seg"))  # fully sent segments are deleted


def test_a_full_spool_drops_the_oldest_segment_first_and_says_how_much(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 1 << 20, lambda n: None)  # 128 KiB segments
    body = b"x" * (32 * 1024 - HEADER_SIZE)  # four records a segment
    lost = []
    for i in range(40):
        lost += spool.put(Batch(body, i, time.time()))
    assert sum(f.stat().st_size for f in tmp_path.glob("*.seg")) <= 1 << 20
    assert spool.nbytes <= 1 << 20
    assert [batch.count for batch in lost] == list(range(len(lost)))  # oldest first
    assert len(lost) + len(spool) == 40 and spool.peek().count == len(lost)
    spool.close()


def test_spool_full_is_counted_in_spans(tmp_path: Path, receiver: OTLPReceiver) -> None:
    selfmetrics = SelfMetrics()
    receiver.stop()
    sink = build_sink(
        spool_config(receiver, tmp_path, OTEL_EBPF_OTLP_SPOOL_MAX_BYTES=1 << 20, OTEL_BSP_MAX_EXPORT_BATCH_SIZE=500),
        selfmetrics,
    )
    spans = named_spans(500, "x" * 200)
    for _ in range(30):  # ~30 batches of ~60 KiB each: about twice the spool
        sink.export_spans(spans)
        sink.force_flush(5)
    sink.shutdown(1)
    losses = dropped(selfmetrics)
    assert set(losses) == {"spool_full"} and losses["spool_full"] % 500 == 0 and losses["spool_full"] > 0


# --- files on a full disk ---


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs (needs root; fails rather than skips in CI)."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the full-disk test needs root to mount a tmpfs")
        pytest.skip("the full-disk test needs root to mount a tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_never_leaves_a_partial_line_and_writing_resumes(small_tmpfs: Path) -> None:
    out = small_tmpfs / "out"
    config = load_config(
        {"exporter": ["file"], "output": str(out)},
        {"OTEL_BSP_SCHEDULE_DELAY": "10", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "50"},
    )
    selfmetrics = SelfMetrics()
    sink = build_sink(config, selfmetrics)
    filler = small_tmpfs / "filler"
    with filler.open("wb") as file:  # leave about 40 KiB
        try:
            while True:
                file.write(b"\0" * 4096)
                file.flush()
                if os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize <= 40 * 1024:
                    break
        except OSError:
            pass
    sent = 0
    for round_, batches in enumerate((20, 5)):
        for i in range(batches):  # fills the disk, then fails batch after batch
            sink.export_spans(named_spans(50, f"r{round_}b{i}-"))
            sink.export_metrics(make_metrics())
            sink.force_flush(10)
            sent += 50
        if round_ == 0:
            assert dropped(selfmetrics)["export_failed"] > 0
            assert selfmetrics.total("otel_ebpf.metrics.export.failed") > 0
            filler.unlink()  # space returns
    sink.shutdown(5)
    for path in (out / TRACES_FILE, out / METRICS_FILE):
        text = path.read_text()
        assert text.endswith("\n")
        for line in text.splitlines():
            json.loads(line)  # every line whole
    spans = load_file_spans(out)
    exported = selfmetrics.total("otel_ebpf.spans.exported")
    assert len(spans) == exported and exported + sum(dropped(selfmetrics).values()) == sent
    assert [s["name"] for s in spans][-250:] == [f"r1b{b}-{i}" for b in range(5) for i in range(50)]  # resumed
    assert load_file_metrics(out)  # metrics.jsonl kept working too
