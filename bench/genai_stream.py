"""What reading LLM streams costs: token events per second through the replayed pipeline, and agent
CPU per 1,000 streamed tokens live, each beside the same work with the GenAI layer off.

Replayed (no BPF): ``tests/data/genai_events.jsonl`` (six LLM calls seen from both sides: four
25-token streams over SSE and NDJSON, a non-streamed chat completion, embeddings; recorded live)
laid end to end ``--copies`` times. Per repetition, interleaved so that drift hits both alike: the
stream through a pipeline wired as the agent's with the HTTP plugins' ``genai`` on (the default),
then off (``genai: {enabled: false}``: the same exchanges as plain HTTP). A token event is one
SSE/NDJSON event that carried output content, counted from the spans themselves
(``otel_ebpf.gen_ai.output_chunks``), so a run that lost them cannot pass for a fast one.

Per dialect (no BPF): one recorded stream of each dialect, replayed ``--dialect-reps`` times through
an HTTP/1.1 session and stitcher and made into its span and metric points, with the GenAI layer on
and off: a chat completion (the first server-side connection of the recording above, 25 tokens),
a Responses API stream and a Messages stream (``tests/protocols/data/genai/``, 8 tokens each,
recorded from the ``openai`` and ``anthropic`` clients). The cost per token event there includes
each stream's share of its other events (``response.created`` with the whole response object,
``message_start``, the usage events) and of the span, over only 8 tokens; the marginal cost of one
more token event is measured apart, by feeding each dialect's token event (as the stand-in server
writes it) to a response body tap, 7 rounds of 20,000.

Live (root and BPF): ``examples/llm_server.py`` streams ``--tokens`` tokens per request, one every
millisecond, to ``examples/llm_clients.py`` (httpx, SSE) ``--streams`` times in a row, without the
agent, then with it attached to both processes (file exporter), with the GenAI layer on and then
off. Agent CPU: utime+stime from ``/proc/<pid>/stat`` over the load plus a 0.5 s drain; each side
(server and client) sees every token, so the agent reads twice as many token events as the load
streams.

Usage: ``python bench/genai_stream.py [--copies N] [--reps R] [--dialect-reps N] [--streams N]
[--tokens N] [--quick] [--no-live]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from otel_ebpf.pipeline import Pipeline
from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import ConnData, ConnOpen
from otel_ebpf.pipeline.telemetry import Telemetry
from otel_ebpf.protocol import ConnectionInfo, Endpoint, Role, load_protocols
from otel_ebpf.protocol_testing import Chunk, load_recording, replay
from otel_ebpf.protocols.genai import Api, ResponseBody, Route
from otel_ebpf.protocols.http1 import HTTP1
from otel_ebpf.recording import read_recording
from otel_ebpf.selfmetrics import SelfMetrics

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import AGENT, REPO, cpu_seconds, wait_for
from results import write_result
from trace_assembly import laid_end_to_end, run_pipeline

RECORDING = REPO / "tests" / "data" / "genai_events.jsonl"
SERVER = [sys.executable, str(REPO / "examples" / "llm_server.py")]
CLIENTS = [sys.executable, str(REPO / "examples" / "llm_clients.py")]
DIALECT_RECORDINGS = REPO / "tests" / "protocols" / "data" / "genai"
TOKEN_EVENTS = {  # one token event of each dialect, as examples/llm_server.py writes it
    Api.OPENAI_CHAT: b'data: {"id": "cmpl-1", "object": "chat.completion.chunk", "model": "llama-3-8b-served", '
    b'"choices": [{"index": 0, "finish_reason": null, "delta": {"content": "tok1 "}}]}\n\n',
    Api.OPENAI_RESPONSES: b"event: response.output_text.delta\n"
    b'data: {"type": "response.output_text.delta", "sequence_number": 5, "item_id": "msg_1", "output_index": 0, '
    b'"content_index": 0, "delta": "tok1 ", "logprobs": []}\n\n',
    Api.ANTHROPIC_MESSAGES: b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "tok1 "}}\n\n',
}
SERVER_SIDE = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8000), Endpoint("127.0.0.1", 50000))
GENAI_OFF = {"http1": {"genai": {"enabled": False}}, "http2": {"genai": {"enabled": False}}}


def progress(message: str) -> None:
    print(f"[genai_stream] {message}", file=sys.stderr, flush=True)


def replayed(args: argparse.Namespace) -> dict:
    with RECORDING.open() as stream:
        _, events = read_recording(stream)
        events = laid_end_to_end(list(events), args.copies)
    gc.freeze()
    on, off = load_protocols(), load_protocols(options=GENAI_OFF)
    # untimed: count the token events the spans report, and warm the caches
    selfmetrics = SelfMetrics()
    telemetry = Telemetry(on, "bench-host", {}, selfmetrics)
    pipeline = Pipeline(ConnectionTracker(on, selfmetrics), telemetry, selfmetrics)
    pipeline.handle(events)
    pipeline.flush()
    spans = telemetry.take_spans()
    tokens = sum(span.attributes.get("otel_ebpf.gen_ai.output_chunks", 0) for span in spans)
    llm_spans = sum(1 for span in spans if "gen_ai.operation.name" in span.attributes)
    progress(
        f"{len(events)} events, {len(spans)} spans ({llm_spans} LLM calls), {tokens} token events; "
        f"{args.reps} repetitions ..."
    )
    times: dict[str, list[float]] = {"genai on": [], "genai off": []}
    for _ in range(args.reps):
        times["genai on"].append(run_pipeline(events, protocols=on)[0])
        times["genai off"].append(run_pipeline(events, protocols=off)[0])
    median = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"\nReplayed: {args.copies} copies of the recording, {tokens} token events, {len(spans)} spans, "
        f"median of {args.reps}"
    )
    print(f"{'pipeline':<12} {'seconds':>8} {'token events/s':>15} {'µs/token event':>15} {'ratio':>6}")
    for name, seconds in median.items():
        print(
            f"{name:<12} {seconds:8.3f} {tokens / seconds:15,.0f} {seconds / tokens * 1e6:15.2f} "
            f"{seconds / median['genai off']:6.3f}"
        )
    extra = (median["genai on"] - median["genai off"]) / tokens * 1e6
    print(f"the GenAI layer adds {extra:.2f} µs per token event (SSE/NDJSON decoding, JSON per event)")
    return {
        "copies": args.copies,
        "reps": args.reps,
        "token_events": tokens,
        "spans": len(spans),
        "pipelines": [
            {
                "pipeline": name,
                "seconds": round(seconds, 3),
                "token_events_per_s": round(tokens / seconds),
                "us_per_token_event": round(seconds / tokens * 1e6, 2),
            }
            for name, seconds in median.items()
        ],
        "genai_layer_us_per_token_event": round(extra, 2),
    }


def _chat_completion_stream() -> list[Chunk]:
    """The recording's first server-side connection (a streamed chat completion), as chunks."""
    with RECORDING.open() as source:
        _, events = read_recording(source)
        first = None
        chunks: list[Chunk] = []
        for event in events:
            if isinstance(event, ConnOpen) and event.role is Role.SERVER and first is None:
                first = event.key
            elif isinstance(event, ConnData) and event.key == first:
                chunks.append(Chunk(event.direction, event.timestamp_ns, event.data))
    return chunks


