"""The Prometheus exporter without Prometheus: OTel -> Prometheus names and labels, cumulative
series from delta and cumulative points, target_info, stale series and the series cap (counted),
and the agent's HTTP server (/metrics, /healthz, /readyz) on loopback."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Buckets as ExponentialBuckets
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_ebpf.config import load_config
from otel_ebpf.exporters import ExporterSetupError, build_sink
from otel_ebpf.exporters.prometheus import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    PrometheusMetricExporter,
    label_name,
    labels_of,
    metric_name,
)
from otel_ebpf.health import Health
from otel_ebpf.httpserver import AgentHttpServer, start_servers
from otel_ebpf.selfmetrics import SelfMetrics
from tests.conftest import run_agent_command

DELTA = AggregationTemporality.DELTA
CUMULATIVE = AggregationTemporality.CUMULATIVE
SCOPE = InstrumentationScope("otel-ebpf.http1", "0.1.0")
API = Resource(
    {
        "service.name": "api",
        "service.namespace": "shop",
        "service.instance.id": "node-1/101",
        "process.pid": 101,
        "process.command_line": "python3 api.py",
        "host.name": "node-1",
    }
)
DB = Resource({"service.name": "db", "service.instance.id": "node-1/202", "process.pid": 202})
BOUNDS = [0.005, 0.1, 1.0]


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        ("http.server.request.duration", "s", HISTOGRAM, "http_server_request_duration_seconds"),
        ("otel_ebpf.events.received", "{event}", COUNTER, "otel_ebpf_events_received"),
        ("otel_ebpf.payload.not_captured", "By", COUNTER, "otel_ebpf_payload_not_captured_bytes"),
        ("system.network.io", "By/s", GAUGE, "system_network_io_bytes_per_second"),
        ("gpu.utilization", "1", GAUGE, "gpu_utilization_ratio"),
        ("requests.total", "1", COUNTER, "requests"),  # counters end in _total once, on the sample
        ("latency_seconds", "s", HISTOGRAM, "latency_seconds"),  # unit already there: not repeated
        ("queue-depth..now", "{item}/m", GAUGE, "queue_depth_now_per_minute"),
        ("9lives", "", GAUGE, "_9lives"),
        ("weird.unit", "furlong", GAUGE, "weird_unit_furlong"),
    ],
)
def test_metric_names_follow_the_compatibility_spec(name: str, unit: str, kind: str, expected: str) -> None:
    assert metric_name(name, unit, kind) == expected


def test_label_names_and_values() -> None:
    assert label_name("http.request.method") == "http_request_method"
    assert label_name("2xx") == "key_2xx"
    assert label_name("__meta") == "_meta"  # never the reserved __ prefix
    assert labels_of({"a.b": "x", "a_b": "y", "ok": True, "ids": [1, 2], "n": 3}) == {
        "a_b": "x;y",  # collisions joined in key order: "a.b" < "a_b"
        "ok": "true",
        "ids": "[1,2]",
        "n": "3",
    }


def _sum(
    name: str, unit: str, points: Sequence[NumberDataPoint], temporality: AggregationTemporality, monotonic: bool = True
) -> Metric:
    return Metric(name, f"{name} help", unit, Sum(list(points), temporality, monotonic))


def _histogram(points: Sequence[HistogramDataPoint], temporality: AggregationTemporality) -> Metric:
    return Metric("http.server.request.duration", "Duration", "s", Histogram(list(points), temporality))


def _number(value: float, **attributes: object) -> NumberDataPoint:
    return NumberDataPoint(attributes, 0, 1, value)


def _hist_point(buckets: list[int], total: float, **attributes: object) -> HistogramDataPoint:
    return HistogramDataPoint(attributes, 0, 1, sum(buckets), total, buckets, BOUNDS, 0.001, 2.0)


def _data(*by_resource: tuple[Resource, Sequence[Metric]]) -> MetricsData:
    return MetricsData(
        [ResourceMetrics(resource, [ScopeMetrics(SCOPE, list(metrics), "")], "") for resource, metrics in by_resource]
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def selfmetrics() -> SelfMetrics:
    return SelfMetrics()


def _exporter(selfmetrics: SelfMetrics, clock: Clock, max_series: int = 100) -> PrometheusMetricExporter:
    return PrometheusMetricExporter(selfmetrics, max_series=max_series, series_ttl_s=60, clock=clock)


def scrape(exporter: PrometheusMetricExporter) -> dict[tuple[str, tuple], float]:
    """The exposition text as prometheus-client writes it, parsed back: (sample, labels) -> value."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _labels(**extra: str) -> tuple:
    base = {
        "job": "shop/api",
        "instance": "node-1/101",
        "otel_scope_name": "otel-ebpf.http1",
        "otel_scope_version": "0.1.0",
    }
    return tuple(sorted({**base, **extra}.items()))


