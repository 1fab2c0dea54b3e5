"""examples/summarize.py on OTLP JSON Lines built here from opentelemetry-proto messages."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000


@pytest.fixture(scope="module")
def summarize() -> ModuleType:
    spec = importlib.util.spec_from_file_location("summarize", EXAMPLES / "summarize.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["summarize"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def kv(key: str, value: str | int) -> KeyValue:
    any_value = AnyValue(string_value=value) if isinstance(value, str) else AnyValue(int_value=value)
    return KeyValue(key=key, value=any_value)


def span(name: str, kind: int, duration_ms: float, error: bool = False, **attrs: str | int) -> trace_pb2.Span:
    return trace_pb2.Span(
        trace_id=bytes(range(16)),
        span_id=bytes(range(8)),
        name=name,
        kind=kind,
        start_time_unix_nano=T0,
        end_time_unix_nano=T0 + int(duration_ms * MS),
        attributes=[kv(k.replace("_", "."), v) for k, v in attrs.items()],
        status=trace_pb2.Status(
            code=trace_pb2.Status.STATUS_CODE_ERROR if error else trace_pb2.Status.STATUS_CODE_UNSET
        ),
    )


def traces(service: str, spans: list[trace_pb2.Span]) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource={"attributes": [kv("service.name", service), kv("process.pid", 42)]},
                scope_spans=[trace_pb2.ScopeSpans(spans=spans)],
            )
        ]
    )


def counter(name: str, points: list[tuple[int, int, dict[str, str]]], delta: bool = False) -> metrics_pb2.Metric:
    temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA if delta else metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    return metrics_pb2.Metric(
        name=name,
        sum=metrics_pb2.Sum(
            aggregation_temporality=temporality,
            is_monotonic=True,
            data_points=[
                metrics_pb2.NumberDataPoint(
                    time_unix_nano=when, as_int=value, attributes=[kv(k, v) for k, v in attrs.items()]
                )
                for when, value, attrs in points
            ],
        ),
    )


def gauge(name: str, when: int, value: float) -> metrics_pb2.Metric:
    return metrics_pb2.Metric(
        name=name,
        gauge=metrics_pb2.Gauge(data_points=[metrics_pb2.NumberDataPoint(time_unix_nano=when, as_double=value)]),
    )


def metrics(*items: metrics_pb2.Metric) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(
        resource_metrics=[metrics_pb2.ResourceMetrics(scope_metrics=[metrics_pb2.ScopeMetrics(metrics=list(items))])]
    )


def jsonl(path: Path, messages: list[Message], integer_enums: bool = True) -> None:
    """OTLP/JSON lines as the agent's file exporter writes them (integer enums, int64 as strings)."""
    with path.open("w", encoding="utf-8") as f:
        for m in messages:
            doc = json_format.MessageToDict(m, use_integers_for_enums=integer_enums)
            f.write(json.dumps(doc, separators=(",", ":")) + "\n")


SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    users = [span("GET /users/{id}", SERVER, d, **{"http_response_status_code": 200}) for d in range(1, 101)]
    jsonl(
        tmp_path / "traces.jsonl",
        [
            traces("demo-inference", users[:60]),
            traces(
                "demo-inference",
                [*users[60:], span("GET", SERVER, 3.0, error=True), span("POST /predict", SERVER, 12.5)],
            ),
            traces("curl", [span("GET", CLIENT, 4.0)]),
        ],
    )
    jsonl(
        tmp_path / "metrics.jsonl",
        [
            metrics(
                counter("otel_ebpf.events.received", [(T0, 100, {"probe": "http"}), (T0, 5, {"probe": "tls"})]),
                counter("otel_ebpf.parse.errors", [(T0, 1, {"protocol": "http1"})]),
                counter("http.server.request.duration.fake", [(T0, 999, {})]),
            ),
            metrics(
                counter("otel_ebpf.events.received", [(T0 + 2, 250, {"probe": "http"}), (T0 + 2, 7, {"probe": "tls"})]),
                counter("otel_ebpf.parse.errors", [(T0 + 2, 3, {"protocol": "http1"})]),
                counter("otel_ebpf.spans.dropped", [(T0 + 2, 2, {})], delta=True),
                gauge("otel_ebpf.connections.tracked", T0 + 2, 4),
            ),
            metrics(counter("otel_ebpf.spans.dropped", [(T0 + 4, 3, {})], delta=True)),
        ],
    )
    return tmp_path


def test_read_spans_keeps_service_kind_duration_error_and_attributes(summarize: ModuleType, data_dir: Path) -> None:
    spans = summarize.read_spans(data_dir / "traces.jsonl")
    assert len(spans) == 103
    first = spans[0]
    assert (first.service, first.name, first.kind) == ("demo-inference", "GET /users/{id}", "SERVER")
    assert first.duration_ms == pytest.approx(1.0)
    assert first.attributes == {"http.response.status.code": 200}
    assert [s.error for s in spans if s.name == "GET"] == [True, False]
    assert {s.service for s in spans} == {"demo-inference", "curl"}


