"""Metrics for Prometheus to scrape, without a Collector: ``--exporter prometheus``.

:class:`PrometheusMetricExporter` is an SDK ``MetricExporter`` like the others: the sink hands it
every collection. It keeps the latest value of every series in memory, and
:meth:`PrometheusMetricExporter.collect` renders them (``prometheus-client`` writes the exposition
format) when ``/metrics`` is scraped (:mod:`otel_ebpf.httpserver`).

Translation follows the OpenTelemetry "Prometheus and OpenMetrics compatibility" specification,
the way the Collector's ``prometheus`` exporter does it (collector-config/ documents the same
series, so dashboards work with either path):

- names: characters outside ``[a-zA-Z0-9_:]`` become ``_`` (runs collapsed); the unit is appended
  as a word (``s`` → ``_seconds``, ``By`` → ``_bytes``, ``By/s`` → ``_bytes_per_second``,
  ``{request}`` annotations dropped, ``1`` → ``_ratio`` on gauges); monotonic sums are counters
  ending in ``_total``; non-monotonic sums are gauges; histograms give ``_bucket`` / ``_sum`` /
  ``_count``.
- labels: the same character rule (``http.request.method`` → ``http_request_method``), ``key_``
  before a leading digit; attributes that collide after the rule are joined with ``;`` in key order;
  every series also carries ``otel_scope_name`` / ``otel_scope_version``.
- resources (one per observed process): ``job`` is ``service.namespace/service.name`` and
  ``instance`` is ``service.instance.id``, on every series; the other resource attributes go on one
  ``target_info`` series per resource, joined in PromQL when needed (``* on(job, instance)
  group_left(...) target_info``). Copying them onto every series would multiply the cardinality by
  the command lines and paths of every process. The scrape needs ``honor_labels: true`` to keep
  these ``job``/``instance`` (without it they arrive as ``exported_job``/``exported_instance``).

Prometheus wants cumulative counters and histograms: DELTA points (``export.metric_temporality:
delta``) are added to what the series holds; CUMULATIVE points replace it. A series not updated for
``series_ttl_s`` (the process exited, the route went quiet under delta temporality) is forgotten,
so exited processes do not stay forever; at most ``max_series`` series are kept, and points of new
series past the cap are refused. Both are counted: ``otel_ebpf.prometheus.series.dropped{reason}``
(``stale``, ``max_series``, ``type_conflict`` when one name arrives as two kinds,
``unsupported`` for exponential histograms, which the agent does not produce).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from otel_ebpf.selfmetrics import SelfMetrics

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
_FAMILIES: dict[str, Callable[[str, str], Metric]] = {
    COUNTER: CounterMetricFamily,
    GAUGE: GaugeMetricFamily,
    HISTOGRAM: HistogramMetricFamily,
}
DROPPED = "otel_ebpf.prometheus.series.dropped"
SERIES = "otel_ebpf.prometheus.series"

# Units as words (the specification's table of UCUM units), and the denominators of "x/y" units.
_UNIT_WORDS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tebibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "%": "percent",
}
_PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]+")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]+")
_RUNS = re.compile(r"__+")
_ANNOTATIONS = re.compile(r"\{[^}]*\}")
# Resource attributes that become job/instance instead of target_info labels.
_IDENTITY = frozenset({"service.name", "service.namespace", "service.instance.id"})

Labels = tuple[tuple[str, str], ...]


def _sanitize(name: str, invalid: re.Pattern[str]) -> str:
    return _RUNS.sub("_", invalid.sub("_", name))


def unit_suffix(unit: str, kind: str) -> str:
    """The unit as the words a Prometheus name ends with ('' when it has none)."""
    unit = _ANNOTATIONS.sub("", unit or "").strip()
    if unit == "1":
        return "ratio" if kind == GAUGE else ""
    main, _, per = unit.partition("/")
    words = [_UNIT_WORDS.get(main, main)] if main else []
    if per:
        words += ["per", _PER_UNIT_WORDS.get(per, per)]
    return _sanitize("_".join(words), _INVALID_LABEL).strip("_")


def metric_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus family name of an OTel metric; counters' samples add ``_total`` to it."""
    result = _sanitize(name, _INVALID_NAME)
    if result[:1].isdigit():
        result = "_" + result
    if kind == COUNTER and result.endswith("_total"):
        result = result[: -len("_total")]
    suffix = unit_suffix(unit, kind)
    if suffix and not result.endswith("_" + suffix):
        result += "_" + suffix
    return result


def label_name(key: str) -> str:
    """Runs of ``_`` collapse, so no label comes out with the ``__`` Prometheus reserves."""
    result = _sanitize(key, _INVALID_LABEL)
    return "key_" + result if result[:1].isdigit() else result


def label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value), separators=(",", ":"))
    return str(value)


def labels_of(attributes: Mapping[str, Any]) -> dict[str, str]:
    """Attributes as labels; keys that collide after translation are joined with ``;`` in key order."""
    joined: dict[str, list[str]] = {}
    for key in sorted(attributes):
        joined.setdefault(label_name(key), []).append(label_value(attributes[key]))
    return {name: ";".join(values) for name, values in joined.items()}


def target_labels(resource: Resource) -> dict[str, str]:
    """``job`` and ``instance`` from the resource's service attributes (each only when known)."""
    attributes = resource.attributes
    labels = {}
    if "service.name" in attributes:
        namespace = attributes.get("service.namespace")
        service = str(attributes["service.name"])
        labels["job"] = f"{namespace}/{service}" if namespace else service
    if "service.instance.id" in attributes:
        labels["instance"] = str(attributes["service.instance.id"])
    return labels


