"""Shared pieces of the live benchmarks: the agent as a measured child process, ``wrk``, and what
the agent wrote (spans counted by process, kind and status; metric totals that respect temporality).

- :class:`Agent` starts ``otel-ebpf run`` as a child of the benchmark, waits for its ready file,
  stops it with SIGINT and reaps it with ``os.wait4``: CPU (utime + stime) and peak RSS of the
  whole run, start-up and final flush included, and how long it took to exit after the signal.
- :func:`wrk` runs ``wrk`` (``-t1``) and parses requests, non-2xx answers, socket errors and
  latency percentiles; paced either closed-loop (``delay_ms`` between a connection's requests) or
  on a fixed schedule (``rate`` requests/s for the whole run): see ``bench/paced.lua``.
- :class:`Watch` samples a process's RSS under load and notes other processes holding BPF
  programs (another agent or a live test on a shared machine: their probes fire here too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, "-m", "otel_ebpf.cli"]  # the venv's otel-ebpf
PACING_SCRIPT = Path(__file__).with_name("paced.lua")
CLK_TCK = os.sysconf("SC_CLK_TCK")
SPAN_KIND = {"SERVER": 2, "CLIENT": 3}
STATUS_ERROR = 2

T = TypeVar("T")


def parse_live_args(
    parser: argparse.ArgumentParser,
    *,
    duration: float,
    rounds: int,
    quick: tuple[float, int],
    wait_quiet: float = 60,
    tools: Iterable[str] = ("wrk",),
) -> argparse.Namespace:
    """The options every live benchmark has (``--duration``, ``--rounds``, ``--wait-quiet``,
    ``--quick``), parsed; then root and the needed tools checked."""
    parser.add_argument("--duration", type=float, default=duration, help="seconds of load (or idling) per run")
    parser.add_argument("--rounds", type=int, default=rounds, help="rounds, each measuring every variant once")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=wait_quiet,
        help="seconds to wait before a run for other processes holding BPF programs to end",
    )
    parser.add_argument("--quick", action="store_true", help=f"short run: {quick[0]:g} s, {quick[1]} round(s)")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds = quick
    if os.geteuid() != 0:
        raise SystemExit("the benchmark attaches eBPF programs: run it as root")
    for tool in tools:
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: run scripts/bootstrap.sh (it installs the Debian package {tool})")
    return args


def cpu_seconds(pid: int) -> float:
    """utime + stime of a running process so far (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_mb(pid: int, field: str) -> float:
    """A ``/proc/<pid>/status`` size field (VmRSS, VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_for(path: Path, proc: subprocess.Popen, what: str, log: Path | None = None, timeout: float = 120) -> str:
    """Wait until ``path`` exists and is not empty; fail if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and (text := path.read_text().strip()) != ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up (exit {proc.poll()})\n{log.read_text() if log else ''}")
        time.sleep(0.02)
    return text


def kill(proc: subprocess.Popen) -> None:
    """Kill and reap ``proc`` unless it has exited already."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} is not listening on port {port} (exit {proc.poll()})") from None
            time.sleep(0.02)


def program_stats(bpf: Any) -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) of every program a BCC object loaded, by its name less BCC's prefix
    (``tracepoint__tcp__tcp_probe`` -> ``tcp__tcp_probe``, ``raw_tracepoint__sock_recv_length`` ->
    ``sock_recv_length``). The kernel counts only while
    ``kernel.bpf_stats_enabled`` is 1."""
    stats = {}
    for name, function in bpf.funcs.items():
        fields = dict(
            line.split(":\t", 1) for line in Path(f"/proc/self/fdinfo/{function.fd}").read_text().splitlines()
        )
        label = name.decode()
        for prefix in ("tracepoint__", "raw_tracepoint__", "uprobe__", "uretprobe__"):
            label = label.removeprefix(prefix)
        stats[label] = (int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0)))
    return stats


def program_runs(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """(ns, runs) of each program between two :func:`program_stats`, for those that ran."""
    return {
        name: (time_ns - before[name][0], runs - before[name][1])
        for name, (time_ns, runs) in after.items()
        if runs > before[name][1]
    }


def bpf_holders() -> set[int]:
    """Processes holding BPF programs (fds to ``anon_inode:bpf-prog``)."""
    pids = set()
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == "anon_inode:bpf-prog" for fd in fds.iterdir()):
                pids.add(int(fds.parent.name))
        except OSError:
            continue
    return pids