def test_delta_points_accumulate_cumulative_points_replace(selfmetrics: SelfMetrics, clock: Clock) -> None:
    exporter = _exporter(selfmetrics, clock)
    for value in (3, 4):
        exporter.export(
            _data(
                (
                    API,
                    [
                        _sum("requests", "{request}", [_number(value, **{"http.route": "/a"})], DELTA),
                        _sum("bytes.sent", "By", [_number(value * 100)], CUMULATIVE),
                        _sum("inflight", "{request}", [_number(value)], DELTA, monotonic=False),
                    ],
                )
            )
        )
    got = scrape(exporter)
    assert got[("requests_total", _labels(http_route="/a"))] == 7
    assert got[("bytes_sent_bytes_total", _labels())] == 400
    assert got[("inflight", _labels())] == 7  # an up-down counter's deltas add up too


def test_histograms_are_cumulative_buckets(selfmetrics: SelfMetrics, clock: Clock) -> None:
    exporter = _exporter(selfmetrics, clock)
    exporter.export(_data((API, [_histogram([_hist_point([1, 2, 0, 1], 2.5)], DELTA)])))
    exporter.export(_data((API, [_histogram([_hist_point([0, 1, 1, 0], 0.6)], DELTA)])))
    got = scrape(exporter)
    name = "http_server_request_duration_seconds"
    assert [got[(f"{name}_bucket", _labels(le=le))] for le in ("0.005", "0.1", "1.0", "+Inf")] == [1, 4, 5, 6]
    assert got[(f"{name}_count", _labels())] == 6
    assert got[(f"{name}_sum", _labels())] == pytest.approx(3.1)
    # A cumulative point replaces what the series held.
    exporter.export(_data((API, [_histogram([_hist_point([0, 0, 1, 0], 0.5)], CUMULATIVE)])))
    got = scrape(exporter)
    assert got[(f"{name}_count", _labels())] == 1
    assert got[(f"{name}_bucket", _labels(le="+Inf"))] == 1


def test_resources_become_job_instance_and_target_info(selfmetrics: SelfMetrics, clock: Clock) -> None:
    exporter = _exporter(selfmetrics, clock)
    exporter.export(
        _data((API, [_sum("requests", "", [_number(1)], DELTA)]), (DB, [_sum("requests", "", [_number(2)], DELTA)]))
    )
    got = scrape(exporter)
    info = {labels: value for (name, labels), value in got.items() if name == "target_info"}
    assert info == {
        (
            ("host_name", "node-1"),
            ("instance", "node-1/101"),
            ("job", "shop/api"),
            ("process_command_line", "python3 api.py"),
            ("process_pid", "101"),
        ): 1,
        (("instance", "node-1/202"), ("job", "db"), ("process_pid", "202")): 1,
    }
    db_labels = (
        ("instance", "node-1/202"),
        ("job", "db"),
        ("otel_scope_name", "otel-ebpf.http1"),
        ("otel_scope_version", "0.1.0"),
    )
    assert got[("requests_total", db_labels)] == 2
    assert got[("requests_total", _labels())] == 1


