"""Recording format: every event type round-trips exactly; bad files give errors naming the line."""

from __future__ import annotations

import io

import pytest

from otel_ebpf.pipeline.events import (
    ConnClose,
    ConnData,
    ConnOpen,
    HttpRequestCounts,
    KernelLoss,
    KernelTrace,
    ProcessExit,
    ProcessInfo,
)
from otel_ebpf.protocol import Direction, Endpoint, Role, Transport
from otel_ebpf.recording import RecordingError, RecordingHeader, RecordingWriter, read_recording

EVENTS = [
    ProcessInfo(1, 42, "/usr/bin/python3", "python3 app.py", {"OTEL_SERVICE_NAME": "app"}),
    ConnOpen(2, 42, 7, 99, Role.SERVER, Endpoint("127.0.0.1", 80), Endpoint("::1", 5555)),
    ConnOpen(3, 42, 8, 100, None, None, None),
    ConnOpen(3, 42, 9, 101, None, Endpoint("", 0, 2**63 + 5), Endpoint("/run/app.sock", 0, 17), Transport.UNIX),
    ConnData(4, 42, 43, 7, 99, Direction.INGRESS, 10_000, b"GET / HTTP/1.1\r\n\x00\xff"),
    ConnData(4, 42, 43, 7, 99, Direction.EGRESS, 2, b"OK", tls=True),
    ConnData(4, 42, 43, 7, 99, Direction.INGRESS, 3, b"GET", after_loss=True),
    ConnData(4, 42, 43, 7, 99, Direction.INGRESS, 9000, b"HTTP/1.1 200 OK\r\n", tail=b"\r\n0\r\n\r\n"),
    KernelTrace(3, 42, 7, 99, 4, 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True),
    ConnClose(5, 42, 7, 99),
    ConnClose(5, 42, 8, 100, after_loss=True),
    HttpRequestCounts(
        6,
        42,
        Role.CLIENT,
        "GET",
        200,
        "1.1",
        True,
        "10.0.0.1",
        443,
        3,
        9_000_000,
        (2, 1) + (0,) * 13,
        1_000_000,
        5_000_000,
    ),
    KernelLoss(6, 3),
    ProcessExit(7, 42),
]


def test_round_trip() -> None:
    buf = io.StringIO()
    RecordingWriter(buf, RecordingHeader("node-1", kernel_http_metrics=True)).write(EVENTS)
    header, events = read_recording(io.StringIO(buf.getvalue()))
    assert header.host_name == "node-1"
    assert header.kernel_http_metrics
    assert list(events) == EVENTS


def test_fields_added_later_take_their_defaults() -> None:
    """Recordings made before ConnData had ``tls`` still replay."""
    old = (
        '{"type":"ConnData","timestamp_ns":4,"pid":42,"tid":43,"fd":7,"generation":99,"direction":1,'
        '"length":2,"data":"T0s="}'
    )
    _, events = read_recording(io.StringIO('{"format": "otel-ebpf-events", "version": 1}\n' + old + "\n"))
    assert list(events) == [ConnData(4, 42, 43, 7, 99, Direction.INGRESS, 2, b"OK", tls=False)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "line 1: not a recording header"),
        ('{"format": "pcap"}\n', "line 1: not an otel-ebpf-events recording"),
        ('{"format": "otel-ebpf-events", "version": 99}\n', "line 1: recording version 99"),
    ],
)
def test_bad_header(text: str, message: str) -> None:
    with pytest.raises(RecordingError, match=message):
        read_recording(io.StringIO(text))


def test_truncated_recording_names_the_line_after_yielding_what_came_before() -> None:
    buf = io.StringIO()
    RecordingWriter(buf, RecordingHeader("n")).write(EVENTS[:2])
    text = buf.getvalue() + '{"type": "ConnData", "timestamp_ns": 1'
    _, events = read_recording(io.StringIO(text))
    got = []
    with pytest.raises(RecordingError, match="line 4"):
        for event in events:
            got.append(event)
    assert got == EVENTS[:2]
