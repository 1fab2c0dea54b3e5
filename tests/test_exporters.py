"""Exporters and the sink: the same telemetry over gRPC, HTTP and files; a dead backend costs bounded
time and memory and every span is counted."""

from __future__ import annotations

import functools
import io
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, UpDownCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from otel_ebpf.config import AgentConfig, load_config
from otel_ebpf.exporters import ExporterSetupError
from otel_ebpf.exporters.console import ConsoleMetricExporter, ConsoleSpanExporter
from otel_ebpf.exporters.file import FileMetricExporter, FileSpanExporter, from_json_line, to_json_line
from otel_ebpf.exporters.otlp_json import SpanJsonEncoder
from otel_ebpf.exporters.otlp_proto import SpanProtoEncoder
from otel_ebpf.exporters.sink import TelemetrySink, build_sink, temporality_preference
from otel_ebpf.exporters.transport import build_transport
from otel_ebpf.selfmetrics import SelfMetrics
from tests.otlp_receiver import OTLPReceiver, load_file_metrics, load_file_spans

SCOPE = InstrumentationScope("otel-ebpf", "0.1.0")
T0 = 1_700_000_000_000_000_000
TRACE = 0x0AF7651916CD43DD8448EB211C80319C


def _ctx(span_id: int, trace_id: int = TRACE) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def make_spans() -> list[ReadableSpan]:
    """Three spans from two observed processes (two resources), with a parent, a link, an error."""
    api = Resource({"service.name": "api", "process.pid": 101, "k8s.cluster.name": "east"})
    db = Resource({"service.name": "db", "process.pid": 202, "k8s.cluster.name": "east"})
    server = ReadableSpan(
        "GET /v1/chat",
        context=_ctx(0xB7AD6B7169203331),
        resource=api,
        attributes={
            "http.request.method": "GET",
            "http.response.status_code": 200,
            "url.path": "/v1/chat",
            "server.port": 8000,
            "network.peer.address": "10.0.0.7",
            "gen_ai.usage.ratio": 0.25,
            "otel_ebpf.truncated": False,
            "http.request.header.accept": ("application/json", "text/plain"),
        },
        kind=SpanKind.SERVER,
        status=Status(StatusCode.UNSET),
        start_time=T0,
        end_time=T0 + 12_345_678,
        instrumentation_scope=SCOPE,
    )
    client = ReadableSpan(
        "SELECT",
        context=_ctx(0x00F067AA0BA902B7),
        parent=_ctx(0xB7AD6B7169203331),
        resource=api,
        attributes={"db.system.name": "postgresql", "server.address": "db", "server.port": 5432},
        kind=SpanKind.CLIENT,
        status=Status(StatusCode.ERROR, "connection reset"),
        start_time=T0 + 1_000_000,
        end_time=T0 + 9_000_000,
        instrumentation_scope=SCOPE,
    )
    db_server = ReadableSpan(
        "SELECT",
        context=_ctx(0x1122334455667788, trace_id=0x1),
        resource=db,
        attributes={"db.system.name": "postgresql"},
        links=[Link(_ctx(0x00F067AA0BA902B7), {"otel_ebpf.link.reason": "ambiguous_thread"})],
        kind=SpanKind.SERVER,
        status=Status(StatusCode.OK),
        start_time=T0 + 2_000_000,
        end_time=T0 + 8_000_000,
        instrumentation_scope=SCOPE,
    )
    return [server, client, db_server]


def expected_flat(span: ReadableSpan) -> dict[str, Any]:
    """What the receiver's flattening must yield for ``span``."""

    def plain(attributes: Any) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}

    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": format(span.context.span_id, "016x"),
        "parent_span_id": format(span.parent.span_id, "016x") if span.parent else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status_code": span.status.status_code.name,
        "status_message": span.status.description or "",
        "attributes": plain(span.attributes),
        "links": [
            {
                "trace_id": format(link.context.trace_id, "032x"),
                "span_id": format(link.context.span_id, "016x"),
                "attributes": plain(link.attributes),
            }
            for link in span.links
        ],
        "scope": span.instrumentation_scope.name,
        "resource": dict(span.resource.attributes),
    }


def make_metrics() -> MetricsData:
    """Real SDK metrics from two resources: a counter, an up-down counter and a histogram each."""
    resource_metrics = []
    for service, scale in (("api", 1), ("db", 10)):
        reader = InMemoryMetricReader()
        provider = MeterProvider(
            resource=Resource({"service.name": service}),
            metric_readers=[reader],
            views=[
                View(
                    instrument_name="http.server.request.duration",
                    aggregation=ExplicitBucketHistogramAggregation((0.005, 0.01, 0.1, 1.0)),
                )
            ],
        )
        meter = provider.get_meter("otel-ebpf", "0.1.0")
        requests = meter.create_counter("otel_ebpf.test.requests", unit="{request}")
        active = meter.create_up_down_counter("http.server.active_requests", unit="{request}")
        duration = meter.create_histogram("http.server.request.duration", unit="s")
        for status in (200, 200, 500):
            requests.add(scale, {"http.response.status_code": status})
            duration.record(0.003 * scale, {"http.request.method": "GET"})
        active.add(2 * scale)
        active.add(-1)
        data = reader.get_metrics_data()
        assert data is not None
        resource_metrics.extend(data.resource_metrics)
        provider.shutdown()
    return MetricsData(resource_metrics=resource_metrics)


