"""A FastAPI service on uvicorn (``examples/fastapi_service.py``, ``GET /items/{id}``) under
``wrk -t1 -c16`` keep-alive, three ways side by side in one run: plain, under OpenTelemetry's own
Python auto-instrumentation (``opentelemetry-instrument``), and plain with this agent attached.

- ``plain``: the service as is.
- ``otel-instrument``: ``opentelemetry-instrument python examples/fastapi_service.py`` (the FastAPI
  instrumentation; the SDK's BatchSpanProcessor), traces and metrics exported with OTLP
  http/protobuf to a sink in this process that keeps the request bodies and decodes them only
  after the run (to count the spans): a real exporter, as a deployment would have, rather than
  ``none`` (which would skip encoding and sending) or ``console`` (whose indented JSON per span
  costs more than OTLP); the sink itself costs next to nothing during the load, less than a
  node-local collector would.
- ``agent``: the plain service with ``otel-ebpf run --pid <server> --exporter otlp`` attached
  after the warm-up (OTLP http/protobuf to the same sink, as the SDK's), stopped with SIGINT after
  the load.

Each run gets a fresh server and 1 s of warm-up load; rounds rotate the order of the three, so
drift hits all alike. Reported per variant: requests/s (median), ratio to plain (median of
per-round ratios), latency, SERVER spans per request (what reached the sink: for the agent over
the requests of the load, for the SDK over those of the warm-up and the load, as both were
traced), the server's own CPU per request under load (``/proc``: the SDK's work and the agent's
probes are charged there), and for the agent its CPU per request (whole run less start-up, i.e.
the load and the final flush, from ``os.wait4``) and RSS.

Usage: ``python bench/fastapi_load.py [--quick] [--duration S] [--rounds R]``
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import (
    REPO,
    SPAN_KIND,
    Agent,
    Watch,
    WrkRun,
    cpu_seconds,
    free_port,
    kill,
    parse_live_args,
    unshared,
    wait_listening,
    wrk,
)
from results import write_result

SERVICE = [sys.executable, str(REPO / "examples" / "fastapi_service.py")]
INSTRUMENT = str(Path(sys.executable).with_name("opentelemetry-instrument"))
CONNECTIONS = 16
PATH = "/items/42"
VARIANTS = ("plain", "otel-instrument", "agent")


def progress(message: str) -> None:
    print(f"[fastapi_load] {message}", file=sys.stderr, flush=True)


@dataclass
class Run(WrkRun):
    variant: str = ""
    server_cpu_s: float = 0.0  # the server's utime + stime under load
    server_spans: int = 0
    spanned_requests: int = 0  # requests the spans stand for: the load's (agent), warm-up's too (SDK)
    agent_cpu_s: float = 0.0  # whole run (os.wait4)
    agent_cpu_startup_s: float = 0.0
    agent_rss_load_mb: float = 0.0
    agent_peak_rss_mb: float = 0.0
    agent_exit_s: float = 0.0
    shared: list[int] = field(default_factory=list)


class Sink(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint on loopback that answers 200 and keeps the trace request bodies, to be
    decoded after the run (:meth:`server_spans`), so that it takes little CPU during the load."""

    daemon_threads = True

    def __init__(self) -> None:
        self.traces: list[bytes] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/traces":
                    sink.traces.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")  # an empty Export*ServiceResponse
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, args=(0.1,), daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def server_spans(self) -> int:
        """SERVER spans received since the last call."""
        bodies, self.traces = self.traces, []
        return sum(
            1
            for body in bodies
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
            if span.kind == SPAN_KIND["SERVER"]
        )


def measure(variant: str, seconds: float, sink: Sink) -> Run:
    port = free_port()
    command, env = [*SERVICE, "--port", str(port)], dict(os.environ)
    if variant == "otel-instrument":
        command = [INSTRUMENT, *command]
        env.update(
            OTEL_SERVICE_NAME="fastapi-bench",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_METRICS_EXPORTER="otlp",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
        )
    sink.server_spans()  # forget anything left over
    url = f"http://127.0.0.1:{port}{PATH}"
    with tempfile.TemporaryDirectory(prefix="fastapi-load-") as tmp, ExitStack() as stack:
        server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(kill, server)
        agent: Agent | None = None
        wait_listening(port, server, f"the {variant} server")
        warm = wrk(url, 1, CONNECTIONS)  # warm-up, before any agent: not counted (the SDK traces it)
        if variant == "agent":
            export = ["--exporter", "otlp", "--otlp-protocol", "http/protobuf", "--otlp-endpoint", sink.endpoint]
            agent = stack.enter_context(Agent(["--pid", str(server.pid)], Path(tmp) / "out", export=export))
        watch = Watch(agent and agent.pid)
        watch.start()
        cpu_before = cpu_seconds(server.pid)
        w = wrk(url, seconds, CONNECTIONS)
        run = Run(**asdict(w), variant=variant, server_cpu_s=cpu_seconds(server.pid) - cpu_before)
        run.shared = sorted(watch.finish().others)
        if agent:
            usage = agent.stop()
            run.agent_cpu_s, run.agent_cpu_startup_s, run.agent_peak_rss_mb, run.agent_exit_s = (
                usage.cpu_total_s,
                usage.cpu_startup_s,
                usage.maxrss_mb,
                usage.exit_s,
            )
            run.agent_rss_load_mb = watch.peak
            run.server_spans, run.spanned_requests = sink.server_spans(), w.requests
        server.send_signal(signal.SIGTERM)  # graceful: the SDK flushes at exit
        server.wait(timeout=30)
        if variant == "otel-instrument":
            run.server_spans, run.spanned_requests = sink.server_spans(), warm.requests + w.requests
        return run


