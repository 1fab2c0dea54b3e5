"""``make demo`` (GPU part): the GPU views on a "training loop" — no GPU needed.

1. builds the stand-in CUDA runtime/driver, NCCL and PyTorch-allocator libraries
   (``tests/gpu/standin/``, real symbol names, memory from the host) and starts
   ``examples/gpu_training_standin.py`` on them with ``OTEL_SERVICE_NAME=demo-training``;
2. attaches the agent to it (``run --pid <it> --gpu true``, file exporter) while it runs — nothing
   is restarted — and lets the loop go: allocations, copies, launches, collectives and one leak;
3. stops the agent and prints what it exported: memory in use per layer and device, copies by
   direction, launches, NCCL bytes, the leak report with the Python function that made it, and the
   GPU flame graphs written under ``profiles/``.

Needs root (the agent loads eBPF programs). Output stays in ``otel-ebpf-data/demo-gpu/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
REPO = EXAMPLES.parent
sys.path.insert(0, str(REPO))
READY_TIMEOUT_S = 90.0


def _wait_ready(path: Path, agent: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"gpu demo: the agent did not start; its log:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def _last_values(metrics: dict, name: str, pid: int) -> dict[tuple, float]:
    last: dict[tuple, tuple[int, float]] = {}
    for point in metrics.get(name, []):
        if point["resource"].get("process.pid") != pid:
            continue
        key = tuple(sorted(point["attributes"].items()))
        value = point.get("sum", point.get("value"))
        if key not in last or point["time_ns"] >= last[key][0]:
            last[key] = (point["time_ns"], value)
    return {key: value for key, (_, value) in last.items()}


def summary(output: Path, pid: int) -> str:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from otel_ebpf.exporters.file import from_json_line
    from tests.otlp_receiver import load_file_metrics

    metrics = load_file_metrics(output / "metrics.jsonl")
    lines = ["GPU views of demo-training (from metrics.jsonl, logs.jsonl, profiles/):"]
    lines.append("  memory in use (cuda.memory.in_use):")
    for key, value in sorted(_last_values(metrics, "cuda.memory.in_use", pid).items()):
        attrs = dict(key)
        where = f"{attrs['cuda.api']:<8} device {attrs['cuda.device']} {attrs['cuda.memory.kind']:<11}"
        lines.append(f"    {where}: {value / 2**20:8.2f} MiB")
    lines.append("  copies (cuda.memcpy.size):")
    for key, value in sorted(_last_values(metrics, "cuda.memcpy.size", pid).items()):
        attrs = dict(key)
        mode = "sync" if attrs["cuda.memcpy.synchronous"] else "async"
        lines.append(f"    {attrs['cuda.api']:<8} {attrs['cuda.memcpy.direction']:<17} {mode:<5} {value:>12,.0f} B")
    launches: dict[str, float] = defaultdict(float)
    for key, value in _last_values(metrics, "cuda.kernel.launches", pid).items():
        attrs = dict(key)
        launches[attrs.get("cuda.kernel.name") or f"({attrs['cuda.api']}, unnamed)"] += value
    lines.append("  kernel launches: " + ", ".join(f"{name} {n:.0f}" for name, n in sorted(launches.items())))
    nccl: dict[str, float] = defaultdict(float)
    for key, value in _last_values(metrics, "nccl.operation.size", pid).items():
        nccl[dict(key)["nccl.operation"]] += value
    lines.append("  NCCL bytes: " + ", ".join(f"{op} {value:,.0f}" for op, value in sorted(nccl.items())))
    reports = []
    logs = output / "logs.jsonl"
    for line in logs.read_text().splitlines() if logs.exists() else []:
        request = from_json_line(line, ExportLogsServiceRequest())
        reports += [r.body.string_value for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    lines.append(f"  leak reports: {len(reports)}" + (f"; the last one:\n    {reports[-1]}" if reports else ""))
    graphs = sorted(p.name for p in (output / "profiles").glob("*.svg")) if (output / "profiles").exists() else []
    lines.append(f"  flame graphs: {', '.join(graphs) or 'none'} (in {output / 'profiles'})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", default=str(REPO / ".venv/bin/otel-ebpf"), help="otel-ebpf executable")
    parser.add_argument("--output", type=Path, default=REPO / "otel-ebpf-data/demo-gpu", help="file exporter directory")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("gpu demo: the agent loads eBPF programs and needs root: sudo make demo", file=sys.stderr)
        return 1
    shutil.rmtree(args.output, ignore_errors=True)
    args.output.mkdir(parents=True)
    workload = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "gpu_training_standin.py"), "--steps", str(args.steps)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OTEL_SERVICE_NAME": "demo-training"},
    )
    agent = None
    log = args.output / "agent.log"
    try:
        if workload.stdout.readline() != "ready\n":
            raise SystemExit("gpu demo: the training loop did not start")
        cmd = [
            args.agent,
            "run",
            "--pid",
            str(workload.pid),
            "--gpu",
            "true",
            "--exporter",
            "file",
            "--output",
            str(args.output),
            "--ready-file",
            str(args.output / "ready"),
        ]
        print("$ " + " ".join(cmd))
        with open(log, "w") as log_file:
            agent = subprocess.Popen(
                cmd, stderr=log_file, env={**os.environ, "OTEL_EBPF_GPU_LEAK_AGE": "0.5", "OTEL_EBPF_GPU_INTERVAL": "2"}
            )
        _wait_ready(args.output / "ready", agent, log)
        print(f"agent attached to the running training loop (pid {workload.pid}); go")
        workload.stdin.write("go\n")
        workload.stdin.flush()
        done = json.loads(workload.stdout.readline())
        time.sleep(0.5)
        agent.send_signal(signal.SIGINT)
        if agent.wait(timeout=60) != 0:
            raise SystemExit(f"gpu demo: the agent failed; its log:\n{log.read_text()[-3000:]}")
        workload.communicate("exit\n", timeout=30)
    finally:
        for proc in (agent, workload):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    print()
    print(summary(args.output, done["pid"]))
    print(f"\nAll output is in {args.output}/ (metrics.jsonl, logs.jsonl, profiles.jsonl, profiles/, agent.log).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
