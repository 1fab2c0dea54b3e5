"""Live: GPU device state from NVML, read by the agent through nvidia-ml-py from the stand-in
``libnvidia-ml.so.1`` (tests/gpu/standin/nvml.c: two devices with known state, one XID), exported
with the rest of its metrics; the device memory a process holds lands on that process's resource."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.gpu.standin.build import build
from tests.live.file_agent import start_file_agent, stop_file_agent
from tests.otlp_receiver import load_file_metrics

pytestmark = pytest.mark.bpf

H200, L4 = "GPU-5a1d1e00-0000-4000-8000-000000000000", "GPU-5a1d1e00-0000-4000-8000-000000000001"
HELD = 3 << 30


def _latest(metrics: dict, name: str, **attributes: object) -> list[tuple[dict, float]]:
    """(resource, value) of the latest point of each series of ``name`` whose attributes include ``attributes``."""
    latest: dict[tuple, dict] = {}
    for point in metrics.get(name, []):
        if all(point["attributes"].get(k) == v for k, v in attributes.items()):
            key = (tuple(sorted(point["resource"].items())), tuple(sorted(point["attributes"].items())))
            if key not in latest or point["time_ns"] >= latest[key]["time_ns"]:
                latest[key] = point
    return [(p["resource"], p["value"]) for p in latest.values()]


def test_device_state_and_process_memory_reach_the_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = subprocess.Popen(["sleep", "60"])
    monkeypatch.setenv("LD_LIBRARY_PATH", str(build()))
    monkeypatch.setenv("STANDIN_NVML_PROCESSES", f"{holder.pid}:{HELD}")
    agent = None
    try:
        agent = start_file_agent(tmp_path, holder.pid, "export:\n  metric_interval_s: 0.5\n")
        subprocess.run(["sleep", "2"], check=True)
        stderr = stop_file_agent(agent)
        agent = None
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        holder.kill()
        holder.wait()

    assert "GPU device state: NVML: 2 device(s): NVIDIA H200 (stand-in), NVIDIA L4 (stand-in)" in stderr
    metrics = load_file_metrics(tmp_path / "out")
    node = {"hw.vendor": "NVIDIA"}
    values = {
        (name, device): [value for _, value in _latest(metrics, name, **{"hw.id": device}, **node)]
        for name in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.power")
        for device in (H200, L4)
    }
    assert values == {
        ("hw.gpu.utilization", H200): [0.37],
        ("hw.gpu.utilization", L4): [0.8],
        ("hw.gpu.memory.usage", H200): [20 << 30],
        ("hw.gpu.memory.usage", L4): [1 << 30],
        ("hw.gpu.memory.limit", H200): [141 << 30],
        ("hw.gpu.memory.limit", L4): [24 << 30],
        ("hw.power", H200): [523],
        ("hw.power", L4): [],  # the L4 does not report power: no series, no error
    }
    clocks = {
        (p["attributes"]["hw.id"], p["attributes"]["hw.gpu.clock"]): p["value"]
        for p in metrics["otel_ebpf.gpu.clock.frequency"]
    }
    assert clocks == {(H200, "sm"): 1980e6, (H200, "memory"): 3201e6, (L4, "sm"): 2040e6, (L4, "memory"): 6251e6}
    errors = {
        (p["attributes"]["hw.id"], p["attributes"]["error.type"]): v
        for p, v in ((p, p["value"]) for p in metrics["hw.errors"])
    }
    assert errors == {(H200, "ecc_corrected"): 5, (L4, "xid_79"): 1}
    ((resource, held),) = _latest(metrics, "otel_ebpf.gpu.process.memory.usage", **{"hw.id": H200})
    assert (resource["process.pid"], resource["process.executable.name"], held) == (holder.pid, "sleep", HELD)