def test_span_stats_percentiles_and_errors(summarize: ModuleType, data_dir: Path) -> None:
    stats = summarize.span_stats(summarize.read_spans(data_dir / "traces.jsonl"))
    by_key = {(s.service, s.name, s.kind): s for s in stats}
    users = by_key[("demo-inference", "GET /users/{id}", "SERVER")]
    assert (users.count, users.p50_ms, users.p99_ms, users.errors) == (100, 50.0, 99.0, 0)
    assert by_key[("demo-inference", "GET", "SERVER")].errors == 1
    assert by_key[("curl", "GET", "CLIENT")].count == 1
    assert stats[0].service == "curl" and stats[1].name == "GET /users/{id}"  # by service, then count


def test_self_metrics_take_latest_cumulative_and_add_deltas(summarize: ModuleType, data_dir: Path) -> None:
    totals = summarize.read_self_metrics(data_dir / "metrics.jsonl")
    assert totals == {
        "otel_ebpf.events.received": 257,  # latest per attribute set, summed over sets
        "otel_ebpf.parse.errors": 3,
        "otel_ebpf.spans.dropped": 5,  # delta points add up
        "otel_ebpf.connections.tracked": 4.0,
    }


def test_enum_names_are_accepted_too(summarize: ModuleType, tmp_path: Path) -> None:
    """Plain protobuf JSON writes enums by name; a reader of other producers' files must cope."""
    jsonl(tmp_path / "traces.jsonl", [traces("svc", [span("op", CLIENT, 2.0, error=True)])], integer_enums=False)
    assert '"SPAN_KIND_CLIENT"' in (tmp_path / "traces.jsonl").read_text()
    (only,) = summarize.read_spans(tmp_path / "traces.jsonl")
    assert (only.kind, only.error) == ("CLIENT", True)


def test_format_summary_and_cli(summarize: ModuleType, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with (data_dir / "traces.jsonl").open("a") as f:
        f.write('{"resourceSpans": [')  # an agent killed mid-write leaves half a line
    assert summarize.main([str(data_dir)]) == 0
    text = capsys.readouterr().out
    assert "Spans in" in text and ": 103" in text
    assert any(
        line.split() == ["demo-inference", "GET", "/users/{id}", "SERVER", "100", "50.00", "99.00", "0"]
        for line in text.splitlines()
    )
    assert re.search(r"^  events lost .* 0$", text, re.M)  # absent from the file: shown as 0
    assert re.search(r"^  parse errors .* 3$", text, re.M)
    assert re.search(r"^  spans dropped .* 5$", text, re.M)
    assert re.search(r"^  events\.received +257$", text, re.M)
    assert "request.duration.fake" not in text


def test_traces_are_summarized_by_shape(summarize: ModuleType, tmp_path: Path) -> None:
    def linked(name: str, kind: int, trace: int, span_id: int, parent: int | None = None) -> trace_pb2.Span:
        s = span(name, kind, 1.0)
        s.trace_id, s.span_id = bytes([trace]) * 16, bytes([span_id]) * 8
        if parent is not None:
            s.parent_span_id = bytes([parent]) * 8
        return s

    jsonl(
        tmp_path / "traces.jsonl",
        [
            traces("gateway", [linked("GET /a", SERVER, 1, 1), linked("GET /b", CLIENT, 1, 2, parent=1)]),
            traces("backend", [linked("GET /b", SERVER, 1, 3, parent=2), linked("GET /c", SERVER, 2, 4, parent=9)]),
        ],
    )
    text = summarize.format_traces(summarize.read_spans(tmp_path / "traces.jsonl"))
    assert (
        text
        == "Traces: 2 (1 of 1 span, 1 of 3 spans); 2 spans have their parent in the trace, 1 of them across services"
    )
    assert "Traces: 2" in summarize.format_summary(tmp_path)


def test_empty_directory_and_usage(summarize: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "Spans in" in summarize.format_summary(tmp_path)
    assert summarize.main([str(tmp_path / "missing")]) == 2
    assert "usage" in capsys.readouterr().err


def test_llm_calls_are_summarized(summarize: ModuleType) -> None:
    def call(ttft: float | None, tpot: float | None, tokens_in: int, tokens_out: int) -> object:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.usage.input_tokens": tokens_in,
            "gen_ai.usage.output_tokens": tokens_out,
        }
        if ttft is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = ttft
            attributes["otel_ebpf.gen_ai.time_per_output_token"] = tpot
        return summarize.Span("llm", "chat m", "SERVER", 1.0, False, attributes)

    spans = [
        call(0.30, 0.040, 20, 25),
        call(0.32, 0.042, 20, 25),
        call(None, None, 7, 3),
        summarize.Span("web", "GET /", "SERVER", 1.0, False, {}),
    ]
    text = summarize.format_llm_calls(spans)
    assert text.splitlines()[1].split() == [
        "llm",
        "SERVER",
        "chat",
        "m",
        "3",
        "calls",
        "tokens",
        "47",
        "/",
        "53",
        "TTFT",
        "300.0",
        "ms",
        "TPOT",
        "40.0",
        "ms",
    ]
    assert summarize.format_llm_calls(spans[3:]) == ""
