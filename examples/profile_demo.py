"""``make demo`` (CPU part): profile an unmodified CPU-heavy Python program and draw its flame graph.

1. starts ``examples/cpu_heavy.py run`` (two thirds of its CPU in a pure-Python loop, one third in
   ``zlib.compress``) with ``OTEL_SERVICE_NAME=demo-cpu-heavy``;
2. starts ``otel-ebpf run --pid <it> --profile`` with the file exporter and waits for its ready file;
3. lets it sample for a few seconds, stops it with SIGINT (it flushes and exits);
4. prints where the CPU went (Python and native frames merged) and where the flame graph is.

Needs root. Output stays in ``otel-ebpf-data/profile-demo/``: ``profiles.jsonl`` (OTLP profiles),
``profiles/demo-cpu-heavy.folded`` and ``profiles/demo-cpu-heavy.svg``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
REPO = EXAMPLES.parent
sys.path.insert(0, str(REPO))

from otel_ebpf.profiles import flamegraph  # noqa: E402

SERVICE_NAME = "demo-cpu-heavy"
READY_TIMEOUT_S = 90.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to sample")
    parser.add_argument("--output", type=Path, default=REPO / "otel-ebpf-data" / "profile-demo")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("profile demo: needs root (the agent loads eBPF programs)", file=sys.stderr)
        return 1
    shutil.rmtree(args.output, ignore_errors=True)
    args.output.mkdir(parents=True)
    ready = args.output / "agent.ready"
    workload = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "cpu_heavy.py"), "run"], env={**os.environ, "OTEL_SERVICE_NAME": SERVICE_NAME}
    )
    agent = None
    try:
        with open(args.output / "agent.log", "w") as log:
            agent = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "otel_ebpf.cli",
                    "run",
                    "--pid",
                    str(workload.pid),
                    "--profile",
                    "--exporter",
                    "file",
                    "--output",
                    str(args.output),
                    "--ready-file",
                    str(ready),
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not ready.exists():
                if agent.poll() is not None or time.monotonic() > deadline:
                    print(f"profile demo: the agent did not start; see {args.output / 'agent.log'}", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            print(f"[profile demo] sampling pid {workload.pid} at 49 Hz for {args.seconds:g} s ...")
            time.sleep(args.seconds)
            agent.send_signal(signal.SIGINT)
            agent.wait(timeout=60)
    finally:
        workload.kill()
        workload.wait()
        if agent is not None and agent.poll() is None:
            agent.kill()
    folded_path = args.output / "profiles" / f"{SERVICE_NAME}.folded"
    stacks = flamegraph.parse_folded(folded_path.read_text())
    total = sum(stacks.values())
    shares = flamegraph.shares(stacks, ["hot_python", "hot_native"])
    print(
        f"[profile demo] {total} samples; hot_python {shares['hot_python']:.0%} (expected ~67%), "
        f"hot_native {shares['hot_native']:.0%} (expected ~33%, mostly inside libz)"
    )
    print("[profile demo] hottest stacks (root -> leaf):")
    for line, count in sorted(stacks.items(), key=lambda kv: -kv[1])[:5]:
        frames = line.split(";")
        print(f"  {count / total:6.1%}  {' -> '.join(frames[-4:])}")
    print(f"[profile demo] flame graph: {args.output / 'profiles' / (SERVICE_NAME + '.svg')}")
    print(
        f"[profile demo] OTLP profiles: {args.output / 'profiles.jsonl'} "
        f"(render any profile file: otel-ebpf flamegraph FILE)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
