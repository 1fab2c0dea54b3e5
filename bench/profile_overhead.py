"""CPU profiler overhead: a CPU-bound Python workload's throughput without the profiler and with it at
49 Hz and 99 Hz, side by side in one run, plus the agent's own CPU.

One long-lived workload process (the venv's Python, pinned to one CPU) runs a pure-Python loop
(batches of 20,000 steps of ``total += i * i % 7``) for ``--duration`` seconds whenever told, and
reports batches per second. Each round measures the three configurations in a rotated order (drift
hits all alike): untraced, then ``otel-ebpf run --pid <workload> --profile --profile-frequency HZ``
(file exporter; measured only once the agent is attached, i.e. after its ready file). Reported:
iterations/s (median of rounds), loss against untraced (median of per-round ratios), profile
samples taken, the sampling BPF program's own run time (kernel BPF statistics, enabled for the
run), agent CPU (utime+stime of the agent process over the measured window, % of one CPU: user
space only — the BPF program's time is charged to the sampled process, so it is in the loss) and
agent RSS. Throughput is given per wall second and per second of the workload's own CPU time: on a
machine others load, only the latter compares like with like.

Target: <= 1 % throughput loss at 49 Hz.

Usage: ``python bench/profile_overhead.py [--rounds R] [--duration S] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import AGENT, REPO, cpu_seconds, status_mb  # noqa: E402
from results import write_result  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.otlp_receiver import load_file_metrics  # noqa: E402

WORKLOAD = """
import os, sys, time


