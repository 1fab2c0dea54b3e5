"""The agent's reader on CPU the applications leave idle, past a small floor each second.

Niceness alone does not keep the agent out of a busy application's way. nginx and its load
generator saturating both CPUs of a host leave short idle gaps (each waits on the other's bytes);
an agent at niceness 10 or 19, or SCHED_BATCH, fills them and then keeps its CPU for a slice when
they wake: it took half a core against its 0.5 budget in every case and cost nginx 28 % of its
throughput, where the kernel's own work costs ~20 % (docs/performance.md). A SCHED_IDLE thread is
preempted as soon as any other thread wants its CPU, so it runs in the gaps only. It is opt-in
(``capture.cpu_floor``): a threaded Python server whose threads hand each other the GIL lost
throughput to it instead, and the agent, preempted mid-work, spends more CPU per call.

SCHED_IDLE alone would starve the agent on CPUs that are busy without gaps (a thread per CPU
spinning: seconds between its turns), and it runs Python: while it waits, preempted, it holds the
GIL, and every other thread of the agent (exporters, the health endpoint) waits with it. So each
period the main thread first runs at its niceness until it has used its floor (``capture.cpu_floor``),
which keeps its loop turning, the kernel's counts read and the health beat going however busy the
CPUs are; only then it asks for SCHED_IDLE. It cannot lift itself back while starved, so a helper
process (this module as ``__main__``: a sleeping loop, no GIL shared) sets every SCHED_IDLE thread of
the agent to SCHED_OTHER at every period's start: the main thread, and any thread it started while
idle (Linux hands a new thread its creator's policy).
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

PERIOD_S = 1.0
_NORMAL = os.sched_param(0)
_LIBC = ctypes.CDLL(None, use_errno=True)


class IdleAfterFloor:
    """Schedules the thread that made it (the agent's main loop): ``floor_cores`` of each period at
    its niceness, the rest on idle CPU only. The loop calls :meth:`turned` after every iteration."""

    def __init__(self, floor_cores: float, period_s: float = PERIOD_S) -> None:
        self._floor_s = floor_cores * period_s
        self._period_s = period_s
        self._helper: subprocess.Popen[bytes] | None = None
        self._idle = False
        self._period_cpu = 0.0  # the thread's CPU time when its current period began

    def start(self) -> bool:
        """Start the helper that lifts the thread at every period's start (before any SCHED_IDLE:
        the helper inherits the policy). False, and a warning, when it could not lift it."""
        if not _can_leave_idle():
            log.warning(
                "capture.cpu_floor: a thread cannot leave SCHED_IDLE at niceness %d without CAP_SYS_NICE: the "
                "reader stays at its niceness",
                os.getpriority(os.PRIO_PROCESS, 0),
            )
            return False
        command = [sys.executable, "-m", __name__, str(os.getpid()), str(self._period_s)]
        try:
            self._helper = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        except OSError as exc:
            log.warning(
                "capture.cpu_floor: cannot start the process that lifts the reader each second (%s): "
                "the reader stays at its niceness",
                exc,
            )
            return False
        self._period_cpu = time.thread_time()
        return True

    def turned(self) -> None:
        """After an iteration of the loop: past the floor, SCHED_IDLE until the helper lifts it."""
        helper = self._helper
        if helper is None:
            return
        if self._idle:
            if os.sched_getscheduler(0) != os.SCHED_IDLE:
                self._idle = False  # lifted: a new period
                self._period_cpu = time.thread_time()
            elif helper.poll() is not None:
                self._stop_idling(helper)
        elif time.thread_time() - self._period_cpu >= self._floor_s:
            if helper.poll() is not None:  # nothing would lift the thread: it stays
                self._stop_idling(helper)
                return
            _go_idle()
            self._idle = True

    def close(self) -> None:
        """Back to SCHED_OTHER for good (the final drain must not wait on the applications); the
        helper stops."""
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.terminate()
            helper.wait()
            os.sched_setscheduler(0, os.SCHED_OTHER, _NORMAL)
            self._idle = False

    def _stop_idling(self, helper: subprocess.Popen[bytes]) -> None:
        log.warning(
            "capture.cpu_floor: the process that lifts the reader each second exited (status %s): "
            "the reader stays at its niceness from now on",
            helper.returncode,
        )
        os.sched_setscheduler(0, os.SCHED_OTHER, _NORMAL)
        self._helper = None
        self._idle = False


def _can_leave_idle() -> bool:
    """Whether a thread of this process may go from SCHED_IDLE back to SCHED_OTHER at its niceness
    (CAP_SYS_NICE, or a niceness RLIMIT_NICE allows), tried on a thread of its own: one that could
    not stays idle."""
    allowed: list[bool] = []

    def leave_idle() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, _NORMAL)
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, _NORMAL)
        except PermissionError:
            allowed.append(False)
        else:
            allowed.append(True)

    trial = threading.Thread(target=leave_idle, name="sched-idle-trial")
    trial.start()
    trial.join()
    return allowed == [True]


def _go_idle() -> None:
    """SCHED_IDLE for the calling thread, through libc so that the GIL is released meanwhile: on busy
    CPUs the thread is preempted as the call returns, and ``os.sched_setscheduler`` would leave it
    holding the GIL until it next runs, a period later."""
    if _LIBC.sched_setscheduler(0, os.SCHED_IDLE, ctypes.byref(ctypes.c_int(0))) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def lift_every_period(agent_pid: int, period_s: float) -> None:
    """The helper's loop: every SCHED_IDLE thread of the agent (its parent) back to SCHED_OTHER
    every ``period_s``, until the agent is gone."""
    while os.getppid() == agent_pid:
        try:
            tasks = [int(task.name) for task in os.scandir(f"/proc/{agent_pid}/task")]
        except FileNotFoundError:
            return
        for tid in tasks:
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, _NORMAL)
            except ProcessLookupError:  # the thread ended meanwhile
                continue
            except PermissionError:
                sys.exit(f"otel-ebpf: cannot set the scheduling policy of thread {tid} of process {agent_pid}")
        time.sleep(period_s)


if __name__ == "__main__":
    lift_every_period(int(sys.argv[1]), float(sys.argv[2]))
