"""CPU per HTTP/1.1 exchange through the real user-space pipeline, and the protocol plugin's share.

Builds, in memory, the event stream the probe hands over while ``wrk`` loads a Python
``http.server`` JSON service with keep-alive (``bench/http_load.py``): one ``ProcessInfo``, a
``ConnOpen`` per connection, then per exchange one ``ConnData`` with the request exactly as wrk
sends it and one with the whole response (status line, ``Server``, ``Date``, ``Content-Type``,
``Content-Length``, body) as one buffered write. Then, per repetition:

``pipeline``
    the stream through ``ConnectionTracker`` + ``Telemetry`` + ``Pipeline`` with the installed
    protocol plugins, wired as ``otel_ebpf/agent.py`` does, in batches of ``REPLAY_BATCH``
    events, taking the spans after each batch (no exporter);
``plugin``
    the same data events straight through the HTTP/1 plugin, each stage timed on its own, batch
    by batch: ``session.feed`` for every syscall, ``stitcher.add`` for every message,
    ``exchange.span`` and ``exchange.metric_points`` for every exchange.

Then the same for gRPC unary calls as ``bench/protocol_load.py`` makes them (a grpcio client and
server, both traced): per call, the client's request (HEADERS and DATA, as grpcio's headers and
HPACK-encoded by a real encoder, whose dynamic table the sessions must follow), the server's read
of it, its response (HEADERS, DATA, trailers) and the client's read of that, one syscall each, on
``--connections`` connections with their prefaces and SETTINGS; ``pipeline`` only, per call (two
spans, client and server).

And the HTTP/1 exchanges again, each on a connection of its own, as under connection churn
(``Connection: close``, a proxy without keep-alive): its open (with the handshake's sequence
numbers, as the kernel reports a connection it saw made), request, response and close;
``pipeline`` only, per exchange.

Each stage is measured three ways in the same run, so that the figures are comparable on a busy
machine: wall time (``time.perf_counter``), the process's CPU time (``time.process_time``: what the
agent would be charged, whatever else the machine runs) and, in one extra run with a
``sys.setprofile`` hook, Python-level function calls (deterministic: what a change of code removes,
free of timing noise).

Prints the median over the repetitions in µs per exchange, and the calls per exchange. A warm-up
run comes first, which also
fills the plugin's caches as a long-running agent's are; the input stream itself is kept out of
the garbage collector's way (``gc.freeze``), since the live agent never holds one.

Usage: ``python bench/pipeline_replay.py [--quick] [--exchanges N] [--grpc-calls N] [--connections C]
[--reps R] [--protocols DIR]``. ``--protocols`` runs a copy of ``protocols/`` (e.g. the code before a change)
in place of the installed one, so two versions can be compared side by side on the same machine.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

from hpack import Encoder
from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame

from otel_ebpf.agent import REPLAY_BATCH
from otel_ebpf.pipeline.events import ConnClose, ConnData, ConnOpen, Event, ProcessInfo
from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, Role

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from results import write_result

PID = 4242
START_NS = 1_764_000_000_000_000_000
EXCHANGE_NS = 62_500  # ~16k requests/s across all connections
SERVICE_NS = 30_000  # request read -> response written
REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
BODY = b'{"status": "ok"}'
SERVER_HEADER = b"demo-inference/1.0 Python/3.11.7"
GRPC_CLIENT_PID, GRPC_SERVER_PID = 5151, 5252
GRPC_PATH = "/tracechain.Chain/Work"
# protocols/http2/frames.py has it too; imported from there, the plugins would load before
# --protocols could replace them
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# What grpcio 1.8x sends and answers for a unary call, in its order.
GRPC_REQUEST_HEADERS = [
    (":scheme", "http"),
    (":method", "POST"),
    (":authority", "127.0.0.1:50051"),
    (":path", GRPC_PATH),
    ("te", "trailers"),
    ("content-type", "application/grpc"),
    ("user-agent", "grpc-python/1.85.3 grpc-c/51.0.0 (linux; chttp2)"),
    ("grpc-accept-encoding", "identity, deflate, gzip"),
]
GRPC_RESPONSE_HEADERS = [
    (":status", "200"),
    ("content-type", "application/grpc"),
    ("grpc-accept-encoding", "identity, deflate, gzip"),
]
GRPC_TRAILERS = [("grpc-status", "0")]
GRPC_STAGE = "gRPC pipeline total"  # per call
CHURN_STAGE = "churn pipeline total"  # per exchange, each on a connection of its own
STAGES = ("session.feed", "stitcher.add", "exchange.span", "exchange.metric_points")
# What a stage is measured in: a clock returns a reading, a stage costs the difference of two.
Clock = Callable[[], float]
WALL: Clock = time.perf_counter
CPU: Clock = time.process_time


def response(timestamp_ns: int) -> bytes:
    """What ``examples/http_service.py`` writes for ``GET /health`` (one buffered write)."""
    date = formatdate(timestamp_ns / 1e9, usegmt=True).encode()
    return (
        b"HTTP/1.1 200 OK\r\n"
        b"Server: " + SERVER_HEADER + b"\r\n"
        b"Date: " + date + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n"
        b"\r\n" % len(BODY)
    ) + BODY


def build_events(exchanges: int, connections: int) -> list[Event]:
    """ProcessInfo, the connections' opens, then ``exchanges`` round-robin over the connections."""
    events: list[Event] = [ProcessInfo(START_NS, PID, "/usr/bin/python3.11", "python3 examples/http_service.py")]
    local = Endpoint("127.0.0.1", 8080)
    for c in range(connections):
        events.append(ConnOpen(START_NS, PID, 10 + c, 0, Role.SERVER, local, Endpoint("127.0.0.1", 40000 + c)))
    for i in range(exchanges):
        fd = 10 + i % connections
        t = START_NS + 1_000 + i * EXCHANGE_NS
        answer = response(t)
        events.append(ConnData(t, PID, PID + 1, fd, 0, Direction.INGRESS, len(REQUEST), bytes(REQUEST)))
        events.append(ConnData(t + SERVICE_NS, PID, PID + 1, fd, 0, Direction.EGRESS, len(answer), answer))
    return events


