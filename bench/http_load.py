"""Keep-alive HTTP load with and without the agent, measured side by side in one run.

For each offered load (paced rates, then "max": wrk as fast as it can) and each round, a fresh
server is loaded by ``wrk`` untraced, then a fresh server with the agent attached to it (file
exporter). Untraced and traced alternate so drift on a shared machine hits both sides. Per load:

- throughput traced / untraced                     (target >= 0.90)
- server spans captured per request wrk completed  (target 1.000)
- agent CPU seconds per 1,000 requests
- agent RSS: steady state under load (max of samples) and start-up peak (VmHWM, which includes
  BCC's in-process compile)                        (target <= 150 MB)

Usage: ``python bench/http_load.py [--duration S] [--connections N] [--rounds R] [--rates 1000,5000,max]``
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVICE = [sys.executable, str(REPO / "examples" / "http_service.py")]
AGENT = [sys.executable, "-m", "otel_ebpf.cli"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


PACING_SCRIPT = Path(__file__).with_name("paced.lua")


@dataclass
class Result:
    requests: int
    rps: float
    spans: int = 0
    agent_cpu_s: float = 0.0
    agent_rss_mb: float = 0.0  # steady state: max VmRSS sampled under load
    agent_peak_mb: float = 0.0  # VmHWM: start-up compile included


def _wrk(port: int, duration: float, connections: int, rate: int | None) -> tuple[int, float]:
    """Run wrk; ``rate`` paces each connection to about rate/connections requests per second."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{round(duration)}s", f"http://127.0.0.1:{port}/health"]
    env = dict(os.environ)
    if rate is not None:
        command[1:1] = ["-s", str(PACING_SCRIPT)]
        env["WRK_DELAY_MS"] = str(max(1, round(connections * 1000 / rate)))
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return requests, rps


def _start_service() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([*SERVICE, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    port = int(re.search(r"(\d+)\s*$", line).group(1))
    return proc, port


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssSampler(threading.Thread):
    """Samples a process's VmRSS twice a second; ``peak`` is the largest sample."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.peak = max(self.peak, _status_mb(self.pid, "VmRSS"))


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
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        _wrk(port, 1, connections, rate)  # warm-up, before the agent: not counted
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
            sampler = RssSampler(agent.pid)
            sampler.start()
            requests, rps = _wrk(port, duration, connections, rate)
            time.sleep(0.5)  # let the agent drain the ring buffer
            sampler.stop.set()
            cpu = _cpu_seconds(agent.pid) - cpu_before
            peak = _status_mb(agent.pid, "VmHWM")
        finally:
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=120)[1]
            service.kill()
            service.wait()
        if agent.returncode != 0:
            raise SystemExit(f"agent failed ({agent.returncode}): {stderr}")
        return Result(requests, rps, _count_server_spans(Path(tmp) / "traces.jsonl"), cpu, sampler.peak, peak)


def _parse_rates(text: str) -> list[int | None]:
    return [None if r == "max" else int(r) for r in text.split(",")]


def measure(rate: int | None, args: argparse.Namespace) -> None:
    label = "max" if rate is None else f"{rate}/s"
    untraced: list[Result] = []
    traced: list[Result] = []
    for round_no in range(1, args.rounds + 1):
        print(f"[bench] offered {label}, round {round_no}/{args.rounds}: untraced, then traced ...", flush=True)
        untraced.append(run_untraced(args.duration, args.connections, rate))
        traced.append(run_traced(args.duration, args.connections, rate))
    ratio = statistics.median(t.rps / u.rps for u, t in zip(untraced, traced))
    requests = sum(t.requests for t in traced)
    captured = sum(t.spans for t in traced) / requests
    cpu = sum(t.agent_cpu_s for t in traced) / requests * 1000
    print(f"  offered {label:>7}: untraced {statistics.median(u.rps for u in untraced):8.0f} req/s, "
          f"traced {statistics.median(t.rps for t in traced):8.0f} req/s, ratio {ratio:.3f} | "
          f"spans/request {captured:.4f} | agent {cpu:.3f} CPU-s/1k req | "
          f"RSS steady {max(t.agent_rss_mb for t in traced):.0f} MB, "
          f"start-up peak {max(t.agent_peak_mb for t in traced):.0f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of load per measurement")
    parser.add_argument("--connections", type=int, default=10, help="wrk keep-alive connections")
    parser.add_argument("--rounds", type=int, default=2, help="untraced/traced pairs per load")
    parser.add_argument("--rates", type=_parse_rates, default=_parse_rates("1000,2500,5000,max"),
                        help="offered loads in requests/s, comma-separated; 'max' is unpaced")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the benchmark attaches eBPF programs: run it as root")
    print("targets: ratio >= 0.90, spans/request 1.000, RSS <= 150 MB", flush=True)
    for rate in args.rates:
        measure(rate, args)


if __name__ == "__main__":
    main()
