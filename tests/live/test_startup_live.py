"""Live BPF: what a script waiting for the ready file sees while the agent starts.

A ready file left by a killed agent is removed before the probes attach, so it never says "ready"
early; a ``--pid`` target that exits while the probes attach leaves nothing to trace: the agent
stops with exit code 2 instead of reporting ready (otel_ebpf/preflight.py). Its start-up runs at
the niceness it was started with; once ready, all its threads are at its configured niceness.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO
from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent

pytestmark = pytest.mark.bpf


def test_stale_ready_file_goes_first_and_a_target_gone_during_start_up_stops_the_agent(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.write_text("424242\n")  # what a killed agent left behind
    target = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    agent = subprocess.Popen(
        [
            *AGENT,
            "run",
            "--pid",
            str(target.pid),
            "--exporter",
            "file",
            "--output",
            str(tmp_path / "out"),
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while ready.exists():  # the pid was checked before the stale file went
            assert agent.poll() is None, agent.stderr.read()
            assert time.monotonic() < deadline, "the stale ready file was not removed"
            time.sleep(0.01)
        # The probes take seconds to compile and attach: the target exits meanwhile.
        target.stdin.close()
        target.wait(timeout=30)
        stderr = agent.communicate(timeout=120)[1]
    finally:
        target.kill()
        agent.kill()
    assert agent.returncode == 2, stderr
    assert f"otel-ebpf: targets.pids (--pid): exited while the agent started: {target.pid}\n" in stderr
    assert "Traceback" not in stderr
    assert not ready.exists()


def _nice(pid: int, tid: str) -> int:
    """The niceness of thread ``tid`` of ``pid`` (field 19 of its stat)."""
    return int(Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_every_thread_of_the_agent_runs_at_its_niceness(tmp_path: Path) -> None:
    """``capture.nice``: the main thread and the exporters' threads alike, so that
    under CPU contention the traced applications run first (otel_ebpf/niceness.py); start-up
    (BCC's compile) runs at the niceness the agent was started with, so that it is quick."""
    target = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    agent = None
    during_start_up: list[int] = []

    def popen(*args: object, **kwargs: object) -> subprocess.Popen:
        process = subprocess.Popen(*args, **kwargs)  # type: ignore[call-overload]

        def sample() -> None:  # until the ready file, which start_file_agent waits for
            while not (tmp_path / "ready").exists() and process.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    during_start_up.append(_nice(process.pid, str(process.pid)))
                time.sleep(0.02)

        threading.Thread(target=sample, daemon=True).start()
        return process

    try:
        agent = start_file_agent(tmp_path, target.pid, "capture:\n  nice: 7\n", popen=popen)
        # the compile is most of the start-up: it did not run at 7 (imports before it are quick)
        assert during_start_up.count(os.getpriority(os.PRIO_PROCESS, 0)) > 0.8 * len(during_start_up)
        threads = sorted(p.name for p in Path(f"/proc/{agent.pid}/task").iterdir())
        assert len(threads) > 1  # the exporters' threads at least
        assert {tid: _nice(agent.pid, tid) for tid in threads} == dict.fromkeys(threads, 7)
        assert _nice(target.pid, str(target.pid)) == os.getpriority(os.PRIO_PROCESS, 0)  # the traced keeps its own
        stop_file_agent(agent)
    finally:
        kill_all(agent, target)