def build_churn_events(exchanges: int) -> list[Event]:
    """ProcessInfo, then per exchange a connection of its own: its open (ends and handshake ISNs,
    as the kernel reports a connection it saw made), the request, the response and its close."""
    events: list[Event] = [ProcessInfo(START_NS, PID, "/usr/bin/python3.11", "python3 examples/http_service.py")]
    local = Endpoint("127.0.0.1", 8080)
    for i in range(exchanges):
        fd, t = 10 + i % 16, START_NS + 1_000 + i * EXCHANGE_NS
        peer = Endpoint("127.0.0.1", 30000 + i % 30000)
        answer = response(t)
        events.append(ConnOpen(t, PID, fd, i, Role.SERVER, local, peer, client_isn=i, server_isn=~i & 0xFFFFFFFF))
        events.append(ConnData(t, PID, PID + 1, fd, i, Direction.INGRESS, len(REQUEST), bytes(REQUEST)))
        events.append(ConnData(t + SERVICE_NS, PID, PID + 1, fd, i, Direction.EGRESS, len(answer), answer))
        events.append(ConnClose(t + SERVICE_NS + 1_000, PID, fd, i))
    return events


def _grpc_message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _frames(*frames: HeadersFrame | DataFrame | SettingsFrame) -> bytes:
    return b"".join(frame.serialize() for frame in frames)


