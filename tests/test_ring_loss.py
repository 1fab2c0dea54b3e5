"""The log's word on events the kernel lost to a full ring buffer (otel_ebpf/ring_loss.py)."""

from __future__ import annotations

import logging

import pytest

from otel_ebpf.ring_loss import RingLossLog


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    caplog.clear()
    return messages


def test_the_first_loss_is_said_at_once_then_at_most_once_an_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "otel_ebpf")
    loss = RingLossLog(interval_s=60)
    loss.update(0, 10.0)
    assert _warnings(caplog) == []  # nothing lost: nothing said
    loss.update(120, 11.0)
    [first] = _warnings(caplog)
    assert "the kernel lost 120 event(s) since start" in first and "otel_ebpf.events.lost" in first
    loss.update(500, 30.0)
    loss.update(900, 70.9)
    assert _warnings(caplog) == []  # within the interval: counted, not said again
    loss.update(1000, 71.0)
    [second] = _warnings(caplog)
    assert "the kernel lost 880 event(s) in the 60 s since the last warning" in second
    loss.update(1000, 500.0)
    assert _warnings(caplog) == []  # no new loss
    loss.update(1001, 501.0)
    assert "lost 1 event(s) in the 430 s since the last warning" in _warnings(caplog)[0]
