"""CPU cost of encoding a span, file (OTLP/JSON) and OTLP (protobuf): the SDK's path and the direct encoders.

The spans look like the agent's HTTP server spans: 15 semantic-convention attributes each, a few
observed processes (one shared ``Resource`` object each, as the agent creates them) and one
protocol scope. Each round times every path on the same batches, alternating, so drift on a
shared machine hits all of them; the figures are medians over the rounds.

- ``old``: ``to_json_line(encode_spans(spans))`` — protobuf messages, then ``MessageToDict``
- ``new``: ``SpanJsonEncoder.encode(spans)`` — the JSON text straight from the spans
- ``new+write``: ``FileSpanExporter.export`` — the new encoding plus the flushed file append
- ``proto old``: ``encode_spans(spans).SerializeToString()`` — what the OTLP exporter did
- ``proto new``: ``SpanProtoEncoder.encode(spans)`` — the same bytes, written directly

The speed-up column compares each JSON path with ``old`` and each protobuf path with ``proto old``.

It also prints what a span costs on the wire to a backend: the OTLP protobuf bytes per span of
those batches, plain and gzip-compressed (``otlp.compression``), the figures the gateway sizing in
docs/kubernetes.md is computed from.

Usage: ``python bench/file_export.py [--quick] [--batch N] [--batches B] [--rounds R]``
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_ebpf.exporters.file import FileSpanExporter, to_json_line
from otel_ebpf.exporters.otlp_json import SpanJsonEncoder
from otel_ebpf.exporters.otlp_proto import SpanProtoEncoder

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from results import write_result

SCOPE = InstrumentationScope("otel_ebpf.protocols.http1", "0.1.0")
PATHS = ["/v1/chat/completions", "/v1/embeddings", "/health", "/v1/models", "/metrics"]


def resources(count: int) -> list[Resource]:
    return [
        Resource(
            {
                "host.name": "gpu-node-17",
                "process.pid": 4000 + i,
                "process.executable.name": "python3",
                "process.executable.path": "/usr/bin/python3.11",
                "process.command_line": f"python3 -m vllm.entrypoints.openai.api_server --port {8000 + i}",
                "service.instance.id": f"gpu-node-17/{4000 + i}",
                "service.name": f"vllm-{i}",
                "telemetry.sdk.name": "otel-ebpf",
                "telemetry.sdk.language": "python",
                "telemetry.sdk.version": "0.1.0",
            }
        )
        for i in range(count)
    ]


def http_span(rng: random.Random, resource: Resource, start_ns: int) -> ReadableSpan:
    status = rng.choice((200, 200, 200, 404, 500))
    path = rng.choice(PATHS)
    attributes = {
        "http.request.method": rng.choice(("GET", "POST")),
        "url.path": path,
        "url.scheme": "http",
        "server.address": "10.0.3.17",
        "server.port": 8000,
        "client.address": f"10.0.{rng.randrange(256)}.{rng.randrange(256)}",
        "network.peer.address": f"10.0.{rng.randrange(256)}.{rng.randrange(256)}",
        "network.peer.port": rng.randrange(32768, 61000),
        "network.protocol.version": "1.1",
        "http.response.status_code": status,
        "user_agent.original": "python-httpx/0.27.0",
        "http.request.body.size": rng.randrange(100, 4000),
        "http.response.body.size": rng.randrange(100, 40000),
        "http.route": path,
        "url.query": "stream=false",
    }
    if status >= 500:
        attributes["error.type"] = str(status)
        del attributes["url.query"]
    return ReadableSpan(
        f"{attributes['http.request.method']} {path}",
        context=SpanContext(rng.getrandbits(128), rng.getrandbits(64), False, TraceFlags(TraceFlags.SAMPLED)),
        resource=resource,
        attributes=attributes,
        kind=SpanKind.SERVER,
        status=Status(StatusCode.ERROR if status >= 500 else StatusCode.UNSET),
        start_time=start_ns,
        end_time=start_ns + rng.randrange(100_000, 50_000_000),
        instrumentation_scope=SCOPE,
    )


def batches(count: int, size: int, processes: int) -> list[list[ReadableSpan]]:
    rng = random.Random(7)
    pool = resources(processes)
    start = 1_700_000_000_000_000_000
    return [[http_span(rng, rng.choice(pool), start + i * 1_000_000) for i in range(size)] for _ in range(count)]


def us_per_span(export: Callable[[Sequence[ReadableSpan]], object], spans: list[list[ReadableSpan]]) -> float:
    begin = time.perf_counter()
    for batch in spans:
        export(batch)
    return (time.perf_counter() - begin) / sum(map(len, spans)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=512, help="spans per export (the sink's max_batch)")
    parser.add_argument("--batches", type=int, default=8, help="batches per path per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--processes", type=int, default=4, help="distinct resources in the spans")
    parser.add_argument("--quick", action="store_true", help="short run: 4 batches, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.rounds = 4, 3

    spans = batches(args.batches, args.batch, args.processes)
    encoder = SpanJsonEncoder()
    proto = SpanProtoEncoder()
    if encoder.encode(spans[0]) != to_json_line(encode_spans(spans[0])):
        sys.exit("the two JSON paths disagree; not timing them")
    if proto.encode(spans[0]) != encode_spans(spans[0]).SerializeToString():
        sys.exit("the two protobuf paths disagree; not timing them")
    with tempfile.TemporaryDirectory() as out:
        exporter = FileSpanExporter(Path(out))
        paths: dict[str, Callable[[Sequence[ReadableSpan]], object]] = {
            "old": lambda batch: to_json_line(encode_spans(batch)),
            "new": encoder.encode,
            "new+write": exporter.export,
            "proto old": lambda batch: encode_spans(batch).SerializeToString(),
            "proto new": proto.encode,
        }
        figures: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, export in paths.items():
                figures[name].append(us_per_span(export, spans))
        exporter.shutdown()

    print(f"{args.batch}-span batches, 15 attributes a span, {args.processes} resources, {args.rounds} rounds")
    wire = [encode_spans(batch).SerializeToString() for batch in spans]
    count = sum(map(len, spans))
    otlp_bytes = sum(map(len, wire)) / count
    otlp_gzip_bytes = sum(len(gzip.compress(body)) for body in wire) / count
    print(f"  OTLP protobuf: {otlp_bytes:.0f} bytes/span, {otlp_gzip_bytes:.0f} gzip-compressed")

    def baseline(name: str) -> float:
        return statistics.median(figures["proto old" if name.startswith("proto") else "old"])

    for name, values in figures.items():
        median = statistics.median(values)
        print(
            f"{name:>10}: {median:7.2f} us/span  (min {min(values):.2f}, max {max(values):.2f})"
            f"  x{baseline(name) / median:.1f}"
        )
    write_result(
        "file_export",
        None,
        {
            "batch": args.batch,
            "batches": args.batches,
            "rounds": args.rounds,
            "processes": args.processes,
            "otlp_bytes_per_span": round(otlp_bytes),
            "otlp_gzip_bytes_per_span": round(otlp_gzip_bytes),
            "paths": [
                {
                    "path": name,
                    "us_per_span": round(statistics.median(v), 2),
                    "min_us": round(min(v), 2),
                    "max_us": round(max(v), 2),
                    "speedup": round(baseline(name) / statistics.median(v), 1),
                }
                for name, v in figures.items()
            ],
        },
    )


if __name__ == "__main__":
    main()
