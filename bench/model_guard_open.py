"""What the model-file guard costs each file open, measured side by side in one run.

A child process opens and closes one file in a loop and reports nanoseconds per open+close, for
two files: ``notes.txt`` (not a model file: the hook's common path, an extension lookup) and
``weights.gguf`` (a model file: allow-list lookups, a report per open). Arms: no agent; the agent
without the guard (``--pid`` of an idle ``sleep``); the agent with the guard auditing, through BPF
LSM where it loads and through the open syscalls' tracepoints where it does not; and, where BPF LSM
loads, the guard enforcing, the looping process allow-listed by uid so that its opens succeed.
Each round runs every arm once, in rotated order; reported: median ns per open+close per arm and
file, and the ratio to the run without an agent.

Usage: ``python bench/model_guard_open.py [--duration S] [--rounds R] [--quick]`` (as root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from harness import Agent, kill, parse_live_args  # noqa: E402
from otel_ebpf.probes.lsm import lsm_load_error  # noqa: E402
from results import write_result  # noqa: E402

LOOP = r"""
import os, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
count, start = 0, time.perf_counter_ns()
deadline = start + int(seconds * 1e9)
while time.perf_counter_ns() < deadline:
    for _ in range(1000):
        os.close(os.open(path, os.O_RDONLY))
    count += 1000
print((time.perf_counter_ns() - start) / count)
"""
GUARD_MODES = {"agent + guard (audit)": "audit", "agent + guard (enforce)": "enforce"}


def _loop_ns(path: Path, seconds: float) -> float:
    out = subprocess.run(
        [sys.executable, "-c", LOOP, str(path), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds * 10 + 60,
    )
    return float(out.stdout)


def _agent(arm: str, index: int, tmp: Path, sleeper: int) -> Agent | nullcontext:
    if arm == "no agent":
        return nullcontext()
    env = dict(os.environ)
    if arm in GUARD_MODES:
        env.update(
            {
                "OTEL_EBPF_MODEL_GUARD": GUARD_MODES[arm],
                "OTEL_EBPF_MODEL_GUARD_PATHS": f"{tmp}/**/*.gguf",
                "OTEL_EBPF_MODEL_GUARD_ALLOW_UIDS": str(os.getuid()),
            }
        )
    return Agent(["--pid", str(sleeper)], tmp / f"out-{index}", env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = parse_live_args(parser, duration=3.0, rounds=5, quick=(1.0, 1), tools=())
    refused = lsm_load_error("file_open")
    mechanism = "syscall tracepoints" if refused else "BPF LSM"
    print(f"guard mechanism: {mechanism}" + (f" (BPF LSM unavailable: {refused}; no enforce arm)" if refused else ""))
    arms = ("no agent", "agent, no guard", "agent + guard (audit)", *(() if refused else ("agent + guard (enforce)",)))
    files = ("notes.txt", "weights.gguf")
    samples: dict[tuple[str, str], list[float]] = {(arm, name): [] for arm in arms for name in files}
    with tempfile.TemporaryDirectory(prefix="model-guard-bench-") as name:
        tmp = Path(name)
        models = tmp / "models"
        models.mkdir()
        for file in files:
            (models / file).write_text("x")
        sleeper = subprocess.Popen(["sleep", "infinity"])
        try:
            for round_ in range(args.rounds):
                for arm in arms[round_ % len(arms) :] + arms[: round_ % len(arms)]:
                    agent = _agent(arm, arms.index(arm), tmp, sleeper.pid)
                    with agent:
                        for file in files:
                            samples[arm, file].append(_loop_ns(models / file, args.duration))
                        if isinstance(agent, Agent):
                            agent.stop()
        finally:
            kill(sleeper)
    rows = []
    for file in files:
        base = statistics.median(samples["no agent", file])
        for arm in arms:
            ns = statistics.median(samples[arm, file])
            rows.append({"file": file, "arm": arm, "ns_per_open_close": round(ns, 1), "ratio": round(ns / base, 3)})
            print(f"{file:<14} {arm:<26} {ns:9.1f} ns/open+close  x{ns / base:.3f}")
    write_result(
        "model_guard_open",
        None,
        {"duration_s": args.duration, "rounds": args.rounds, "mechanism": mechanism, "rows": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
