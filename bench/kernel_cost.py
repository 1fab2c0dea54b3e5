"""Where the kernel's time per HTTP/1 request goes: runs per request and ns per run of every
socket-probe program, with nginx and ``wrk`` both traced.

nginx with one worker (``return 200``, as ``bench/nginx_load.py``) under ``wrk -t1 -c16``
keep-alive; the socket probe is loaded in this process on nginx's port (``--port``: nginx's SERVER
side and wrk's CLIENT side), with the default capture settings, and a thread reads and drops what
reaches the ring buffer (the pipeline's cost is not measured here: ``bench/pipeline_replay.py``).
With ``kernel.bpf_stats_enabled`` on (restored after), each program's run count and run time are
read from its ``fdinfo`` before and after the load.

Loads: fixed rates (wrk2-style schedule, ``bench/paced.lua``), below where the kernel sheds, and as
fast as possible, where it sheds whole exchanges (``docs/performance.md``) and copies nothing for
them. Per load, medians over rounds: for every program that ran, runs and ns per request and ns per
run; the total per request, for both sides together and per traced side (half of it).

Usage: ``python bench/kernel_cost.py [--quick] [--duration S] [--rounds R] [--rates 5000,20000] [--no-max]``
(as root)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from harness import parse_live_args, print_columns, program_runs, program_stats, wrk  # noqa: E402
from nginx_load import CONNECTIONS, Nginx  # noqa: E402
from otel_ebpf.config import load_config  # noqa: E402
from otel_ebpf.containers import ContainerResolver  # noqa: E402
from otel_ebpf.probes.socket import SocketProbe  # noqa: E402
from results import write_result  # noqa: E402

BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


@contextmanager
def draining(probe: SocketProbe) -> Iterator[None]:
    """Read and drop the ring's records while the load runs, as the agent would read them."""
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            probe.poll(50)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        while probe.poll(0):
            pass


@contextmanager
def probed_nginx(rate: float | None) -> Iterator[tuple[Nginx, SocketProbe]]:
    """A fresh nginx, warmed up at ``rate``, with a fresh socket probe on its port whose ring a
    thread reads and drops."""
    with tempfile.TemporaryDirectory(prefix="kernel-cost-") as tmp:
        nginx = Nginx(Path(tmp))
        try:
            wrk(nginx.url, 1, CONNECTIONS, rate=rate)  # warm-up, before the probe
            config = load_config({"port": [nginx.port]}, {})
            probe = SocketProbe(config.capture, config.targets, ContainerResolver("/"))
            probe.start()
            try:
                with draining(probe):
                    yield nginx, probe
            finally:
                probe.close()
        finally:
            nginx.close()


def measure(rate: float | None, seconds: float) -> dict[str, Any]:
    """One run on a fresh nginx with a fresh probe: per program (runs, ns) per request."""
    with probed_nginx(rate) as (nginx, probe):
        before = program_stats(probe.bpf)
        run = wrk(nginx.url, seconds, CONNECTIONS, rate=rate)
        after = program_stats(probe.bpf)
        shed = sum(probe.shed_requests().values())
    programs = {
        name: {"runs": runs / run.requests, "ns": time_ns / run.requests}
        for name, (time_ns, runs) in program_runs(before, after).items()
    }
    return {"requests_per_s": run.rps, "shed_per_request": shed / run.requests, "programs": programs}


def summarize(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    names = sorted({name for r in runs for name in r["programs"]})
    programs = {}
    for name in names:
        per = [r["programs"].get(name, {"runs": 0.0, "ns": 0.0}) for r in runs]
        runs_per_request = statistics.median(p["runs"] for p in per)
        ns_per_request = statistics.median(p["ns"] for p in per)
        programs[name] = {
            "runs_per_request": round(runs_per_request, 3),
            "ns_per_request": round(ns_per_request, 1),
            "ns_per_run": round(ns_per_request / runs_per_request, 1) if runs_per_request else 0.0,
        }
    total_runs = statistics.median(sum(p["runs"] for p in r["programs"].values()) for r in runs)
    total_ns = statistics.median(sum(p["ns"] for p in r["programs"].values()) for r in runs)
    return {
        "load": label,
        "requests_per_s": round(statistics.median(r["requests_per_s"] for r in runs)),
        "shed_per_request": round(statistics.median(r["shed_per_request"] for r in runs), 3),
        "runs_per_request": round(total_runs, 2),
        "ns_per_request": round(total_ns),
        "ns_per_request_per_side": round(total_ns / 2),
        "programs": programs,
    }


def print_load(row: dict[str, Any]) -> None:
    print(
        f"\n{row['load']}: {row['requests_per_s']:,} requests/s, shed {row['shed_per_request']:.3f} per request;"
        f" {row['runs_per_request']:.2f} runs and {row['ns_per_request']:,} ns per request"
        f" ({row['ns_per_request_per_side']:,} ns per traced side)"
    )
    lines = [["program", "runs/request", "ns/run", "ns/request"]]
    by_cost = sorted(row["programs"].items(), key=lambda item: -item[1]["ns_per_request"])
    for name, p in by_cost:
        lines.append([name, f"{p['runs_per_request']:.3f}", f"{p['ns_per_run']:.0f}", f"{p['ns_per_request']:.0f}"])
    print_columns(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="5000,20000", help="fixed loads, requests/s, comma-separated")
    parser.add_argument("--no-max", action="store_true", help="skip the as-fast-as-possible load")
    args = parse_live_args(parser, duration=5.0, rounds=3, quick=(2.0, 1), tools=("nginx", "wrk"))
    loads: list[float | None] = [float(r) for r in args.rates.split(",") if r]
    if not args.no_max:
        loads.append(None)
    stats_before = BPF_STATS.read_text().strip()
    BPF_STATS.write_text("1")
    results: dict[float | None, list[dict[str, Any]]] = {load: [] for load in loads}
    try:
        for round_ in range(args.rounds):
            for load in loads:
                print(f"[kernel_cost] round {round_ + 1}/{args.rounds}, load {load or 'max'}", file=sys.stderr)
                results[load].append(measure(load, args.duration))
    finally:
        BPF_STATS.write_text(stats_before)
    rows = [summarize(f"{load:,.0f}/s" if load else "as fast as possible", runs) for load, runs in results.items()]
    print(
        f"nginx 1 worker `return 200`, wrk -t1 -c{CONNECTIONS}, socket probe on the port (both sides traced),"
        f" {args.rounds} round(s) of {args.duration:g} s, medians"
    )
    for row in rows:
        print_load(row)
    write_result("kernel_cost", None, {"rounds": args.rounds, "duration_s": args.duration, "loads": rows})


if __name__ == "__main__":
    main()