class Watch(threading.Thread):
    """Twice a second until stopped: the agent's VmRSS (``peak``, ``samples``) and CPU seconds so
    far (``cpu``: (monotonic time, CPU seconds), the first taken at the start), and other
    processes holding BPF programs (``others``)."""

    def __init__(self, agent: int | None) -> None:
        super().__init__(daemon=True)
        self.agent, self.peak, self.samples = agent, 0.0, list[float]()
        self.cpu = [(time.monotonic(), cpu_seconds(agent))] if agent else []
        self.others, self.stop = set[int](), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.others |= bpf_holders() - {self.agent}
            if self.agent:
                try:
                    rss = status_mb(self.agent, "VmRSS")
                    self.cpu.append((time.monotonic(), cpu_seconds(self.agent)))
                except OSError:
                    return
                self.samples.append(rss)
                self.peak = max(self.peak, rss)

    def cores_after(self, seconds: float) -> float:
        """The agent's CPU, in cores, from ``seconds`` after the start to the last sample: what
        it settles at once its CPU budget has acted (0.0 without samples that late)."""
        late = [(t, cpu) for t, cpu in self.cpu if t - self.cpu[0][0] >= seconds] if self.cpu else []
        if len(late) < 2:
            return 0.0
        return (late[-1][1] - late[0][1]) / (late[-1][0] - late[0][0])

    def finish(self) -> Watch:
        self.stop.set()
        self.join()
        return self


def unshared(
    measure: Callable[[], T],
    shared: Callable[[T], Iterable[int]],
    wait_s: float,
    progress: Callable[[str], None],
    attempts: int = 3,
) -> T:
    """``measure()``, first waiting up to ``wait_s`` for other BPF users to end, and again (up to
    ``attempts`` times) while one shared the run; the last run stands, its ``shared`` noted."""
    for _ in range(attempts):
        deadline = time.monotonic() + wait_s
        if others := bpf_holders():
            progress(f"  waiting up to {wait_s:.0f} s for other BPF users to end: pids {sorted(others)}")
        while bpf_holders() and time.monotonic() < deadline:
            time.sleep(2)
        run = measure()
        if not list(shared(run)):
            break
        progress(f"  other processes held BPF programs during the load: pids {sorted(shared(run))}")
    return run


# --- wrk ---


@dataclass
class WrkRun:
    """What wrk reports; benchmarks' own run records extend it."""

    requests: int  # completed (wrk leaves out those in flight when it stops)
    rps: float
    non_2xx: int  # "Non-2xx or 3xx responses"
    socket_errors: int  # connect + read + write + timeout
    p50_ms: float
    p99_ms: float
    wrk_pid: int = 0  # its connections are the CLIENT side


