"""nginx (1 worker, ``return 200``) under ``wrk -t1 -c16`` keep-alive, without and with the agent,
side by side in one run: what the agent costs a fast native server, and whether it accounts for
every request.

Per offered load ("max": wrk as fast as it can; then fixed schedules of ``--rates`` requests/s,
``bench/paced.lua``) and round, an untraced and a traced run in alternating order, so drift on a
shared machine hits both. Each run gets a fresh nginx (config, pid and logs in a temp dir,
``access_log off``) and 1 s of warm-up load; a traced run then starts the agent
(``otel-ebpf run --port PORT --exporter file``: every process's connections on that port, so
nginx's SERVER side and wrk's CLIENT side), waits for its ready file, runs the load, and stops it
with SIGINT as soon as wrk ends (no grace period: whatever the agent still holds must come out in
its final flush). The agent is this script's child: ``os.wait4`` gives its CPU and peak RSS over
the whole run, start-up and final flush included.

Per traced run: requests wrk completed (and non-2xx answers); SERVER spans from nginx's processes
(resource ``process.pid``), CLIENT spans from wrk's; the ``http.server.request.duration`` count
for nginx's resources (temporality-aware); the self-metrics ``otel_ebpf.spans.shed`` (0 if the
agent has none), ``otel_ebpf.events.lost``, ``otel_ebpf.kernel.drops``, ``otel_ebpf.spans.dropped``;
ERROR spans while wrk saw only 2xx (false errors), less wrk's CLIENT spans that its own exit ended
before their response (``otel_ebpf.process.exited``: requests it sent in its last loop turn and
abandoned, counted apart, at most one per connection: any more count as false); agent CPU (whole run, at start-up, under
load, and settled: from ``SETTLE_S`` into the load, once its CPU budget has acted), RSS (sampled
under load, and peak), and its exit time after SIGINT.

The invariant: every exchange is either a span or counted as shed; both sides are traced, so
``(server spans + client spans + shed) / (2 x requests)`` is 1 (up to the <= 16 requests in flight
when wrk stops, which nginx answers but wrk does not count).

``--nice N`` runs the agent at niceness N (``OTEL_EBPF_NICE``) instead of its default
(``capture.nice``): ``--nice 0`` shows what yielding the CPU to the applications is worth.

``--cpu-floor F`` sets ``capture.cpu_floor`` (``OTEL_EBPF_CPU_FLOOR``): past F of a core each
second the agent's reader runs on idle CPU only (``otel_ebpf/idle_cpu.py``). Written to
``nginx_load_idle_cpu.json``.

``--connection-close`` sends ``Connection: close`` with every request: a connection per request,
as from a client or proxy with no keep-alive (nginx to its upstreams, by default). Then
``connections opened/req`` (``otel_ebpf.connections.opened``: connections whose bytes reached user
space) says whether the connections of shed exchanges cost user space anything. Written to
``nginx_load_churn.json``.

Usage: ``python bench/nginx_load.py [--quick] [--duration S] [--rounds R] [--rates 5000,20000] [--no-max] [--keep DIR]
[--nice N] [--cpu-floor F] [--connection-close]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import (
    SPAN_KIND,
    STATUS_ERROR,
    Agent,
    Watch,
    WrkRun,
    cpu_seconds,
    free_port,
    load_metrics,
    metric_total,
    parse_live_args,
    self_counter,
    span_counts,
    unshared,
    wait_listening,
    wrk,
)
from results import write_result

CONNECTIONS = 16
SETTLE_S = 3.0  # into a load, the CPU budget has acted (budget.py: 2 s of patience, then one cut)
NGINX_CONF = """\
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
    {settings}
    server {{
        listen 127.0.0.1:{port};
        location / {{ {location} }}
    }}
}}
"""


def progress(message: str) -> None:
    print(f"[nginx_load] {message}", file=sys.stderr, flush=True)


class Nginx:
    """nginx with one worker on a free loopback port, everything it writes in a temp dir;
    ``location``: what it does with every request (``return 200 "ok"``), ``settings``: more of its
    ``http`` block."""

    def __init__(self, tmp: Path, location: str = 'return 200 "ok\\n";', settings: str = "") -> None:
        self.tmp, self.port = tmp, free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=self.port, location=location, settings=settings))
        self.proc = subprocess.Popen(
            ["nginx", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_listening(self.port, self.proc, "nginx")
        self.url = f"http://127.0.0.1:{self.port}/"

    @property
    def pids(self) -> set[int]:
        """The master and its workers."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return {self.proc.pid, *map(int, children)}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: the worker ends too
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Run(WrkRun):
    traced: bool = False
    server_spans: int = 0
    client_spans: int = 0
    error_server_spans: int = 0  # nginx's SERVER spans with status ERROR
    error_client_spans: int = 0  # wrk's CLIENT spans with status ERROR, but for those below
    abandoned_client_spans: int = 0  # wrk's CLIENT spans ERROR as wrk exited before their response
    duration_count: int = 0  # http.server.request.duration count, nginx's resources
    shed: int = 0
    connections_opened: int = 0
    events_lost: int = 0
    kernel_drops: int = 0
    spans_dropped: int = 0
    agent_cpu_s: float = 0.0  # whole run (os.wait4)
    agent_cpu_startup_s: float = 0.0
    agent_cpu_load_s: float = 0.0  # from the start of the load to SIGINT
    agent_cores_settled: float = 0.0  # CPU per second from SETTLE_S into the load to its end
    agent_startup_s: float = 0.0
    agent_rss_load_mb: float = 0.0  # max sampled under load
    agent_peak_rss_mb: float = 0.0  # ru_maxrss
    agent_exit_s: float = 0.0
    shared: list[int] = field(default_factory=list)  # other BPF users during the load