def build_grpc_events(calls: int, connections: int) -> list[Event]:
    """Both processes' ProcessInfo, each connection's two ends and SETTINGS, then ``calls`` unary
    calls round-robin over the connections: four syscalls each, as both sides see them."""
    events: list[Event] = [
        ProcessInfo(START_NS, GRPC_CLIENT_PID, "/usr/bin/python3.11", "python3 examples/trace_chain.py load-grpc"),
        ProcessInfo(START_NS, GRPC_SERVER_PID, "/usr/bin/python3.11", "python3 examples/trace_chain.py serve-grpc"),
    ]
    server = Endpoint("127.0.0.1", 50051)
    # per connection: each side's HPACK encoder (its dynamic table)
    request_encoders = [Encoder() for _ in range(connections)]
    response_encoders = [Encoder() for _ in range(connections)]
    hello = PREFACE + _frames(SettingsFrame(0, settings={SettingsFrame.MAX_CONCURRENT_STREAMS: 100}))
    answer = _frames(SettingsFrame(0), SettingsFrame(0, flags=["ACK"]))
    for c in range(connections):
        client = Endpoint("127.0.0.1", 41000 + c)
        fd = 10 + c
        events.append(ConnOpen(START_NS, GRPC_CLIENT_PID, fd, 0, Role.CLIENT, client, server))
        events.append(ConnOpen(START_NS, GRPC_SERVER_PID, fd, 0, Role.SERVER, server, client))
        events.extend(
            ConnData(START_NS, pid, pid, fd, 0, direction, len(data), data)
            for pid, direction, data in (
                (GRPC_CLIENT_PID, Direction.EGRESS, hello),
                (GRPC_SERVER_PID, Direction.INGRESS, hello),
                (GRPC_SERVER_PID, Direction.EGRESS, answer),
                (GRPC_CLIENT_PID, Direction.INGRESS, answer),
            )
        )
    for i in range(calls):
        c = i % connections
        fd = 10 + c
        stream = 1 + 2 * (i // connections)  # a client's streams are odd, in order
        t = START_NS + 1_000 + i * EXCHANGE_NS
        request = _frames(
            HeadersFrame(stream, data=request_encoders[c].encode(GRPC_REQUEST_HEADERS), flags=["END_HEADERS"]),
            DataFrame(stream, data=_grpc_message(b"work %d" % i), flags=["END_STREAM"]),
        )
        response = _frames(
            HeadersFrame(stream, data=response_encoders[c].encode(GRPC_RESPONSE_HEADERS), flags=["END_HEADERS"]),
            DataFrame(stream, data=_grpc_message(b"done %d" % i)),
            HeadersFrame(stream, data=response_encoders[c].encode(GRPC_TRAILERS), flags=["END_HEADERS", "END_STREAM"]),
        )
        for ts, pid, direction, data in (
            (t, GRPC_CLIENT_PID, Direction.EGRESS, request),
            (t + 5_000, GRPC_SERVER_PID, Direction.INGRESS, request),
            (t + SERVICE_NS, GRPC_SERVER_PID, Direction.EGRESS, response),
            (t + SERVICE_NS + 5_000, GRPC_CLIENT_PID, Direction.INGRESS, response),
        ):
            events.append(ConnData(ts, pid, pid + 1, fd, 0, direction, len(data), data))
    return events


class CallCounter:
    """A clock that reads Python-level function calls (``sys.setprofile``), while in its ``with``.

    Each reading is itself one call, which adds one per stage and batch: noise next to the
    thousands of calls of a batch.
    """

    def __init__(self) -> None:
        self.calls = 0

    def _hook(self, frame: object, event: str, arg: object) -> None:
        if event == "call":
            self.calls += 1

    def __call__(self) -> float:
        return self.calls

    def __enter__(self) -> CallCounter:
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


def use_protocols_from(directory: Path) -> None:
    """Make ``otel_ebpf.protocols`` the package in ``directory`` (before anything imports it)."""
    if "otel_ebpf.protocols" in sys.modules:
        raise RuntimeError("otel_ebpf.protocols is already imported")
    spec = importlib.util.spec_from_file_location(
        "otel_ebpf.protocols",
        directory / "__init__.py",
        submodule_search_locations=[str(directory)],
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["otel_ebpf.protocols"] = module
    spec.loader.exec_module(module)


def run_pipeline(events: list[Event], clock: Clock = WALL) -> tuple[float, int]:
    """``clock`` units (seconds by default) to run ``events`` through a fresh pipeline, and the
    spans it produced."""
    from otel_ebpf.pipeline import Pipeline
    from otel_ebpf.pipeline.connections import ConnectionTracker
    from otel_ebpf.pipeline.telemetry import Telemetry
    from otel_ebpf.protocol import load_protocols
    from otel_ebpf.selfmetrics import SelfMetrics

    selfmetrics = SelfMetrics()
    protocols = load_protocols()
    telemetry = Telemetry(protocols, "bench-host", {}, selfmetrics)
    tracker = ConnectionTracker(protocols, selfmetrics)
    pipeline = Pipeline(tracker, telemetry, selfmetrics)
    batches = [events[i : i + REPLAY_BATCH] for i in range(0, len(events), REPLAY_BATCH)]
    spans = 0
    start = clock()
    for batch in batches:
        pipeline.handle(batch)
        spans += len(telemetry.take_spans())
    pipeline.flush()  # what the reorder window still holds
    spans += len(telemetry.take_spans())
    return clock() - start, spans


def run_plugin(events: list[Event], clock: Clock = WALL) -> tuple[dict[str, float], int]:
    """``clock`` units per plugin stage over the data events of ``events``, and the exchanges made.

    Batch by batch, as the pipeline goes: what a batch made is dropped before the next one, so the
    stages pay for the garbage collection of what they allocate, not for keeping a whole run alive.
    """
    from otel_ebpf.protocol import load_protocols

    (http1,) = load_protocols(["http1"])
    data = [event for event in events if isinstance(event, ConnData)]
    fds = {event.fd for event in data}
    sessions = {fd: http1.new_session(Role.SERVER) for fd in fds}
    stitchers = {fd: http1.new_stitcher(Role.SERVER) for fd in fds}
    conn = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8080), Endpoint("127.0.0.1", 40000))
    # what each syscall is handed to, resolved up front so that the harness costs next to nothing
    calls = [(sessions[e.fd].feed, stitchers[e.fd].add, e.direction, e.data, e.timestamp_ns) for e in data]
    times = dict.fromkeys(STAGES, 0.0)
    made = 0
    for first in range(0, len(calls), REPLAY_BATCH):
        batch = calls[first : first + REPLAY_BATCH]

        start = clock()
        messages = [
            (add, message)
            for feed, add, direction, data, timestamp_ns in batch
            for message in feed(direction, data, timestamp_ns)
        ]
        fed = clock()
        exchanges = [exchange for add, message in messages for exchange in add(message)]
        added = clock()
        spans = [exchange.span(conn) for exchange in exchanges]
        described = clock()
        points = [exchange.metric_points(conn) for exchange in exchanges]
        measured = clock()

        times["session.feed"] += fed - start
        times["stitcher.add"] += added - fed
        times["exchange.span"] += described - added
        times["exchange.metric_points"] += measured - described
        made += len(exchanges)
        del messages, exchanges, spans, points
    return times, made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=20_000)
    parser.add_argument("--grpc-calls", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--protocols", type=Path, help="run this copy of protocols/ instead")
    parser.add_argument("--quick", action="store_true", help="short run: 5,000 exchanges, 2,500 calls, 3 reps")
    args = parser.parse_args()
    if args.quick:
        args.exchanges, args.grpc_calls, args.reps = 5000, 2500, 3
    if args.protocols is not None:
        use_protocols_from(args.protocols.resolve())

    from otel_ebpf.protocol import load_protocols

    (http1,) = load_protocols(["http1"])
    print(f"plugin: {sys.modules[type(http1).__module__].__file__}")
    events = build_events(args.exchanges, args.connections)
    grpc_events = build_grpc_events(args.grpc_calls, args.connections)
    churn_events = build_churn_events(args.exchanges)
    # The live agent never holds a whole run of events: keep the garbage collector from walking
    # them again and again, which would charge every stage for the size of the input.
    gc.collect()
    gc.freeze()
    run_pipeline(events[: 2 + args.connections + 2000])  # warm up
    run_pipeline(grpc_events[: 2 + 6 * args.connections + 2000])
    # stage -> clock -> one reading per repetition
    figures: dict[str, dict[str, list[float]]] = {}

    def note(stage: str, clock: str, value: float) -> None:
        figures.setdefault(stage, {}).setdefault(clock, []).append(value)

    for _ in range(args.reps):
        for clock_name, clock in (("wall", WALL), ("cpu", CPU)):
            seconds, spans = run_pipeline(events, clock)
            if spans != args.exchanges:
                raise SystemExit(f"pipeline made {spans} spans for {args.exchanges} exchanges")
            note("pipeline total", clock_name, seconds)
            times, made = run_plugin(events, clock)
            if made != args.exchanges:
                raise SystemExit(f"plugin made {made} exchanges for {args.exchanges}")
            note("plugin share", clock_name, sum(times.values()))
            for stage, seconds in times.items():
                note(stage, clock_name, seconds)
            seconds, spans = run_pipeline(grpc_events, clock)
            if spans != 2 * args.grpc_calls:
                raise SystemExit(f"pipeline made {spans} spans for {args.grpc_calls} gRPC calls (two each)")
            note(GRPC_STAGE, clock_name, seconds)
            seconds, spans = run_pipeline(churn_events, clock)
            if spans != args.exchanges:
                raise SystemExit(f"pipeline made {spans} spans for {args.exchanges} exchanges on their own connections")
            note(CHURN_STAGE, clock_name, seconds)
    with CallCounter() as counter:  # last: the hook slows everything it sees
        note("pipeline total", "calls", run_pipeline(events, counter)[0])
        note(GRPC_STAGE, "calls", run_pipeline(grpc_events, counter)[0])
        note(CHURN_STAGE, "calls", run_pipeline(churn_events, counter)[0])
        times, _ = run_plugin(events, counter)
    note("plugin share", "calls", sum(times.values()))
    for stage, calls in times.items():
        note(stage, "calls", calls)

    def per_unit(clock: str, values: list[float], units: int) -> float:
        scale = 1 if clock == "calls" else 1e6  # calls stay calls; seconds become µs
        return round(statistics.median(values) / units * scale, 2)

    grpc = {clock: per_unit(clock, values, args.grpc_calls) for clock, values in figures.pop(GRPC_STAGE).items()}
    churn = {clock: per_unit(clock, values, args.exchanges) for clock, values in figures.pop(CHURN_STAGE).items()}
    table = {
        stage: {clock: per_unit(clock, values, args.exchanges) for clock, values in by_clock.items()}
        for stage, by_clock in figures.items()
    }
    print(
        f"{args.exchanges} exchanges on {args.connections} connections, median of {args.reps} "
        "repetitions, per exchange:"
    )
    print(f"  {'stage':<26} {'wall µs':>8} {'cpu µs':>8} {'py calls':>9}")
    for stage, row in table.items():
        indent = "  " if stage in STAGES else ""
        print(f"  {indent + stage:<26} {row['wall']:8.2f} {row['cpu']:8.2f} {row['calls']:9.1f}")
    print(f"{args.grpc_calls} gRPC unary calls on {args.connections} connections, both sides traced, per call:")
    print(f"  {'pipeline total':<26} {grpc['wall']:8.2f} {grpc['cpu']:8.2f} {grpc['calls']:9.1f}")
    print(f"{args.exchanges} exchanges, each on a connection of its own (open, request, response, close):")
    print(f"  {'pipeline total':<26} {churn['wall']:8.2f} {churn['cpu']:8.2f} {churn['calls']:9.1f}")
    write_result(
        "pipeline_replay",
        None,
        {
            "exchanges": args.exchanges,
            "connections": args.connections,
            "reps": args.reps,
            "us_per_exchange": {stage: row["wall"] for stage, row in table.items()},
            "cpu_us_per_exchange": {stage: row["cpu"] for stage, row in table.items()},
            "python_calls_per_exchange": {stage: row["calls"] for stage, row in table.items()},
            "grpc": {
                "calls": args.grpc_calls,
                "spans_per_call": 2,
                "us_per_call": grpc["wall"],
                "cpu_us_per_call": grpc["cpu"],
                "python_calls_per_call": grpc["calls"],
            },
            "churn": {
                "us_per_exchange": churn["wall"],
                "cpu_us_per_exchange": churn["cpu"],
                "python_calls_per_exchange": churn["calls"],
            },
        },
    )


if __name__ == "__main__":
    main()