def summarize(variant: str, runs: list[Run], plain: list[Run]) -> dict:
    med = statistics.median
    requests = sum(r.requests for r in runs)
    row = {
        "variant": variant,
        "rps": round(med(r.rps for r in runs)),
        "ratio_to_plain": round(med(r.rps / p.rps for r, p in zip(runs, plain, strict=True)), 3),
        "requests": requests,
        "non_2xx": sum(r.non_2xx for r in runs),
        "p50_ms": round(med(r.p50_ms for r in runs), 2),
        "p99_ms": round(med(r.p99_ms for r in runs), 2),
        "server_cpu_us_per_request": round(sum(r.server_cpu_s for r in runs) / requests * 1e6),
        "server_spans_per_request": (
            round(sum(r.server_spans for r in runs) / sum(r.spanned_requests for r in runs), 4)
            if variant != "plain"
            else None
        ),
    }
    if variant == "agent":
        row.update(
            agent_cpu_us_per_request=round(sum(r.agent_cpu_s - r.agent_cpu_startup_s for r in runs) / requests * 1e6),
            agent_cpu_s_startup=round(med(r.agent_cpu_startup_s for r in runs), 2),
            agent_rss_load_mb=round(max(r.agent_rss_load_mb for r in runs)),
            agent_peak_rss_mb=round(max(r.agent_peak_rss_mb for r in runs)),
            agent_exit_s=round(med(r.agent_exit_s for r in runs), 2),
        )
    row["runs_shared"] = sum(1 for r in runs if r.shared)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = parse_live_args(parser, duration=8.0, rounds=3, quick=(3.0, 1))
    if not Path(INSTRUMENT).exists():
        raise SystemExit(f"{INSTRUMENT} not found: run scripts/bootstrap.sh (it installs the bench extra)")
    runs: dict[str, list[Run]] = {v: [] for v in VARIANTS}
    sink = Sink()
    try:
        for n in range(args.rounds):
            for variant in VARIANTS[n % 3 :] + VARIANTS[: n % 3]:
                run = unshared(
                    partial(measure, variant, args.duration, sink), lambda r: r.shared, args.wait_quiet, progress
                )
                runs[variant].append(run)
                progress(
                    f"round {n + 1}/{args.rounds} {variant}: {run.rps:,.0f}/s, {run.requests:,} requests, "
                    f"server {run.server_cpu_s / run.requests * 1e6:.0f} µs CPU/request"
                    + (f", {run.server_spans:,} server spans" if variant != "plain" else "")
                    + (f", agent {run.agent_cpu_s:.2f} CPU-s" if variant == "agent" else "")
                )
    finally:
        sink.shutdown()
    rows = [summarize(v, runs[v], runs["plain"]) for v in VARIANTS]
    print(
        f"\nFastAPI {importlib.metadata.version('fastapi')} on uvicorn {importlib.metadata.version('uvicorn')}, "
        f"GET {PATH}, wrk -t1 -c{CONNECTIONS} keep-alive, {args.rounds} round(s) of {args.duration:g} s, "
        f"variants rotated, medians; opentelemetry-instrument "
        f"{importlib.metadata.version('opentelemetry-instrumentation')} (OTLP http/protobuf to a local sink); "
        f"agent: --pid, OTLP http/protobuf to the sink; {os.cpu_count()} CPUs, kernel {os.uname().release}"
    )
    header = (
        f"{'variant':<16} {'req/s':>7} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'server CPU/req':>15} "
        f"{'spans/req':>9} {'agent CPU/req':>14} {'agent RSS':>9}"
    )
    print(header)
    for r in rows:
        spans = "" if r["server_spans_per_request"] is None else f"{r['server_spans_per_request']:.4f}"
        agent = (
            f"{r['agent_cpu_us_per_request']:>11} µs {r['agent_rss_load_mb']:>6} MB"
            if "agent_cpu_us_per_request" in r
            else ""
        )
        print(
            f"{r['variant']:<16} {r['rps']:>7,} {r['ratio_to_plain']:>6.3f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['server_cpu_us_per_request']:>12} µs {spans:>9} {agent}"
        )
    write_result(
        "fastapi_load",
        None,
        {
            "parameters": {
                "duration_s": args.duration,
                "rounds": args.rounds,
                "connections": CONNECTIONS,
                "path": PATH,
                "versions": {
                    p: importlib.metadata.version(p)
                    for p in ("fastapi", "uvicorn", "opentelemetry-sdk", "opentelemetry-instrumentation-fastapi")
                },
                "otel_instrument_export": "OTLP http/protobuf (traces, metrics) to a local sink",
                "agent": "--pid SERVER --exporter otlp --otlp-protocol http/protobuf (to the local sink)",
            },
            "variants": rows,
            "runs": [asdict(r) for v in VARIANTS for r in runs[v]],
        },
    )


if __name__ == "__main__":
    main()
