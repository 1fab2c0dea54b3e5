"""ProcessMetrics (protocol metric aggregation) and SelfMetrics (the agent's own counters), exactly."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    InMemoryMetricReader,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ebpf.pipeline.metrics import DEFAULT_BOUNDARIES, DELTA_KINDS, ProcessMetrics, merged_by_resource
from otel_ebpf.protocol import InstrumentKind, InstrumentSpec, MetricPoint, SharedAttributes
from otel_ebpf.selfmetrics import DESCRIPTIONS, SelfMetrics

H, C, U, D = "test.duration", "test.requests", "test.active", "test.size"
SPECS = {
    H: InstrumentSpec(H, InstrumentKind.HISTOGRAM, "s", "durations", boundaries=(1.0, 2.0)),
    C: InstrumentSpec(C, InstrumentKind.COUNTER, "{request}", "requests"),
    U: InstrumentSpec(U, InstrumentKind.UP_DOWN_COUNTER, "{request}", "active requests"),
    D: InstrumentSpec(D, InstrumentKind.HISTOGRAM, "By", "sizes"),  # default buckets
}
SCOPE = InstrumentationScope("otel_ebpf.protocols.test", "1")
OTHER_SCOPE = InstrumentationScope("otel_ebpf.protocols.other", "1")
RESOURCE = Resource({"service.name": "svc"})
DELTA = DELTA_KINDS["delta"]


def record(
    pm: ProcessMetrics, instrument: str, value: float, t: int, scope: InstrumentationScope = SCOPE, **attributes: object
) -> None:
    pm.record(scope, MetricPoint(instrument, value, attributes), t)


def table(rm: ResourceMetrics | None) -> dict[tuple, tuple]:
    """(scope, metric, sorted attributes) -> (temporality, monotonic or None, point)."""
    out: dict[tuple, tuple] = {}
    if rm is None:
        return out
    assert rm.resource is RESOURCE
    for sm in rm.scope_metrics:
        for metric in sm.metrics:
            assert (metric.unit, metric.description) == (SPECS[metric.name].unit, SPECS[metric.name].description)
            monotonic = getattr(metric.data, "is_monotonic", None)
            for point in metric.data.data_points:
                key = (sm.scope.name, metric.name, tuple(sorted(point.attributes.items())))
                assert key not in out
                out[key] = (metric.data.aggregation_temporality, monotonic, point)
    return out


def test_histograms_and_sums_aggregate_exactly() -> None:
    pm = ProcessMetrics(RESOURCE, SPECS)
    assert pm.collect(100) is None
    for t, value in enumerate((0.5, 1.0, 1.5, 2.0, 2.5, 1.0), start=10):
        record(pm, H, value, t, route="/a")
    record(pm, H, 3.0, 20, route="/b")
    record(pm, C, 1, 11, route="/a")
    record(pm, C, 2, 12, route="/a")
    record(pm, C, 0.25, 13, route="/b")
    record(pm, U, 1, 14)
    record(pm, U, -3, 15)
    record(pm, D, 5, 16)
    record(pm, D, 5.5, 17)
    record(pm, D, 20000, 18)
    record(pm, C, 7, 19, scope=OTHER_SCOPE, route="/a")

    got = table(pm.collect(100))
    cumulative = AggregationTemporality.CUMULATIVE
    assert got == {
        ("otel_ebpf.protocols.test", H, (("route", "/a"),)): (
            cumulative,
            None,
            HistogramDataPoint({"route": "/a"}, 10, 100, 6, 8.5, [3, 2, 1], [1.0, 2.0], 0.5, 2.5),
        ),  # bounds are inclusive
        ("otel_ebpf.protocols.test", H, (("route", "/b"),)): (
            cumulative,
            None,
            HistogramDataPoint({"route": "/b"}, 20, 100, 1, 3.0, [0, 0, 1], [1.0, 2.0], 3.0, 3.0),
        ),
        ("otel_ebpf.protocols.test", C, (("route", "/a"),)): (
            cumulative,
            True,
            NumberDataPoint({"route": "/a"}, 11, 100, 3),
        ),
        ("otel_ebpf.protocols.test", C, (("route", "/b"),)): (
            cumulative,
            True,
            NumberDataPoint({"route": "/b"}, 13, 100, 0.25),
        ),
        ("otel_ebpf.protocols.test", U, ()): (cumulative, False, NumberDataPoint({}, 14, 100, -2)),
        ("otel_ebpf.protocols.test", D, ()): (
            cumulative,
            None,
            HistogramDataPoint(
                {},
                16,
                100,
                3,
                20010.5,
                [0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                list(DEFAULT_BOUNDARIES),
                5,
                20000,
            ),
        ),
        ("otel_ebpf.protocols.other", C, (("route", "/a"),)): (
            cumulative,
            True,
            NumberDataPoint({"route": "/a"}, 19, 100, 7),
        ),
    }
    counter = got[("otel_ebpf.protocols.test", C, (("route", "/a"),))][2]
    assert type(counter.value) is int  # whole sums are exported as integers
    assert pm.overflowed == 0


def test_attribute_order_does_not_split_a_series() -> None:
    pm = ProcessMetrics(RESOURCE, SPECS)
    pm.record(SCOPE, MetricPoint(C, 1, {"a": 1, "b": 2}), 1)
    pm.record(SCOPE, MetricPoint(C, 1, {"b": 2, "a": 1}), 2)
    assert [p.value for *_, p in table(pm.collect(3)).values()] == [2]


def test_cumulative_series_keep_growing_from_their_first_point() -> None:
    pm = ProcessMetrics(RESOURCE, SPECS)
    record(pm, H, 1.5, 10)
    record(pm, C, 1, 10)
    first = table(pm.collect(100))
    record(pm, H, 0.5, 150)
    record(pm, C, 4, 150)
    second = table(pm.collect(200))
    assert [
        (p.start_time_unix_nano, p.time_unix_nano, p.count, p.sum, p.bucket_counts)
        for *_, p in (first[k] for k in first if k[1] == H)
    ] == [(10, 100, 1, 1.5, [0, 1, 0])]
    assert [
        (p.start_time_unix_nano, p.time_unix_nano, p.count, p.sum, p.bucket_counts)
        for *_, p in (second[k] for k in second if k[1] == H)
    ] == [(10, 200, 2, 2.0, [1, 1, 0])]
    assert [
        (p.start_time_unix_nano, p.time_unix_nano, p.value) for *_, p in (second[k] for k in second if k[1] == C)
    ] == [(10, 200, 5)]
    # nothing new: a cumulative series is still reported, unchanged
    third = table(pm.collect(300))
    assert {k: (v[2].start_time_unix_nano, v[2].time_unix_nano) for k, v in third.items()} == {
        k: (10, 300) for k in second
    }


def test_delta_kinds_restart_after_each_collection_and_up_down_counters_stay_cumulative() -> None:
    pm = ProcessMetrics(RESOURCE, SPECS)
    record(pm, H, 1.5, 10)
    record(pm, C, 2, 11)
    record(pm, U, 5, 12)
    first = table(pm.collect(100, DELTA))
    assert {k[1]: (v[0], v[2].start_time_unix_nano, v[2].time_unix_nano) for k, v in first.items()} == {
        H: (AggregationTemporality.DELTA, 10, 100),
        C: (AggregationTemporality.DELTA, 11, 100),
        U: (AggregationTemporality.CUMULATIVE, 12, 100),
    }
    # no new points: the delta series are gone, the up-down counter is still there
    second = table(pm.collect(200, DELTA))
    assert {k[1]: (v[2].start_time_unix_nano, v[2].value) for k, v in second.items()} == {U: (12, 5)}
    record(pm, H, 0.5, 250)
    record(pm, C, 3, 260)
    record(pm, U, -1, 270)
    third = table(pm.collect(300, DELTA))
    h = next(v[2] for k, v in third.items() if k[1] == H)
    assert (h.start_time_unix_nano, h.time_unix_nano, h.count, h.sum, h.bucket_counts, h.min, h.max) == (
        250,
        300,
        1,
        0.5,
        [1, 0, 0],
        0.5,
        0.5,
    )
    assert {k[1]: (v[2].start_time_unix_nano, v[2].value) for k, v in third.items() if k[1] != H} == {
        C: (260, 3),
        U: (12, 4),
    }


def test_cardinality_cap_folds_new_series_into_the_overflow_series() -> None:
    pm = ProcessMetrics(RESOURCE, SPECS, max_series=3)
    record(pm, C, 1, 1, route="/1")
    record(pm, C, 1, 2, route="/2")
    record(pm, H, 1.5, 3, route="/1")  # the cap counts series of every instrument together
    record(pm, C, 10, 4, route="/3")
    record(pm, C, 100, 5, route="/4")
    record(pm, C, 1, 6, route="/1")  # an existing series still takes points
    record(pm, H, 0.5, 7, route="/2")
    assert pm.overflowed == 3
    got = table(pm.collect(100, DELTA))
    overflow = (("otel.metric.overflow", True),)
    assert {
        (k[1], k[2]): (v[2].start_time_unix_nano, getattr(v[2], "value", None) or v[2].count) for k, v in got.items()
    } == {
        (C, (("route", "/1"),)): (1, 2),
        (C, (("route", "/2"),)): (2, 1),
        (C, overflow): (4, 110),
        (H, (("route", "/1"),)): (3, 1),
        (H, overflow): (7, 1),
    }
    # DELTA series were dropped at collection: the budget is free again
    record(pm, C, 1, 200, route="/5")
    assert [k[2] for k in table(pm.collect(300, DELTA))] == [(("route", "/5"),)]
    assert pm.overflowed == 3  # the caller (Telemetry) reads and resets it


def test_cumulative_overflow_keeps_folding() -> None:
    pm = ProcessMetrics(RESOURCE, SPECS, max_series=1)
    record(pm, C, 1, 1, route="/1")
    pm.collect(10)
    record(pm, C, 1, 11, route="/2")
    assert pm.overflowed == 1
    assert {k[2]: v[2].value for k, v in table(pm.collect(20)).items()} == {
        (("route", "/1"),): 1,
        (("otel.metric.overflow", True),): 1,
    }


def test_shared_attributes_aggregate_as_plain_ones_across_collections_scopes_and_the_cap() -> None:
    """Series found by a SharedAttributes object (remembered per scope, forgotten at each
    collection) hold what the same points with plain dicts make, overflow counts included."""
    routes = [SharedAttributes(route=f"/{i}") for i in range(3)]
    shared, plain = ProcessMetrics(RESOURCE, SPECS, max_series=4), ProcessMetrics(RESOURCE, SPECS, max_series=4)
    got: list[tuple[dict, dict]] = []
    t = 0
    for collection in range(3):
        for i in range(12):
            t += 1
            route, scope = routes[i % 3], (SCOPE, OTHER_SCOPE)[i % 2]
            points = [(H, 0.5 * (i % 5)), (C, 1), (D, 10.0 * i)]
            shared.record_all(scope, [MetricPoint(n, v, route) for n, v in points], t, skip={D} if i == 7 else ())
            plain.record_all(scope, [MetricPoint(n, v, dict(route)) for n, v in points], t, skip={D} if i == 7 else ())
        kinds = DELTA if collection != 1 else frozenset()
        got.append((table(shared.collect(t, kinds)), table(plain.collect(t, kinds))))
    for from_shared, from_plain in got:
        assert from_shared.keys() == from_plain.keys()
        assert {k: v[2] for k, v in from_shared.items()} == {k: v[2] for k, v in from_plain.items()}
    assert shared.overflowed == plain.overflowed > 0


# ---- SelfMetrics --------------------------------------------------------------------------------


def test_selfmetrics_counters_gauges_and_totals() -> None:
    sm = SelfMetrics()
    sm.add("otel_ebpf.parse.errors", 2, {"protocol": "http1"})
    sm.add("otel_ebpf.parse.errors", 3, {"protocol": "other"})
    sm.add("otel_ebpf.parse.errors", 1, {"protocol": "http1"})
    sm.add("otel_ebpf.events.lost", 0)
    sm.set("otel_ebpf.connections.tracked", 7)
    sm.set("otel_ebpf.connections.tracked", 4)
    assert sm.total("otel_ebpf.parse.errors") == 6
    assert sm.total("otel_ebpf.connections.tracked") == 4
    snapshot = sm.snapshot()
    assert set(snapshot) == set(DESCRIPTIONS)
    assert snapshot["otel_ebpf.parse.errors"] == 6
    assert snapshot["otel_ebpf.events.lost"] == 0

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    sm.register(provider.get_meter("otel_ebpf"))
    exported = {
        m.name: m for rm in reader.get_metrics_data().resource_metrics for s in rm.scope_metrics for m in s.metrics
    }
    errors = exported["otel_ebpf.parse.errors"]
    assert isinstance(errors.data, Sum) and errors.data.is_monotonic
    assert errors.unit == "{error}"
    assert sorted((dict(p.attributes)["protocol"], p.value) for p in errors.data.data_points) == [
        ("http1", 3),
        ("other", 3),
    ]
    tracked = exported["otel_ebpf.connections.tracked"]
    assert isinstance(tracked.data, Gauge)
    assert [p.value for p in tracked.data.data_points] == [4]
    # a zero amount creates no series: nothing to report for events.lost
    assert "otel_ebpf.events.lost" not in exported
    provider.shutdown()


def test_collections_of_one_process_from_several_views_are_merged_not_replaced() -> None:
    """The OTLP encoder keys by resource then scope: a second entry for a process (its GPU and its
    RDMA views both emit) would replace the first."""
    specs = {
        name: InstrumentSpec(name, InstrumentKind.COUNTER, "1", "") for name in ("gpu.calls", "rdma.calls", "http.x")
    }
    process = {"process.pid": 7}
    views = []
    for scope, names in (("gpu", ("gpu.calls",)), ("rdma", ("rdma.calls",)), ("gpu", ("http.x",))):
        metrics = ProcessMetrics(Resource(process), specs)
        for name in names:
            metrics.record(InstrumentationScope(scope), MetricPoint(name, 1, {}), 10)
        views.append(metrics.collect(20))
    other = ProcessMetrics(Resource({"process.pid": 8}), specs)
    other.record(InstrumentationScope("gpu"), MetricPoint("gpu.calls", 2, {}), 10)
    views.append(other.collect(20))
    merged = merged_by_resource(views)
    assert [r.resource.attributes["process.pid"] for r in merged] == [7, 8]
    encoded = encode_metrics(MetricsData(merged))
    sent = {
        (r.resource.attributes[0].value.int_value, s.scope.name): [m.name for m in s.metrics]
        for r in encoded.resource_metrics
        for s in r.scope_metrics
    }
    assert sent == {(7, "gpu"): ["gpu.calls", "http.x"], (7, "rdma"): ["rdma.calls"], (8, "gpu"): ["gpu.calls"]}