def work(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


os.sched_setaffinity(0, {int(sys.argv[1])})
print("ready", flush=True)
for line in sys.stdin:
    seconds = float(line)
    start, cpu_start = time.perf_counter(), time.process_time()
    batches = 0
    while time.perf_counter() - start < seconds:
        work(20_000)
        batches += 1
    print(batches / (time.perf_counter() - start), batches / (time.process_time() - cpu_start), flush=True)
"""
READY_TIMEOUT_S = 120
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
PERF_EVENT_PROG = "7"  # BPF_PROG_TYPE_PERF_EVENT


def _sampling_program_stats(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of the perf-event programs process ``pid`` holds (kernel BPF stats)."""
    time_ns = count = 0
    for fdinfo in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            fields = dict(line.split(":\t", 1) for line in fdinfo.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("prog_type") == PERF_EVENT_PROG:
            time_ns += int(fields.get("run_time_ns", 0))
            count += int(fields.get("run_cnt", 0))
    return time_ns, count


class Workload:
    def __init__(self, cpu: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD, str(cpu)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, seconds: float) -> dict:
        """Batches per second of wall time ("rate") and per second of the workload's own CPU time
        ("cpu_rate": immune to other processes taking the CPU, but blind to interrupt time when
        the kernel accounts it apart)."""
        self.proc.stdin.write(f"{seconds}\n")
        self.proc.stdin.flush()
        wall, cpu = self.proc.stdout.readline().split()
        return {"rate": float(wall), "cpu_rate": float(cpu)}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def measure_traced(workload: Workload, hz: int, seconds: float, tmp: Path) -> dict:
    out = tmp / f"agent-{hz}-{time.monotonic_ns()}"
    ready = out / "ready"
    out.mkdir(parents=True)
    agent = subprocess.Popen(
        [
            *AGENT,
            "run",
            "--pid",
            str(workload.proc.pid),
            "--profile",
            "--profile-frequency",
            str(hz),
            "--exporter",
            "file",
            "--output",
            str(out),
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OTEL_METRIC_EXPORT_INTERVAL": "3600000"},
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not start: {agent.stderr.read() if agent.stderr else ''}")
            time.sleep(0.05)
        time.sleep(0.5)  # first samples symbolized (ELF parsing) before the window
        cpu0, t0, bpf0 = cpu_seconds(agent.pid), time.monotonic(), _sampling_program_stats(agent.pid)
        rates = workload.run(seconds)
        cpu1, t1, bpf1 = cpu_seconds(agent.pid), time.monotonic(), _sampling_program_stats(agent.pid)
        rss = status_mb(agent.pid, "VmRSS")
        agent.send_signal(signal.SIGINT)
        agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    metrics = load_file_metrics(out)
    samples = sum(p["value"] for p in metrics.get("otel_ebpf.profiles.samples", []))
    runs = max(1, bpf1[1] - bpf0[1])
    return {
        **rates,
        "agent_cpu": (cpu1 - cpu0) / (t1 - t0),
        "rss": rss,
        "samples": samples,
        "bpf_ns": (bpf1[0] - bpf0[0]) / runs,
        "bpf_cpu": (bpf1[0] - bpf0[0]) / 1e9 / (t1 - t0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="CPU the workload runs on")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 2, 3.0
    if os.geteuid() != 0:
        print("profile_overhead: needs root (the agent loads eBPF programs)", file=sys.stderr)
        return 1
    configs: list[int | None] = [None, 49, 99]
    # Kernel BPF run-time statistics (what the sampling program costs per run), for this run only.
    stats_before = BPF_STATS.read_text().strip() if BPF_STATS.exists() else None
    if stats_before is not None:
        BPF_STATS.write_text("1")
    results: dict[int | None, list[dict]] = {c: [] for c in configs}
    workload = Workload(args.cpu)
    try:
        workload.run(1.0)  # warm-up
        with tempfile.TemporaryDirectory(prefix="profile-overhead-") as tmp:
            for round_number in range(args.rounds):
                order = configs[round_number % 3 :] + configs[: round_number % 3]
                for config in order:
                    if config is None:
                        result = workload.run(args.duration)
                    else:
                        result = measure_traced(workload, config, args.duration, Path(tmp))
                    results[config].append(result)
                    label = "untraced" if config is None else f"{config} Hz"
                    print(f"  round {round_number + 1} {label:>8}: {result['rate']:.2f} batches/s", file=sys.stderr)
    finally:
        workload.close()
        if stats_before is not None:
            BPF_STATS.write_text(stats_before)

    base = results[None]
    print(
        f"\nCPU-bound Python workload (venv {sys.version.split()[0]}, pinned to CPU {args.cpu}), "
        f"{args.rounds} rounds x {args.duration:g} s, side by side"
    )
    print(
        f"{'config':>10} {'batches/s':>10} {'loss':>8} {'per CPU-s':>10} {'loss':>8} {'samples/s':>10} "
        f"{'BPF ns/run':>10} {'BPF CPU':>8} {'agent CPU':>10} {'agent RSS':>10}"
    )
    print(
        f"{'untraced':>10} {statistics.median(r['rate'] for r in base):10.2f} {'':>8} "
        f"{statistics.median(r['cpu_rate'] for r in base):10.2f}"
    )
    rows = [
        {
            "config": "untraced",
            "batches_per_s": round(statistics.median(r["rate"] for r in base), 2),
            "batches_per_cpu_s": round(statistics.median(r["cpu_rate"] for r in base), 2),
        }
    ]
    for hz in (49, 99):
        runs = results[hz]
        loss = 1 - statistics.median(r["rate"] / b["rate"] for r, b in zip(runs, base))
        cpu_loss = 1 - statistics.median(r["cpu_rate"] / b["cpu_rate"] for r, b in zip(runs, base))
        rows.append(
            {
                "config": f"{hz} Hz",
                "batches_per_s": round(statistics.median(r["rate"] for r in runs), 2),
                "loss": round(loss, 4),
                "batches_per_cpu_s": round(statistics.median(r["cpu_rate"] for r in runs), 2),
                "loss_per_cpu_s": round(cpu_loss, 4),
                "samples_per_s": round(statistics.median(r["samples"] for r in runs) / args.duration, 1),
                "bpf_ns_per_run": round(statistics.median(r["bpf_ns"] for r in runs)),
                "bpf_cpu_share": round(statistics.median(r["bpf_cpu"] for r in runs), 5),
                "agent_cpu_share": round(statistics.median(r["agent_cpu"] for r in runs), 4),
                "agent_rss_mb": round(statistics.median(r["rss"] for r in runs)),
            }
        )
        print(
            f"{hz:>7} Hz {statistics.median(r['rate'] for r in runs):10.2f} {loss:8.2%} "
            f"{statistics.median(r['cpu_rate'] for r in runs):10.2f} {cpu_loss:8.2%} "
            f"{statistics.median(r['samples'] for r in runs) / args.duration:10.1f} "
            f"{statistics.median(r['bpf_ns'] for r in runs):10.0f} {statistics.median(r['bpf_cpu'] for r in runs):8.3%} "
            f"{statistics.median(r['agent_cpu'] for r in runs):10.2%} "
            f"{statistics.median(r['rss'] for r in runs):8.0f} MB"
        )
    print(
        "loss: 1 - median of per-round (traced / untraced), per wall second and per CPU second of the "
        "workload (the latter immune to other load; the kernel charges interrupt time to the sampled task "
        "without IRQ time accounting); BPF ns/run, BPF CPU: the sampling program's own run time "
        "(kernel.bpf_stats_enabled) per run and as a share of one CPU; agent CPU: user space, % of one CPU "
        "(samples/s counts the whole run, attach to stop)"
    )
    write_result(
        "profile_overhead",
        None,
        {"parameters": {"rounds": args.rounds, "duration_s": args.duration, "cpu": args.cpu}, "configs": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
