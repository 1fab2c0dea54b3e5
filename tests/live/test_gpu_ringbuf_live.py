"""Live BPF: a GPU probe whose ring buffer overflows loses the calls it could not record, counted,
and nothing more.

A burst of ``cudaStreamSynchronize`` calls on the stand-in runtime, far faster than the agent
reads a 64 KiB ring, overflows it; the same thread then makes a few more calls, slowly. Each call is
either decoded or counted in ``otel_ebpf.kernel.drops{reason=gpu_ringbuf_full}``; and the slow calls
after the overflow are all decoded (a lost entry once left the thread marked as inside a call that
never returned, so that every later call of it looked nested and was silently dropped).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.standin.build import build
from tests.live.test_gpu_live import _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver, latest_total

pytestmark = pytest.mark.bpf

BURST = 20_000
SLOW = 40

DRIVER = r"""
import ctypes, sys, time
cudart = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    calls, pause_s = line.split()
    for _ in range(int(calls)):
        cudart.cudaStreamSynchronize(None)
        time.sleep(float(pause_s))
    print("done", flush=True)
"""


def _calls(receiver: OTLPReceiver) -> float:
    return latest_total(receiver.metrics(), "cuda.api.calls", **{"cuda.function": "cudaStreamSynchronize"})


def test_an_overflowing_ring_loses_only_what_it_counts(tmp_path: Path) -> None:
    library = build() / "libcudart.so.12"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(library)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            env = {"OTEL_EBPF_GPU_RING_BUFFER_KB": "64", "OTEL_METRIC_EXPORT_INTERVAL": "500"}
            agent = _start_agent(tmp_path, receiver, driver.pid, env)
            try:
                for calls, pause_s in ((BURST, 0), (SLOW, 0.01)):
                    driver.stdin.write(f"{calls} {pause_s}\n")
                    driver.stdin.flush()
                    assert driver.stdout.readline() == "done\n"
                receiver.wait_for(lambda r: _calls(r) >= SLOW, timeout=30)
            finally:
                stderr = _stop(agent, tmp_path / "agent.stderr")
            metrics = receiver.metrics()
            decoded = _calls(receiver)
            lost = latest_total(metrics, "otel_ebpf.kernel.drops", reason="gpu_ringbuf_full")
        assert lost > 0, f"the ring did not overflow: the test proves nothing ({stderr[-500:]})"
        assert latest_total(metrics, "otel_ebpf.kernel.drops", reason="gpu_nested_calls") == 0
        # an entry lost is a call lost; a return lost (its entry recorded) may still be decoded
        assert BURST + SLOW <= decoded + lost <= BURST + SLOW + lost
    finally:
        driver.stdin.close()
        driver.wait(timeout=10)
