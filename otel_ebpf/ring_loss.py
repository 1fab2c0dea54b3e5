"""Saying in the log, not only in a self-metric, that the kernel lost events to a full ring buffer.

``otel_ebpf.events.lost`` counts them for a dashboard; an operator reading the agent's log during
an incident should not have to know to look there. HTTP/1 exchanges are shed whole before the ring
fills (counted in ``otel_ebpf.spans.shed``), so a loss means that traffic the kernel cannot shed
(HTTP/2, gRPC, RTPS, other protocols) outran user space, or that a burst filled the ring before
the agent's next read. Pure: fed the kernel's total and a clock reading, it reads no clock.
"""

from __future__ import annotations

import logging

log = logging.getLogger("otel_ebpf")

INTERVAL_S = 60.0  # after a warning, the next one waits at least this long


class RingLossLog:
    """Warns when the kernel's count of events lost to a full ring grew: at once the first time,
    then at most once per ``interval_s``, with how many were lost since the previous warning."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._reported = 0  # the total at the previous warning
        self._warned_at: float | None = None

    def update(self, lost_total: int, now_s: float) -> None:
        """``lost_total``: events the kernel lost since start; ``now_s``: a monotonic reading."""
        last = self._warned_at
        if lost_total <= self._reported or (last is not None and now_s < last + self._interval_s):
            return
        since = "since start" if last is None else f"in the {now_s - last:.0f} s since the last warning"
        log.warning(
            "ring buffer full: the kernel lost %d event(s) %s (otel_ebpf.events.lost). User space was behind: "
            "HTTP/1 exchanges are shed whole before the ring fills, but HTTP/2, gRPC and other protocols are "
            "not, and their spans around a loss are missing or partly unknown; a larger "
            "capture.ring_buffer_kb absorbs bursts",
            lost_total - self._reported,
            since,
        )
        self._reported = lost_total
        self._warned_at = now_s
