"""End-to-end check of the GPU views on a machine with an NVIDIA GPU: real PyTorch on CUDA, agent attached.

A PyTorch program (started first, then traced by pid — no restart) allocates tensors, leaks large
ones from a function named ``leaky_cache``, copies host<->device and launches kernels. The agent
(``otel-ebpf run --pid <it> --gpu true``, file exporter) then has to show:

1. the CUDA runtime (and driver) libraries hooked, and PyTorch's ``pytorch:malloc``/``free`` USDT
   probes when this PyTorch build has them (reported either way: not every wheel is built with them);
2. kernel launches: at least one per elementwise op the program ran;
3. copies: host_to_device / device_to_host bytes at least what the program copied;
4. device memory: ``cudaMalloc`` segments in use at least the leaked bytes (PyTorch's caching
   allocator gets a segment per large tensor), and, with the USDT probes, tensor-level in-use;
5. a leak report naming ``leaky_cache``; the pinned staging buffer (``pin_memory``: ``cudaHostAlloc``)
   as ``pinned_host`` memory, apart from device memory;
6. profiles with launches and allocations by stack, the Python frames included.

Then the same program again under ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, where the
caching allocator grows segments through the driver's virtual memory API (``cuMemCreate`` +
``cuMemMap``) instead of ``cudaMalloc``; the agent has to show:

7. physical memory in use at layer ``vmm`` at least the leaked bytes, and as much mapped;
8. the leak reported, naming ``leaky_cache`` (the chunks were created under it).

Then a CUDA graph (``torch.cuda.CUDAGraph``) captured after the agent attached, of ``GRAPH_OPS``
elementwise kernels, replayed ``GRAPH_REPLAYS`` times; the agent has to show:

9. the captured kernels as launches labelled ``cuda.launch.kind = captured`` (at least one per op);
10. the replays as ``cuda.graph.launches``, none of them counted as a kernel launch, with the
    graph's kernel count (``cuda.graph.kernel_nodes``) learnt from the capture.

Prints one line per check (``ok`` / ``FAIL`` / ``n/a`` with the figures) and exits 0 only when every
applicable check passed. Without a GPU, PyTorch or root it says which and exits 2.

Usage: ``sudo .venv/bin/python bench/gpu_check.py [--keep DIR] [--only classic|expandable|graph]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LEAK_MB = 64
LEAKS = 8
OPS = 200
COPY_MB = 16

PROGRAM = r"""
import json, os, sys, time
import torch

LEAK_MB, LEAKS, OPS, COPY_MB = (int(a) for a in sys.argv[1:5])
dev = torch.device("cuda")
torch.ones(1, device=dev)  # CUDA context and libraries up before the agent attaches
_cache = []

def leaky_cache():
    # never trimmed: one new caching-allocator segment (cudaMalloc) per call, kept forever
    _cache.append(torch.empty(LEAK_MB << 20, dtype=torch.uint8, device=dev))

def step(x):
    for _ in range(OPS // 2):
        x = x * 1.0001
        x = x + 1
    return x

print("ready", flush=True)
sys.stdin.readline()
host = torch.ones(COPY_MB << 18, dtype=torch.float32).pin_memory()  # COPY_MB MiB
x = host.to(dev, non_blocking=False)  # host_to_device
for i in range(LEAKS):
    leaky_cache()
    x = step(x)
    time.sleep(0.5)
back = x.cpu()  # device_to_host
torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid(), "copy_bytes": COPY_MB << 20, "ops": OPS * LEAKS,
                  "leaked": LEAKS * (LEAK_MB << 20), "torch": torch.__version__,
                  "cuda": torch.version.cuda}), flush=True)
sys.stdin.readline()
"""


GRAPH_OPS = 50
GRAPH_REPLAYS = 20

GRAPH_PROGRAM = r"""
import json, os, sys
import torch

OPS, REPLAYS = (int(a) for a in sys.argv[1:3])
dev = torch.device("cuda")
x = torch.ones(1 << 20, device=dev)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm-up before capture, on a side stream (torch.cuda.graphs' advice)
    for _ in range(3):
        y = x * 1.0001
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):  # captured now, with the agent attached
    y = x
    for _ in range(OPS):
        y = y * 1.0001
for _ in range(REPLAYS):
    graph.replay()
torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid(), "ops": OPS, "replays": REPLAYS, "torch": torch.__version__,
                  "cuda": torch.version.cuda}), flush=True)