def measure(
    rate: float | None,
    seconds: float,
    traced: bool,
    keep: Path | None = None,
    settings: Mapping[str, str] | None = None,
    headers: Sequence[str] = (),
) -> Run:
    """One run on a fresh nginx; ``keep``: copy the agent's output (and log) there; ``settings``:
    the agent's environment variables besides this one's (None: its defaults); ``headers``: wrk's
    (``wrk``)."""
    with tempfile.TemporaryDirectory(prefix="nginx-load-") as tmp_name:
        tmp = Path(tmp_name)
        nginx = Nginx(tmp)
        try:
            load = partial(wrk, nginx.url, connections=CONNECTIONS, rate=rate, headers=headers)
            load(1)  # warm-up, before any agent: not counted
            if not traced:
                watch = Watch(None)
                watch.start()
                w = load(seconds)
                return Run(**asdict(w), shared=sorted(watch.finish().others))
            nginx_pids = nginx.pids
            env = {**os.environ, **settings} if settings else None
            with Agent(["--port", str(nginx.port)], tmp / "out", env) as agent:
                watch = Watch(agent.pid)
                watch.start()
                cpu_before = cpu_seconds(agent.pid)
                w = load(seconds)
                cpu_load = cpu_seconds(agent.pid) - cpu_before
                watch.finish()
                usage = agent.stop()
        finally:
            nginx.close()
        if keep is not None:
            shutil.copytree(tmp / "out", keep, dirs_exist_ok=True)
            shutil.copy(tmp / "out.log", keep / "agent.log")
        counts = span_counts(tmp / "out" / "traces.jsonl")
        client_errors = ended_by_exit = 0
        for (pid, kind, status, exited), n in counts.items():
            if status == STATUS_ERROR and pid == w.wrk_pid and kind == SPAN_KIND["CLIENT"]:
                client_errors += n
                ended_by_exit += n if exited else 0
        # wrk abandons at most its one request in flight per connection: any more are false
        abandoned = min(ended_by_exit, CONNECTIONS)
        metrics = load_metrics(tmp / "out")
        return Run(
            **asdict(w),
            traced=True,
            server_spans=sum(
                n for (pid, kind, _, _), n in counts.items() if pid in nginx_pids and kind == SPAN_KIND["SERVER"]
            ),
            client_spans=sum(
                n for (pid, kind, _, _), n in counts.items() if pid == w.wrk_pid and kind == SPAN_KIND["CLIENT"]
            ),
            error_server_spans=sum(
                n
                for (pid, kind, status, _), n in counts.items()
                if status == STATUS_ERROR and pid in nginx_pids and kind == SPAN_KIND["SERVER"]
            ),
            error_client_spans=client_errors - abandoned,
            abandoned_client_spans=abandoned,
            duration_count=int(
                metric_total(
                    metrics.get("http.server.request.duration", []),
                    lambda p: p["resource"].get("process.pid") in nginx_pids,
                )
            ),
            shed=self_counter(metrics, "otel_ebpf.spans.shed"),
            connections_opened=self_counter(metrics, "otel_ebpf.connections.opened"),
            events_lost=self_counter(metrics, "otel_ebpf.events.lost"),
            kernel_drops=self_counter(metrics, "otel_ebpf.kernel.drops"),
            spans_dropped=self_counter(metrics, "otel_ebpf.spans.dropped"),
            agent_cpu_s=usage.cpu_total_s,
            agent_cpu_startup_s=usage.cpu_startup_s,
            agent_cpu_load_s=cpu_load,
            agent_cores_settled=watch.cores_after(SETTLE_S),
            agent_startup_s=usage.startup_s,
            agent_rss_load_mb=watch.peak,
            agent_peak_rss_mb=usage.maxrss_mb,
            agent_exit_s=usage.exit_s,
            shared=sorted(watch.others),
        )


