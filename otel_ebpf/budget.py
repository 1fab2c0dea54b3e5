"""Keeping the agent within its CPU budget by copying fewer new exchanges, never by falling behind.

The kernel sheds whole HTTP/1 exchanges at the share this controller sets (bpf/http1_summary.h,
``SET_KEEP_1024``); the metrics stay exact because the kernel counts every request anyway. Over
budget for ``PATIENCE`` periods in a row (one busy second, a burst of start-up work, is no
overload), the share drops in proportion to the excess, and the next cut waits as long again: the
period after a cut still reads the backlog copied at the old share. Under ``HEADROOM`` of the
budget the share grows back in proportion to the room, at most doubling per period. Both aim at
``SETPOINT``, the middle of the band in which the share is left alone, not at the budget itself:
the agent's CPU at a given share varies by a tenth or more from one second to the next (more when
the applications take the CPUs), and a share that brought it to the budget exactly would leave it
over the budget half the time. Pure: fed CPU and wall time (and the kernel's request counts), it
reads no clock.

The cut scales the share of exchanges the agent really received over the period. When user space
falls behind, the kernel also sheds on ring backlog, and the agent's CPU then shows only what it
could do, not how much more there was: scaling the controller's own setting would take one
halving per period to get there, scaling what was copied takes one period.

Traffic the kernel cannot shed whole (HTTP/2 and gRPC, whose header compression makes every frame
of a connection matter; RTPS; protocols it does not know) is held by :class:`CpuCap` instead: past
its allowance the reader waits, and what overflows the ring meanwhile is lost and counted.
"""

from __future__ import annotations

MIN_KEEP = 1 / 1024  # the kernel's resolution
PATIENCE = 2  # periods over budget before shedding starts
HEADROOM = 0.8  # "well under budget": below this share of it
SETPOINT = (1 + HEADROOM) / 2  # the share of the budget a change of the share aims at
# One cut divides the share by at most this: a second in which the kernel shed nearly everything
# on backlog (a burst that filled half the ring) says little about what the agent can take.
MAX_CUT = 32
# CpuCap's allowance, in seconds of budget: the agent may run this far ahead of its budget before
# its reader waits. One period: a burst passes, an overload does not (at a tenth over the budget it
# would run 10 s before the reader waits with 1 s, 30 s with 3). An HTTP/1 overload may meet the
# cap before the controller's cut: meanwhile the ring's backlog grows and the kernel sheds on it,
# counted, and a second in which the reader waited is over budget for the controller, so the cut
# still comes.
ALLOWANCE_S = 1.0


class CpuBudget:
    def __init__(self, cores: float) -> None:
        """``cores``: the CPU the agent may use, as a share of one core (0.5: half a core)."""
        self.cores = cores
        self.keep = 1.0  # share of new exchanges copied
        self._last: tuple[float, float, int, int, float] | None = None
        self._over = 0  # periods over budget in a row

    def update(self, cpu_s: float, wall_s: float, requests: int = 0, shed: int = 0, paused_s: float = 0.0) -> float:
        """The share of new exchanges to copy, given the agent's CPU time and the wall time now.

        ``requests`` and ``shed``: HTTP/1 requests the kernel counted, and those it shed for any
        reason, since start (both 0 when it counts none): what was copied over the period.
        ``paused_s``: the time :class:`CpuCap` made the reader wait, since start. A period in which
        it waited is over budget whatever its CPU (held to the budget, the agent shows the cap, not
        what it was offered), so that HTTP/1 is cut by share and not left to the ring's backlog;
        the cut scales what the kernel copied, the backlog's shedding included, as always."""
        last, self._last = self._last, (cpu_s, wall_s, requests, shed, paused_s)
        if last is None or wall_s <= last[1]:
            return self.keep
        used = (cpu_s - last[0]) / (wall_s - last[1])
        capped = paused_s > last[4]
        self._over = self._over + 1 if used > self.cores or capped else 0
        if self._over >= PATIENCE:
            counted = requests - last[2]
            copied = min(self.keep, max(0.0, 1 - (shed - last[3]) / counted)) if counted > 0 else self.keep
            cut = max(MIN_KEEP, self.keep / MAX_CUT, copied * SETPOINT * self.cores / used) if used > 0 else self.keep
            self.keep = min(self.keep, cut)
            # The next period still ends the ring's backlog of the old share: judged anew after it.
            self._over = 0
        elif used < HEADROOM * self.cores and not capped:  # toward the setpoint, at most doubling
            self.keep = min(1.0, self.keep * (min(2.0, SETPOINT * self.cores / used) if used > 0 else 2.0))
        return self.keep


class CpuCap:
    """A ceiling on the agent's CPU however little of its traffic the kernel can shed: a bucket of
    CPU time filled at the budget's rate, up to ``ALLOWANCE_S`` seconds of it, and emptied by the
    CPU the agent uses; empty, the reader waits for it to refill. Pure: fed CPU and wall time."""

    def __init__(self, cores: float, allowance_s: float = ALLOWANCE_S) -> None:
        """``cores``: the CPU the agent may use, as a share of one core (``capture.cpu_budget``)."""
        self.cores = cores
        self._allowance = cores * allowance_s
        self._left = self._allowance  # CPU seconds the agent may still use ahead of the budget
        self._last: tuple[float, float] | None = None

    def pause(self, cpu_s: float, wall_s: float) -> float:
        """Seconds the reader should wait before it reads more, given the agent's CPU and the wall
        time now (0.0: none). The wait's own time refills the bucket at the next call."""
        last, self._last = self._last, (cpu_s, wall_s)
        if last is None:
            return 0.0
        refill = max(0.0, wall_s - last[1]) * self.cores
        self._left = min(self._allowance, self._left + refill - (cpu_s - last[0]))
        return -self._left / self.cores if self._left < 0 else 0.0
