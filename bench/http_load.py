"""Keep-alive HTTP load with and without the agent, measured side by side in one run.

For each round: a fresh server is loaded by ``wrk`` untraced, then a fresh server is loaded with the
agent attached to it (file exporter). Rounds alternate so drift on a shared machine hits both sides.
Prints per-round figures and the ratios the foundation issue sets targets for:

- throughput traced / untraced                     (target >= 0.90)
- server spans captured per request wrk completed  (target 1.000)
- agent CPU seconds per 1,000 requests
- agent peak RSS (VmHWM)                           (target <= 150 MB)

Usage: ``python bench/http_load.py [--duration S] [--connections N] [--rounds R]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVICE = [sys.executable, str(REPO / "examples" / "http_service.py")]
AGENT = [sys.executable, "-m", "otel_ebpf.cli"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    requests: int
    rps: float
    spans: int = 0
    agent_cpu_s: float = 0.0
    agent_rss_mb: float = 0.0


def _wrk(port: int, duration: float, connections: int) -> tuple[int, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{round(duration)}s", f"http://127.0.0.1:{port}/health"],
        capture_output=True, text=True, check=True,
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return requests, rps


def _start_service() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([*SERVICE, "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    port = int(re.search(r"(\d+)\s*$", line).group(1))
    return proc, port


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _count_server_spans(traces: Path) -> int:
    count = 0
    if not traces.exists():
        return 0
    with traces.open() as f:
        for line in f:
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    count += sum(1 for s in ss.get("spans", []) if s.get("kind") == 2)  # SPAN_KIND_SERVER
    return count


def run_untraced(duration: float, connections: int) -> Result:
    service, port = _start_service()
    try:
        _wrk(port, 1, connections)  # warm-up
        return Result(*_wrk(port, duration, connections))
    finally:
        service.kill()
        service.wait()


def run_traced(duration: float, connections: int) -> Result:
    service, port = _start_service()
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        _wrk(port, 1, connections)  # warm-up, before the agent: not counted
        agent = subprocess.Popen(
            [*AGENT, "run", "--pid", str(service.pid), "--exporter", "file", "--output", tmp,
             "--ready-file", str(ready)],
            cwd=REPO, stderr=subprocess.PIPE, text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"agent did not start: {agent.stderr.read()}")
                time.sleep(0.05)
            cpu_before = _cpu_seconds(agent.pid)
            requests, rps = _wrk(port, duration, connections)
            time.sleep(0.5)  # let the agent drain the ring buffer
            cpu = _cpu_seconds(agent.pid) - cpu_before
            rss = _peak_rss_mb(agent.pid)
        finally:
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=120)[1]
            service.kill()
            service.wait()
        if agent.returncode != 0:
            raise SystemExit(f"agent failed ({agent.returncode}): {stderr}")
        return Result(requests, rps, _count_server_spans(Path(tmp) / "traces.jsonl"), cpu, rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load per measurement")
    parser.add_argument("--connections", type=int, default=8, help="wrk keep-alive connections")
    parser.add_argument("--rounds", type=int, default=3, help="untraced/traced pairs")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the benchmark attaches eBPF programs: run it as root")

    untraced: list[Result] = []
    traced: list[Result] = []
    for round_no in range(1, args.rounds + 1):
        print(f"[bench] round {round_no}/{args.rounds}: untraced ...", flush=True)
        untraced.append(run_untraced(args.duration, args.connections))
        print(f"[bench] round {round_no}/{args.rounds}: traced ...", flush=True)
        traced.append(run_traced(args.duration, args.connections))
        u, t = untraced[-1], traced[-1]
        print(f"  untraced {u.rps:9.1f} req/s | traced {t.rps:9.1f} req/s ({t.rps / u.rps:.3f}) | "
              f"spans/request {t.spans / t.requests:.4f} | agent {t.agent_cpu_s / t.requests * 1000:.3f} "
              f"CPU-s/1k req, peak RSS {t.agent_rss_mb:.1f} MB", flush=True)

    ratio = statistics.median(t.rps / u.rps for u, t in zip(untraced, traced))
    captured = sum(t.spans for t in traced) / sum(t.requests for t in traced)
    cpu = sum(t.agent_cpu_s for t in traced) / sum(t.requests for t in traced) * 1000
    rss = max(t.agent_rss_mb for t in traced)
    print()
    print(f"throughput traced/untraced (median of {args.rounds}): {ratio:.3f}   target >= 0.90")
    print(f"server spans per request completed:                {captured:.4f}  target 1.000")
    print(f"agent CPU seconds per 1,000 requests:              {cpu:.3f}")
    print(f"agent peak RSS:                                    {rss:.1f} MB  target <= 150 MB")


if __name__ == "__main__":
    main()
