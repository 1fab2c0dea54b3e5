"""Liveness and readiness of the agent, as Kubernetes probes ask for them (``/healthz``, ``/readyz``).

*Alive* means the main loop still turns: it calls :meth:`Health.beat` every iteration (at most a
poll interval plus a bounded batch of work apart). Attaching the probes compiles BPF programs,
which takes tens of seconds on a slow node; the loop has not started then, and the agent counts as
alive — a liveness probe that killed it during start-up would never let it start. Once the loop
has beaten, a silence longer than ``stall_after_s`` means it is stuck (a deadlock, a hung read):
not alive, and a restart is the cure.

*Ready* means every probe is attached and the pipeline is running: from :meth:`Health.ready_now`
(called after the first loop iteration) until :meth:`Health.stopping`, and only while alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

STALL_AFTER_S = 30.0


class Health:
    """Thread-safe: the main loop writes, the HTTP server's threads read."""

    def __init__(self, stall_after_s: float = STALL_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._stall_after_s = stall_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_beat: float | None = None
        self._ready = False

    def beat(self) -> None:
        with self._lock:
            self._last_beat = self._clock()

    def ready_now(self) -> None:
        with self._lock:
            self._ready = True
            self._last_beat = self._clock()

    def stopping(self) -> None:
        with self._lock:
            self._ready = False

    def live(self) -> tuple[bool, str]:
        """(alive, why) for ``/healthz``."""
        with self._lock:
            if self._last_beat is None:
                return True, "starting: attaching probes"
            silent_s = self._clock() - self._last_beat
        if silent_s > self._stall_after_s:
            return False, f"main loop stalled: no iteration for {silent_s:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """(ready, why) for ``/readyz``."""
        alive, why = self.live()
        if not alive:
            return False, why
        with self._lock:
            if self._ready:
                return True, "ok"
            return False, "stopping" if self._last_beat is not None else "starting: attaching probes"
