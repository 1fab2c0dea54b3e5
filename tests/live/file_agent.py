"""An agent run that traces one process and writes files, for live tests that read its output."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.conftest import AGENT, REPO


def start_file_agent(
    tmp: Path,
    pid: int | Sequence[int],
    config_yaml: str,
    timeout: float = 90,
    args: Sequence[str] = (),
    popen: Callable[..., subprocess.Popen] = subprocess.Popen,
) -> subprocess.Popen:
    """``otel-ebpf run --pid PID --exporter file --output TMP/out`` with ``config_yaml`` (a ``--pid``
    for each of several pids, none for none) and more ``args``, started by ``popen`` (another PID
    namespace's, say) and returned once its ready file says the probes are attached."""
    config = tmp / "agent.yaml"
    config.write_text(config_yaml)
    ready = tmp / "ready"
    agent = popen(
        [
            *AGENT,
            "run",
            "--config",
            str(config),
            *(arg for each in ([pid] if isinstance(pid, int) else pid) for arg in ("--pid", str(each))),
            "--exporter",
            "file",
            "--output",
            str(tmp / "out"),
            "--ready-file",
            str(ready),
            *args,
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while not (ready.exists() and ready.read_text().strip()):
        if agent.poll() is not None:
            raise AssertionError(f"agent exited early ({agent.returncode}): {agent.stderr.read()}")
        if time.monotonic() > deadline:
            agent.kill()
            raise AssertionError(f"{ready} did not appear within {timeout}s")
        time.sleep(0.05)
    return agent


def kill_all(*processes: subprocess.Popen | None) -> None:
    """Kill and reap each process still running: what a live test's ``finally`` owes its peers."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


def stop_file_agent(agent: subprocess.Popen) -> str:
    """Stop an agent as a user would (SIGINT), wait for its final flush, and return its stderr;
    it must exit cleanly."""
    agent.send_signal(signal.SIGINT)
    stderr = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, stderr
    return stderr