def dialects(args: argparse.Namespace) -> list[dict]:
    streams = {
        "openai chat completions": _chat_completion_stream(),
        "openai responses": load_recording(DIALECT_RECORDINGS / "openai_responses_stream.json"),
        "anthropic messages": load_recording(DIALECT_RECORDINGS / "anthropic_messages_stream.json"),
    }
    on, off = HTTP1(), HTTP1({"genai": {"enabled": False}})

    def seconds(chunks: list[Chunk], protocol: HTTP1) -> float:
        start = time.perf_counter()
        for _ in range(args.dialect_reps):
            for exchange in replay(chunks, Role.SERVER, protocol).exchanges:
                exchange.span(SERVER_SIDE)
                exchange.metric_points(SERVER_SIDE)
        return time.perf_counter() - start

    print(f"\nPer dialect: one recorded stream replayed {args.dialect_reps} times, span and points included")
    print(f"{'dialect':<24} {'token events':>12} {'µs/stream on':>13} {'off':>8} {'µs/token event added':>21}")
    rows = []
    for name, chunks in streams.items():
        exchange = replay(chunks, Role.SERVER, on).exchanges[0]
        tokens = exchange.span(SERVER_SIDE).attributes["otel_ebpf.gen_ai.output_chunks"]
        seconds(chunks, on)  # warm the caches
        timed = [(seconds(chunks, on), seconds(chunks, off)) for _ in range(5)]
        with_genai = statistics.median(t[0] for t in timed) / args.dialect_reps * 1e6
        without = statistics.median(t[1] for t in timed) / args.dialect_reps * 1e6
        added = (with_genai - without) / tokens
        print(f"{name:<24} {tokens:12d} {with_genai:13.1f} {without:8.1f} {added:21.2f}")
        rows.append(
            {
                "dialect": name,
                "token_events": tokens,
                "us_per_stream_genai_on": round(with_genai, 1),
                "us_per_stream_genai_off": round(without, 1),
                "genai_us_per_token_event": round(added, 2),
            }
        )
    print(f"\n{'one more token event':<24} {'µs, tap only (median)':>22} {'fastest':>8}")
    for api, event in TOKEN_EVENTS.items():
        rounds = []
        for _ in range(7):  # rounds of 20,000 events: the median and the fastest say how noisy it was
            tap = ResponseBody(Route(api, "bench"), [("content-type", "text/event-stream")])
            start = time.perf_counter()
            for i in range(20_000):
                tap.feed(event, i)
            rounds.append((time.perf_counter() - start) / 20_000 * 1e6)
            if tap.finish().chunks != 20_000:
                raise SystemExit(f"{api.value}: the tap did not count every token event")
        median, fastest = statistics.median(rounds), min(rounds)
        print(f"{api.value:<24} {median:22.2f} {fastest:8.2f}")
        rows.append(
            {"dialect": api.value, "tap_us_per_token_event": round(median, 2), "tap_fastest_us": round(fastest, 2)}
        )
    return rows