@functools.cache
def shared_metrics() -> MetricsData:
    return make_metrics()


def by_span_id(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(spans, key=lambda span: span["span_id"])


def sorted_points(metrics: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {name: sorted(points, key=repr) for name, points in metrics.items()}


def counters(selfmetrics: SelfMetrics) -> dict[tuple[str, frozenset], int]:
    """Self-metric values per (name, attributes), read through a real SDK reader."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    selfmetrics.register(provider.get_meter("test"))
    data = reader.get_metrics_data()
    provider.shutdown()
    values: dict[tuple[str, frozenset], int] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    values[(metric.name, frozenset(point.attributes.items()))] = point.value
    return values


def config(tmp_path: Path, **cli: Any) -> AgentConfig:
    cli.setdefault("output", str(tmp_path / "out"))
    env = {key: str(value) for key, value in cli.pop("env", {}).items()}
    return load_config(cli, env)


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as rx:
        yield rx


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port that accepts TCP connections (in the kernel backlog) but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        yield sock.getsockname()[1]


# --- the same telemetry on every path ---


def test_spans_and_metrics_are_identical_over_grpc_http_and_file(tmp_path: Path, receiver: OTLPReceiver) -> None:
    spans, metrics = make_spans(), make_metrics()
    paths = {"grpc": receiver.grpc_endpoint, "http/protobuf": receiver.http_endpoint}
    for protocol, endpoint in paths.items():
        cfg = config(
            tmp_path,
            exporter=["otlp", "file"],
            otlp_endpoint=endpoint,
            otlp_protocol=protocol,
            output=str(tmp_path / protocol.replace("/", "-")),
        )
        sink = build_sink(cfg, SelfMetrics())
        sink.export_spans(spans[:2])
        sink.export_spans(spans[2:])
        sink.export_metrics(metrics)
        sink.shutdown(10)

    expected = by_span_id([expected_flat(span) for span in spans])
    assert by_span_id(receiver.spans("grpc")) == expected
    assert by_span_id(receiver.spans("http")) == expected
    assert by_span_id(load_file_spans(tmp_path / "grpc")) == expected
    assert by_span_id(load_file_spans(tmp_path / "http-protobuf")) == expected

    over_grpc = sorted_points(receiver.metrics("grpc"))
    assert sorted_points(receiver.metrics("http")) == over_grpc
    assert sorted_points(load_file_metrics(tmp_path / "grpc")) == over_grpc
    assert sorted_points(load_file_metrics(tmp_path / "http-protobuf")) == over_grpc

    requests = {
        (p["resource"]["service.name"], p["attributes"]["http.response.status_code"]): p
        for p in over_grpc["otel_ebpf.test.requests"]
    }
    assert requests[("api", 200)]["value"] == 2 and requests[("db", 500)]["value"] == 10
    assert requests[("api", 200)]["temporality"] == "CUMULATIVE" and requests[("api", 200)]["monotonic"]
    histogram = {p["resource"]["service.name"]: p for p in over_grpc["http.server.request.duration"]}
    assert histogram["api"]["count"] == 3 and histogram["api"]["bucket_counts"] == [3, 0, 0, 0, 0]
    assert histogram["db"]["bucket_counts"] == [0, 0, 3, 0, 0]
    assert histogram["db"]["explicit_bounds"] == [0.005, 0.01, 0.1, 1.0]
    assert {p["value"] for p in over_grpc["http.server.active_requests"]} == {1, 19}


def test_jsonl_is_collector_otlp_json(tmp_path: Path) -> None:
    spans, metrics = make_spans(), make_metrics()
    span_exporter, metric_exporter = FileSpanExporter(tmp_path), FileMetricExporter(tmp_path)
    span_exporter.export(spans)
    metric_exporter.export(metrics)
    # flushed per export: visible to a reader before the exporter is closed
    trace_lines = (tmp_path / "traces.jsonl").read_text().splitlines()
    metric_lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    span_exporter.shutdown()
    metric_exporter.shutdown()
    assert len(trace_lines) == 1 and len(metric_lines) == 1

    assert from_json_line(trace_lines[0], ExportTraceServiceRequest()) == encode_spans(spans)
    assert from_json_line(metric_lines[0], ExportMetricsServiceRequest()) == encode_metrics(metrics)

    document = json.loads(trace_lines[0])
    first = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert first["traceId"] == format(TRACE, "032x")
    assert first["spanId"] == "b7ad6b7169203331"
    assert first["kind"] == 2  # enums as integers
    assert first["startTimeUnixNano"] == str(T0)  # 64-bit integers as strings
    assert {"key": "server.port", "value": {"intValue": "8000"}} in first["attributes"]
    child = document["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    assert child["parentSpanId"] == "b7ad6b7169203331"
    assert child["status"] == {"code": 2, "message": "connection reset"}
    link = document["resourceSpans"][1]["scopeSpans"][0]["spans"][0]["links"][0]
    assert (link["traceId"], link["spanId"]) == (format(TRACE, "032x"), "00f067aa0ba902b7")
    assert trace_lines[0] == json.dumps(document, separators=(",", ":"), ensure_ascii=False)  # compact

    def keys(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield key
                yield from keys(value)
        elif isinstance(node, list):
            for item in node:
                yield from keys(item)

    assert not [key for key in keys(document) if "_" in key]  # lowerCamelCase field names


def test_jsonl_appends_across_exporters_and_creates_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    for _ in range(2):
        exporter = FileSpanExporter(out)
        exporter.export(make_spans()[:1])
        exporter.shutdown()
    assert len(load_file_spans(out)) == 2


def test_from_json_line_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        from_json_line("{", ExportTraceServiceRequest())
    with pytest.raises(ValueError, match="not hex"):
        from_json_line('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}', ExportTraceServiceRequest())


def test_to_json_line_round_trips(tmp_path: Path) -> None:
    request = encode_spans(make_spans())
    assert from_json_line(to_json_line(request), ExportTraceServiceRequest()) == request


# --- the direct span encoder against the protobuf path it replaces ---


def protobuf_line(spans: Sequence[ReadableSpan]) -> str:
    """The oracle: the SDK's OTLP encoder, then protobuf's JSON mapping with hex ids."""
    return to_json_line(encode_spans(spans))


def assert_same_document(
    spans: Sequence[ReadableSpan],
    encoder: SpanJsonEncoder | None = None,
    proto: SpanProtoEncoder | None = None,
    oracle: Sequence[ReadableSpan] | None = None,
) -> str:
    """Both direct encoders write what the SDK's path writes: the very bytes of its protobuf, and
    its JSON document; of ``oracle`` where the SDK is handed other spans (the repaired ones)."""
    oracle = spans if oracle is None else oracle
    assert (proto or SpanProtoEncoder()).encode(spans) == encode_spans(oracle).SerializeToString()
    line = (encoder or SpanJsonEncoder()).encode(spans)
    assert from_json_line(line, ExportTraceServiceRequest()) == encode_spans(oracle)
    expected = protobuf_line(oracle)
    assert json.loads(line) == json.loads(expected)
    assert line == expected  # same key order, separators and escaping, too
    return line


EVERY_VALUE_TYPE: dict[str, Any] = {
    "str": "GET",
    "str.empty": "",
    "str.escapes": 'quote " backslash \\ newline \n tab \t nul \x00 del \x7f',
    "str.unicode": "naïve 日本語 \u2028 \U0001f600",
    "int": 8000,
    "int.zero": 0,
    "int.min": -(2**63),
    "int.max": 2**63 - 1,
    "float": 0.25,
    "float.zero": 0.0,
    "float.negative_zero": -0.0,
    "float.integral": 5.0,
    "float.huge": 1e300,
    "float.tiny": 5e-324,
    "float.inf": float("inf"),
    "float.-inf": float("-inf"),
    "bool.true": True,
    "bool.false": False,
    "bytes": b"\x00\xffid",
    "bytes.empty": b"",
    "array.str": ("application/json", "text/plain", ""),
    "array.int": [1, -2, 2**63 - 1],
    "array.float": (0.5, -1.0, float("inf")),
    "array.bool": (True, False),
    "array.empty": (),
    "array.with_none": (1, None),
    "array.nested": ((1, "a"), ()),
    "kvlist": {"k": 1, "nested": {"x": (True,)}, 7: "non-str key is str()ed"},
    "kvlist.empty": {},
    "": "empty key",
}


def varied_spans() -> list[ReadableSpan]:
    """Spans exercising every field and grouping case the SDK encoder has."""
    api = Resource({"service.name": "api", "process.pid": 101}, schema_url="https://opentelemetry.io/schemas/1.26.0")
    api_again = Resource({"process.pid": 101, "service.name": "api"}, schema_url=api.schema_url)  # equal, not same
    db = Resource({"service.name": "db", "tags": ("a", "b"), "ratio": 0.5})
    empty = Resource({})
    http = InstrumentationScope("otel_ebpf.protocols.http1", "0.1.0", "https://schema/1", {"scope.attr": 1})
    http_again = InstrumentationScope("otel_ebpf.protocols.http1", "0.1.0", "https://schema/1", {"scope.attr": 1})
    bare = InstrumentationScope("bare")
    remote_parent = SpanContext(TRACE, 0xAB, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    traced = SpanContext(
        TRACE, 0xCD, is_remote=False, trace_flags=TraceFlags(0), trace_state=TraceState([("vendor", "v1"), ("b", "2")])
    )
    bounded = BoundedAttributes(maxlen=2, attributes={"a": 1, "b": 2, "c": 3, "d": 4})
    events = BoundedList(1)
    events.extend([Event("dropped", timestamp=T0), Event("kept", {"exception.type": "ValueError"}, timestamp=T0 + 1)])
    links = BoundedList(1)
    links.extend([Link(_ctx(0x1)), Link(_ctx(0x2), {"reason": "follows"})])
    spans = []
    for number, kind in enumerate(SpanKind):
        spans.append(
            ReadableSpan(
                f"span-{kind.name}",
                context=_ctx(0x100 + number),
                parent=_ctx(0x99) if number % 2 else None,
                resource=(api, db, api_again, empty, api)[number],
                attributes={"kind.number": number},
                kind=kind,
                start_time=T0 + number,
                end_time=T0 + 10 * number + 1,
                instrumentation_scope=(http, bare, http_again, None, http)[number],
            )
        )
    spans += [
        ReadableSpan(
            "every value type",
            context=_ctx(0x200),
            resource=db,
            attributes=EVERY_VALUE_TYPE,
            kind=SpanKind.SERVER,
            status=Status(StatusCode.ERROR, "connection reset by peer"),
            start_time=T0,
            end_time=T0 + 5,
            instrumentation_scope=bare,
        ),
        ReadableSpan(
            "events and links",
            context=traced,
            parent=remote_parent,
            resource=api_again,
            attributes=bounded,
            events=[Event("started", timestamp=T0), Event("", {"n": 1, "names": ("x", "y")}, timestamp=T0 + 2)],
            links=[
                Link(remote_parent, {"otel_ebpf.link.reason": "ambiguous_thread"}),
                Link(SpanContext(1, 2, is_remote=False, trace_state=TraceState([("t", "s")]))),
            ],
            kind=SpanKind.CLIENT,
            status=Status(StatusCode.OK),
            start_time=T0,
            end_time=T0 + 7,
            instrumentation_scope=bare,
        ),
        ReadableSpan(
            "dropped events and links",
            context=_ctx(0x300),
            resource=api,
            events=events,
            links=links,
            start_time=T0,
            end_time=T0 + 9,
            instrumentation_scope=http_again,
        ),
        # what the SDK encoder leaves out: no name, no times, no status at all; zero ids are still ids
        ReadableSpan(
            "", context=SpanContext(0, 0, False), parent=SpanContext(0, 0, False), resource=empty, status=None
        ),
    ]
    return spans


def test_span_encoder_writes_the_protobuf_paths_document() -> None:
    spans = varied_spans()
    line = assert_same_document(spans)
    document = json.loads(line)
    # the cases above really are there: equal resources and scopes merged, in first-seen order
    assert [len(r["scopeSpans"]) for r in document["resourceSpans"]] == [2, 1, 1]
    assert document["resourceSpans"][0]["schemaUrl"] == "https://opentelemetry.io/schemas/1.26.0"
    empty = document["resourceSpans"][2]
    assert (empty["resource"], empty["scopeSpans"][0]["scope"], "schemaUrl" in empty) == ({}, {}, False)
    by_name = {
        span.get("name", ""): span
        for resource_spans in document["resourceSpans"]
        for scope_spans in resource_spans["scopeSpans"]
        for span in scope_spans["spans"]
    }
    assert len(by_name) == len(spans)
    every = by_name["every value type"]
    values = {kv.get("key", ""): kv["value"] for kv in every["attributes"]}
    assert values["float.inf"] == {"doubleValue": "Infinity"} and values["int.min"] == {"intValue": str(-(2**63))}
    assert values["array.empty"] == {"arrayValue": {}} and values["array.with_none"]["arrayValue"]["values"][1] == {}
    assert values["bytes"] == {"bytesValue": "AP9pZA=="} and values[""] == {"stringValue": "empty key"}
    assert every["status"] == {"message": "connection reset by peer", "code": 2} and "parentSpanId" not in every
    linked = by_name["events and links"]
    assert (linked["traceState"], linked["flags"], linked["droppedAttributesCount"]) == ("vendor=v1,b=2", 0x300, 2)
    assert [link["flags"] for link in linked["links"]] == [0x300, 0x100] and "traceState" not in linked["links"][1]
    dropped = by_name["dropped events and links"]
    assert (dropped["droppedEventsCount"], dropped["droppedLinksCount"], dropped["status"]) == (1, 1, {})
    assert by_name[""] == {"traceId": "0" * 32, "spanId": "0" * 16, "parentSpanId": "0" * 16, "kind": 1, "flags": 0x100}


def test_span_encoder_matches_span_by_span_and_in_small_batches() -> None:
    spans = varied_spans()
    # every batch evicts: cached and fresh encodings agree
    encoder, proto = SpanJsonEncoder(max_cached=1), SpanProtoEncoder(max_cached=1)
    for span in spans:
        assert_same_document([span], encoder, proto)
    for start in range(0, len(spans), 3):
        assert_same_document(spans[start : start + 3], encoder, proto)
    assert_same_document(make_spans(), encoder, proto)
    assert SpanJsonEncoder().encode([]) == protobuf_line([]) == "{}"
    assert SpanProtoEncoder().encode([]) == encode_spans([]).SerializeToString() == b""


def test_span_encoder_drops_the_attributes_the_sdk_encoder_drops(caplog: pytest.LogCaptureFixture) -> None:
    attributes = {
        "kept": 1,
        "int.too_big": 2**63,
        "int.too_small": -(2**63) - 1,
        "array.too_big": (1, 2**64),
        "unsupported": object(),
        "kvlist.bad": {"x": 2**70},
        5: "non-string key",
        "kept.too": "yes",
    }
    span = ReadableSpan("s", context=_ctx(1), attributes=attributes, start_time=T0, end_time=T0 + 1)
    line = assert_same_document([span])
    kept = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    assert [kv["key"] for kv in kept] == ["kept", "kept.too"]
    # once by each direct encoder
    assert sum("cannot be encoded" in r.getMessage() for r in caplog.records) == 2 * (len(attributes) - 2)


@pytest.mark.parametrize(
    "span",
    [
        ReadableSpan("s", context=_ctx(1), start_time=-1),
        ReadableSpan("s", context=_ctx(1), end_time=2**64),
        ReadableSpan("s", context=SpanContext(2**128, 1, False)),
        ReadableSpan("s", context=_ctx(1), links=[Link(SpanContext(1, -1, False))]),
    ],
    ids=["negative-time", "time-past-uint64", "trace-id-too-big", "negative-id"],
)
def test_span_encoder_fails_the_batch_where_protobuf_does(span: ReadableSpan) -> None:
    with pytest.raises(Exception) as protobuf:
        protobuf_line([span])
    with pytest.raises(protobuf.type):
        SpanJsonEncoder().encode([span])
    with pytest.raises(protobuf.type):
        SpanProtoEncoder().encode([span])


def repaired(value: Any) -> Any:
    """``value`` with every lone surrogate of its strings (keys too) replaced by ``?``, as the direct
    encoders write them: what the SDK's encoder must be handed to write the same."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode()
    if isinstance(value, (tuple, list)):
        return type(value)(repaired(item) for item in value)
    if isinstance(value, dict):
        return {repaired(key): repaired(item) for key, item in value.items()}
    return value


def test_lone_surrogates_are_written_as_question_marks_and_lose_nothing_else() -> None:
    # json.loads makes them of a peer's "\ud800": the SDK encoder would fail the whole batch
    def span(name: str, attributes: dict[str, Any], message: str) -> ReadableSpan:
        status = Status(StatusCode.ERROR, message)
        return ReadableSpan(name, context=_ctx(1), attributes=attributes, status=status, start_time=T0, end_time=T0 + 1)

    hostile = span("chat \ud800", {"gen_ai.request.model": "m\udfffx", "k\udc80": "v", "n": 1}, "bad \udc80")
    fixed = span("chat ?", {"gen_ai.request.model": "m?x", "k?": "v", "n": 1}, "bad ?")
    neighbour = ReadableSpan("ok", context=_ctx(2), start_time=T0, end_time=T0 + 1)
    assert [repaired(hostile.name), repaired(dict(hostile.attributes))] == [fixed.name, dict(fixed.attributes)]
    assert_same_document([neighbour, hostile, neighbour], oracle=[neighbour, fixed, neighbour])


any_text = st.text(st.characters(exclude_categories=()))  # lone surrogates too: written as "?"
scalars = st.one_of(
    any_text,
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False),  # NaN: protobuf messages holding it are never equal; covered below
    st.binary(max_size=20),
)
attribute_values = st.one_of(
    scalars,
    st.lists(any_text, max_size=4).map(tuple),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4),
    st.lists(st.floats(allow_nan=False), max_size=4).map(tuple),
    st.lists(st.booleans(), max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(
    # keys that stay distinct once repaired: two KeyValues with one key would be one dict entry
    attributes=st.dictionaries(any_text, attribute_values, max_size=6).filter(lambda a: len(repaired(a)) == len(a)),
    name=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=10),
    description=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=10),
)
def test_span_encoder_matches_protobuf_for_any_attributes(
    attributes: dict[str, Any], name: str, description: str
) -> None:
    def span(attributes: dict[str, Any]) -> ReadableSpan:
        return ReadableSpan(
            name,
            context=_ctx(7),
            resource=Resource(attributes),
            attributes=attributes,
            events=[Event(name, attributes, timestamp=T0)],
            links=[Link(_ctx(8), attributes)],
            status=Status(StatusCode.ERROR, description),
            start_time=T0,
            end_time=T0 + 1,
            instrumentation_scope=InstrumentationScope(name, description, None, attributes),
        )

    assert_same_document([span(attributes)], oracle=[span(repaired(attributes))])