def summarize(label: str, untraced: list[Run], traced: list[Run]) -> dict:
    """One offered load: medians of rates, sums of counts over the traced runs."""
    med = statistics.median
    requests = sum(r.requests for r in traced)
    spans, shed = sum(r.server_spans + r.client_spans for r in traced), sum(r.shed for r in traced)
    non_2xx = sum(r.non_2xx for r in untraced + traced)
    return {
        "offered": label,
        "untraced_rps": round(med(r.rps for r in untraced)),
        "traced_rps": round(med(r.rps for r in traced)),
        "ratio": round(med(t.rps / u.rps for u, t in zip(untraced, traced, strict=True)), 3),
        "requests": requests,
        "non_2xx": non_2xx,
        "socket_errors": sum(r.socket_errors for r in untraced + traced),
        "server_spans_per_request": round(sum(r.server_spans for r in traced) / requests, 4),
        "client_spans_per_request": round(sum(r.client_spans for r in traced) / requests, 4),
        "duration_count_per_request": round(sum(r.duration_count for r in traced) / requests, 4),
        "shed_per_request": round(shed / requests, 4),
        # both sides are traced: each request is two exchanges, each a span or shed
        "spans_plus_shed_per_request": round((spans + shed) / (2 * requests), 4),
        "connections_opened_per_request": round(sum(r.connections_opened for r in traced) / requests, 4),
        "events_lost": sum(r.events_lost for r in traced),
        "kernel_drops": sum(r.kernel_drops for r in traced),
        "spans_dropped": sum(r.spans_dropped for r in traced),
        # an ERROR span is false when wrk saw nothing but 2xx answers
        "false_error_spans": sum(r.error_server_spans + r.error_client_spans for r in traced if r.non_2xx == 0),
        "false_error_server_spans": sum(r.error_server_spans for r in traced if r.non_2xx == 0),
        "false_error_client_spans": sum(r.error_client_spans for r in traced if r.non_2xx == 0),
        # not false: wrk exited with these requests unanswered (it does not count them either)
        "client_spans_abandoned_at_exit": sum(r.abandoned_client_spans for r in traced),
        "agent_cpu_us_per_request_load": round(sum(r.agent_cpu_load_s for r in traced) / requests * 1e6, 1),
        "agent_cores_settled": round(med(r.agent_cores_settled for r in traced), 3),
        "agent_cpu_us_per_request_after_startup": round(
            sum(r.agent_cpu_s - r.agent_cpu_startup_s for r in traced) / requests * 1e6, 1
        ),
        "agent_cpu_s_whole_run": round(med(r.agent_cpu_s for r in traced), 2),
        "agent_cpu_s_startup": round(med(r.agent_cpu_startup_s for r in traced), 2),
        "agent_rss_load_mb": round(max(r.agent_rss_load_mb for r in traced)),
        "agent_peak_rss_mb": round(max(r.agent_peak_rss_mb for r in traced)),
        "agent_exit_s": round(med(r.agent_exit_s for r in traced), 2),
        "agent_exit_s_max": round(max(r.agent_exit_s for r in traced), 2),
        "p50_ms_untraced": round(med(r.p50_ms for r in untraced), 3),
        "p50_ms_traced": round(med(r.p50_ms for r in traced), 3),
        "p99_ms_untraced": round(med(r.p99_ms for r in untraced), 3),
        "p99_ms_traced": round(med(r.p99_ms for r in traced), 3),
        "runs_shared": sum(1 for r in untraced + traced if r.shared),
    }


COLUMNS = [  # (header, key, format)
    ("offered", "offered", "{}"),
    ("untraced", "untraced_rps", "{:,}/s"),
    ("traced", "traced_rps", "{:,}/s"),
    ("ratio", "ratio", "{:.3f}"),
    ("requests", "requests", "{:,}"),
    ("non-2xx", "non_2xx", "{}"),
    ("srv spans/req", "server_spans_per_request", "{:.4f}"),
    ("cli spans/req", "client_spans_per_request", "{:.4f}"),
    ("hist/req", "duration_count_per_request", "{:.4f}"),
    ("shed/req", "shed_per_request", "{:.4f}"),
    ("(spans+shed)/req", "spans_plus_shed_per_request", "{:.4f}"),
    ("conn opened/req", "connections_opened_per_request", "{:.4f}"),
    ("ev lost", "events_lost", "{:,}"),
    ("false ERR", "false_error_spans", "{}"),
    ("wrk-exit ERR", "client_spans_abandoned_at_exit", "{}"),
    ("CPU µs/req", "agent_cpu_us_per_request_after_startup", "{:.1f}"),
    ("CPU s run", "agent_cpu_s_whole_run", "{:.2f}"),
    ("cores settled", "agent_cores_settled", "{:.2f}"),
    ("RSS load", "agent_rss_load_mb", "{} MB"),
    ("RSS peak", "agent_peak_rss_mb", "{} MB"),
    ("exit s", "agent_exit_s", "{:.2f}"),
    ("p99 ms u/t", None, ""),
]