def stream(port: int, streams: int, tokens: int) -> float:
    """Seconds for ``streams`` streamed chat completions in a row; every one must bring all tokens."""
    clients = subprocess.Popen(
        [
            *CLIENTS,
            str(port),
            "--only",
            "httpx_chat_stream",
            "--repeat",
            str(streams),
            "--tokens",
            str(tokens),
            "--wait",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert clients.stdout is not None and clients.stdout.readline() == "ready\n"
    start = time.perf_counter()
    out, _ = clients.communicate("go\n", timeout=600)
    seconds = time.perf_counter() - start
    got = [json.loads(line)["chunks"] for line in out.splitlines()]
    if clients.returncode != 0 or got != [tokens] * streams:
        raise SystemExit(f"clients: {got} (exit {clients.returncode})")
    return seconds


def traced(port: int, server_pid: int, args: argparse.Namespace, tmp: Path, genai: bool) -> tuple[float, float, int]:
    """(load seconds, agent CPU seconds, token events the spans report) with the agent attached."""
    output, ready, log, config = tmp / f"out-{genai}", tmp / f"ready-{genai}", tmp / f"log-{genai}", tmp / "off.yaml"
    config.write_text(json.dumps({"protocols": GENAI_OFF}))
    agent_cmd = [
        *AGENT,
        "run",
        f"--pid={server_pid}",
        "--exporter",
        "file",
        "--output",
        str(output),
        "--ready-file",
        str(ready),
        *([] if genai else ["--config", str(config)]),
    ]
    # the clients process must exist before the agent, to be traced by pid: start it, then attach
    clients = subprocess.Popen(
        [
            *CLIENTS,
            str(port),
            "--only",
            "httpx_chat_stream",
            "--repeat",
            str(args.streams),
            "--tokens",
            str(args.tokens),
            "--wait",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert clients.stdout is not None and clients.stdout.readline() == "ready\n"
    with log.open("w") as stderr:
        agent = subprocess.Popen([*agent_cmd, f"--pid={clients.pid}"], cwd=REPO, stderr=stderr)
    try:
        wait_for(ready, agent, "the agent", log)
        cpu_before = cpu_seconds(agent.pid)
        start = time.perf_counter()
        out, _ = clients.communicate("go\n", timeout=600)
        seconds = time.perf_counter() - start
        time.sleep(0.5)  # let the agent drain the ring buffer
        cpu = cpu_seconds(agent.pid) - cpu_before
        if clients.returncode != 0:
            raise SystemExit(f"clients failed: {out}")
    finally:
        agent.send_signal(signal.SIGINT)
        if agent.wait(timeout=120) != 0:
            raise SystemExit(f"agent failed ({agent.returncode}):\n{log.read_text()}")
    sys.path.insert(0, str(REPO))
    from tests.otlp_receiver import load_file_spans

    spans = load_file_spans(output)
    return seconds, cpu, sum(s["attributes"].get("otel_ebpf.gen_ai.output_chunks", 0) for s in spans)


def live(args: argparse.Namespace) -> dict | None:
    if os.geteuid() != 0:
        print("\nLive: skipped, attaching the agent's eBPF programs needs root")
        return None
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = subprocess.Popen(
            [*SERVER, str(tmp / "port"), "--first-token-ms", "0", "--token-ms", "1"], stdout=subprocess.DEVNULL
        )
        try:
            port = int(wait_for(tmp / "port", server, "the LLM server"))
            progress("warm-up, then the streams without the agent ...")
            stream(port, 2, args.tokens)
            bare = stream(port, args.streams, args.tokens)
            progress("the streams with the agent, GenAI layer on ...")
            on = traced(port, server.pid, args, tmp, genai=True)
            progress("the streams with the agent, GenAI layer off ...")
            off = traced(port, server.pid, args, tmp, genai=False)
        finally:
            server.terminate()
            server.wait(timeout=30)
    tokens = args.streams * args.tokens
    print(
        f"\nLive: {args.streams} streams x {args.tokens} tokens (one per ms), httpx SSE client, agent on server "
        f"+ client (file exporter); {2 * tokens} token events seen by the agent when it reads them"
    )
    print(f"{'':<22} {'tokens/s':>9} {'ratio':>6} {'agent CPU s':>12} {'CPU ms / 1k tokens':>19} {'token events':>13}")
    print(f"{'without agent':<22} {tokens / bare:9.0f} {1:6.3f}")
    for name, (seconds, cpu, seen) in (("agent, genai on", on), ("agent, genai off", off)):
        print(
            f"{name:<22} {tokens / seconds:9.0f} {bare / seconds:6.3f} {cpu:12.2f} {cpu / tokens * 1e6:19.1f} "
            f"{seen:13d}"
        )
    if on[2] != 2 * tokens:
        raise SystemExit(f"the agent reported {on[2]} token events, not {2 * tokens}")
    return {
        "streams": args.streams,
        "tokens_per_stream": args.tokens,
        "untraced_tokens_per_s": round(tokens / bare),
        "runs": [
            {
                "run": name,
                "tokens_per_s": round(tokens / seconds),
                "ratio": round(bare / seconds, 3),
                "agent_cpu_s": round(cpu, 2),
                "agent_cpu_ms_per_1k_tokens": round(cpu / tokens * 1e6, 1),
                "token_events_seen": seen,
            }
            for name, (seconds, cpu, seen) in (("agent, genai on", on), ("agent, genai off", off))
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=200, help="copies of the recording per repetition")
    parser.add_argument("--reps", type=int, default=7, help="replayed repetitions")
    parser.add_argument("--dialect-reps", type=int, default=2000, help="replays of each dialect's stream")
    parser.add_argument("--streams", type=int, default=20, help="live: streamed completions per load")
    parser.add_argument("--tokens", type=int, default=500, help="live: tokens per stream")
    parser.add_argument("--quick", action="store_true", help="short run: 40 copies, 3 reps, 5 streams")
    parser.add_argument("--no-live", action="store_true", help="the replayed part only")
    args = parser.parse_args()
    if args.quick:
        args.copies, args.reps, args.streams, args.dialect_reps = 40, 3, 5, 300
    figures = {"replayed": replayed(args), "dialects": dialects(args)}
    if not args.no_live:
        figures["live"] = live(args)
    write_result("genai_stream", None, figures)


if __name__ == "__main__":
    main()