@dataclass
class _Series:
    value: float = 0.0  # the sum, for histograms
    count: int = 0
    bounds: tuple[float, ...] = ()
    buckets: list[int] = field(default_factory=list)  # per bucket, not cumulative (as OTLP has them)
    updated: float = 0.0


@dataclass
class _Family:
    kind: str
    help: str
    series: dict[Labels, _Series] = field(default_factory=dict)


class PrometheusMetricExporter(MetricExporter):
    """Keeps cumulative series from every export and renders them on scrape (see the module doc)."""

    def __init__(
        self,
        selfmetrics: SelfMetrics,
        *,
        max_series: int,
        series_ttl_s: float,
        preferred_temporality: dict[type, AggregationTemporality] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(preferred_temporality=preferred_temporality)
        self._selfmetrics = selfmetrics
        self._max_series = max_series
        self._ttl_s = series_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._targets: dict[Labels, tuple[Labels, float]] = {}  # job/instance -> (target_info labels, updated)
        self._count = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        now = self._clock()
        with self._lock:
            for resource_metrics in metrics_data.resource_metrics:
                target = target_labels(resource_metrics.resource)
                self._remember_target(resource_metrics.resource, target, now)
                for scope_metrics in resource_metrics.scope_metrics:
                    scope = {
                        "otel_scope_name": scope_metrics.scope.name,
                        "otel_scope_version": scope_metrics.scope.version or "",
                    }
                    for metric in scope_metrics.metrics:
                        self._merge(metric, {**scope, **target}, now)
            self._expire(now)
            self._selfmetrics.set(SERIES, self._count)
        return MetricExportResult.SUCCESS

    def _remember_target(self, resource: Resource, target: dict[str, str], now: float) -> None:
        info = labels_of({k: v for k, v in resource.attributes.items() if k not in _IDENTITY})
        self._targets[tuple(sorted(target.items()))] = (tuple(sorted({**info, **target}.items())), now)

    def _merge(self, metric: Any, fixed: dict[str, str], now: float) -> None:
        data = metric.data
        if isinstance(data, Histogram):
            kind = HISTOGRAM
        elif isinstance(data, Sum) and data.is_monotonic:
            kind = COUNTER
        elif isinstance(data, (Sum, Gauge)):
            kind = GAUGE
        else:
            self._selfmetrics.add(DROPPED, len(data.data_points), {"reason": "unsupported"})
            return
        name = metric_name(metric.name, metric.unit, kind)
        family = self._families.setdefault(name, _Family(kind, metric.description or metric.name))
        if family.kind != kind:
            self._selfmetrics.add(DROPPED, len(data.data_points), {"reason": "type_conflict"})
            return
        delta = getattr(data, "aggregation_temporality", None) is AggregationTemporality.DELTA
        for point in data.data_points:
            key = tuple(sorted({**labels_of(point.attributes or {}), **fixed}.items()))
            series = family.series.get(key)
            if series is None:
                if self._count >= self._max_series:
                    self._selfmetrics.add(DROPPED, 1, {"reason": "max_series"})
                    continue
                series = family.series[key] = _Series()
                self._count += 1
            series.updated = now
            if kind == HISTOGRAM:
                _merge_histogram(series, point, delta)
            else:
                series.value = series.value + point.value if delta else point.value

    def _expire(self, now: float) -> None:
        horizon = now - self._ttl_s
        for name, family in list(self._families.items()):
            stale = [key for key, series in family.series.items() if series.updated < horizon]
            for key in stale:
                del family.series[key]
            if stale:
                self._count -= len(stale)
                self._selfmetrics.add(DROPPED, len(stale), {"reason": "stale"})
            if not family.series:
                del self._families[name]
        for target, (_, updated) in list(self._targets.items()):
            if updated < horizon:
                del self._targets[target]

    def collect(self) -> Iterator[Metric]:
        """The families as ``prometheus-client`` renders them; a ``Collector`` for its registry."""
        with self._lock:
            families = [(name, f.kind, f.help, list(f.series.items())) for name, f in self._families.items()]
            targets = [labels for labels, _ in self._targets.values()]
        if targets:
            info = GaugeMetricFamily("target_info", "Target metadata: the resource attributes of each job/instance")
            for target in targets:
                info.add_sample("target_info", dict(target), 1)
            yield info
        for name, kind, help_text, series in families:
            # Series of one family may carry different label names (error.type only on failures):
            # add_sample takes labels per sample, unlike add_metric.
            family = _FAMILIES[kind](name, help_text)
            for key, s in series:
                labels = dict(key)
                if kind == HISTOGRAM:
                    _add_histogram(family, name, labels, s)
                elif kind == COUNTER:
                    family.add_sample(name + "_total", labels, s.value)
                else:
                    family.add_sample(name, labels, s.value)
            yield family

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True  # nothing is sent: Prometheus pulls

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Nothing to release: the HTTP server that serves :meth:`collect` belongs to the agent."""


def _merge_histogram(series: _Series, point: Any, delta: bool) -> None:
    bounds = tuple(point.explicit_bounds)
    if not delta or bounds != series.bounds:  # new boundaries restart the series (a counter reset)
        series.bounds, series.buckets, series.count, series.value = bounds, [0] * (len(bounds) + 1), 0, 0.0
    for i, n in enumerate(point.bucket_counts):
        series.buckets[i] += n
    series.count += point.count
    series.value += point.sum


def _add_histogram(family: Metric, name: str, labels: dict[str, str], s: _Series) -> None:
    running = 0
    for bound, n in zip((*s.bounds, float("inf")), s.buckets, strict=True):
        running += n
        family.add_sample(name + "_bucket", {**labels, "le": floatToGoString(bound)}, running)
    family.add_sample(name + "_count", labels, s.count)
    family.add_sample(name + "_sum", labels, s.value)