def test_stale_series_are_forgotten_and_counted(selfmetrics: SelfMetrics, clock: Clock) -> None:
    exporter = _exporter(selfmetrics, clock)
    exporter.export(
        _data((API, [_sum("requests", "", [_number(1)], DELTA)]), (DB, [_sum("requests", "", [_number(2)], DELTA)]))
    )
    clock.now += 61  # the api process exited: only db reports from now on
    exporter.export(_data((DB, [_sum("requests", "", [_number(2)], DELTA)])))
    got = scrape(exporter)
    assert {labels for (name, labels) in got if name == "requests_total"} == {
        (
            ("instance", "node-1/202"),
            ("job", "db"),
            ("otel_scope_name", "otel-ebpf.http1"),
            ("otel_scope_version", "0.1.0"),
        )
    }
    assert not any(dict(labels).get("job") == "shop/api" for (_, labels) in got)  # target_info gone too
    assert selfmetrics.snapshot()["otel_ebpf.prometheus.series.dropped"] == 1
    assert selfmetrics.snapshot()["otel_ebpf.prometheus.series"] == 1


def test_series_past_the_cap_are_refused_and_counted(selfmetrics: SelfMetrics, clock: Clock) -> None:
    exporter = _exporter(selfmetrics, clock, max_series=3)
    points = [_number(1, **{"http.route": f"/r{i}"}) for i in range(5)]
    exporter.export(_data((API, [_sum("requests", "", points, DELTA)])))
    exporter.export(_data((API, [_sum("requests", "", points, DELTA)])))
    got = scrape(exporter)
    assert sorted(dict(labels)["http_route"] for (name, labels) in got if name == "requests_total") == [
        "/r0",
        "/r1",
        "/r2",
    ]
    assert got[("requests_total", _labels(http_route="/r0"))] == 2
    assert selfmetrics.total("otel_ebpf.prometheus.series.dropped") == 4  # 2 points refused per export


def test_a_name_seen_as_two_kinds_and_exponential_histograms_are_dropped_and_counted(
    selfmetrics: SelfMetrics, clock: Clock
) -> None:
    exporter = _exporter(selfmetrics, clock)
    exponential = ExponentialHistogramDataPoint(
        {}, 0, 1, 1, 1.0, 0, 0, ExponentialBuckets(0, [1]), ExponentialBuckets(0, []), 0, 1.0, 1.0
    )
    exporter.export(
        _data(
            (
                API,
                [
                    _sum("queue", "", [_number(1)], DELTA),
                    Metric("queue", "", "", Gauge([_number(5)])),  # a gauge named like the counter "queue"
                    Metric("sizes", "", "By", ExponentialHistogram([exponential], DELTA)),
                ],
            )
        )
    )
    assert scrape(exporter)[("queue_total", _labels())] == 1
    dropped = {o.attributes["reason"]: o.value for o in selfmetrics.observe("otel_ebpf.prometheus.series.dropped")}
    assert dropped == {"type_conflict": 1, "unsupported": 1}


def test_build_sink_serves_metrics_only(tmp_path: Path) -> None:
    selfmetrics = SelfMetrics()
    sink = build_sink(load_config({"exporter": ["prometheus"]}, {}), selfmetrics)
    try:
        assert isinstance(sink.metric_exporter(PrometheusMetricExporter), PrometheusMetricExporter)
        assert sink.exporters == ("prometheus",)
        assert sink.pending_spans() == {}  # no span worker: Prometheus takes no spans
    finally:
        sink.shutdown(1)
    sink = build_sink(load_config({"exporter": ["file"], "output": str(tmp_path)}, {}), selfmetrics)
    try:
        assert sink.metric_exporter(PrometheusMetricExporter) is None
    finally:
        sink.shutdown(1)


# --- the HTTP server ---