def test_remembered_attributes_never_stand_for_equal_values_of_another_type() -> None:
    # 1 == True == 1.0 and "1" is not 1: each value keeps its own encoding across spans and batches
    values = [1, True, 1.0, "1", 0, False, 0.0, "", None, (1,), 2**62, -1]
    spans = [ReadableSpan("s", context=_ctx(n + 1), attributes={"v": value}) for n, value in enumerate(values)]
    proto = SpanProtoEncoder()
    assert_same_document(spans, proto=proto)
    for span in reversed(spans):
        assert_same_document([span], proto=proto)


def test_span_encoder_writes_nan_as_protobuf_json_does() -> None:
    span = ReadableSpan("s", context=_ctx(1), attributes={"nan": float("nan"), "in": (float("nan"),)})
    assert SpanProtoEncoder().encode([span]) == encode_spans([span]).SerializeToString()
    assert SpanJsonEncoder().encode([span]) == protobuf_line([span])
    assert '{"doubleValue":"NaN"}' in protobuf_line([span])


def test_unwritable_output_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(ExporterSetupError, match=r"file exporter cannot write .*not-a-dir/sub/traces\.jsonl"):
        build_sink(config(tmp_path, exporter=["file"], output=str(blocker / "sub")), SelfMetrics())


def test_console_output() -> None:
    out = io.StringIO()
    ConsoleSpanExporter(out).export(make_spans())
    ConsoleMetricExporter(out).export(make_metrics())
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("api  SERVER  GET /v1/chat  UNSET  12.346 ms  http.request.method=GET ")
    assert "http.request.header.accept=application/json,text/plain" in lines[0]
    assert lines[1] == (
        "api  CLIENT  SELECT  ERROR(connection reset)  8.000 ms  "
        "db.system.name=postgresql server.address=db server.port=5432"
    )
    assert lines[2].startswith("db  SERVER  SELECT  OK  6.000 ms")
    assert "api  otel_ebpf.test.requests{http.response.status_code=200}  2 {request}" in lines
    histogram = "db  http.server.request.duration{http.request.method=GET}  count=3 sum=0.09 s min=0.03 max=0.03"
    assert histogram in lines


