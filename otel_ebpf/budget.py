"""Keeping the agent within its CPU budget by copying fewer new exchanges, never by falling behind.

The kernel sheds whole HTTP/1 exchanges at the share this controller sets (bpf/http1_summary.h,
``SET_KEEP_1024``); the metrics stay exact because the kernel counts every request anyway. Over
budget for ``PATIENCE`` periods in a row (one busy second, a burst of start-up work, is no
overload), the share drops in proportion to the excess; under ``HEADROOM`` of the budget it
doubles back. Pure: fed CPU and wall time, it reads no clock.
"""

from __future__ import annotations

MIN_KEEP = 1 / 1024  # the kernel's resolution
PATIENCE = 2  # periods over budget before shedding starts
HEADROOM = 0.8  # "well under budget": below this share of it


class CpuBudget:
    def __init__(self, cores: float) -> None:
        """``cores``: the CPU the agent may use, as a share of one core (0.5: half a core)."""
        self.cores = cores
        self.keep = 1.0  # share of new exchanges copied
        self._last: tuple[float, float] | None = None
        self._over = 0  # periods over budget in a row

    def update(self, cpu_s: float, wall_s: float) -> float:
        """The share of new exchanges to copy, given the agent's CPU time and the wall time now."""
        last, self._last = self._last, (cpu_s, wall_s)
        if last is None or wall_s <= last[1]:
            return self.keep
        used = (cpu_s - last[0]) / (wall_s - last[1])
        self._over = self._over + 1 if used > self.cores else 0
        if self._over >= PATIENCE:
            self.keep = max(MIN_KEEP, self.keep * self.cores / used)
        elif used < HEADROOM * self.cores:
            self.keep = min(1.0, self.keep * 2)
        return self.keep