sys.stdin.readline()
"""


def _preflight() -> tuple[str, str] | None:
    """Why this machine cannot run the check, or None."""
    if os.geteuid() != 0:
        return "root", "the agent needs root (sudo)"
    try:
        import torch
    except ImportError:
        return "torch", "PyTorch is not installed here (pip install torch)"
    if not torch.cuda.is_available():
        return "gpu", "no CUDA GPU: torch.cuda.is_available() is False — this check needs an NVIDIA GPU"
    return None


def _wait(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"FAIL: the agent exited ({proc.returncode}) before it was ready")
        if time.monotonic() > deadline:
            raise SystemExit("FAIL: the agent was not ready in time")
        time.sleep(0.1)


CONFIGURATIONS = {  # name -> (program and its arguments, PYTORCH_CUDA_ALLOC_CONF)
    "classic": ((PROGRAM, LEAK_MB, LEAKS, OPS, COPY_MB), ""),
    "expandable": ((PROGRAM, LEAK_MB, LEAKS, OPS, COPY_MB), "expandable_segments:True"),
    "graph": ((GRAPH_PROGRAM, GRAPH_OPS, GRAPH_REPLAYS), ""),
}
Result = tuple[str, bool | None, str]  # check, passed (None: not applicable), figures


@dataclass
class Run:
    """What the agent wrote while tracing the program once."""

    out: Path
    summary: dict[str, Any]
    log: str
    metrics: dict[str, list[dict[str, Any]]]
    logs: list[dict[str, Any]]
    profiles: list

    def final(self, name: str, **attrs: object) -> float:
        points = [
            p
            for p in self.metrics.get(name, [])
            if p["resource"].get("process.pid") == self.summary["pid"]
            and all(p["attributes"].get(k) == v for k, v in attrs.items())
        ]
        last: dict = {}
        for p in sorted(points, key=lambda p: p["time_ns"]):
            last[tuple(sorted(p["attributes"].items()))] = p.get("sum", p.get("value", 0))
        return sum(last.values())

    def leak_origins(self) -> list[str]:
        return [a["code.function.name"].string_value for a in self.logs if "code.function.name" in a]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", metavar="DIR", help="write the agent's output here and keep it")
    parser.add_argument("--only", choices=sorted(CONFIGURATIONS), help="run one allocator configuration only")
    args = parser.parse_args()
    problem = _preflight()
    if problem is not None:
        print(f"gpu_check: cannot run: {problem[1]}", file=sys.stderr)
        return 2
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    failed = 0
    checks = {"classic": _classic_checks, "expandable": _expandable_checks, "graph": _graph_checks}
    for name, (program, alloc_conf) in CONFIGURATIONS.items():
        if args.only and name != args.only:
            continue
        run = _run(keep / name, program, alloc_conf)
        results = checks[name](run)
        print(
            f"gpu_check [{name}: PYTORCH_CUDA_ALLOC_CONF={alloc_conf!r}]: torch {run.summary['torch']}, "
            f"CUDA {run.summary['cuda']}, agent output in {run.out}"
        )
        for check, ok, detail in results:
            mark = "n/a " if ok is None else ("ok  " if ok else "FAIL")
            failed += ok is False
            print(f"  {mark} {check}: {detail}")
    if not args.keep and not failed:
        shutil.rmtree(keep, ignore_errors=True)
    return 1 if failed else 0


def _run(out: Path, program_and_args: tuple, alloc_conf: str) -> Run:
    """A PyTorch program (its source, then its arguments) under ``alloc_conf``, traced by the
    agent (file exporter into ``out``)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest,
    )

    from otel_ebpf.exporters.file import from_json_line
    from otel_ebpf.profiles import otlp as profiles_otlp
    from tests.otlp_receiver import load_file_metrics

    out.mkdir(parents=True, exist_ok=True)
    program = subprocess.Popen(
        [sys.executable, "-c", *map(str, program_and_args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": alloc_conf},
    )
    agent = None
    try:
        if program.stdout.readline() != "ready\n":
            raise SystemExit("FAIL: the PyTorch program did not start (see above)")
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "otel_ebpf.cli",
                "run",
                "--pid",
                str(program.pid),
                "--gpu",
                "true",
                "--exporter",
                "file",
                "--output",
                str(out),
                "--ready-file",
                str(out / "ready"),
            ],
            cwd=REPO,
            stderr=open(out / "agent.log", "w"),
            env={**os.environ, "OTEL_EBPF_GPU_LEAK_AGE": "1.5", "OTEL_EBPF_GPU_INTERVAL": "2"},
        )
        _wait(out / "ready", agent, 120)
        program.stdin.write("go\n")
        program.stdin.flush()
        summary = json.loads(program.stdout.readline())
        time.sleep(1.0)
        agent.send_signal(signal.SIGINT)
        agent.wait(timeout=120)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        program.kill()
        program.wait()

    logs = []
    if (out / "logs.jsonl").exists():
        for line in (out / "logs.jsonl").read_text().splitlines():
            request = from_json_line(line, ExportLogsServiceRequest())
            for rl in request.resource_logs:
                for sl in rl.scope_logs:
                    for record in sl.log_records:
                        logs.append({kv.key: kv.value for kv in record.attributes})
    profiles = []
    if (out / "profiles.jsonl").exists():
        for line in (out / "profiles.jsonl").read_text().splitlines():
            profiles += profiles_otlp.decode(from_json_line(line, ExportProfilesServiceRequest()))
    log = (out / "agent.log").read_text()
    return Run(out, summary, log, load_file_metrics(out / "metrics.jsonl"), logs, profiles)


