"""Trace assembly's cost: alone, within the replayed pipeline, and in a live agent, in one run.

Replayed (no BPF): ``tests/data/trace_chain_events.jsonl`` (16 three-hop requests, 80 exchanges,
recorded live, arriving out of order) laid end to end ``--copies`` times, each copy later and on
connection generations of its own. An untimed pass through a pipeline wired as the agent's
(``ConnectionTracker`` with the installed plugins) checks the traces and notes every assembler
call: ``start`` per ``RequestStart``, ``finish`` per exchange (``start_ns`` of its span description
computed there), ``expire`` per batch. Then per repetition, interleaved so drift hits all alike:
``pipeline`` (the stream in ``REPLAY_BATCH`` batches, spans taken after each, then ``flush``), the
same with ``EventReorderer(window_ns=0)`` (never holds events: its trace column shows what holding
buys), ``EventReorderer.push`` alone over the same batches, and the noted calls alone replayed into
a fresh ``TraceAssembler``. Figures: median, best, spread = (max - min) / median.

Live (root and BPF): the three ``examples/trace_chain.py`` servers get the same load from its
loader (``--wait``: timed from the first request) without, then with the agent attached to all
three (file exporter). Agent CPU: utime+stime from ``/proc/<pid>/stat`` before the load and after
it plus a 0.5 s drain. The spans written are checked, one trace of exactly 5 spans per request, so
a broken run cannot pass for a cheap one.

Usage: ``python bench/trace_assembly.py [--copies N] [--reps R] [--requests N] [--concurrency C]
[--quick] [--no-live]``
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from otel_ebpf.agent import REPLAY_BATCH
from otel_ebpf.pipeline import Pipeline
from otel_ebpf.pipeline.assembly import TraceAssembler
from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import Event, ProcessExit, ProcessInfo
from otel_ebpf.pipeline.reorder import EventReorderer
from otel_ebpf.pipeline.telemetry import Telemetry
from otel_ebpf.protocol import Protocol, load_protocols
from otel_ebpf.recording import read_recording
from otel_ebpf.selfmetrics import SelfMetrics

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import AGENT, REPO, cpu_seconds, load_metrics, self_counter, wait_for
from results import write_result

RECORDING = REPO / "tests" / "data" / "trace_chain_events.jsonl"
CHAIN = [sys.executable, str(REPO / "examples" / "trace_chain.py")]
SPANS_PER_REQUEST = 5  # gateway SERVER, gateway CLIENT, service SERVER, service CLIENT, backend SERVER
GENERATION_STRIDE = 1_000_000  # connection generations of copy c: recorded + c * stride
Call = tuple[str, tuple[Any, ...]]  # (TraceAssembler method, its arguments)


def progress(message: str) -> None:
    print(f"[trace_assembly] {message}", file=sys.stderr, flush=True)


def complete_traces(trace_ids: Iterable[int]) -> int:
    """How many traces hold exactly SPANS_PER_REQUEST spans."""
    return sum(1 for n in Counter(trace_ids).values() if n == SPANS_PER_REQUEST)


def batched(events: list[Event]) -> list[list[Event]]:
    return [events[i : i + REPLAY_BATCH] for i in range(0, len(events), REPLAY_BATCH)]


def laid_end_to_end(events: list[Event], copies: int) -> list[Event]:
    """``copies`` of the recording's connections one after another (ProcessInfo once, ProcessExit
    never), arrival order kept."""
    shift = max(e.timestamp_ns for e in events) - min(e.timestamp_ns for e in events) + 1_000_000
    stream = [e for e in events if isinstance(e, ProcessInfo)]
    for c in range(copies):
        stream += [
            dataclasses.replace(
                e, timestamp_ns=e.timestamp_ns + c * shift, generation=e.generation + c * GENERATION_STRIDE
            )
            for e in events
            if not isinstance(e, (ProcessInfo, ProcessExit))
        ]
    return stream


class NotingAssembler(TraceAssembler):
    """A TraceAssembler that notes every call the pipeline makes to it."""

    def __init__(self, selfmetrics: SelfMetrics) -> None:
        super().__init__(selfmetrics)
        self.calls: list[Call] = []

    def start(self, *args: Any) -> None:
        self.calls.append(("start", args))
        super().start(*args)

    def finish(self, *args: Any) -> Any:
        self.calls.append(("finish", args))
        return super().finish(*args)

    def expire(self, now_ns: int) -> None:
        self.calls.append(("expire", (now_ns,)))
        super().expire(now_ns)


def run_pipeline(
    events: list[Event],
    window_ns: int | None = None,
    assembler: TraceAssembler | None = None,
    protocols: list[Protocol] | None = None,
) -> tuple[float, list[int]]:
    """Seconds through a fresh pipeline (``window_ns`` None: the default reorder window; ``protocols``
    None: the installed plugins with default options) and the trace id of every span. Unlike
    ``pipeline_replay.run_pipeline`` it flushes at the end: without, the spans still held in the
    reorder window never come out."""
    selfmetrics = SelfMetrics()
    protocols = load_protocols() if protocols is None else protocols
    telemetry = Telemetry(protocols, "bench-host", {}, selfmetrics)
    reorderer = None if window_ns is None else EventReorderer(selfmetrics, window_ns=window_ns)
    pipeline = Pipeline(ConnectionTracker(protocols, selfmetrics), telemetry, selfmetrics, assembler, reorderer)
    batches = batched(events)
    trace_ids: list[int] = []  # not the spans: holding a whole run of them would load the GC
    start = time.perf_counter()
    for batch in batches:
        pipeline.handle(batch)
        trace_ids += [span.context.trace_id for span in telemetry.take_spans()]
    pipeline.flush()
    trace_ids += [span.context.trace_id for span in telemetry.take_spans()]
    return time.perf_counter() - start, trace_ids


def run_reorder(events: list[Event]) -> tuple[float, list[int]]:
    reorderer, batches = EventReorderer(SelfMetrics()), batched(events)
    start = time.perf_counter()
    for batch in batches:
        reorderer.push(batch)
    reorderer.release_before()
    return time.perf_counter() - start, []


def run_assembly(calls: list[Call]) -> tuple[float, list[int]]:
    """Seconds for the noted calls into a fresh assembler, and the trace id of every exchange."""
    assembler = TraceAssembler(SelfMetrics())
    plan = [(getattr(assembler, name), args) for name, args in calls]
    start = time.perf_counter()
    results = [method(*args) for method, args in plan]
    seconds = time.perf_counter() - start
    return seconds, [context.trace_id for context in results if context is not None]


def replayed(args: argparse.Namespace) -> dict:
    with RECORDING.open() as f:
        stream = laid_end_to_end(list(read_recording(f)[1]), args.copies)
    noting = NotingAssembler(SelfMetrics())
    _, traced = run_pipeline(stream, assembler=noting)  # untimed: notes the calls, warms up
    calls = noting.calls
    exchanges = sum(1 for name, _ in calls if name == "finish")
    requests = exchanges // SPANS_PER_REQUEST
    gc.collect()
    gc.freeze()  # the inputs: the live agent never holds a whole run of them
    progress(f"{len(stream)} events, {exchanges} exchanges; {args.reps} repetitions ...")
    measures: dict[str, Callable[[], tuple[float, list[int]]]] = {
        "pipeline (default reorderer)": lambda: run_pipeline(stream),
        "pipeline, window_ns=0": lambda: run_pipeline(stream, window_ns=0),
        "reordering alone": lambda: run_reorder(stream),
        "assembly alone": lambda: run_assembly(calls),
    }
    times: dict[str, list[float]] = {name: [] for name in measures}
    traces = dict.fromkeys(measures, requests)  # the worst repetition's
    for rep in range(args.reps):
        for name, measure in measures.items():
            seconds, trace_ids = measure()
            times[name].append(seconds)
            traces[name] = min(traces[name], complete_traces(trace_ids))
        progress(f"  repetition {rep + 1}/{args.reps}: pipeline {times['pipeline (default reorderer)'][-1]:.3f} s")
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    pipeline = medians["pipeline (default reorderer)"]
    both = medians["assembly alone"] + medians["reordering alone"]

    print(
        f"\nReplayed: {RECORDING.name} x {args.copies} = {requests} requests, {exchanges} exchanges, "
        f"median of {args.reps} interleaved repetitions (untimed pass: {complete_traces(traced)}/{requests} "
        f"traces of 5 spans)"
    )
    print(
        f"{'measure':<30} {'µs/exch':>8} {'best':>7} {'spread':>7} {'exch/s':>9} {'of pipeline':>12} "
        f"{'5-span traces':>14}"
    )
    for name, seconds in times.items():
        check = "-" if name == "reordering alone" else f"{traces[name]}/{requests}"
        print(
            f"{name:<30} {medians[name] / exchanges * 1e6:8.2f} {min(seconds) / exchanges * 1e6:7.2f} "
            f"{(max(seconds) - min(seconds)) / medians[name]:7.1%} {exchanges / medians[name]:9,.0f} "
            f"{medians[name] / pipeline:12.1%} {check:>14}"
        )
    print(
        f"{'assembly + reordering':<30} {both / exchanges * 1e6:8.2f} {'':>15} {exchanges / both:9,.0f} "
        f"{both / pipeline:12.1%}"
    )
    return {
        "requests": requests,
        "exchanges": exchanges,
        "reps": args.reps,
        "measures": [
            {
                "measure": name,
                "us_per_exchange": round(medians[name] / exchanges * 1e6, 2),
                "best_us": round(min(seconds) / exchanges * 1e6, 2),
                "exchanges_per_s": round(exchanges / medians[name]),
                "of_pipeline": round(medians[name] / pipeline, 3),
                "complete_traces": None if name == "reordering alone" else f"{traces[name]}/{requests}",
            }
            for name, seconds in times.items()
        ],
    }


def load(port: int, requests: int, concurrency: int) -> float:
    """Requests/s of one loader run; every request must get a 200."""
    loader = subprocess.Popen(
        [
            *CHAIN,
            "load",
            f"http://127.0.0.1:{port}",
            "--requests",
            str(requests),
            "--concurrency",
            str(concurrency),
            "--wait",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert loader.stdout is not None and loader.stdout.readline() == "ready\n"
    start = time.perf_counter()
    out, _ = loader.communicate("go\n", timeout=600)
    seconds = time.perf_counter() - start
    ok = sum(1 for line in out.splitlines() if json.loads(line).get("status") == 200)
    if loader.returncode != 0 or ok != requests:
        raise SystemExit(f"loader: {ok}/{requests} requests answered 200 (exit {loader.returncode})")
    return requests / seconds


def live(args: argparse.Namespace) -> dict | None:
    if os.geteuid() != 0:
        print("\nLive: skipped, attaching the agent's eBPF programs needs root")
        return None
    sys.path.insert(0, str(REPO))
    from tests.otlp_receiver import load_file_spans

    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        output, ready, log = Path(tmp) / "out", Path(tmp) / "agent.ready", Path(tmp) / "agent.log"
        try:
            port: int | None = None
            for name in ("backend", "service", "gateway"):
                downstream = [] if port is None else ["--next", f"http://127.0.0.1:{port}"]
                procs.append(subprocess.Popen([*CHAIN, "serve", name, f"{tmp}/{name}.port", *downstream]))
                port = int(wait_for(Path(tmp) / f"{name}.port", procs[-1], f"the {name} server"))
            assert port is not None
            progress("warm-up, then the load without the agent ...")
            load(port, min(200, args.requests), args.concurrency)
            untraced_rps = load(port, args.requests, args.concurrency)
            progress("starting the agent ...")
            with log.open("w") as stderr:
                agent = subprocess.Popen(
                    [
                        *AGENT,
                        "run",
                        *(f"--pid={p.pid}" for p in procs),
                        "--exporter",
                        "file",
                        "--output",
                        str(output),
                        "--ready-file",
                        str(ready),
                    ],
                    cwd=REPO,
                    stderr=stderr,
                )
            procs.append(agent)
            wait_for(ready, agent, "the agent", log)
            progress("the load with the agent ...")
            cpu_before = cpu_seconds(agent.pid)
            traced_rps = load(port, args.requests, args.concurrency)
            time.sleep(0.5)  # let the agent drain the ring buffer
            cpu = cpu_seconds(agent.pid) - cpu_before
            agent.send_signal(signal.SIGINT)
            if agent.wait(timeout=120) != 0:
                raise SystemExit(f"agent failed ({agent.returncode}):\n{log.read_text()}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=30)
        spans = load_file_spans(output)
        shed = self_counter(load_metrics(output), "otel_ebpf.spans.shed")
    traces, per_request = complete_traces(span["trace_id"] for span in spans), cpu / args.requests
    print(
        f"\nLive: {args.requests} three-hop requests ({SPANS_PER_REQUEST} exchanges each), concurrency "
        f"{args.concurrency}, agent on gateway + service + backend, file exporter"
    )
    print(f"{'':<14} {'req/s':>7} {'ratio':>6} {'agent CPU ms / 1k req':>22} {'µs/exch':>8} {'5-span traces':>14}")
    print(f"{'without agent':<14} {untraced_rps:7.0f} {1:6.3f}")
    print(
        f"{'with agent':<14} {traced_rps:7.0f} {traced_rps / untraced_rps:6.3f} {per_request * 1e6:22.0f} "
        f"{per_request / SPANS_PER_REQUEST * 1e6:8.1f} {f'{traces}/{args.requests}':>14}"
    )
    print(
        f"(agent CPU {cpu:.2f} s in {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms ticks; {len(spans)} spans written, "
        f"{shed} exchanges shed)"
    )
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "untraced_rps": round(untraced_rps),
        "traced_rps": round(traced_rps),
        "ratio": round(traced_rps / untraced_rps, 3),
        "agent_cpu_ms_per_1k_requests": round(per_request * 1e6),
        "complete_traces": f"{traces}/{args.requests}",
        "spans": len(spans),
        "spans_shed": shed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=250, help="copies of the recording per repetition")
    parser.add_argument("--reps", type=int, default=9, help="replayed repetitions")
    parser.add_argument("--requests", type=int, default=3000, help="live: three-hop requests per load")
    parser.add_argument("--concurrency", type=int, default=8, help="live: loader threads")
    parser.add_argument("--quick", action="store_true", help="short run: 40 copies, 3 reps, 500 requests")
    parser.add_argument("--no-live", action="store_true", help="the replayed part only")
    args = parser.parse_args()
    if args.quick:
        args.copies, args.reps, args.requests = 40, 3, 500
    figures = {"replayed": replayed(args)}
    if not args.no_live:
        figures["live"] = live(args)
    write_result("trace_assembly", None, figures)


if __name__ == "__main__":
    main()