# --- OTLP specifics ---


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_headers_and_gzip_reach_the_backend(tmp_path: Path, receiver: OTLPReceiver, protocol: str) -> None:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint + "/"
    cfg = config(
        tmp_path,
        exporter=["otlp"],
        otlp_endpoint=endpoint,
        otlp_protocol=protocol,
        env={"OTEL_EXPORTER_OTLP_HEADERS": "X-Api-Key=s3cr%3Dt,x-tenant=ml", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
    )
    sink = build_sink(cfg, SelfMetrics())
    sink.export_spans(make_spans())
    sink.export_metrics(make_metrics())
    sink.shutdown(10)
    received = receiver.received()
    assert sorted(r.signal for r in received) == ["metrics", "traces"]
    for request in received:
        assert request.headers["x-api-key"] == "s3cr=t" and request.headers["x-tenant"] == "ml"
        if protocol == "http/protobuf":  # gRPC's grpc-encoding is transport-level, not metadata
            assert request.headers["content-encoding"] == "gzip"
    assert len(receiver.spans()) == 3


def test_signal_specific_http_endpoints_are_used_as_is(tmp_path: Path, receiver: OTLPReceiver) -> None:
    cfg = config(
        tmp_path,
        exporter=["otlp"],
        otlp_protocol="http/protobuf",
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # must not be used
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint + "/v1/traces",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.http_endpoint + "/v1/metrics",
        },
    )
    sink = build_sink(cfg, SelfMetrics())
    sink.export_spans(make_spans())
    sink.export_metrics(make_metrics())
    sink.shutdown(10)
    assert len(receiver.spans("http")) == 3 and receiver.metrics("http")


