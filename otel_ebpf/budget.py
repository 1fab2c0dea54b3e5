"""Keeping the agent within its CPU budget by copying fewer new exchanges, never by falling behind.

The kernel sheds whole HTTP/1 exchanges at the share this controller sets (bpf/http1_summary.h,
``SET_KEEP_1024``); the metrics stay exact because the kernel counts every request anyway. The
controller is multiplicative: over budget, the share drops in proportion to the excess at once;
well under budget, it grows back by a quarter per step. Pure: fed CPU and wall time, no clocks.
"""

from __future__ import annotations

MIN_KEEP = 1 / 1024  # the kernel's resolution
RECOVERY = 1.25  # growth per step while well under budget
HEADROOM = 0.8  # "well under": below this share of the budget


class CpuBudget:
    def __init__(self, cores: float) -> None:
        """``cores``: the CPU the agent may use, as a share of one core (0.5: half a core)."""
        self.cores = cores
        self.keep = 1.0  # share of new exchanges copied
        self._last: tuple[float, float] | None = None

    def update(self, cpu_s: float, wall_s: float) -> float:
        """The share of new exchanges to copy, given the agent's CPU time and the wall time now."""
        last, self._last = self._last, (cpu_s, wall_s)
        if last is None or wall_s <= last[1]:
            return self.keep
        used = (cpu_s - last[0]) / (wall_s - last[1])
        if used > self.cores:
            self.keep = max(MIN_KEEP, self.keep * self.cores / used)
        elif used < HEADROOM * self.cores:
            self.keep = min(1.0, self.keep * RECOVERY)
        return self.keep