def _get(port: int, path: str, accept: str = "") -> tuple[int, str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 — http:// on loopback
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture
def served(selfmetrics: SelfMetrics, clock: Clock) -> Iterator[tuple[AgentHttpServer, Health, Clock]]:
    health = Health(stall_after_s=30, clock=clock)
    exporter = _exporter(selfmetrics, clock)
    exporter.export(_data((API, [_sum("requests", "{request}", [_number(5)], DELTA)])))
    server = AgentHttpServer("127.0.0.1", 0, health, exporter, "prometheus.port")
    yield server, health, clock
    server.close()


def test_healthz_and_readyz_through_the_agent_lifecycle(served: tuple[AgentHttpServer, Health, Clock]) -> None:
    server, health, clock = served

    def statuses() -> tuple[int, int]:
        return _get(server.port, "/healthz")[0], _get(server.port, "/readyz")[0]

    assert statuses() == (200, 503)  # attaching probes: alive, not ready
    assert _get(server.port, "/readyz")[2] == "starting: attaching probes\n"
    clock.now += 600  # however long the BPF compile takes
    assert statuses() == (200, 503)
    health.ready_now()
    assert statuses() == (200, 200)
    clock.now += 29
    health.beat()
    clock.now += 29
    assert statuses() == (200, 200)
    clock.now += 2  # 31 s without a loop turn: stalled
    assert statuses() == (503, 503)
    assert _get(server.port, "/healthz")[2] == "main loop stalled: no iteration for 31 s\n"
    health.beat()
    assert statuses() == (200, 200)
    health.stopping()
    assert statuses() == (200, 503)
    assert _get(server.port, "/nope")[0] == 404


def test_metrics_endpoint_in_both_exposition_formats(served: tuple[AgentHttpServer, Health, Clock]) -> None:
    server, _, _ = served
    status, content_type, text = _get(server.port, "/metrics")
    assert (status, content_type.split(";")[0]) == (200, "text/plain")
    assert 'requests_total{instance="node-1/101",job="shop/api",' in text
    status, content_type, text = _get(server.port, "/metrics", "application/openmetrics-text; version=1.0.0")
    assert (status, content_type.split(";")[0]) == (200, "application/openmetrics-text")
    assert text.endswith("# EOF\n")


def test_a_taken_port_is_a_clear_error(served: tuple[AgentHttpServer, Health, Clock]) -> None:
    server, health, _ = served
    with pytest.raises(
        ExporterSetupError,
        match=r"cannot listen on 127.0.0.1:\d+ for /healthz, /readyz: "
        r"the port is already in use; choose another with health.port",
    ):
        AgentHttpServer("127.0.0.1", server.port, health, None, "health.port")


def test_start_servers_shares_or_splits_the_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    health = Health()
    exporter = PrometheusMetricExporter(SelfMetrics(), max_series=10, series_ttl_s=60)
    env = {
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
        "OTEL_EBPF_HEALTH_HOST": "127.0.0.1",
    }
    for health_port, servers_wanted in ((None, 1), (port, 1), (0, 2)):
        extra = {} if health_port is None else {"OTEL_EBPF_HEALTH_PORT": str(health_port or port + 1)}
        servers = start_servers(load_config({}, {**env, **extra}), health, exporter)
        try:
            assert len(servers) == servers_wanted
            assert all(_get(s.port, "/healthz")[0] == 200 for s in servers)
        finally:
            for server in servers:
                server.close()
    # Without the prometheus exporter only health.port serves, and only the probes.
    servers = start_servers(load_config({}, {**env, "OTEL_EBPF_HEALTH_PORT": str(port)}), health, None)
    try:
        assert [_get(s.port, "/metrics")[0] for s in servers] == [404]
    finally:
        servers[0].close()


def test_replay_refuses_the_prometheus_exporter(tmp_path: Path) -> None:
    recording = tmp_path / "r.jsonl"
    recording.write_text("")
    result = run_agent_command("replay", str(recording), "--exporter", "prometheus")
    assert result.returncode == 2
    assert "prometheus exporter is scraped from a running agent" in result.stderr
