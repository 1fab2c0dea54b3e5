"""Live BPF: the GPU views on the stand-in CUDA/NCCL/PyTorch libraries, and on the real wheels.

The stand-in "training loop" (``examples/gpu_training_standin.py``) keeps a ledger of every call it
makes; what a real OTLP receiver gets from the agent must match it exactly: in-use bytes per
process, layer and device, copy bytes per direction, launch counts, collective bytes per operation
and datatype, error codes — and the one deliberate leak, reported with the Python function that
made it. Everything is traced by pid, so other programs on a busy machine stay out of the counts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.profiles import otlp as profiles_otlp
from tests.conftest import AGENT, REPO
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import OTLPReceiver, _attributes

pytestmark = pytest.mark.bpf
WORKLOAD = [sys.executable, str(REPO / "examples" / "gpu_training_standin.py")]
STEPS = 20
MIB = 1 << 20
NCCL_OPS = ("AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "Send", "Recv")
DTYPES = {
    0: "int8",
    1: "uint8",
    2: "int32",
    3: "uint32",
    4: "int64",
    5: "uint64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "bfloat16",
    10: "float8e4m3",
    11: "float8e5m2",
}


def _start_agent(tmp: Path, receiver: OTLPReceiver, pid: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The agent on ``pid``, its stderr in ``tmp/agent.stderr`` (readable while it runs)."""
    ready = tmp / "agent.ready"
    stderr = (tmp / "agent.stderr").open("w")  # the child keeps its own descriptor
    agent = subprocess.Popen(
        [
            *AGENT,
            "run",
            "--pid",
            str(pid),
            "--gpu",
            "true",
            "--exporter",
            "otlp",
            "--otlp-endpoint",
            receiver.grpc_endpoint,
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        stderr=stderr,
        env={**os.environ, "OTEL_EBPF_GPU_LEAK_AGE": "0.4", "OTEL_EBPF_GPU_INTERVAL": "60", **(env or {})},
    )
    stderr.close()
    _wait_for_file(ready, agent)
    return agent


def _stop(agent: subprocess.Popen, stderr_file: Path | None = None) -> str:
    """SIGINT, then the agent's whole stderr: its pipe's, or ``stderr_file`` (``_start_agent``'s
    ``tmp/agent.stderr``)."""
    agent.send_signal(signal.SIGINT)
    piped = agent.communicate(timeout=60)[1]
    stderr = stderr_file.read_text() if stderr_file else piped
    assert agent.returncode == 0, stderr
    return stderr


def _final(metrics: dict[str, list[dict[str, Any]]], name: str, pid: int, **attributes: Any) -> Any:
    """The last cumulative value (histograms: (count, sum)) of the series with exactly ``attributes``."""
    points = [
        p for p in metrics.get(name, []) if p["resource"].get("process.pid") == pid and p["attributes"] == attributes
    ]
    if not points:
        return None
    last = max(points, key=lambda p: p["time_ns"])
    return (last["count"], last["sum"]) if last["type"] == "histogram" else last["value"]


def _logs(receiver: OTLPReceiver) -> list[dict[str, Any]]:
    records = []
    for request in receiver.requests("logs"):
        for resource_logs in request.resource_logs:
            resource = _attributes(resource_logs.resource.attributes)
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    records.append(
                        {
                            "resource": resource,
                            "body": record.body.string_value,
                            "event_name": record.event_name,
                            "severity": record.severity_text,
                            "attributes": _attributes(record.attributes),
                        }
                    )
    return records


def _profiles(receiver: OTLPReceiver) -> list:
    return [p for request in receiver.requests("profiles") for p in profiles_otlp.decode(request)]


@dataclass
class Traced:
    summary: dict[str, Any]  # the JSON line the program printed after its calls
    stderr: str  # the agent's
    metrics: dict[str, list[dict[str, Any]]]
    logs: list[dict[str, Any]]
    profiles: list


def _traced_run(
    tmp: Path,
    program: subprocess.Popen,
    before_go: Callable[[], None] = lambda: None,
    settle_s: float = 0.0,
    profiles: bool = True,
) -> Traced:
    """Attach the agent to ``program`` (which waits for lines on stdin), let it go, read its JSON
    summary line, stop the agent and collect what the receiver got; ``program`` is then told to
    exit (a last line) and reaped."""
    try:
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp, receiver, program.pid)
            before_go()
            program.stdin.write("go\n")
            program.stdin.flush()
            summary = json.loads(program.stdout.readline())
            time.sleep(settle_s)
            stderr = _stop(agent, tmp / "agent.stderr")
            receiver.wait_for(
                lambda r: bool(r.metrics()) and (bool(r.requests("profiles")) or not profiles), timeout=15
            )
            traced = Traced(summary, stderr, receiver.metrics(), _logs(receiver), _profiles(receiver))
        program.communicate("exit\n", timeout=30)
        return traced
    finally:
        program.kill()
        program.wait()


