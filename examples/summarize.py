"""Summarize what the agent's file exporter wrote: spans per service and name, and self-metrics.

    python examples/summarize.py otel-ebpf-data/demo

Reads ``traces.jsonl`` (one OTLP/JSON ``ExportTraceServiceRequest`` per line) and ``metrics.jsonl``
(one ``ExportMetricsServiceRequest`` per line). It walks the JSON directly instead of parsing it into
protobuf messages, so it runs with any Python 3 and accepts both encodings a producer may choose for
enums (integers, as OTLP/JSON requires, or protobuf's names) and for 64-bit integers (strings or
numbers).
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.jsonl"
SELF_METRIC_PREFIX = "otel_ebpf."

SPAN_KINDS = ["UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]
STATUS_ERROR = 2
TEMPORALITY_DELTA = 1

# Self-metrics always shown, even when absent (absent reads as 0): the losses a user must see.
HEADLINE_SELF_METRICS = {
    "otel_ebpf.events.lost": "events lost (ring buffer full)",
    "otel_ebpf.parse.errors": "parse errors",
    "otel_ebpf.spans.dropped": "spans dropped",
}


@dataclass(frozen=True)
class Span:
    """One exported span, reduced to what the summary needs."""

    service: str
    name: str
    kind: str
    duration_ms: float
    error: bool
    attributes: dict[str, Any] = field(default_factory=dict)
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""  # empty for a root


@dataclass(frozen=True)
class SpanStats:
    """Latency and error figures of one (service, span name, kind) group."""

    service: str
    name: str
    kind: str
    count: int
    p50_ms: float
    p99_ms: float
    errors: int


def _enum(value: Any, names: Sequence[str], prefix: str) -> int:
    """An OTLP enum given as an integer or as its protobuf name (``SPAN_KIND_SERVER``)."""
    if isinstance(value, str) and not value.isdigit():
        name = value.removeprefix(prefix)
        return names.index(name) if name in names else 0
    return int(value or 0)


def any_value(value: dict[str, Any]) -> Any:
    """The Python value of an OTLP/JSON ``AnyValue`` (``{"stringValue": "x"}``, ``{"intValue": "3"}``...)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return attributes(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP/JSON ``[{key, value}]`` as a dict."""
    return {kv["key"]: any_value(kv.get("value", {})) for kv in items}


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """Each JSON object in a JSON Lines file; a half-written last line (agent killed) is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_spans(path: Path) -> list[Span]:
    """Every span in a ``traces.jsonl`` file, with its resource's ``service.name``."""
    spans = []
    for request in _json_lines(path):
        for resource_spans in request.get("resourceSpans", []):
            resource = attributes(resource_spans.get("resource", {}).get("attributes", []))
            service = str(resource.get("service.name", "unknown_service"))
            for scope_spans in resource_spans.get("scopeSpans", []):
                for s in scope_spans.get("spans", []):
                    start = int(s.get("startTimeUnixNano", 0))
                    end = int(s.get("endTimeUnixNano", start))
                    kind = _enum(s.get("kind", 0), SPAN_KINDS, "SPAN_KIND_")
                    status = _enum(s.get("status", {}).get("code", 0), ["UNSET", "OK", "ERROR"], "STATUS_CODE_")
                    spans.append(
                        Span(
                            service=service,
                            name=s.get("name", ""),
                            kind=SPAN_KINDS[kind] if 0 <= kind < len(SPAN_KINDS) else str(kind),
                            duration_ms=max(end - start, 0) / 1e6,
                            error=status == STATUS_ERROR,
                            attributes=attributes(s.get("attributes", [])),
                            trace_id=s.get("traceId", ""),
                            span_id=s.get("spanId", ""),
                            parent_span_id=s.get("parentSpanId", ""),
                        )
                    )
    return spans


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of already sorted values; 0.0 for none."""
    if not sorted_values:
        return 0.0
    rank = max(math.ceil(q / 100 * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def span_stats(spans: Sequence[Span]) -> list[SpanStats]:
    """Spans grouped by (service, name, kind), sorted by service then descending count."""
    groups: dict[tuple[str, str, str], list[Span]] = defaultdict(list)
    for s in spans:
        groups[(s.service, s.name, s.kind)].append(s)
    stats = []
    for (service, name, kind), members in groups.items():
        durations = sorted(s.duration_ms for s in members)
        stats.append(
            SpanStats(
                service=service,
                name=name,
                kind=kind,
                count=len(members),
                p50_ms=percentile(durations, 50),
                p99_ms=percentile(durations, 99),
                errors=sum(s.error for s in members),
            )
        )
    return sorted(stats, key=lambda s: (s.service, -s.count, s.name))


def _point_value(point: dict[str, Any]) -> float:
    if "asInt" in point:
        return int(point["asInt"])
    return float(point.get("asDouble", 0))


def read_self_metrics(path: Path, prefix: str = SELF_METRIC_PREFIX) -> dict[str, float]:
    """Latest total of each ``otel_ebpf.*`` sum or gauge in a ``metrics.jsonl`` file.

    The file holds one collection per line. For cumulative sums and gauges the newest point of each
    attribute set is the current value, so those are summed across attribute sets; delta sums are
    added up over every line.
    """
    latest: dict[str, dict[str, tuple[int, float]]] = defaultdict(dict)
    deltas: dict[str, float] = defaultdict(float)
    for request in _json_lines(path):
        for resource_metrics in request.get("resourceMetrics", []):
            for scope_metrics in resource_metrics.get("scopeMetrics", []):
                for metric in scope_metrics.get("metrics", []):
                    name = metric.get("name", "")
                    if not name.startswith(prefix):
                        continue
                    data = metric.get("sum") or metric.get("gauge") or {}
                    temporality = _enum(
                        data.get("aggregationTemporality", 0),
                        ["UNSPECIFIED", "DELTA", "CUMULATIVE"],
                        "AGGREGATION_TEMPORALITY_",
                    )
                    for point in data.get("dataPoints", []):
                        if "sum" in metric and temporality == TEMPORALITY_DELTA:
                            deltas[name] += _point_value(point)
                            continue
                        key = json.dumps(point.get("attributes", []), sort_keys=True)
                        when = int(point.get("timeUnixNano", 0))
                        if key not in latest[name] or when >= latest[name][key][0]:
                            latest[name][key] = (when, _point_value(point))
    totals = {name: sum(v for _, v in series.values()) for name, series in latest.items()}
    for name, value in deltas.items():
        totals[name] = totals.get(name, 0) + value
    return totals


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def format_span_table(stats: Sequence[SpanStats]) -> str:
    """An aligned text table: names left-aligned, numbers right-aligned."""
    header = ("service", "span name", "kind", "count", "p50 ms", "p99 ms", "errors")
    rows = [header] + [
        (s.service, s.name, s.kind, str(s.count), f"{s.p50_ms:.2f}", f"{s.p99_ms:.2f}", str(s.errors)) for s in stats
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        left = [cell.ljust(w) for cell, w in zip(row[:3], widths[:3], strict=True)]
        right = [cell.rjust(w) for cell, w in zip(row[3:], widths[3:], strict=True)]
        lines.append("  ".join(left + right).rstrip())
    return "\n".join(lines)


def format_traces(spans: Sequence[Span]) -> str:
    """How the spans form traces: traces by span count, and how many spans found their parent
    (in their own process, or across processes: a client span of another service)."""
    by_trace: dict[str, list[Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    sizes = Counter(len(trace) for trace in by_trace.values())
    services = {(s.trace_id, s.span_id): s.service for s in spans}
    with_parent = [s for s in spans if (s.trace_id, s.parent_span_id) in services]
    across = sum(services[(s.trace_id, s.parent_span_id)] != s.service for s in with_parent)
    shape = ", ".join(f"{count} of {size} span{'s' * (size > 1)}" for size, count in sorted(sizes.items()))
    return (
        f"Traces: {len(by_trace)} ({shape}); {len(with_parent)} spans have their parent in the trace, "
        f"{across} of them across services"
    )


def format_llm_calls(spans: Sequence[Span]) -> str:
    """LLM calls (spans with ``gen_ai.*`` attributes) by (service, kind, span name): count, median
    time to first token and per output token, tokens in and out; empty when there are none."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in spans:
        if "gen_ai.operation.name" in s.attributes:
            groups[(s.service, s.kind, s.name)].append(s.attributes)
    if not groups:
        return ""
    lines = ["LLM calls (median TTFT / TPOT of streamed calls; tokens in / out summed):"]
    for (service, kind, name), calls in sorted(groups.items()):
        ttft = sorted(
            float(a["gen_ai.response.time_to_first_chunk"]) for a in calls if "gen_ai.response.time_to_first_chunk" in a
        )
        tpot = sorted(
            float(a["otel_ebpf.gen_ai.time_per_output_token"])
            for a in calls
            if "otel_ebpf.gen_ai.time_per_output_token" in a
        )
        tokens = [sum(int(a.get(f"gen_ai.usage.{side}_tokens", 0)) for a in calls) for side in ("input", "output")]
        timing = f"TTFT {percentile(ttft, 50) * 1e3:6.1f} ms  TPOT {percentile(tpot, 50) * 1e3:5.1f} ms" if ttft else ""
        lines.append(
            f"  {service:<14} {kind:<6} {name:<28} {len(calls):>4} calls  "
            f"tokens {tokens[0]:>6} / {tokens[1]:<6} {timing}".rstrip()
        )
    return "\n".join(lines)


def format_summary(directory: Path) -> str:
    """The report ``make demo`` prints: a span table, then the agent's self-metrics."""
    directory = Path(directory)
    spans = read_spans(directory / TRACES_FILE)
    out = [f"Spans in {directory / TRACES_FILE}: {len(spans)}"]
    if spans:
        out.append(format_span_table(span_stats(spans)))
        out.append(format_traces(spans))
        llm = format_llm_calls(spans)
        if llm:
            out += ["", llm]
    self_metrics = read_self_metrics(directory / METRICS_FILE)
    out.append("")
    out.append(f"Agent self-metrics (latest values in {directory / METRICS_FILE}):")
    for name, label in HEADLINE_SELF_METRICS.items():
        out.append(f"  {label:<32} {_number(self_metrics.get(name, 0))}")
    for name in sorted(set(self_metrics) - set(HEADLINE_SELF_METRICS)):
        out.append(f"  {name.removeprefix(SELF_METRIC_PREFIX):<32} {_number(self_metrics[name])}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python examples/summarize.py DIR``; 2 on bad usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python examples/summarize.py DIR  (the agent's --output directory)", file=sys.stderr)
        return 2
    print(format_summary(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
