"""Live BPF: on CPUs kept busy without a gap, the agent's reader, SCHED_IDLE past its floor, is
still lifted every second and keeps up with a light load (otel_ebpf/idle_cpu.py).

A thread spinning on every CPU at niceness 0 leaves a SCHED_IDLE thread nothing: without the
helper's lifts the reader would read the ring every few seconds at best, and the other threads of
the agent would wait on its GIL. With ``capture.cpu_floor: 0`` the reader is idle past every turn
of its loop, so each second's lift is all it gets: the test holds it to that.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.live.test_overload_live import _http_service
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

SPIN_S = 8
HEALTH_PORT = 19743


def _requests_counted(out: Path) -> float:
    """The HTTP server duration histogram's count so far (0 while the file is being written)."""
    try:
        return latest_total(load_file_metrics(out), "http.server.request.duration")
    except (OSError, ValueError):  # not there yet, or its last line half written
        return 0


def _watch_policy(pid: int, policies: list[int], done: threading.Event) -> None:
    while not done.wait(0.002):
        policies.append(os.sched_getscheduler(pid))


def test_on_cpus_busy_without_a_gap_the_idle_reader_keeps_turning(tmp_path: Path) -> None:
    server, port = _http_service()
    agent = None
    spinners: list[subprocess.Popen] = []
    try:
        agent = start_file_agent(
            tmp_path,
            server.pid,
            f"capture:\n  cpu_floor: 0\nexport:\n  metric_interval_s: 1\nhealth:\n  port: {HEALTH_PORT}\n",
        )
        helpers = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
        assert len(helpers) == 1, "no helper process"
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
        time.sleep(1)
        policies: list[int] = []  # the reader's, every few ms
        watching = threading.Event()
        watcher = threading.Thread(target=_watch_policy, args=(agent.pid, policies, watching))
        watcher.start()
        health_s: list[float] = []
        statuses: list[int] = []
        conn = http.client.HTTPConnection("127.0.0.1", port)
        end = time.monotonic() + SPIN_S
        while time.monotonic() < end:
            conn.request("GET", f"/users/{len(statuses)}")
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
            started = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{HEALTH_PORT}/healthz", timeout=30) as health:
                assert health.status == 200
            health_s.append(time.monotonic() - started)
            time.sleep(0.05)
        conn.close()
        watching.set()
        watcher.join()
        # still spinning: the kernel's counts of every request reach the exporter within seconds
        deadline = time.monotonic() + 6
        while _requests_counted(tmp_path / "out") < len(statuses):
            assert time.monotonic() < deadline, (_requests_counted(tmp_path / "out"), len(statuses))
            time.sleep(0.2)
        kill_all(*spinners)
        log = stop_file_agent(agent)
    finally:
        kill_all(*spinners, agent, server)
    lifts = sum(
        1
        for before, after in zip(policies, policies[1:], strict=False)
        if (before, after) == (os.SCHED_IDLE, os.SCHED_OTHER)
    )
    assert SPIN_S - 2 <= lifts <= 3 * SPIN_S, policies
    assert max(health_s) < 1.5, health_s
    assert statuses == [200] * len(statuses) and len(statuses) > 20
    spans = [span for span in load_file_spans(tmp_path / "out") if span["kind"] == "SERVER"]
    assert len(spans) == len(statuses), log[-2000:]
    assert "Traceback" not in log and "capture.cpu_floor:" not in log, log
    assert not Path(f"/proc/{helpers[0]}").exists()
