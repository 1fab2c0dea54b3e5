"""Encoded export batches waiting for a backend, and the bounded queues that hold them.

A :class:`Batch` is one serialized OTLP ``Export*ServiceRequest`` plus how many spans, points,
records or samples it carries (the unit a loss is counted in). A :class:`BatchQueue` is FIFO: the
delivery thread sends the head, and removes it with :meth:`BatchQueue.ack` once the backend took it
or it was given up on, so a batch that keeps failing holds back everything behind it and export
resumes *in order* when the backend returns.

:class:`MemoryQueue` keeps batches in memory, bounded in batches and in bytes; a batch that does
not fit is refused (``queue_full``). :class:`~.spool.Spool` keeps them on disk instead.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass


@dataclass(eq=False)  # identity matters: ack() must remove the very batch that was sent
class Batch:
    body: bytes
    count: int  # items it carries, in the signal's unit
    created: float  # wall-clock seconds when it was queued (expiry survives a restart)


class BatchQueue(ABC):
    """A bounded FIFO of batches shared by a producer and the delivery thread."""

    drop_reason = "queue_full"  # the loss reason of what put() gives back
    durable = False  # whether what is still queued at stop survives the agent

    @abstractmethod
    def put(self, batch: Batch) -> list[Batch]:
        """Queue ``batch``; return what was dropped to respect the bounds (``batch`` itself when
        it is refused, older batches when the queue drops the oldest)."""

    @abstractmethod
    def peek(self) -> Batch | None:
        """The oldest batch, left in the queue; None when empty."""

    @abstractmethod
    def ack(self, batch: Batch) -> bool:
        """Remove ``batch`` if it is still the head (it may have been dropped meanwhile)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes held (file bytes for a spool)."""

    def drain(self) -> list[Batch]:
        """Remove and return everything queued (at stop, to count what a memory queue loses)."""
        taken = []
        while (head := self.peek()) is not None and self.ack(head):
            taken.append(head)
        return taken

    def close(self) -> None:  # noqa: B027 — optional: a memory queue holds no files
        """Release files; nothing by default."""


class MemoryQueue(BatchQueue):
    def __init__(self, max_batches: int, max_bytes: int) -> None:
        if max_batches < 1 or max_bytes < 1:
            raise ValueError("a memory queue needs room for at least one batch and one byte")
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self._items: deque[Batch] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, batch: Batch) -> list[Batch]:
        with self._lock:
            if len(self._items) >= self.max_batches or self._bytes + len(batch.body) > self.max_bytes:
                return [batch]
            self._items.append(batch)
            self._bytes += len(batch.body)
            return []

    def peek(self) -> Batch | None:
        with self._lock:
            return self._items[0] if self._items else None

    def ack(self, batch: Batch) -> bool:
        with self._lock:
            if not self._items or self._items[0] is not batch:
                return False
            self._items.popleft()
            self._bytes -= len(batch.body)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes
