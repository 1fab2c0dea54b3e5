"""Live BPF: a process's state at its exit is exported when it exits, not at the next interval.

Two programs that exit between two intervals: the stand-in training loop (``examples/
gpu_training_standin.py``), which leaks device memory and exits 2 s after its last call with
``gpu.interval_s`` 10 s, and a CPU-bound program (pure-Python recursion alternating with
``hashlib.sha256`` over a 4 MiB buffer) that exits long before its 60 s profile interval ends.
What a real OTLP receiver gets while the agent still runs must be their state at exit, labelled
``otel_ebpf.process.exited``: the leaked bytes on the stack that allocated them, and the samples
the CPU time they used is worth at the sampling rate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_ebpf.profiles.model import Profile
from tests.conftest import AGENT, REPO
from tests.live.test_gpu_live import (
    WORKLOAD,
    _functions,
    _profiles,
    _start_agent,
    _stop,
)
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
HZ = 49
# prints its pid, waits for a line, burns CPU for the given seconds, prints its CPU time, exits
CPU_BOUND = r"""
import hashlib, os, sys, time
BUFFER = os.urandom(4 << 20)
def recurse(n):
    return 0 if n == 0 else 1 + recurse(n - 1)
def python_part(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        recurse(200)
def native_part(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hashlib.sha256(BUFFER).digest()
print(os.getpid(), flush=True)
sys.stdin.readline()
end = time.perf_counter() + float(sys.argv[1])
while time.perf_counter() < end:
    python_part(0.1)
    native_part(0.1)
print(time.process_time(), flush=True)
"""


def _exited(profile: Profile) -> bool:
    return bool(profile.samples) and all(
        dict(key.attributes).get("otel_ebpf.process.exited") is True for key in profile.samples
    )


def _profiles_at_exit(receiver: OTLPReceiver, pid: int, sample_type: str | None) -> tuple[list, float]:
    """``pid`` has just exited: its profiles labelled as its state at exit (of ``sample_type``, or
    all), and how long after now they had arrived; at most 8 s, well within any interval."""
    exited_at = time.monotonic()

    def at_exit(r: OTLPReceiver) -> list:
        return [
            p
            for p in _profiles(r)
            if p.resource.get("process.pid") == pid and _exited(p) and sample_type in (None, p.sample_types[0].type)
        ]

    assert receiver.wait_for(lambda r: bool(at_exit(r)), timeout=8), "no profile at exit"
    return at_exit(receiver), time.monotonic() - exited_at


def test_gpu_memory_still_held_at_exit_is_exported_at_once(tmp_path: Path) -> None:
    workload = subprocess.Popen(
        [*WORKLOAD, "--steps", "10", "--step-ms", "50"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert workload.stdout.readline() == "ready\n"
        pid = workload.pid
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, pid, env={"OTEL_EBPF_GPU_INTERVAL": "10"})
            try:
                workload.stdin.write("go\n")
                workload.stdin.flush()
                summary = json.loads(workload.stdout.readline())
                time.sleep(2.0)
                workload.communicate("exit\n", timeout=30)
                profiles, waited = _profiles_at_exit(receiver, pid, "inuse_space")
            finally:
                _stop(agent, tmp_path / "agent.stderr")
    finally:
        workload.kill()
        workload.wait()
    (in_use,) = profiles
    ledger = summary["ledger"]
    # everything it held, every layer and device (the ledger counts as the agent sees)
    assert in_use.total() == sum(v for k, v in ledger.items() if k.startswith("in_use "))
    leaked = sum(values[0] for key, values in in_use.samples.items() if "leaky_batch_cache" in _functions(key.stack))
    assert leaked == summary["leaks"] * summary["leak_size"]
    print(f"in-use at exit: {in_use.total()} bytes, received {waited:.2f} s after the exit")


def test_cpu_samples_of_a_process_that_exits_within_the_interval(tmp_path: Path) -> None:
    program = subprocess.Popen(
        [sys.executable, "-c", CPU_BOUND, "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    ready = tmp_path / "ready"
    try:
        pid = int(program.stdout.readline())
        with OTLPReceiver() as receiver:
            agent = subprocess.Popen(
                [
                    *AGENT,
                    "run",
                    "--pid",
                    str(pid),
                    "--profile",
                    "--profile-frequency",
                    str(HZ),
                    "--exporter",
                    "otlp",
                    "--otlp-endpoint",
                    receiver.grpc_endpoint,
                    "--ready-file",
                    str(ready),
                ],
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "OTEL_EBPF_PROFILING_INTERVAL": "60", "OTEL_EBPF_GPU": "false"},
            )
            try:
                _wait_for_file(ready, agent)
                program.stdin.write("go\n")
                program.stdin.flush()
                cpu_s = float(program.stdout.readline())
                program.wait(timeout=30)
                profiles, waited = _profiles_at_exit(receiver, pid, None)
            finally:
                _stop(agent)
    finally:
        program.kill()
        program.wait()
    samples = sum(p.total() for p in profiles)
    expected = cpu_s * HZ  # one busy thread: HZ samples per second of its CPU time
    functions = {f for p in profiles for key in p.samples for f in _functions(key.stack)}
    assert {"recurse", "native_part"} <= functions
    assert 0.6 * expected <= samples <= 1.25 * expected, (samples, expected)
    print(
        f"{samples} samples at exit for {cpu_s:.2f} s of CPU ({expected:.0f} expected), "
        f"received {waited:.2f} s after the exit"
    )
