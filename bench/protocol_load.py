"""gRPC unary calls, HTTPS requests and HTTP/2 calls with and without the agent, measured side by side
in one run.

- gRPC: ``examples/trace_chain.py serve-grpc`` (plaintext grpcio, 16 worker threads, raw-bytes
  handler, ~2 ms of "work" per call) loaded by its ``load-grpc``: unary calls on one channel (one
  HTTP/2 connection) from 16 threads, which fill the pool: "max" is bound by the CPUs, not by the
  sleep (4 threads would be: ~1,500/s, CPUs a third idle). Paced: each thread on a fixed schedule.
- HTTPS: ``examples/tls_peers.py``'s https server (``http.server`` behind Python's ``ssl``, i.e. the
  system OpenSSL the agent hooks with uprobes; trustme cert for 127.0.0.1), loaded by ``wrk``
  (10 keep-alive connections), which links the same libssl: its SSL calls hit the uprobes too.
  Paced as in ``http_load.py`` (``paced.lua``): a whole number of ms between a connection's
  requests (closed loop), so latency the agent adds lowers the traced rate too.
- HTTP/2: Node.js's ``http2`` on both ends (``tests/live/h2_burst.js``: ``serve``, a GET answered
  with a small JSON body; ``flood``, 32 streams always in flight on one h2c connection; paced, each
  stream on a schedule). The kernel does not shed HTTP/2, and the agent cannot keep up with it at
  full speed here: the row shows the agent held to its CPU budget (``capture.cpu_budget``, by its
  reader's waits: ``otel_ebpf.budget.CpuCap``), the events the full ring lost counted, no call a
  failed span.

Per workload, "max" first, then ``--paced`` fractions of the untraced max. Per load and round, an
untraced and a traced run in alternating order, so drift hits both; each on a fresh server warmed
up by 1 s of load before the agent attaches (``run --pid <server>``, file exporter, SIGINT to
flush); the load then connects anew. A run during which another process held BPF programs (an
agent, a live test: its probes fire here too) is done again. Reported: calls/s (medians), ratio
(median of per-round ratios), spans per call (SERVER spans named ``tracechain.Chain/Work``, resp.
with ``url.scheme=https``, over calls the client completed; wrk leaves out the <= 10 requests in
flight when it stops, so a row is met when each traced run has calls <= spans <= calls + 10),
events lost in the kernel / spans dropped at export (self-metrics), agent CPU per call
(utime+stime of the agent process over its whole run less its start-up, the final flush after
SIGINT included: user space only, probe time is charged to the traced processes), the agent's
CPU in cores from ``SETTLE_S`` into the load to its end (once its budget has acted), agent RSS
(max sampled under load), p50/p99 latency.
Target: spans per call 1.000 and ratio >= 0.90.

Usage: ``python bench/protocol_load.py [--quick] [--duration S] [--rounds R] [--paced 0.5,...]
[--only grpc|https|http2]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import REPO, Agent, Watch, kill, parse_live_args, self_counter, unshared, wait_for, wrk
from results import write_result

sys.path.insert(0, str(REPO))
from tests.otlp_receiver import load_file_metrics, load_file_spans

CHAIN = [sys.executable, str(REPO / "examples" / "trace_chain.py")]
# tls_peers.py's https server with its handler set up as http_service.py's (one write per response,
# TCP_NODELAY): as is, Nagle + the client's delayed ACK stall each response ~40 ms (~200/s at -c10).
HTTPS_SERVER = [sys.executable, str(REPO / "examples" / "tls_peers.py"), "https-serve"]
GRPC_SPAN = "tracechain.Chain/Work"
H2_PEERS = ["node", str(REPO / "tests" / "live" / "h2_burst.js")]
H2_STREAMS = 32
# The agent's CPU is read from here on: its budget has acted (CpuCap's allowance, 1 s of budget, is
# spent within a few seconds at full speed; the controller's first cut shows after 3 s).
SETTLE_S = 4.0
WRK_CONNECTIONS = 10
HEADER = [
    "workload",
    "offered",
    "untraced",
    "traced",
    "ratio",
    "spans/call",
    "lost ev/spans",
    "agent CPU/call",
    "agent cores",
    "agent RSS",
    "p50 ms u / t",
    "p99 ms u / t",
    "meets target",
]


@dataclass
class Run:
    calls: int
    rate: float  # calls/s the client achieved
    p50_ms: float
    p99_ms: float
    errors: int = 0  # failed calls, as the client counts them
    spans: int = 0
    error_spans: int = 0  # of those, with status ERROR
    lost: tuple[int, int] = (0, 0)  # events lost in the kernel, spans dropped at export
    agent_cpu_s: float = 0.0
    agent_cores: float = 0.0  # CPU per second from SETTLE_S into the load to its end
    agent_rss_mb: float = 0.0
    shared: tuple[int, ...] = ()  # other processes holding BPF programs during the load


Load = Callable[[int, float, float | None], Run]  # (port, seconds, calls/s or None: max) -> Run


@dataclass
class Workload:
    name: str
    serve: Callable[[Path], list[str]]  # port file -> server command line (writes its port there)
    load: Load
    is_span: Callable[[dict], bool]  # a flattened SERVER span standing for one call
    pace: Callable[[float], float]  # a wanted rate -> the nearest rate not above it the load can offer
    in_flight: int  # calls that can be answered (and traced) after the client stopped counting


def progress(message: str) -> None:
    print(f"[protocol_load] {message}", file=sys.stderr, flush=True)


def grpc_load(concurrency: int) -> Load:
    def load(port: int, seconds: float, rate: float | None) -> Run:
        paced = [] if rate is None else ["--rate", str(rate)]
        out = subprocess.run(
            [
                *CHAIN,
                "load-grpc",
                f"127.0.0.1:{port}",
                "--seconds",
                str(seconds),
                "--concurrency",
                str(concurrency),
                *paced,
            ],
            capture_output=True,
            text=True,
        )
        if not out.stdout.strip():
            raise SystemExit(f"load-grpc failed ({out.returncode}): {out.stderr}")
        r = json.loads(out.stdout)
        return Run(r["calls"], r["calls"] / r["seconds"], r["p50_ms"] or 0.0, r["p99_ms"] or 0.0, r["errors"])

    return load


def h2_load(port: int, seconds: float, rate: float | None) -> Run:
    paced = [] if rate is None else [str(rate)]
    out = subprocess.run(
        [*H2_PEERS, "flood", str(port), str(seconds), str(H2_STREAMS), *paced], capture_output=True, text=True
    )
    if not out.stdout.strip():
        raise SystemExit(f"h2_burst.js flood failed ({out.returncode}): {out.stderr}")
    r = json.loads(out.stdout)
    return Run(r["calls"], r["calls"] / r["seconds"], r["p50_ms"] or 0.0, r["p99_ms"] or 0.0, r["errors"])


def _wrk_delay_ms(rate: float) -> int:
    return max(1, math.ceil(WRK_CONNECTIONS * 1000 / rate))


def https_load(port: int, seconds: float, rate: float | None) -> Run:
    delay_ms = None if rate is None else _wrk_delay_ms(rate)
    w = wrk(f"https://127.0.0.1:{port}/health", seconds, WRK_CONNECTIONS, delay_ms=delay_ms)
    return Run(w.requests, w.rps, w.p50_ms, w.p99_ms, w.socket_errors + w.non_2xx)


def measure(workload: Workload, rate: float | None, seconds: float, traced: bool) -> Run:
    """One run: a fresh server, a 1 s warm-up, then (traced) the agent attached, then the load."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        port_file, out = Path(tmp) / "port", Path(tmp) / "out"
        server = subprocess.Popen(workload.serve(port_file), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(kill, server)
        port = int(wait_for(port_file, server, f"{workload.name} server"))
        workload.load(port, 1, rate)  # warm-up, before any agent: not counted
        agent = stack.enter_context(Agent(["--pid", str(server.pid)], out)) if traced else None
        watch = Watch(agent and agent.pid)
        watch.start()
        run = workload.load(port, seconds, rate)
        if agent is None:
            run.shared = tuple(sorted(watch.finish().others))
            return run
        time.sleep(0.5)  # let the agent drain the ring buffer
        run.shared, run.agent_rss_mb = tuple(sorted(watch.finish().others)), watch.peak
        run.agent_cores = watch.cores_after(SETTLE_S)
        usage = agent.stop()  # SIGINT: the final flush is part of the run
        run.agent_cpu_s = usage.cpu_total_s - usage.cpu_startup_s
        spans = [s for s in load_file_spans(out) if s["kind"] == "SERVER" and workload.is_span(s)]
        run.spans, run.error_spans = len(spans), sum(1 for s in spans if s["status_code"] == "ERROR")
        metrics = load_file_metrics(out)
        run.lost = (
            self_counter(metrics, "otel_ebpf.events.lost"),
            self_counter(metrics, "otel_ebpf.spans.dropped"),
        )
        return run


def quiet_measure(workload: Workload, rate: float | None, traced: bool, args: argparse.Namespace) -> Run:
    """``measure``, first waiting for other BPF users to end, and again while one shared the run."""
    return unshared(
        lambda: measure(workload, rate, args.duration, traced), lambda r: r.shared, args.wait_quiet, progress
    )


def row(workload: Workload, rate: float | None, args: argparse.Namespace) -> tuple[dict[str, Any], list[Run]]:
    """The figures of one offered load, and its untraced runs."""
    label = "max" if rate is None else f"{rate:,.0f}/s"
    u: list[Run] = []
    t: list[Run] = []
    for n in range(args.rounds):
        order = (False, True) if n % 2 == 0 else (True, False)
        progress(
            f"{workload.name} {label}, round {n + 1}/{args.rounds}: "
            + " then ".join("traced" if traced else "untraced" for traced in order)
            + " ..."
        )
        for traced in order:
            run = quiet_measure(workload, rate, traced, args)
            (t if traced else u).append(run)
            progress(
                f"  {'traced' if traced else 'untraced'}: {run.rate:,.0f}/s, {run.calls} calls"
                + (
                    f", {run.spans} spans ({run.error_spans} ERROR), lost (events, spans) {run.lost}, "
                    f"agent {run.agent_cpu_s:.2f} CPU-s, {run.agent_cores:.2f} cores settled"
                    if traced
                    else ""
                )
                + (f", {run.errors} client ERRORS" if run.errors else "")
            )
    med = statistics.median
    ratio = med(b.rate / a.rate for a, b in zip(u, t, strict=True))
    calls = sum(r.calls for r in t)
    captured = all(r.calls <= r.spans <= r.calls + workload.in_flight for r in t)
    return {
        "workload": workload.name,
        "offered": label,
        "untraced_rps": round(med(r.rate for r in u)),
        "traced_rps": round(med(r.rate for r in t)),
        "ratio": round(ratio, 3),
        "spans_per_call": round(sum(r.spans for r in t) / calls, 4),
        "error_spans": sum(r.error_spans for r in t),
        "events_lost": sum(r.lost[0] for r in t),
        "spans_dropped": sum(r.lost[1] for r in t),
        "agent_cpu_us_per_call": round(sum(r.agent_cpu_s for r in t) / calls * 1e6),
        "agent_cores_settled": round(med(r.agent_cores for r in t), 2),
        "agent_rss_mb": round(max(r.agent_rss_mb for r in t)),
        "p50_ms": [round(med(r.p50_ms for r in runs), 2) for runs in (u, t)],
        "p99_ms": [round(med(r.p99_ms for r in runs), 2) for runs in (u, t)],
        "client_errors": sum(r.errors for r in u + t),
        "runs_shared": sum(1 for r in u + t if r.shared),
        "misses": [what for what, ok in (("spans", captured), ("ratio", ratio >= 0.90)) if not ok],
    }, u


def cells(load: dict[str, Any]) -> list[str]:
    """A load's figures as the printed table's cells (HEADER)."""
    notes = [f"{n} errors" for n in [load["client_errors"]] if n]
    notes += [f"{n} runs shared" for n in [load["runs_shared"]] if n]
    errs = load["error_spans"]
    return [
        load["workload"],
        load["offered"],
        f"{load['untraced_rps']:,}/s",
        f"{load['traced_rps']:,}/s",
        f"{load['ratio']:.3f}",
        f"{load['spans_per_call']:.4f}" + (f" ({errs} ERROR)" if errs else ""),
        f"{load['events_lost']} / {load['spans_dropped']}",
        f"{load['agent_cpu_us_per_call']} µs",
        f"{load['agent_cores_settled']:.2f}",
        f"{load['agent_rss_mb']} MB",
        "{:.2f} / {:.2f}".format(*load["p50_ms"]),
        "{:.2f} / {:.2f}".format(*load["p99_ms"]),
        ("yes" if not load["misses"] else f"NO ({', '.join(load['misses'])})") + "".join(f" [{n}]" for n in notes),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paced", default="0.5", help="paced loads, fractions of the untraced max ('' for none)")
    parser.add_argument("--grpc-concurrency", type=int, default=16, help="load-grpc threads on the one channel")
    parser.add_argument("--only", choices=["grpc", "https", "http2"], help="one workload only")
    args = parse_live_args(parser, duration=8.0, rounds=3, quick=(3.0, 1), wait_quiet=300)
    import trustme

    certs = Path(tempfile.mkdtemp(prefix="protocol_load-"))
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(certs / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(certs / "server.pem"))
    workloads = {
        "grpc": Workload(
            "gRPC",
            lambda port: [*CHAIN, "serve-grpc", "bench", str(port)],
            grpc_load(args.grpc_concurrency),
            lambda s: s["name"] == GRPC_SPAN,
            lambda r: round(r, -1),
            0,
        ),
        "https": Workload(
            "HTTPS",
            lambda port: [*HTTPS_SERVER, str(port), *[str(certs / "server.pem")] * 2],
            https_load,
            lambda s: s["attributes"].get("url.scheme") == "https",
            lambda r: WRK_CONNECTIONS * 1000 / _wrk_delay_ms(r),
            WRK_CONNECTIONS,
        ),
        "http2": Workload(
            "HTTP/2",
            lambda port_file: [*H2_PEERS, "serve", str(port_file)],
            h2_load,
            lambda s: s["attributes"].get("url.path", "").startswith("/items/"),
            lambda r: round(r, -1),
            H2_STREAMS,
        ),
    }
    loads: list[dict[str, Any]] = []
    try:
        for key, workload in workloads.items():
            if args.only in (None, key):
                top_load, untraced = row(workload, None, args)
                loads.append(top_load)
                top = statistics.median(r.rate for r in untraced)
                loads += [row(workload, workload.pace(top * float(f)), args)[0] for f in args.paced.split(",") if f]
    finally:
        shutil.rmtree(certs, ignore_errors=True)
    table = [HEADER, *(cells(load) for load in loads)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    print(
        f"\n{args.rounds} round(s) of {args.duration:g} s per load, medians; gRPC: {args.grpc_concurrency} threads "
        f"on one channel; HTTPS: wrk -c{WRK_CONNECTIONS}; HTTP/2: {H2_STREAMS} streams on one connection; "
        f"agent cores: from {SETTLE_S:g} s into the load; {os.cpu_count()} CPUs, kernel {os.uname().release}"
    )
    print("target: spans/call 1.000 and traced/untraced ratio >= 0.90")
    for line in table:
        print(
            "  ".join(
                cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    write_result(
        "protocol_load",
        None,
        {
            "parameters": {
                "duration_s": args.duration,
                "rounds": args.rounds,
                "grpc_concurrency": args.grpc_concurrency,
                "https_connections": WRK_CONNECTIONS,
                "http2_streams": H2_STREAMS,
                "paced": args.paced,
            },
            "loads": loads,
        },
    )


if __name__ == "__main__":
    main()