def print_table(rows: list[dict]) -> None:
    table = [[h for h, _, _ in COLUMNS]]
    for row in rows:
        table.append(
            [
                fmt.format(row[key]) if key else f"{row['p99_ms_untraced']:.2f}/{row['p99_ms_traced']:.2f}"
                for _, key, fmt in COLUMNS
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    for line in table:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="5000,20000", help="fixed-schedule loads in requests/s ('' for none)")
    parser.add_argument("--no-max", action="store_true", help="leave out the as-fast-as-possible load")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep each traced run's agent output in DIR/<load>-<round> (can be GBs at max)",
    )
    parser.add_argument("--nice", type=int, choices=range(20), metavar="N", help="the agent's niceness (0-19)")
    parser.add_argument(
        "--cpu-floor", type=float, metavar="F", help="capture.cpu_floor: past F of a core, idle CPU only"
    )
    parser.add_argument(
        "--connection-close", action="store_true", help="Connection: close with every request (a connection each)"
    )
    args = parse_live_args(parser, duration=5.0, rounds=3, quick=(2.0, 1), tools=("nginx", "wrk"))
    loads: list[float | None] = ([] if args.no_max else [None]) + [float(r) for r in args.rates.split(",") if r]
    headers = ["Connection: close"] if args.connection_close else []
    connections = "a connection per request" if args.connection_close else "keep-alive"
    settings = {}
    if args.nice is not None:
        settings["OTEL_EBPF_NICE"] = str(args.nice)
    if args.cpu_floor is not None:
        settings["OTEL_EBPF_CPU_FLOOR"] = str(args.cpu_floor)
    rows, runs = [], []
    for rate in loads:
        label = "max" if rate is None else f"{rate:,.0f}/s"
        untraced: list[Run] = []
        traced: list[Run] = []
        for n in range(args.rounds):
            for is_traced in (False, True) if n % 2 == 0 else (True, False):
                keep = (
                    args.keep / f"{'max' if rate is None else int(rate)}-{n + 1}" if args.keep and is_traced else None
                )
                run = unshared(
                    partial(measure, rate, args.duration, is_traced, keep, settings, headers),
                    lambda r: r.shared,
                    args.wait_quiet,
                    progress,
                )
                (traced if is_traced else untraced).append(run)
                runs.append({"offered": label, "round": n + 1, **asdict(run)})
                progress(
                    f"{label} round {n + 1}/{args.rounds} {'traced' if is_traced else 'untraced'}: "
                    f"{run.rps:,.0f}/s, {run.requests:,} requests"
                    + (
                        f", {run.server_spans:,} server + {run.client_spans:,} client spans, shed {run.shed:,}, "
                        f"lost {run.events_lost:,}, agent {run.agent_cpu_s:.2f} CPU-s, "
                        f"exit {run.agent_exit_s:.2f} s"
                        if is_traced
                        else ""
                    )
                )
        rows.append(summarize(label, untraced, traced))
    print(
        f"\nnginx 1 worker `return 200`, wrk -t1 -c{CONNECTIONS} {connections}, {args.rounds} round(s) of "
        f"{args.duration:g} s per load, untraced/traced alternated, medians (rates) and sums (counts); "
        f"agent: --port, file exporter, {''.join(f'{name}={value}, ' for name, value in settings.items())}"
        f"SIGINT right after the load; {os.cpu_count()} CPUs, kernel {os.uname().release}"
    )
    print_table(rows)
    print(
        "invariant: (server + client spans + shed) / (2 x requests) = 1 (both sides traced), up to 16 requests "
        "in flight per run when wrk stops; "
        "CPU µs/req: whole run less start-up (load and final flush) per request; "
        f"cores settled: the agent's CPU from {SETTLE_S:g} s into the load to its end (its budget has acted)"
    )
    write_result(
        "nginx_load_churn"
        if args.connection_close
        else "nginx_load_idle_cpu"
        if args.cpu_floor is not None
        else "nginx_load",
        None,
        {
            "parameters": {
                "duration_s": args.duration,
                "rounds": args.rounds,
                "connections": CONNECTIONS,
                "wrk_headers": list(headers),
                "loads": [("max" if r is None else r) for r in loads],
                "agent": "--port PORT --exporter file",
                "agent_nice": "default (capture.nice)" if args.nice is None else args.nice,
                "agent_cpu_floor": "default (capture.cpu_floor)" if args.cpu_floor is None else args.cpu_floor,
            },
            "loads": rows,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
