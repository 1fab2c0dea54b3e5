"""Delivery of one signal's encoded batches to one OTLP backend: in order, retried, bounded, counted.

The same class serves spans, metric points, log records and profile samples; what differs per
signal is only the encoder that makes a :class:`~.batches.Batch` and the unit it is counted in.

- :meth:`Delivery.submit` queues a batch and returns at once (the caller is an export worker,
  never the event loop). The queue is a :class:`~.batches.MemoryQueue` (bounded in batches and
  bytes; a batch that does not fit is lost as ``queue_full``) or, with ``otlp.spool_dir``, a
  :class:`~.spool.Spool` (bounded in bytes; the oldest segment is lost as ``spool_full``).
- One thread sends the head of the queue. A retryable failure (:mod:`.retry`) keeps the batch at
  the head and waits a jittered exponential backoff, or the server's ``Retry-After``/``RetryInfo``
  within the cap; the batches behind it wait too, so export resumes in order when the backend
  returns. A non-retryable answer drops the batch (``non_retryable``); a batch still unsent
  ``max_elapsed_s`` after it was queued is dropped (``expired``).
- :meth:`Delivery.close` drains within a deadline: it keeps sending while the backend answers,
  then stops. What a memory queue still holds is lost (``shutdown``); a spool keeps it for the next
  start. An attempt still in flight at the deadline is abandoned (and, for a memory queue, counted
  as lost although the backend may yet take it), so stopping never waits for a hung backend.

Every item submitted is counted exactly once through ``account``: exported, or lost with a reason.
Every failed attempt is counted in ``otel_ebpf.export.attempts.failed{signal, reason}`` (``http_503``,
``grpc_unavailable``, ...). Failures and losses are logged once per outage (or backlog), not once
per batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from otel_ebpf.exporters.batches import Batch, BatchQueue
from otel_ebpf.exporters.retry import Backoff
from otel_ebpf.exporters.transport import Transport
from otel_ebpf.selfmetrics import SelfMetrics

_logger = logging.getLogger(__name__)

EXPORTED = "exported"
NON_RETRYABLE = "non_retryable"
EXPIRED = "expired"
SHUTDOWN = "shutdown"

Account = Callable[[str, int], None]  # (outcome, number of items)


class Delivery:
    """One signal's queue and the thread that sends it to one backend (see the module doc)."""

    def __init__(
        self,
        signal: str,
        transport: Transport,
        queue: BatchQueue,
        backoff: Backoff,
        account: Account,
        selfmetrics: SelfMetrics,
        *,
        timeout_s: float,
        max_elapsed_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.signal = signal
        self._transport = transport
        self._queue = queue
        self._backoff = backoff
        self._account = account
        self._selfmetrics = selfmetrics
        self._timeout_s = timeout_s
        self._max_elapsed_s = max_elapsed_s
        self._clock = clock
        self._cond = threading.Condition()
        self._next_attempt = 0.0  # monotonic
        self._failures = 0  # consecutive failed attempts: the current outage
        self._logged: set[str] = set()  # what this outage already logged
        self._stop_at: float | None = None  # monotonic deadline once close() began
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name=f"otel-ebpf-otlp-{signal}", daemon=True)
        self._thread.start()

    # --- producer side ---

    def submit(self, body: bytes, count: int) -> None:
        """Queue one encoded request carrying ``count`` items; never waits for the backend."""
        with self._cond:
            if self._stop_at is not None:
                self._lose(SHUTDOWN, count)
                return
            dropped = self._queue.put(Batch(body, count, self._clock()))
            self._cond.notify_all()
        self._gauge()
        if dropped:
            self._lose(self._queue.drop_reason, sum(batch.count for batch in dropped))

    @property
    def pending(self) -> int:
        """Batches queued, the one being sent included."""
        return len(self._queue)

    def flush(self, timeout_s: float) -> bool:
        """Wait until the queue is empty; gives up early (False) while the backend is failing,
        so a stop does not spend its time on a backend that is down."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._queue):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._failures:
                    return False
                self._cond.wait(min(remaining, 0.1))
            return True

    def close(self, timeout_s: float) -> None:
        """Send what the backend takes within ``timeout_s``, then stop (see the module doc)."""
        with self._cond:
            if self._stop_at is None:
                self._stop_at = time.monotonic() + timeout_s
            self._cond.notify_all()
        self._thread.join(max(0.0, self._stop_at - time.monotonic()))
        with self._cond:
            self._abandoned = True  # an attempt still in flight is no longer ours to count
        self._transport.close()
        if self._queue.durable:
            if len(self._queue):
                _logger.warning(
                    "OTLP %s: %d batches left in the spool; the next start sends them first",
                    self.signal,
                    len(self._queue),
                )
        else:
            self._lose(SHUTDOWN, sum(batch.count for batch in self._queue.drain()))
        self._queue.close()

    # --- the sending thread ---

    def _next(self) -> Batch | None:
        """The head once it is due; None when it is time to stop."""
        with self._cond:
            while True:
                now = time.monotonic()
                stop_at = self._stop_at
                if stop_at is not None and (not len(self._queue) or now >= stop_at or self._failures):
                    return None
                if len(self._queue) and now >= self._next_attempt:
                    return self._queue.peek()
                wake = self._next_attempt if len(self._queue) else None
                if stop_at is not None:
                    wake = stop_at if wake is None else min(wake, stop_at)
                self._cond.wait(None if wake is None else max(0.0, wake - now))

    def _run(self) -> None:
        while (batch := self._next()) is not None:
            if self._clock() - batch.created > self._max_elapsed_s:
                self._settle(batch, EXPIRED)
                continue
            timeout = self._timeout_s
            if self._stop_at is not None:
                timeout = max(0.05, min(timeout, self._stop_at - time.monotonic()))
            result = self._transport.send(batch.body, timeout)
            with self._cond:
                if self._abandoned:
                    return
            if result.ok:
                if self._failures:
                    _logger.warning("OTLP %s export recovered after %d failed attempts", self.signal, self._failures)
                self._settle(batch, EXPORTED)
                if self._failures or not len(self._queue):  # the outage, or the backlog, is over
                    self._logged.clear()
                self._failures = 0
                continue
            self._selfmetrics.add(
                "otel_ebpf.export.attempts.failed", 1, {"signal": self.signal, "reason": result.reason}
            )
            if not result.retryable:
                self._note(f"OTLP {self.signal} export rejected ({result.reason}): batch dropped, not retried")
                self._settle(batch, NON_RETRYABLE)
                continue
            delay = self._backoff.delay(self._failures, result.retry_after_s)
            self._failures += 1
            self._note(
                f"OTLP {self.signal} export failing ({result.reason}); retrying with backoff, "
                f"newer batches wait in the queue"
            )
            with self._cond:
                self._next_attempt = time.monotonic() + delay
                self._cond.notify_all()

    def _settle(self, batch: Batch, outcome: str) -> None:
        if not self._queue.ack(batch):
            return  # dropped from a full spool while it was being sent: already counted
        with self._cond:
            self._cond.notify_all()
        self._gauge()
        if outcome == EXPORTED:
            self._account(EXPORTED, batch.count)
        else:
            self._lose(outcome, batch.count)

    def _gauge(self) -> None:
        attributes = {"signal": self.signal}
        self._selfmetrics.set("otel_ebpf.export.queue.batches", len(self._queue), attributes)
        self._selfmetrics.set("otel_ebpf.export.queue.bytes", self._queue.nbytes, attributes)

    def _lose(self, reason: str, count: int) -> None:
        if count:
            self._note(f"OTLP {self.signal}: items lost ({reason}), counted in the self-metrics")
            self._account(reason, count)

    def _note(self, message: str) -> None:
        """Log ``message`` once per outage or backlog (cleared when either is over)."""
        if message not in self._logged:
            self._logged.add(message)
            _logger.warning(message)
