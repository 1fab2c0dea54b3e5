"""Aggregation of protocol metric points into the SDK's ``MetricsData``, fast enough for the event path.

The SDK's instruments validate and hash attributes on every ``record`` (tens of microseconds per
point, the largest cost per request when we used them), and tie each ``MeterProvider`` to one
resource. Here one small aggregator per observed process keeps explicit-bucket histograms and sums
keyed by attribute tuples, and produces the same ``opentelemetry.sdk.metrics.export`` data classes
the exporters take. Series per process are capped; points past the cap go to the overflow series
the SDK uses (``otel.metric.overflow=true``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ..protocol import AttributeValue, InstrumentKind, InstrumentSpec, MetricPoint, SharedAttributes

# OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE presets: which kinds report DELTA.
DELTA_KINDS = {
    "cumulative": frozenset(),
    "delta": frozenset({InstrumentKind.HISTOGRAM, InstrumentKind.COUNTER}),
    "lowmemory": frozenset({InstrumentKind.HISTOGRAM, InstrumentKind.COUNTER}),
}
# The SDK's default explicit buckets, for histograms that declare none.
DEFAULT_BOUNDARIES = (
    0.0,
    5.0,
    10.0,
    25.0,
    50.0,
    75.0,
    100.0,
    250.0,
    500.0,
    750.0,
    1000.0,
    2500.0,
    5000.0,
    7500.0,
    10000.0,
)
OVERFLOW_ATTRIBUTES = (("otel.metric.overflow", True),)
MAX_SERIES = 2000
MAX_SHARED = 256  # SharedAttributes objects whose series a ProcessMetrics remembers


@dataclass
class _Series:
    attributes: tuple
    start_ns: int
    value: float = 0.0  # sum (counters, histograms) or the last reading (gauges)
    count: int = 0
    minimum: float = float("inf")
    maximum: float = float("-inf")
    buckets: list[int] = field(default_factory=list)


class ProcessMetrics:
    """The metric series of one resource."""

    def __init__(self, resource: Resource, specs: Mapping[str, InstrumentSpec], max_series: int = MAX_SERIES) -> None:
        self.resource = resource
        self._specs = specs
        self._max_series = max_series
        # (scope, instrument) -> attribute tuple -> series
        self._series: dict[tuple[InstrumentationScope, str], dict[tuple, _Series]] = {}
        # (scope, id of a SharedAttributes) -> (the object, its series by instrument): see record_all
        self._shared: dict[tuple[InstrumentationScope, int], tuple[Mapping, dict]] = {}
        self._count = 0
        self.overflowed = 0

    def record(self, scope: InstrumentationScope, point: MetricPoint, now_ns: int) -> None:
        self.record_all(scope, (point,), now_ns)

    def record_all(
        self, scope: InstrumentationScope, points: Iterable[MetricPoint], now_ns: int, skip: Container[str] = ()
    ) -> None:
        """Record ``points`` (an exchange's), except those of the instruments in ``skip``.

        An exchange's points share one attributes mapping: its series key (the sorted items) is
        built once for all of them, not once per instrument. For :class:`SharedAttributes` not
        even that: their series, per instrument, are remembered by the object itself.
        """
        attributes: Mapping[str, AttributeValue] | None = None
        key: tuple | None = None
        known: dict[str, tuple[_Series, Sequence[float] | None]] | None = None
        boundaries: Sequence[float] | None
        for point in points:
            instrument = point.instrument
            if instrument in skip:
                continue
            if point.attributes is not attributes:
                attributes = point.attributes
                known = self._known_series(scope, attributes) if type(attributes) is SharedAttributes else None
                key = None
            found = known.get(instrument) if known is not None else None
            if found is None:
                spec = self._specs[instrument]
                if key is None:
                    key = tuple(sorted(attributes.items()))
                series = self._series_at(scope, spec, key, now_ns)
                boundaries = (spec.boundaries or DEFAULT_BOUNDARIES) if series.buckets else None
                if known is not None and series.attributes is not OVERFLOW_ATTRIBUTES:
                    known[instrument] = series, boundaries  # overflowing points are counted each time
            else:
                series, boundaries = found
            value = point.value
            series.value += value
            series.count += 1
            if boundaries is not None:
                series.buckets[bisect_left(boundaries, value)] += 1
                if value < series.minimum:
                    series.minimum = value
                if value > series.maximum:
                    series.maximum = value

    def _known_series(
        self, scope: InstrumentationScope, attributes: Mapping[str, AttributeValue]
    ) -> dict[str, tuple[_Series, Sequence[float] | None]]:
        """The series remembered for ``attributes`` (a SharedAttributes) in ``scope``, by instrument:
        the entry keeps the object, so its id is not reused while the entry lasts. The oldest entry
        goes when MAX_SHARED are kept; all go when series may be dropped (collect, forget)."""
        entry = self._shared.get((scope, id(attributes)))
        if entry is None:
            if len(self._shared) >= MAX_SHARED:
                del self._shared[next(iter(self._shared))]
            entry = self._shared[(scope, id(attributes))] = (attributes, {})
        return entry[1]

    def observe(
        self,
        scope: InstrumentationScope,
        instrument: str,
        attributes: Mapping[str, AttributeValue],
        value: float,
        now_ns: int,
    ) -> None:
        """A reading of a gauge, or the current total of an up-down counter: it replaces the last."""
        self._series_of(scope, self._specs[instrument], attributes, now_ns).value = float(value)

    def merge_histogram(
        self,
        scope: InstrumentationScope,
        instrument: str,
        attributes: Mapping[str, AttributeValue],
        count: int,
        total: float,
        buckets: Sequence[int],
        minimum: float,
        maximum: float,
        now_ns: int,
    ) -> None:
        """Add values aggregated elsewhere (the kernel's HTTP/1 counts) into a histogram series:
        ``buckets`` are per-bucket counts for the instrument's boundaries."""
        spec = self._specs[instrument]
        series = self._series_of(scope, spec, attributes, now_ns)
        series.value += total
        series.count += count
        for i, n in enumerate(buckets):
            series.buckets[i] += n
        series.minimum = min(series.minimum, minimum)
        series.maximum = max(series.maximum, maximum)

    def _series_of(
        self, scope: InstrumentationScope, spec: InstrumentSpec, attributes: Mapping[str, AttributeValue], now_ns: int
    ) -> _Series:
        return self._series_at(scope, spec, tuple(sorted(attributes.items())), now_ns)

    def _series_at(self, scope: InstrumentationScope, spec: InstrumentSpec, key: tuple, now_ns: int) -> _Series:
        """The series of ``key`` (sorted attribute items), made if new (or the overflow series)."""
        instrument = (scope, spec.name)
        by_attributes = self._series.get(instrument)
        if by_attributes is None:  # not setdefault: that would make a dict per call to throw away
            by_attributes = self._series[instrument] = {}
        series = by_attributes.get(key)
        if series is None:
            if self._count >= self._max_series:
                self.overflowed += 1
                key = OVERFLOW_ATTRIBUTES
                series = by_attributes.get(key)
            if series is None:
                series = _Series(key, now_ns)
                if spec.kind is InstrumentKind.HISTOGRAM:
                    series.buckets = [0] * (len(spec.boundaries or DEFAULT_BOUNDARIES) + 1)
                by_attributes[key] = series
                self._count += 1
        return series

    def forget(self, matches: Callable[[tuple], bool]) -> None:
        """Drop the series whose attributes (sorted ``(key, value)`` pairs) ``matches``: their
        source is gone. One that comes back starts anew, with a new start time."""
        self._shared.clear()
        for instrument, by_attributes in list(self._series.items()):
            for attributes in [a for a in by_attributes if matches(a)]:
                del by_attributes[attributes]
                self._count -= 1
            if not by_attributes:  # an instrument without series exports nothing
                del self._series[instrument]

    def collect(self, now_ns: int, delta: frozenset[InstrumentKind] = frozenset()) -> ResourceMetrics | None:
        """The current points. Instruments whose kind is in ``delta`` report DELTA temporality:
        their series restart after each collection; the others are cumulative."""
        self._shared.clear()
        by_scope: dict[InstrumentationScope, list[Metric]] = {}
        for (scope, name), by_attributes in list(self._series.items()):
            spec = self._specs[name]
            temporality = AggregationTemporality.DELTA if spec.kind in delta else AggregationTemporality.CUMULATIVE
            if temporality is AggregationTemporality.DELTA:
                self._count -= len(by_attributes)
                del self._series[(scope, name)]
            data: Histogram | Sum | Gauge
            if spec.kind is InstrumentKind.HISTOGRAM:
                data = Histogram([self._histogram_point(spec, s, now_ns) for s in by_attributes.values()], temporality)
            elif spec.kind is InstrumentKind.GAUGE:
                data = Gauge([self._number_point(s, now_ns) for s in by_attributes.values()])
            else:
                data = Sum(
                    [self._number_point(s, now_ns) for s in by_attributes.values()],
                    temporality,
                    is_monotonic=spec.kind is InstrumentKind.COUNTER,
                )
            by_scope.setdefault(scope, []).append(Metric(spec.name, spec.description, spec.unit, data))
        if not by_scope:
            return None
        scopes = [ScopeMetrics(scope, metrics, "") for scope, metrics in by_scope.items()]
        return ResourceMetrics(self.resource, scopes, "")

    @staticmethod
    def _histogram_point(spec: InstrumentSpec, s: _Series, now_ns: int) -> HistogramDataPoint:
        bounds = spec.boundaries or DEFAULT_BOUNDARIES
        return HistogramDataPoint(
            dict(s.attributes),
            s.start_ns,
            now_ns,
            s.count,
            s.value,
            list(s.buckets),
            list(bounds),
            s.minimum,
            s.maximum,
        )

    @staticmethod
    def _number_point(s: _Series, now_ns: int) -> NumberDataPoint:
        value = int(s.value) if s.value.is_integer() else s.value
        return NumberDataPoint(dict(s.attributes), s.start_ns, now_ns, value)


def merged_by_resource(collected: Sequence[ResourceMetrics]) -> list[ResourceMetrics]:
    """One ``ResourceMetrics`` per resource, and within it one ``ScopeMetrics`` per scope. Several
    views emit for the same process (sockets, GPU, RDMA); the OTLP encoder keys what it sends by
    resource, then by scope, so a second entry for either would replace the first."""
    merged: dict[Resource, tuple[str, dict[InstrumentationScope, ScopeMetrics]]] = {}
    for resource_metrics in collected:
        _, scopes = merged.setdefault(resource_metrics.resource, (resource_metrics.schema_url, {}))
        for scope_metrics in resource_metrics.scope_metrics:
            known = scopes.get(scope_metrics.scope)
            scopes[scope_metrics.scope] = (
                scope_metrics
                if known is None
                else ScopeMetrics(known.scope, [*known.metrics, *scope_metrics.metrics], known.schema_url)
            )
    return [
        ResourceMetrics(resource, list(scopes.values()), schema_url)
        for resource, (schema_url, scopes) in merged.items()
    ]
