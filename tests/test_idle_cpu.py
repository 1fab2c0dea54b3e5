"""The reader past its floor runs SCHED_IDLE, and its helper lifts it back every period
(otel_ebpf/idle_cpu.py).

Each case runs in a child process of its own (a loop as busy as the agent's under load, calling
``turned`` after each turn), whose scheduling policy the test suite must not inherit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

PERIOD_S = 0.25
FLOOR = 0.2  # of a core: 50 ms of CPU at the start of each period

# Busy for RUN_S, calling turned() after every ~1 ms turn; a thread started while SCHED_IDLE; then
# close(). Prints, as JSON: the policy after each turn with the CPU time then, the thread's policy
# at its start and two periods later, the policy after close() and the helper's pid.
PROGRAM = """
import json, os, sys, threading, time
from otel_ebpf.idle_cpu import IdleAfterFloor
period, floor, run_s, kill_helper = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "kill"
reader = IdleAfterFloor(floor, period)
assert reader.start()
helper = reader._helper.pid
turns, thread_policy = [], []

def watch_own_policy():
    thread_policy.append(os.sched_getscheduler(0))
    time.sleep(2 * period)
    thread_policy.append(os.sched_getscheduler(0))

end = time.monotonic() + run_s
while time.monotonic() < end:
    deadline = time.thread_time() + 0.001
    while time.thread_time() < deadline:
        pass
    reader.turned()
    policy = os.sched_getscheduler(0)
    turns.append((policy, time.thread_time()))
    if policy != os.SCHED_OTHER and not thread_policy:
        thread = threading.Thread(target=watch_own_policy)
        thread.start()
        if kill_helper:
            os.kill(helper, 9)
thread.join()
reader.close()
print(json.dumps({"turns": turns, "thread": thread_policy, "closed": os.sched_getscheduler(0), "helper": helper}))
"""


def _run(run_s: float, kill_helper: bool = False) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(PERIOD_S), str(FLOOR), str(run_s), "kill" if kill_helper else ""],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout), done.stderr


def _gone(pid: int) -> bool:
    return (
        not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    )


def test_past_its_floor_the_thread_is_idle_until_the_next_period() -> None:
    result, stderr = _run(2.0)
    turns = result["turns"]
    idle = os.SCHED_IDLE
    assert {policy for policy, _ in turns} == {os.SCHED_OTHER, idle}, stderr
    # each lift starts a period at its niceness, which lasts as long as the floor's CPU
    normal_runs: list[float] = []
    start = None
    for (policy, cpu), (before, _) in zip(turns, [(idle, 0.0), *turns[:-1]], strict=True):
        if policy == os.SCHED_OTHER and before != os.SCHED_OTHER:
            start = cpu
        elif policy != os.SCHED_OTHER and before == os.SCHED_OTHER and start is not None:
            normal_runs.append(cpu - start)
    lifts = len(normal_runs)
    assert 2.0 / PERIOD_S - 3 <= lifts <= 2.0 / PERIOD_S + 1, turns
    floor_s = FLOOR * PERIOD_S
    assert all(floor_s - 0.005 <= run <= floor_s + 0.01 for run in normal_runs), normal_runs
    # a thread started meanwhile inherits SCHED_IDLE, and is lifted for good; close() ends it,
    # the helper too
    assert result["thread"] == [os.SCHED_IDLE, os.SCHED_OTHER]
    assert result["closed"] == os.SCHED_OTHER
    assert _gone(result["helper"])


def test_without_its_helper_the_thread_stays_at_its_niceness() -> None:
    """Nothing would lift it: idle, it could wait for seconds on busy CPUs, holding the GIL."""
    result, stderr = _run(1.0, kill_helper=True)
    after_kill = [policy for policy, _ in result["turns"]][-100:]
    assert set(after_kill) == {os.SCHED_OTHER}
    assert "the process that lifts the reader each second exited (status -9)" in stderr
    assert result["closed"] == os.SCHED_OTHER


def test_the_helper_ends_with_the_agent() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(PERIOD_S), str(FLOOR), "60", ""],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        helpers: list[int] = []
        while not helpers:
            assert time.monotonic() < deadline, "no helper started"
            children = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
            helpers = [int(pid) for pid in children]
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 2 * PERIOD_S + 2
        while not _gone(helpers[0]):
            assert time.monotonic() < deadline, "the helper outlived the agent"
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait()


# at niceness 10, as the agent is when it starts the helper; then without CAP_SYS_NICE (root drops to
# nobody first), which leaving SCHED_IDLE at a niceness RLIMIT_NICE does not allow needs
REFUSED = """
import os, sys
from otel_ebpf.idle_cpu import IdleAfterFloor
os.setpriority(os.PRIO_PROCESS, 0, 10)
if sys.argv[1]:
    os.setuid(int(sys.argv[1]))
print(IdleAfterFloor(0.1).start(), os.sched_getscheduler(0))
"""


def test_without_cap_sys_nice_the_thread_is_never_made_idle() -> None:
    """It could not come back: on busy CPUs it would wait for seconds at a time."""
    done = subprocess.run(
        [sys.executable, "-c", REFUSED, "65534" if os.geteuid() == 0 else ""],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["False", str(os.SCHED_OTHER)]
    assert "cannot leave SCHED_IDLE at niceness 10 without CAP_SYS_NICE" in done.stderr