def _functions(stack: tuple) -> list[str]:
    return [frame.function for frame in stack]


def test_standin_training_loop_is_seen_exactly(tmp_path: Path) -> None:
    workload = subprocess.Popen(
        [*WORKLOAD, "--steps", str(STEPS), "--step-ms", "50"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert workload.stdout.readline() == "ready\n"  # libraries loaded before the agent starts
    # after the loop, a few more leak checks: in-use no longer grows, nothing new is reported
    run = _traced_run(tmp_path, workload, settle_s=0.5)
    summary, stderr, metrics, logs, profiles = run.summary, run.stderr, run.metrics, run.logs, run.profiles

    pid, ledger = summary["pid"], summary["ledger"]
    assert "GPU: hooked" in stderr and "libcudart.so.12" in stderr and "pytorch:malloc" in stderr
    # memory: in use, allocated, counts, per layer (cuda.api), device and kind (device memory,
    # managed, pinned host): every series the ledger has, and no other
    series_held = {key.removeprefix("in_use "): n for key, n in ledger.items() if key.startswith("in_use ")}
    assert len(series_held) == 10
    for series, held in series_held.items():
        layer, device, *kind = series.split()
        attrs = {"cuda.api": layer, "cuda.device": int(device), "cuda.memory.kind": kind[0] if kind else "device"}
        assert _final(metrics, "cuda.memory.in_use", pid, **attrs) == held, attrs
        assert _final(metrics, "cuda.memory.allocated", pid, **attrs) == ledger[f"alloc {series}"], attrs
        if f"allocs {series}" in ledger:
            assert _final(metrics, "cuda.memory.allocations", pid, **attrs) == ledger[f"allocs {series}"], attrs
    assert {p["resource"].get("process.pid") for p in metrics["cuda.memory.in_use"]} == {pid}
    assert len({tuple(sorted(p["attributes"].items())) for p in metrics["cuda.memory.in_use"]}) == len(series_held)
    # the driver's virtual memory API: physical chunks mapped into reserved ranges
    for device in (0, 1):
        assert _final(metrics, "cuda.memory.mapped", pid, **{"cuda.device": device}) == ledger[f"mapped {device}"]
    assert _final(metrics, "cuda.memory.address_reserved", pid) == ledger["address_reserved"]
    assert (
        _final(
            metrics,
            "cuda.api.calls",
            pid,
            **{"cuda.api": "runtime", "cuda.function": "cudaMalloc", "error.type": "cudaErrorMemoryAllocation"},
        )
        == 1
    )
    # the free of memory allocated before the agent attached pairs with nothing
    assert _final(metrics, "otel_ebpf.gpu.allocations.untracked", os.getpid(), reason="unmatched_free") is None
    untracked = [
        p for p in metrics["otel_ebpf.gpu.allocations.untracked"] if p["attributes"] == {"reason": "unmatched_free"}
    ]
    assert max(p["value"] for p in untracked) == 1
    # copies: bytes and calls by layer, direction and synchronicity
    for key, total in ledger.items():
        if key.startswith("copy "):
            _, layer, direction, mode = key.split()
            attrs = {"cuda.api": layer, "cuda.memcpy.direction": direction, "cuda.memcpy.synchronous": mode == "sync"}
            count, size = _final(metrics, "cuda.memcpy.size", pid, **attrs)
            assert (count, size) == (ledger[f"copies {layer} {direction} {mode}"], total), attrs
    # launches (runtime: cudaLaunchKernel; driver: cuLaunchKernel + cuLaunchKernelEx) and waits
    # runtime launches by the kernel their host stub is named after, demangled
    kernels = {key.removeprefix("launch kernel "): n for key, n in ledger.items() if key.startswith("launch kernel ")}
    assert len(kernels) == 3 and sum(kernels.values()) == ledger["launch runtime"]
    for name, launched in kernels.items():
        assert _final(metrics, "cuda.kernel.launches", pid, **{"cuda.api": "runtime", "cuda.kernel.name": name}) == (
            launched
        ), name
    assert _final(metrics, "cuda.kernel.launches", pid, **{"cuda.api": "runtime"}) is None  # every one named
    assert _final(metrics, "cuda.kernel.launches", pid, **{"cuda.api": "driver"}) == ledger["launch driver"]
    for function in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
        assert _final(metrics, "cuda.synchronize.duration", pid, **{"cuda.function": function})[0] == STEPS
    # NCCL: bytes = count x datatype size, per operation and datatype, with the communicator's rank
    for op in NCCL_OPS:
        for code, dtype in DTYPES.items():
            attrs = {"nccl.operation": op, "nccl.datatype": dtype, "nccl.rank": 1, "nccl.comm.size": 2}
            expected = ledger.get(f"nccl bytes {op} {code} rank 1")
            found = _final(metrics, "nccl.operation.size", pid, **attrs)
            assert found == (ledger[f"nccl calls {op} {code} rank 1"], expected), attrs
    assert (
        _final(
            metrics,
            "nccl.operations",
            pid,
            **{"nccl.operation": "AllReduce", "nccl.rank": 1, "nccl.comm.size": 2, "error.type": "ncclInvalidArgument"},
        )
        == 1
    )
    assert _final(metrics, "nccl.operations", pid, **{"nccl.operation": "CommInitRank", "nccl.rank": 1}) == 1
    assert _final(metrics, "nccl.operations", pid, **{"nccl.operation": "GroupStart"}) == 1
    drops = {p["attributes"]["reason"]: p["value"] for p in metrics["otel_ebpf.kernel.drops"]}
    assert drops["gpu_ringbuf_full"] == 0 and drops["gpu_returns_without_entry"] == 0
    assert drops["gpu_nested_calls"] > 0  # cudaMalloc -> cuMemAlloc_v2 inside the stand-in runtime

    # the leak: reported, more than once as it grows, always naming the function that made it
    assert logs, "no leak report"
    assert {r["attributes"]["code.function.name"] for r in logs} == {"leaky_batch_cache"}
    assert all(r["event_name"] == "cuda.memory.leak" and r["resource"]["process.pid"] == pid for r in logs)
    counts = [r["attributes"]["cuda.memory.leak.allocations"] for r in logs]
    assert counts == sorted(counts) and len(set(counts)) == len(counts) and 2 <= counts[-1] <= summary["leaks"]
    assert all(
        r["attributes"]["cuda.memory.leak.size"] == c * summary["leak_size"] for r, c in zip(logs, counts, strict=True)
    )
    assert "leaky_batch_cache" in logs[-1]["body"] and "cudaMalloc" in logs[-1]["attributes"]["code.stacktrace"]

    # profiles: explicit sample and period types; the leak's bytes sit on its stack
    by_type = {}
    for profile in profiles:
        if profile.resource.get("process.pid") == pid:
            by_type.setdefault(profile.period_type.type, []).append(profile)
    assert {
        "cuda_memory_allocated",
        "cuda_memory_in_use",
        "cuda_memcpy",
        "cuda_wait",
        "cuda_launch",
        "nccl",
    } <= by_type.keys()
    # OTLP carries one profile per sample type, all with the view's period type
    assert {p.sample_types[0].type for p in by_type["cuda_memory_in_use"]} == {"inuse_space", "inuse_objects"}
    in_use = [p for p in by_type["cuda_memory_in_use"] if p.sample_types[0].type == "inuse_space"][-1]
    assert in_use.sample_types[0].unit == "bytes" and in_use.period_type.unit == "bytes"
    leaked = sum(values[0] for key, values in in_use.samples.items() if "leaky_batch_cache" in _functions(key.stack))
    assert leaked == summary["leaks"] * summary["leak_size"]
    # pinned host memory is labelled apart from device memory
    pinned = sum(
        values[0] for key, values in in_use.samples.items() if dict(key.attributes)["cuda.memory.kind"] == "pinned_host"
    )
    assert pinned == ledger["in_use runtime 0 pinned_host"] + ledger["in_use driver 0 pinned_host"]
    # the expandable segment's chunks still held, by the function that created them
    for function, device in (("grow_segment", 0), ("map_then_release", 1)):
        held = sum(values[0] for key, values in in_use.samples.items() if function in _functions(key.stack))
        assert held == ledger[f"in_use vmm {device}"], function
    launches: dict[tuple[str, str | None], int] = {}
    for profile in by_type["cuda_launch"]:
        for key, values in profile.samples.items():
            where = (key.stack[0].function, dict(key.attributes).get("cuda.kernel.name"))
            launches[where] = launches.get(where, 0) + values[0]
            assert "train_step" in _functions(key.stack)
    assert launches == {
        **{("cudaLaunchKernel", name): launched for name, launched in kernels.items()},
        ("cuLaunchKernel", None): STEPS,
        ("cuLaunchKernelEx", None): STEPS,
    }


def test_libraries_loaded_after_exec_are_hooked_without_restart(tmp_path: Path) -> None:
    """The agent starts first, on a shell that later execs the training loop (same pid): the exec
    event and the rescan of the process's maps find the libraries it loads; nothing restarts."""
    steps = 5
    shell = subprocess.Popen(
        ["sh", "-c", f"read go && exec {' '.join(WORKLOAD)} --steps {steps} --step-ms 1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def exec_and_wait() -> None:
        shell.stdin.write("exec\n")
        shell.stdin.flush()
        assert shell.stdout.readline() == "ready\n"  # the new image has loaded its libraries
        # the agent's periodic rescan (every second) hooks them: waited for, not slept on, as the
        # agent runs at niceness 10 and a loaded host can delay its rescan by seconds
        deadline = time.monotonic() + 60
        while "libnccl.so.2" not in (tmp_path / "agent.stderr").read_text():
            assert time.monotonic() < deadline, "the agent never hooked the libraries loaded after the exec"
            time.sleep(0.1)

    run = _traced_run(tmp_path, shell, exec_and_wait)
    summary, stderr, metrics = run.summary, run.stderr, run.metrics
    assert summary["pid"] == shell.pid
    assert "GPU: hooked" in stderr and "libcudart.so.12" in stderr and "libnccl.so.2" in stderr
    ledger = summary["ledger"]
    named = {"cuda.api": "runtime", "cuda.kernel.name": "plain_c_kernel"}
    assert _final(metrics, "cuda.kernel.launches", shell.pid, **named) == ledger["launch kernel plain_c_kernel"]
    assert (
        _final(
            metrics,
            "cuda.memory.in_use",
            shell.pid,
            **{"cuda.api": "runtime", "cuda.device": 0, "cuda.memory.kind": "device"},
        )
        == ledger["in_use runtime 0"]
    )


REAL_CALLS = """
import ctypes, json, sys
sys.stdin.readline()
rt = ctypes.CDLL(sys.argv[1]); nccl = ctypes.CDLL(sys.argv[2])
p = ctypes.c_void_p(); buf = ctypes.create_string_buffer(64)
class Uid(ctypes.Structure): _fields_ = [("internal", ctypes.c_char * 128)]
nccl.ncclCommInitRank.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, Uid, ctypes.c_int)
nccl.ncclAllReduce.argtypes = (ctypes.c_void_p,) * 3 + (ctypes.c_int,) * 2 + (ctypes.c_void_p,) * 2
print("ready", flush=True); sys.stdin.readline()
out = {"cudaMalloc": rt.cudaMalloc(ctypes.byref(p), 1 << 20), "cudaMemcpy": rt.cudaMemcpy(buf, buf, 64, 1),
       "cudaDeviceSynchronize": rt.cudaDeviceSynchronize(),
       "ncclCommInitRank": nccl.ncclCommInitRank(ctypes.byref(p), 1, Uid(), 0),
       "ncclAllReduce": nccl.ncclAllReduce(None, None, 10, 7, 0, None, None)}
print(json.dumps(out), flush=True); sys.stdin.readline()
"""


def test_real_cuda_runtime_and_nccl_wheels_attach_and_report_errors(tmp_path: Path) -> None:
    """The real libcudart.so.12 (nvidia-cuda-runtime-cu12) and libnccl.so.2 (nvidia-nccl-cu12):
    their symbols resolve, the probes attach, and calls made without a GPU carry their error codes."""
    import nvidia.cuda_runtime  # the test extras install both wheels (pip install -e '.[test]')

    root = Path(nvidia.cuda_runtime.__path__[0]).parent
    cudart, nccl = root / "cuda_runtime" / "lib" / "libcudart.so.12", root / "nccl" / "lib" / "libnccl.so.2"
    assert cudart.exists() and nccl.exists()
    program = subprocess.Popen(
        [sys.executable, "-c", REAL_CALLS, str(cudart), str(nccl)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    program.stdin.write("load\n")
    program.stdin.flush()
    assert program.stdout.readline() == "ready\n"
    run = _traced_run(tmp_path, program, profiles=False)  # failed calls make no profile samples
    codes, stderr, metrics = run.summary, run.stderr, run.metrics
    assert f"GPU: hooked {cudart}" in stderr and f"GPU: hooked {nccl}" in stderr
    assert codes["cudaMalloc"] != 0  # no driver here: cudaErrorInsufficientDriver (35) or no device (100)
    from otel_ebpf.gpu.calls import CUDA_ERRORS, NCCL_ERRORS

    for function in ("cudaMalloc", "cudaMemcpy", "cudaDeviceSynchronize"):
        attrs = {
            "cuda.api": "runtime",
            "cuda.function": function,
            "error.type": CUDA_ERRORS.get(codes[function], str(codes[function])),
        }
        assert _final(metrics, "cuda.api.calls", program.pid, **attrs) == 1, attrs
    assert (
        _final(
            metrics,
            "nccl.operations",
            program.pid,
            **{"nccl.operation": "CommInitRank", "error.type": NCCL_ERRORS.get(codes["ncclCommInitRank"])},
        )
        == 1
    )
    assert (
        _final(
            metrics,
            "nccl.operations",
            program.pid,
            **{"nccl.operation": "AllReduce", "error.type": NCCL_ERRORS.get(codes["ncclAllReduce"])},
        )
        == 1
    )
    assert not metrics.get("cuda.memory.in_use")  # no allocation succeeded


def test_nccl_calls_inside_a_request_become_its_child_spans(tmp_path: Path) -> None:
    """A request handler that all-reduces: each request's SERVER span gets an ``nccl AllReduce``
    child, with the collective's size. The handler then works for 1.5 s, as generation
    does: the trace assembler only knows the requests in flight (it keeps no history), and an
    otherwise idle agent catches up with a call's time about a second after it."""
    import urllib.request

    server = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "gpu_inference_standin.py"), str(tmp_path / "port"), "1.5"]
    )
    requests = 3
    try:
        port = int(_wait_for_file(tmp_path / "port", server))
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, server.pid)
            for _ in range(requests):
                with urllib.request.urlopen(
                    urllib.request.Request(
                        f"http://127.0.0.1:{port}/generate", data=b'{"prompt": "hi"}', method="POST"
                    ),
                    timeout=10,
                ) as r:
                    assert r.status == 200
            _stop(agent, tmp_path / "agent.stderr")
            receiver.wait_for(lambda r: len(r.spans()) >= 2 * requests, timeout=15)
            spans = receiver.spans()
    finally:
        server.kill()
        server.wait()
    servers = {s["span_id"]: s for s in spans if s["kind"] == "SERVER"}
    nccl = [s for s in spans if s["name"] == "nccl AllReduce"]
    assert len(servers) == requests and len(nccl) == requests
    assert {s["parent_span_id"] for s in nccl} == set(servers)
    for span in nccl:
        parent = servers[span["parent_span_id"]]
        assert span["trace_id"] == parent["trace_id"] and span["kind"] == "INTERNAL"
        assert parent["start_ns"] <= span["start_ns"] <= span["end_ns"] <= parent["end_ns"]
        # the communicator was set up before the agent attached: its rank is not known
        assert span["attributes"] == {
            "nccl.operation": "AllReduce",
            "nccl.datatype": "float16",
            "nccl.operation.size": 2048,
            "thread.id": span["attributes"]["thread.id"],
        }