class _Proxy(ThreadingHTTPServer):
    """A forward proxy that answers every request itself: 200, and what it was asked."""

    def __init__(self) -> None:
        seen: list[tuple[str, str | None]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                seen.append((self.requestline, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                """Quiet: what the proxy was asked is in ``seen``."""

        super().__init__(("127.0.0.1", 0), Handler)
        self.seen = seen
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.mark.parametrize("bypassed", [False, True])
def test_http_transport_reads_proxies_and_netrc_from_the_environment_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bypassed: bool
) -> None:
    """The proxy variables and ~/.netrc apply as requests applies them, read when the transport
    is made, not at every post: changed afterwards, they change nothing."""
    proxy = _Proxy()
    netrc = tmp_path / "netrc"
    netrc.write_text("machine collector.invalid login agent password secret\n")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.setenv("NO_PROXY", "collector.invalid" if bypassed else "localhost")
    monkeypatch.setenv("NETRC", str(netrc))
    cfg = config(tmp_path, otlp_endpoint="http://collector.invalid:4318", otlp_protocol="http/protobuf")
    transport = build_transport(cfg.otlp, "traces")
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.setenv("NO_PROXY", "*")
    result = transport.send(encode_spans(make_spans()).SerializeToString(), cfg.otlp.timeout_s)
    transport.close()
    proxy.shutdown()
    proxy.server_close()
    if bypassed:  # straight to a host that does not resolve
        assert not result.ok and result.retryable and proxy.seen == []
    else:
        assert result.ok
        assert proxy.seen == [
            ("POST http://collector.invalid:4318/v1/traces HTTP/1.1", "Basic YWdlbnQ6c2VjcmV0")  # agent:secret
        ]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("dead", ["closed", "blackhole"])
def test_one_batch_to_a_dead_backend_costs_at_most_the_timeout(
    tmp_path: Path, blackhole: int, protocol: str, dead: str
) -> None:
    port = blackhole if dead == "blackhole" else closed_port()
    cfg = config(
        tmp_path,
        otlp_endpoint=f"http://127.0.0.1:{port}",
        otlp_protocol=protocol,
        env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1500"},
    )
    transport = build_transport(cfg.otlp, "traces")
    start = time.monotonic()
    result = transport.send(encode_spans(make_spans()).SerializeToString(), cfg.otlp.timeout_s)
    assert not result.ok and result.retryable  # a dead backend may come back
    assert time.monotonic() - start < 1.5 + 0.5
    transport.close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("dead", ["closed", "blackhole"])
def test_dead_backend_never_blocks_bounds_the_queue_and_counts_every_span(
    tmp_path: Path, blackhole: int, protocol: str, dead: str
) -> None:
    port = blackhole if dead == "blackhole" else closed_port()
    cfg = config(
        tmp_path,
        exporter=["otlp"],
        otlp_endpoint=f"http://127.0.0.1:{port}",
        otlp_protocol=protocol,
        env={
            "OTEL_EXPORTER_OTLP_TIMEOUT": "300",
            "OTEL_BSP_MAX_QUEUE_SIZE": "500",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
            "OTEL_BSP_SCHEDULE_DELAY": "10",
            "OTEL_EBPF_OTLP_QUEUE_MAX_BATCHES": "3",  # encoded batches waiting for the backend
            "OTEL_EBPF_OTLP_RETRY_INITIAL": "0.05",
        },
    )
    selfmetrics = SelfMetrics()
    sink = build_sink(cfg, selfmetrics)
    batch = make_spans() * 20  # 60 spans
    slowest = 0.0
    deadline = time.monotonic() + 1.0  # long enough for several failed exports
    sent = 0
    while time.monotonic() < deadline:
        start = time.monotonic()
        sink.export_spans(batch)
        slowest = max(slowest, time.monotonic() - start)
        sent += len(batch)
        assert sink.pending_spans()["otlp"] <= 500 + 100  # queue bound plus the batch in flight
        sink.export_metrics(shared_metrics())
        time.sleep(0.005)
    assert slowest < 0.05

    start = time.monotonic()
    sink.shutdown(1.0)
    assert time.monotonic() - start < 1.0 + 0.2

    values = counters(selfmetrics)
    dropped = {
        reason: values.get(("otel_ebpf.spans.dropped", frozenset({("reason", reason), ("exporter", "otlp")})), 0)
        for reason in ("queue_full", "shutdown")
    }
    assert dropped["queue_full"] > 0  # the first batches wait for the backend; the queue overflows
    assert dropped["shutdown"] > 0  # what waited in the queue when the agent stopped
    assert selfmetrics.total("otel_ebpf.spans.exported") == 0
    assert sum(dropped.values()) == sent  # every span accounted for, exactly once
    assert selfmetrics.total("otel_ebpf.export.attempts.failed") > 0
    assert selfmetrics.total("otel_ebpf.metrics.points.dropped") > 0


# --- the sink's queueing, batching and isolation, with in-memory exporters ---


class RecordingExporter(SpanExporter):
    def __init__(self, block: threading.Event | None = None, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.block = block
        self.fail = fail
        self.shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.block is not None:
            self.block.wait()
        if self.fail:
            raise RuntimeError("exporter bug")
        self.batches.append([span.name for span in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_down = True


def named_spans(count: int, prefix: str = "s") -> list[ReadableSpan]:
    return [ReadableSpan(f"{prefix}{i}", context=_ctx(i + 1), start_time=T0, end_time=T0 + 1) for i in range(count)]


def wait_until(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_batches_fill_to_max_batch_and_the_rest_leaves_after_the_interval() -> None:
    exporter = RecordingExporter()
    sink = TelemetrySink(SelfMetrics(), {"mem": exporter}, {}, max_queue_spans=100, max_batch=10, interval_s=0.3)
    sink.export_spans(named_spans(1, "first"))  # an idle sink exports at once
    assert wait_until(lambda: len(exporter.batches) == 1, 0.2)
    sink.export_spans(named_spans(25))
    assert wait_until(lambda: len(exporter.batches) == 3, 0.2)  # two full batches go at once
    assert [len(b) for b in exporter.batches] == [1, 10, 10]
    assert wait_until(lambda: len(exporter.batches) == 4, 1.0)  # the rest when the interval is up
    assert exporter.batches[3] == [f"s{i}" for i in range(20, 25)]
    sink.shutdown(1)


def test_force_flush_exports_everything_queued() -> None:
    exporter = RecordingExporter()
    selfmetrics = SelfMetrics()
    sink = TelemetrySink(selfmetrics, {"mem": exporter}, {}, max_queue_spans=100, max_batch=50, interval_s=60)
    sink.export_spans(named_spans(7))
    sink.export_spans(named_spans(7))
    assert sink.force_flush(2.0)
    assert sum(len(b) for b in exporter.batches) == 14
    assert selfmetrics.total("otel_ebpf.spans.exported") == 14
    sink.shutdown(1)


def test_a_stuck_exporter_does_not_hold_back_the_others() -> None:
    release = threading.Event()
    stuck, healthy = RecordingExporter(block=release), RecordingExporter()
    selfmetrics = SelfMetrics()
    sink = TelemetrySink(
        selfmetrics, {"stuck": stuck, "healthy": healthy}, {}, max_queue_spans=10, max_batch=5, interval_s=0.01
    )
    for _ in range(4):
        sink.export_spans(named_spans(5))
        time.sleep(0.05)
    assert wait_until(lambda: sum(len(b) for b in healthy.batches) == 20)
    assert sink.pending_spans()["stuck"] <= 10 + 5
    values = counters(selfmetrics)
    assert values[("otel_ebpf.spans.dropped", frozenset({("reason", "queue_full"), ("exporter", "stuck")}))] > 0
    assert ("otel_ebpf.spans.dropped", frozenset({("reason", "queue_full"), ("exporter", "healthy")})) not in values
    release.set()
    sink.shutdown(2)
    assert stuck.shut_down and healthy.shut_down
    assert selfmetrics.total("otel_ebpf.spans.exported") + selfmetrics.total("otel_ebpf.spans.dropped") == 40


def test_shutdown_is_bounded_even_if_an_exporter_never_returns() -> None:
    never = threading.Event()
    selfmetrics = SelfMetrics()
    sink = TelemetrySink(
        selfmetrics, {"stuck": RecordingExporter(block=never)}, {}, max_queue_spans=100, max_batch=10, interval_s=0.01
    )
    sink.export_spans(named_spans(50))
    start = time.monotonic()
    sink.shutdown(0.5)
    assert time.monotonic() - start < 0.5 + 0.1
    values = counters(selfmetrics)
    assert values[("otel_ebpf.spans.dropped", frozenset({("reason", "shutdown"), ("exporter", "stuck")}))] >= 40
    sink.export_spans(named_spans(3))  # after shutdown: dropped and counted, never queued
    assert selfmetrics.total("otel_ebpf.spans.dropped") >= 43
    sink.shutdown(0.5)  # idempotent
    never.set()


def test_a_raising_exporter_is_counted_and_its_worker_survives() -> None:
    exporter = RecordingExporter(fail=True)
    selfmetrics = SelfMetrics()
    sink = TelemetrySink(selfmetrics, {"buggy": exporter}, {}, max_queue_spans=100, max_batch=5, interval_s=0.01)
    sink.export_spans(named_spans(5))
    assert wait_until(lambda: selfmetrics.total("otel_ebpf.spans.dropped") == 5)
    sink.export_spans(named_spans(5))
    assert wait_until(lambda: selfmetrics.total("otel_ebpf.spans.dropped") == 10)
    values = counters(selfmetrics)
    assert values[("otel_ebpf.spans.dropped", frozenset({("reason", "export_failed"), ("exporter", "buggy")}))] == 10
    sink.shutdown(1)


def test_sdk_disabled_exports_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path, exporter=["file", "console"], env={"OTEL_SDK_DISABLED": "true"})
    selfmetrics = SelfMetrics()
    sink = build_sink(cfg, selfmetrics)
    assert sink.exporters == ()
    sink.export_spans(make_spans())
    sink.export_metrics(shared_metrics())
    sink.shutdown(1)
    assert not (tmp_path / "out").exists()
    assert selfmetrics.total("otel_ebpf.spans.dropped") == 0


def test_build_sink_builds_every_configured_exporter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sink = build_sink(config(tmp_path, exporter=["console", "file"]), SelfMetrics())
    assert sink.exporters == ("console", "file")
    sink.export_spans(make_spans())
    sink.shutdown(2)
    assert capsys.readouterr().out.count("\n") == 3
    assert len(load_file_spans(tmp_path / "out")) == 3


@pytest.mark.parametrize(
    ("name", "counter", "up_down", "histogram"),
    [
        ("cumulative", "CUMULATIVE", "CUMULATIVE", "CUMULATIVE"),
        ("delta", "DELTA", "CUMULATIVE", "DELTA"),
        ("lowmemory", "DELTA", "CUMULATIVE", "DELTA"),
    ],
)
def test_temporality_preference(name: str, counter: str, up_down: str, histogram: str) -> None:
    preference = temporality_preference(name)
    assert preference[Counter] is AggregationTemporality[counter]
    assert preference[UpDownCounter] is AggregationTemporality[up_down]
    assert preference[Histogram] is AggregationTemporality[histogram]


def test_sink_offers_the_configured_temporality(tmp_path: Path) -> None:
    cfg = config(tmp_path, env={"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"})
    sink = build_sink(cfg, SelfMetrics())
    assert sink.preferred_temporality[Counter] is AggregationTemporality.DELTA
    sink.shutdown(1)
