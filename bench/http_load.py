"""Keep-alive HTTP load with and without the agent, measured side by side in one run.

For each offered load (paced rates, then "max": wrk as fast as it can) and each round, a fresh
server is loaded by ``wrk`` untraced, then a fresh server with the agent attached to it (file
exporter). Untraced and traced alternate so drift on a shared machine hits both sides. Per load:

- throughput traced / untraced                     (target >= 0.90)
- server spans captured per request wrk completed  (target 1.000)
- agent CPU per request: its whole run less its start-up, the final flush after SIGINT included
- agent RSS: steady state under load (max of samples) and the run's peak (ru_maxrss, which includes
  BCC's in-process compile)                        (target <= 150 MB)

Usage: ``python bench/http_load.py [--quick] [--duration S] [--connections N] [--rounds R] [--rates 1000,5000,max]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import REPO, SPAN_KIND, Agent, Watch, kill, span_counts, wrk
from results import write_result

SERVICE = [sys.executable, str(REPO / "examples" / "http_service.py")]


@dataclass
class Result:
    requests: int
    rps: float
    spans: int = 0
    agent_cpu_s: float = 0.0
    agent_rss_mb: float = 0.0  # steady state: max VmRSS sampled under load
    agent_peak_mb: float = 0.0  # the whole run's peak (ru_maxrss): start-up compile included


def _wrk(port: int, duration: float, connections: int, rate: int | None) -> tuple[int, float]:
    """Run wrk; ``rate`` paces each connection to about rate/connections requests per second."""
    delay_ms = None if rate is None else max(1, round(connections * 1000 / rate))
    run = wrk(f"http://127.0.0.1:{port}/health", duration, connections, delay_ms=delay_ms)
    return run.requests, run.rps


def _start_service() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([*SERVICE, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    port = int(line.rsplit(":", 1)[1])
    return proc, port


def _count_server_spans(traces: Path) -> int:
    return sum(n for (_, kind, _, _), n in span_counts(traces).items() if kind == SPAN_KIND["SERVER"])


def run_untraced(duration: float, connections: int, rate: int | None) -> Result:
    service, port = _start_service()
    try:
        _wrk(port, 1, connections, rate)  # warm-up
        return Result(*_wrk(port, duration, connections, rate))
    finally:
        service.kill()
        service.wait()


def run_traced(duration: float, connections: int, rate: int | None) -> Result:
    service, port = _start_service()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        stack.callback(kill, service)
        _wrk(port, 1, connections, rate)  # warm-up, before the agent: not counted
        agent = stack.enter_context(Agent(["--pid", str(service.pid)], Path(tmp) / "out"))
        sampler = Watch(agent.pid)
        sampler.start()
        requests, rps = _wrk(port, duration, connections, rate)
        time.sleep(0.5)  # let the agent drain the ring buffer
        sampler.finish()
        usage = agent.stop()  # SIGINT: the final flush is part of the run
        spans = _count_server_spans(Path(tmp) / "out" / "traces.jsonl")
        return Result(requests, rps, spans, usage.cpu_total_s - usage.cpu_startup_s, sampler.peak, usage.maxrss_mb)


def _parse_rates(text: str) -> list[int | None]:
    return [None if r == "max" else int(r) for r in text.split(",")]


def measure(rate: int | None, args: argparse.Namespace) -> dict:
    label = "max" if rate is None else f"{rate}/s"
    untraced: list[Result] = []
    traced: list[Result] = []
    for round_no in range(1, args.rounds + 1):
        print(f"[bench] offered {label}, round {round_no}/{args.rounds}: untraced, then traced ...", flush=True)
        untraced.append(run_untraced(args.duration, args.connections, rate))
        traced.append(run_traced(args.duration, args.connections, rate))
    row = {
        "offered": label,
        "untraced_rps": round(statistics.median(u.rps for u in untraced)),
        "traced_rps": round(statistics.median(t.rps for t in traced)),
        "ratio": round(statistics.median(t.rps / u.rps for u, t in zip(untraced, traced, strict=True)), 3),
        "server_spans_per_request": round(sum(t.spans for t in traced) / sum(t.requests for t in traced), 4),
        "agent_cpu_us_per_request": round(sum(t.agent_cpu_s for t in traced) / sum(t.requests for t in traced) * 1e6),
        "agent_rss_steady_mb": round(max(t.agent_rss_mb for t in traced)),
        "agent_rss_startup_peak_mb": round(max(t.agent_peak_mb for t in traced)),
    }
    print(
        f"  offered {label:>7}: untraced {row['untraced_rps']:8} req/s, traced {row['traced_rps']:8} req/s, "
        f"ratio {row['ratio']:.3f} | spans/request {row['server_spans_per_request']:.4f} | "
        f"agent {row['agent_cpu_us_per_request']} µs CPU/req | RSS steady {row['agent_rss_steady_mb']} MB, "
        f"start-up peak {row['agent_rss_startup_peak_mb']} MB",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of load per measurement")
    parser.add_argument("--connections", type=int, default=10, help="wrk keep-alive connections")
    parser.add_argument("--rounds", type=int, default=2, help="untraced/traced pairs per load")
    parser.add_argument(
        "--rates",
        type=_parse_rates,
        default=_parse_rates("1000,2500,5000,max"),
        help="offered loads in requests/s, comma-separated; 'max' is unpaced",
    )
    parser.add_argument("--quick", action="store_true", help="short run: 3 s, 1 round, 2500/s and max")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds, args.rates = 3.0, 1, _parse_rates("2500,max")
    if os.geteuid() != 0:
        raise SystemExit("the benchmark attaches eBPF programs: run it as root")
    print("targets: ratio >= 0.90, spans/request 1.000, RSS <= 150 MB", flush=True)
    rows = [measure(rate, args) for rate in args.rates]
    write_result(
        "http_load",
        None,
        {
            "parameters": {
                "duration_s": args.duration,
                "connections": args.connections,
                "rounds": args.rounds,
                "server": "examples/http_service.py",
                "agent": "--pid SERVER --exporter file",
            },
            "loads": rows,
        },
    )


if __name__ == "__main__":
    main()
