"""What the agent costs while nothing happens: attached, no traffic, for ``--duration`` seconds.

Targets, each a fresh agent: an idle nginx (``bench/nginx_load.py``'s, 1 worker) by ``--pid``
(master and worker), the same nginx by ``--port``, and no target at all (every process but the
agent: the default, so whatever else runs on the machine is traced). Per run: start-up time to the
ready file and its CPU (BCC compiles the programs in-process), then after a 2 s settle the agent's
CPU over the idle window (``/proc``, % of one core) and RSS (sampled twice a second: mean and max),
then SIGINT: exit time, and from ``os.wait4`` the whole run's CPU and peak RSS.

Usage: ``python bench/idle_cost.py [--quick] [--duration S] [--rounds R] [--targets pid,port,all]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import Agent, Watch, cpu_seconds, parse_live_args, unshared  # noqa: E402
from nginx_load import Nginx  # noqa: E402
from results import write_result  # noqa: E402

SETTLE_S = 2.0


def progress(message: str) -> None:
    print(f"[idle_cost] {message}", file=sys.stderr, flush=True)


def measure(target: str, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="idle-cost-") as tmp_name:
        tmp = Path(tmp_name)
        nginx = Nginx(tmp)
        try:
            args = {
                "pid": [a for pid in sorted(nginx.pids) for a in ("--pid", str(pid))],
                "port": ["--port", str(nginx.port)],
                "all": [],
            }[target]
            with Agent(args, tmp / "out") as agent:
                time.sleep(SETTLE_S)
                watch = Watch(agent.pid)
                watch.start()
                cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
                time.sleep(seconds)
                cpu, window = cpu_seconds(agent.pid) - cpu0, time.monotonic() - t0
                watch.finish()
                usage = agent.stop()
        finally:
            nginx.close()
    return {
        "target": target,
        "cpu_percent_idle": 100 * cpu / window,
        "rss_mean_mb": statistics.fmean(watch.samples) if watch.samples else 0.0,
        "rss_max_mb": watch.peak,
        "startup_s": usage.startup_s,
        "cpu_startup_s": usage.cpu_startup_s,
        "cpu_whole_run_s": usage.cpu_total_s,
        "peak_rss_mb": usage.maxrss_mb,
        "exit_s": usage.exit_s,
        "shared": sorted(watch.others),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="pid,port,all", help="pid, port, all (comma-separated)")
    args = parse_live_args(parser, duration=20.0, rounds=1, quick=(5.0, 1), tools=("nginx",))
    targets = [t for t in args.targets.split(",") if t]
    runs: list[dict] = []
    for n in range(args.rounds):
        for target in targets:
            run = unshared(lambda: measure(target, args.duration), lambda r: r["shared"], args.wait_quiet, progress)
            progress(
                f"round {n + 1}/{args.rounds} {target}: {run['cpu_percent_idle']:.2f} % CPU idle, "
                f"RSS {run['rss_max_mb']:.0f} MB, start-up {run['startup_s']:.1f} s"
            )
            runs.append(run)
    med = statistics.median
    rows = [
        {
            "target": {"pid": "--pid (idle nginx)", "port": "--port (idle nginx)", "all": "every process"}[t],
            **{
                key: round(med(r[key] for r in runs if r["target"] == t), 2)
                for key in (
                    "cpu_percent_idle",
                    "rss_mean_mb",
                    "rss_max_mb",
                    "startup_s",
                    "cpu_startup_s",
                    "cpu_whole_run_s",
                    "peak_rss_mb",
                    "exit_s",
                )
            },
            "runs_shared": sum(1 for r in runs if r["target"] == t and r["shared"]),
        }
        for t in targets
    ]
    print(
        f"\nagent attached, no traffic, {args.duration:g} s idle window after a {SETTLE_S:g} s settle, "
        f"{args.rounds} round(s), medians; {os.cpu_count()} CPUs, kernel {os.uname().release}"
    )
    print(
        f"{'target':<20} {'CPU idle':>9} {'RSS mean':>9} {'RSS max':>8} {'start-up':>9} {'start CPU':>10} "
        f"{'peak RSS':>9} {'exit':>6}"
    )
    for r in rows:
        print(
            f"{r['target']:<20} {r['cpu_percent_idle']:>7.2f} % {r['rss_mean_mb']:>6.0f} MB {r['rss_max_mb']:>5.0f} MB "
            f"{r['startup_s']:>7.1f} s {r['cpu_startup_s']:>8.2f} s {r['peak_rss_mb']:>6.0f} MB {r['exit_s']:>4.2f} s"
        )
    write_result(
        "idle_cost",
        None,
        {
            "parameters": {"idle_seconds": args.duration, "settle_seconds": SETTLE_S, "rounds": args.rounds},
            "targets": rows,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
