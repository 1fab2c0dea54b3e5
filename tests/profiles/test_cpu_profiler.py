"""Raw samples -> profile samples (otel_ebpf/profiles/cpu.py) without BPF: this process's own
addresses stand in for what the kernel would have recorded."""

from __future__ import annotations

import ctypes
import os

from otel_ebpf.probes.cpu import RawSample
from otel_ebpf.profiles.cpu import CpuProfiler, cpu_builder
from otel_ebpf.profiles.model import FrameKind


def _address(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value


def sample(tid: int, user: tuple[int, ...], ts: int = 1_000) -> RawSample:
    return RawSample(ts, os.getpid(), tid, 0, "python", user, (), 0, ())


def test_samples_are_symbolized_linked_and_aggregated() -> None:
    links = {7: (0xABC, 0xDEF)}
    resources = []

    def resource_for(pid: int) -> dict:
        resources.append(pid)
        return {"service.name": "me", "process.pid": pid}

    profiler = CpuProfiler(cpu_builder(49, 100), resource_for, lambda pid, tid, ts: links.get(tid))
    getpid, malloc = _address("getpid"), _address("malloc")
    resolved = profiler.resolve([sample(7, (getpid + 2, malloc + 20)), sample(8, (getpid + 2, malloc + 20))], {})
    links.clear()  # links are decided when samples are added (after trace assembly caught up), not before
    profiler.add_resolved(resolved)
    profiler.add([sample(7, (getpid + 2, malloc + 20))], {})
    (profile,) = profiler.take(end_ns=2_000)
    assert profile.period == 1_000_000_000 // 49 and profile.total() == 3
    stacks = {(k.link, dict(k.attributes)["thread.id"]): v[0] for k, v in profile.samples.items()}
    assert stacks == {(None, 7): 2, (None, 8): 1}
    key = next(iter(profile.samples))
    leaf, caller = key.stack
    assert leaf.function.lstrip("_") == "getpid" and leaf.kind is FrameKind.NATIVE
    # a caller frame is a return address: looked up one byte back, inside the calling function
    assert caller.function.lstrip("_") == "malloc"
    assert resources == [os.getpid()] * 3  # read as samples arrive


def test_links_when_added() -> None:
    profiler = CpuProfiler(cpu_builder(99, 100), lambda pid: {"service.name": "me"}, lambda pid, tid, ts: (1, 2))
    profiler.add([sample(7, (_address("getpid"),))], {})
    (profile,) = profiler.take(end_ns=2_000)
    assert [k.link for k in profile.samples] == [(1, 2)]