def _wrk_ms(out: str, percentile: str) -> float:
    match = re.search(rf"^\s*{percentile}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
    if not match:
        return float("nan")
    value, unit = match.groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def wrk(
    url: str,
    seconds: float,
    connections: int,
    *,
    rate: float | None = None,
    delay_ms: int | None = None,
    on_start: Callable[[int], None] | None = None,
    headers: Sequence[str] = (),
) -> WrkRun:
    """One ``wrk -t1`` run of keep-alive GETs. ``rate``: a fixed schedule of that many requests/s
    (open loop, as wrk2); ``delay_ms``: each connection waits that long between its requests
    (closed loop); neither: as fast as possible. ``on_start(pid)`` is called once wrk is running.
    ``headers`` (``"Name: value"``) go into every request (``Connection: close``: a connection per
    request)."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", url]
    for header in headers:
        command[1:1] = ["-H", header]
    env = dict(os.environ)
    if rate is not None or delay_ms is not None:
        command[1:1] = ["-s", str(PACING_SCRIPT)]
        env["WRK_RATE" if rate is not None else "WRK_DELAY_MS"] = str(rate if rate is not None else delay_ms)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if on_start:
        on_start(proc.pid)
    out, err = proc.communicate()
    if proc.returncode != 0 or "requests in" not in out:
        raise SystemExit(f"wrk failed ({proc.returncode}): {err}{out}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non_2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    return WrkRun(
        int(re.search(r"(\d+) requests in", out).group(1)),
        float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        non_2xx,
        errors,
        _wrk_ms(out, "50"),
        _wrk_ms(out, "99"),
        proc.pid,
    )


# --- the agent as a measured child ---


@dataclass
class AgentUsage:
    startup_s: float  # start to ready file (BCC compiles and attaches)
    cpu_startup_s: float  # CPU until ready
    cpu_total_s: float  # whole run, final flush included (os.wait4: utime + stime)
    maxrss_mb: float  # peak RSS of the whole run (ru_maxrss: BCC's compile included)
    exit_s: float  # SIGINT to exit
    returncode: int


class Agent:
    """``otel-ebpf run ARGS --exporter file --output OUT --ready-file`` as a child (``export``, when
    given, replaces the file exporter's arguments; ``OUT`` still names its log and ready file); a
    context manager that kills it if :meth:`stop` was not reached."""

    def __init__(
        self, args: list[str], out: Path, env: dict[str, str] | None = None, export: list[str] | None = None
    ) -> None:
        self.out, self.log, self.ready = out, out.with_name(out.name + ".log"), out.with_name(out.name + ".ready")
        self.args, self.env = args, env
        self.export = ["--exporter", "file", "--output", str(out)] if export is None else export
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Agent:
        start = time.monotonic()
        with self.log.open("w") as stderr:
            self.proc = subprocess.Popen(
                [
                    *AGENT,
                    "run",
                    *self.args,
                    *self.export,
                    "--ready-file",
                    str(self.ready),
                ],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=self.env,
            )
        wait_for(self.ready, self.proc, "the agent", self.log)
        self.startup_s, self.cpu_startup_s = time.monotonic() - start, cpu_seconds(self.proc.pid)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 120) -> AgentUsage:
        """SIGINT, then reap with ``os.wait4``; killed (exit_s = timeout) if it has not exited by then."""
        assert self.proc is not None and self.proc.returncode is None
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - sent > timeout:
                self.proc.kill()
                pid, status, usage = os.wait4(self.proc.pid, 0)
                break
            time.sleep(0.005)
        exit_s = time.monotonic() - sent
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        if self.proc.returncode != 0:
            raise SystemExit(f"agent failed ({self.proc.returncode}):\n{self.log.read_text()[-4000:]}")
        return AgentUsage(
            self.startup_s,
            self.cpu_startup_s,
            usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss / 1024,
            exit_s,
            self.proc.returncode,
        )

    def __exit__(self, *exc_info: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            kill(self.proc)


# --- what the agent wrote ---


def file_spans(traces: Path) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """Each span in a file exporter's ``traces.jsonl`` with its resource's ``process.pid``, read
    straight from the OTLP JSON (millions of spans: no protobuf round trip)."""
    if not traces.exists():
        return
    with traces.open() as f:
        for line in f:
            for rs in json.loads(line).get("resourceSpans", []):
                pid = next(
                    (
                        int(a["value"]["intValue"])
                        for a in rs.get("resource", {}).get("attributes", [])
                        if a["key"] == "process.pid"
                    ),
                    None,
                )
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        yield pid, span


def span_counts(traces: Path) -> Counter[tuple[int | None, int, int, bool]]:
    """Spans in a file exporter's ``traces.jsonl`` by (resource ``process.pid``, kind, status code,
    ended by its process's exit: ``otel_ebpf.process.exited``)."""
    counts: Counter[tuple[int | None, int, int, bool]] = Counter()
    for pid, span in file_spans(traces):
        exited = any(
            a["key"] == "otel_ebpf.process.exited" and a["value"].get("boolValue") for a in span.get("attributes", [])
        )
        counts[(pid, span.get("kind", 0), span.get("status", {}).get("code", 0), exited)] += 1
    return counts


def _key(attributes: dict[str, Any]) -> str:
    return json.dumps(attributes, sort_keys=True, default=str)


def metric_total(points: list[dict[str, Any]], where: Callable[[dict[str, Any]], bool] = lambda p: True) -> float:
    """The total a sum or histogram (its ``count``) reached over the run, over the points of
    ``tests.otlp_receiver.load_file_metrics`` that ``where`` accepts: DELTA points add up;
    CUMULATIVE ones count by their latest point per series (resource, attributes, start time)."""
    total = 0.0
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for p in points:
        if not where(p):
            continue
        if p.get("temporality") == "DELTA":
            total += p["count"] if p["type"] == "histogram" else p["value"]
        else:
            series = (_key(p["resource"]), _key(p["attributes"]), p["start_ns"])
            if series not in latest or p["time_ns"] >= latest[series]["time_ns"]:
                latest[series] = p
    return total + sum(p["count"] if p["type"] == "histogram" else p["value"] for p in latest.values())


def self_counter(metrics: dict[str, list[dict[str, Any]]], name: str) -> int:
    """An agent self-metric's total over all its attribute sets; 0 when the agent never reported it."""
    return int(metric_total(metrics.get(name, [])))


def load_metrics(out: Path) -> dict[str, list[dict[str, Any]]]:
    """``load_file_metrics`` of the tests' OTLP receiver (the same flattening the tests assert on)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.otlp_receiver import load_file_metrics

    return load_file_metrics(out) if (out / "metrics.jsonl").exists() else {}


def timed_bursts(proc: subprocess.Popen, burst: int, count: int, pause_s: float) -> list[float]:
    """``count`` bursts of ``burst`` iterations of a driver that reads a burst size on stdin and
    answers "<elapsed ns> <errors>": ns per iteration of each, ``pause_s`` apart."""
    results = []
    for _ in range(count):
        proc.stdin.write(f"{burst}\n")
        proc.stdin.flush()
        elapsed, errors = proc.stdout.readline().split()
        assert errors == "0", f"{errors} calls failed"
        results.append(int(elapsed) / burst)
        time.sleep(pause_s)
    return results


def print_columns(rows: list[list[str]]) -> None:
    """Rows of cells as aligned columns: the first to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
        )


def kernel_drops(metrics: dict[str, list[dict[str, Any]]], prefix: str) -> dict[str, float]:
    """``otel_ebpf.kernel.drops`` by reason, for the reasons of one probe (``gpu_``, ``verbs_``)."""
    return {
        p["attributes"]["reason"]: p["value"]
        for p in metrics.get("otel_ebpf.kernel.drops", [])
        if p["attributes"]["reason"].startswith(prefix)
    }