def _classic_checks(run: Run) -> list[Result]:
    summary, log, metrics, final = run.summary, run.log, run.metrics, run.final
    pid = summary["pid"]
    results: list[Result] = []
    hooked = [line.split("GPU: hooked ", 1)[1] for line in log.splitlines() if "GPU: hooked " in line]
    results.append(("libraries hooked", any("libcudart" in h for h in hooked), "; ".join(hooked) or "none"))
    usdt = any("pytorch:malloc" in h for h in hooked)
    launches = final("cuda.kernel.launches")
    results.append(
        ("kernel launches", launches >= summary["ops"], f"{launches:.0f} seen, >= {summary['ops']} expected")
    )
    kernels = {
        p["attributes"]["cuda.kernel.name"]
        for p in metrics.get("cuda.kernel.launches", [])
        if p["resource"].get("process.pid") == pid and "cuda.kernel.name" in p["attributes"]
    }
    results.append(("kernel names", bool(kernels), f"{len(kernels)} named, e.g. {min(kernels, default='none')}"))
    h2d = final("cuda.memcpy.size", **{"cuda.memcpy.direction": "host_to_device"})
    d2h = final("cuda.memcpy.size", **{"cuda.memcpy.direction": "device_to_host"})
    results.append(("copies host_to_device", h2d >= summary["copy_bytes"], f"{h2d:.0f} B >= {summary['copy_bytes']}"))
    results.append(("copies device_to_host", d2h >= summary["copy_bytes"], f"{d2h:.0f} B >= {summary['copy_bytes']}"))
    segments = final("cuda.memory.in_use", **{"cuda.api": "runtime", "cuda.memory.kind": "device"})
    pinned = final("cuda.memory.in_use", **{"cuda.memory.kind": "pinned_host"})
    results.append(
        ("pinned host memory apart", pinned >= summary["copy_bytes"], f"{pinned:.0f} B >= {summary['copy_bytes']}")
    )
    results.append(("cudaMalloc in use", segments >= summary["leaked"], f"{segments:.0f} B >= {summary['leaked']}"))
    tensors = final("cuda.memory.in_use", **{"cuda.api": "pytorch"})
    results.append(
        (
            "tensors in use (USDT)",
            (tensors >= summary["leaked"]) if usdt else None,
            f"{tensors:.0f} B" if usdt else "this PyTorch build has no pytorch:malloc USDT probes",
        )
    )
    named = run.leak_origins()
    results.append(("leak reported", "leaky_cache" in named, f"reports name {sorted(set(named)) or 'nothing'}"))
    launch_stacks = [key.stack for p in run.profiles if p.sample_types[0].type == "launches" for key in p.samples]
    python_frames = any(f.kind.value == "python" for stack in launch_stacks for f in stack)
    results.append(("launch profile with Python frames", python_frames, f"{len(launch_stacks)} stacks"))
    return results


def _expandable_checks(run: Run) -> list[Result]:
    """Expandable segments: the caching allocator's memory comes through cuMemCreate + cuMemMap."""
    leaked = run.summary["leaked"]
    hooked = [line for line in run.log.splitlines() if "GPU: hooked " in line and "libcuda.so" in line]
    vmm = run.final("cuda.memory.in_use", **{"cuda.api": "vmm", "cuda.memory.kind": "device"})
    mapped = run.final("cuda.memory.mapped")
    reserved = run.final("cuda.memory.address_reserved")
    named = run.leak_origins()
    return [
        ("driver hooked", bool(hooked), "; ".join(hooked) or "libcuda.so.1 not hooked"),
        ("vmm physical memory in use", vmm >= leaked, f"{vmm:.0f} B >= {leaked}"),
        ("vmm mapped", mapped >= leaked, f"{mapped:.0f} B >= {leaked}; {reserved:.0f} B of addresses reserved"),
        ("leak reported", "leaky_cache" in named, f"reports name {sorted(set(named)) or 'nothing'}"),
    ]


def _graph_checks(run: Run) -> list[Result]:
    """A graph captured with the agent attached: its kernels captured, its replays graph launches."""
    ops, replays = run.summary["ops"], run.summary["replays"]
    captured = run.final("cuda.kernel.launches", **{"cuda.launch.kind": "captured"})
    graph_launches = run.final("cuda.graph.launches")
    nodes = {
        p["attributes"].get("cuda.graph.kernel_nodes")
        for p in run.metrics.get("cuda.graph.launches", [])
        if p["resource"].get("process.pid") == run.summary["pid"]
    }
    return [
        ("captured kernels", captured >= ops, f"{captured:.0f} launches labelled captured, >= {ops} expected"),
        ("graph launches", graph_launches >= replays, f"{graph_launches:.0f} seen, >= {replays} replays"),
        ("graph kernel count", any(n is not None and n >= ops for n in nodes), f"cuda.graph.kernel_nodes {nodes}"),
    ]


if __name__ == "__main__":
    sys.exit(main())
