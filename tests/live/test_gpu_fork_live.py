"""Live BPF: a target's children are GPU targets too, whichever of its threads forks them
(bpf/targets.h's fork inheritance, shared with the socket probe).

The parent maps the stand-in runtime, so the file is hooked when the agent starts (``--pid``); its
children inherit the mapping. One child is forked by the main thread, one by a thread that was
running before the agent started (the kernel knows that thread by an id it never saw created).
Each child makes a known number of calls; every one is counted under the child's pid.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.standin.build import build
from tests.live.test_gpu_live import _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf

CALLS = {"main": 7, "thread": 11}

LAUNCHER = r"""
import ctypes, json, os, sys, threading
cudart = ctypes.CDLL(sys.argv[1])
calls = json.loads(sys.argv[2])
go = threading.Event()
children = {}

def fork(name):
    pid = os.fork()
    if pid == 0:
        for _ in range(calls[name]):
            cudart.cudaStreamSynchronize(None)
        os._exit(0)
    os.waitpid(pid, 0)
    children[name] = pid

def forking_thread():
    go.wait()
    fork("thread")

worker = threading.Thread(target=forking_thread)
worker.start()  # before the agent: its thread id was never seen created
print("ready", flush=True)
sys.stdin.readline()
fork("main")
go.set()
worker.join()
print(json.dumps(children), flush=True)
sys.stdin.readline()
"""


def _calls_of(metrics: dict[str, list[dict[str, Any]]], pid: int) -> float:
    latest: dict[tuple, dict[str, Any]] = {}
    for point in metrics.get("cuda.api.calls", []):
        if point["resource"].get("process.pid") == pid:
            series = tuple(sorted(point["attributes"].items()))
            if series not in latest or point["time_ns"] >= latest[series]["time_ns"]:
                latest[series] = point
    return sum(p["value"] for p in latest.values())


def test_children_forked_by_any_thread_of_a_target_are_traced(tmp_path: Path) -> None:
    library = build() / "libcudart.so.12"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(library), json.dumps(CALLS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, launcher.pid, {"OTEL_METRIC_EXPORT_INTERVAL": "500"})
            try:
                launcher.stdin.write("go\n")
                launcher.stdin.flush()
                children = json.loads(launcher.stdout.readline())
                receiver.wait_for(
                    lambda r: all(_calls_of(r.metrics(), children[name]) >= n for name, n in CALLS.items()),
                    timeout=30,
                )
            finally:
                _stop(agent, tmp_path / "agent.stderr")
            metrics = receiver.metrics()
        assert {name: _calls_of(metrics, children[name]) for name in CALLS} == CALLS
        assert _calls_of(metrics, launcher.pid) == 0  # the parent made none
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=10)
