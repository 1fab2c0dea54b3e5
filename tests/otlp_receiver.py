"""A real OTLP receiver for tests: gRPC and HTTP/protobuf on loopback, built on opentelemetry-proto.

    with OTLPReceiver() as rx:
        ...point an exporter (or the agent) at rx.grpc_endpoint or rx.http_endpoint...
        assert rx.wait_for(lambda r: len(r.spans()) >= 2, timeout=10)
        span = rx.spans()[0]          # {"name", "kind", "trace_id", ..., "resource": {...}}

A test can make it misbehave like a real backend in trouble: :meth:`OTLPReceiver.answer` makes it
refuse every request (HTTP 503/429 with ``Retry-After``, gRPC ``UNAVAILABLE`` with a ``RetryInfo``
detail, a non-retryable 400 / ``INVALID_ARGUMENT``) or hang before answering; :meth:`~OTLPReceiver.stop`
and :meth:`~OTLPReceiver.start` take it down and bring it back on the same ports. Refused requests
are not stored; ``rejected`` counts them.

``spans()`` and ``metrics()`` flatten what arrived into plain dicts so tests compare values, not
protobuf structure; :func:`load_file_spans` / :func:`load_file_metrics` flatten the file
exporter's output into the very same shapes, so one test can compare both paths exactly.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2, profiles_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_ebpf.exporters.file import METRICS_FILE, TRACES_FILE, from_json_line


@dataclass(frozen=True)
class _Signal:
    request: type[Message]
    response: type[Message]
    servicer: type
    register: Callable[[Any, grpc.Server], None]


_SIGNALS: dict[str, _Signal] = {
    "traces": _Signal(
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
        trace_service_pb2_grpc.TraceServiceServicer,
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server,
    ),
    "metrics": _Signal(
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
        metrics_service_pb2_grpc.MetricsServiceServicer,
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server,
    ),
    "logs": _Signal(
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
        logs_service_pb2_grpc.LogsServiceServicer,
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server,
    ),
    "profiles": _Signal(
        profiles_service_pb2.ExportProfilesServiceRequest,
        profiles_service_pb2.ExportProfilesServiceResponse,
        profiles_service_pb2_grpc.ProfilesServiceServicer,
        profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server,
    ),
}
# Signals still in development are served under their own version prefix.
_HTTP_PATHS = {"profiles": "/v1development/profiles"}

_DECOMPRESS = {"gzip": gzip.decompress, "deflate": zlib.decompress, "identity": bytes, "": bytes}


@dataclass(frozen=True)
class Answer:
    """How the receiver answers every request: ``http_status`` / ``grpc_code`` (None: OK), with a
    server-requested delay (``Retry-After`` seconds, gRPC ``RetryInfo``) when ``retry_after_s`` is
    set. ``hang_s`` > 0 is a backend that hangs: it sleeps that long, then refuses the request
    (504 / ``UNAVAILABLE``) without keeping it — by then the client has usually given up."""

    http_status: int = 200
    grpc_code: grpc.StatusCode | None = None
    retry_after_s: int | None = None
    hang_s: float = 0.0

    @property
    def accepts(self) -> bool:
        return self.http_status == 200 and self.grpc_code is None and not self.hang_s


@dataclass(frozen=True)
class Received:
    """One export request as it arrived."""

    signal: str  # "traces" | "metrics" | "logs"
    transport: str  # "grpc" | "http"
    headers: Mapping[str, str]  # gRPC metadata or HTTP headers, keys lower-case
    message: Message


class OTLPReceiver:
    """gRPC + HTTP/protobuf OTLP receiver on 127.0.0.1 with ephemeral ports; a context manager."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._received: list[Received] = []
        self._answer = Answer()
        self.rejected: dict[str, int] = {}  # signal -> requests refused by answer()
        self._grpc_port = 0  # chosen at the first start, kept across restarts
        self._http_port = 0
        self._running = False
        self._connections: set[socket.socket] = set()  # HTTP keep-alive connections, cut at stop()

    # --- lifecycle ---

    def start(self) -> None:
        """Listen (again, on the same ports after :meth:`stop`)."""
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        for name, signal in _SIGNALS.items():
            signal.register(self._servicer(name, signal), self._grpc)
        self._grpc_port = self._grpc.add_insecure_port(f"127.0.0.1:{self._grpc_port}")
        self._http = ThreadingHTTPServer(("127.0.0.1", self._http_port), self._http_handler())
        self._http_port = self._http.server_address[1]
        self._http.daemon_threads = True
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, args=(0.05,), name="otlp-receiver-http", daemon=True
        )
        self._grpc.start()
        self._http_thread.start()
        self._running = True

    def stop(self) -> None:
        """Close both ports: clients get connection refused until :meth:`start`."""
        if self._running:
            self._running = False
            self._grpc.stop(grace=None)
            self._http.shutdown()
            self._http.server_close()
            with self._lock:
                connections, self._connections = list(self._connections), set()
            for connection in connections:  # a stopped backend keeps no keep-alive connection either
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> OTLPReceiver:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def answer(
        self,
        http_status: int = 200,
        grpc_code: grpc.StatusCode | None = None,
        retry_after_s: int | None = None,
        hang_s: float = 0.0,
    ) -> None:
        """Answer every request from now on like this (no arguments: accept everything again)."""
        if hang_s and http_status == 200 and grpc_code is None:
            http_status, grpc_code = 504, grpc.StatusCode.UNAVAILABLE
        with self._lock:
            self._answer = Answer(http_status, grpc_code, retry_after_s, hang_s)

    def _current_answer(self, signal: str) -> Answer:
        with self._lock:
            answer = self._answer
        if answer.hang_s:
            time.sleep(answer.hang_s)
        if not answer.accepts:
            with self._lock:
                self.rejected[signal] = self.rejected.get(signal, 0) + 1
                self._lock.notify_all()
        return answer

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._http_port}"

    # --- what arrived ---

    def _store(self, received: Received) -> None:
        with self._lock:
            self._received.append(received)
            self._lock.notify_all()

    def received(self, signal: str | None = None, transport: str | None = None) -> list[Received]:
        with self._lock:
            return [
                r
                for r in self._received
                if (signal is None or r.signal == signal) and (transport is None or r.transport == transport)
            ]

    def requests(self, signal: str, transport: str | None = None) -> list[Message]:
        return [r.message for r in self.received(signal, transport)]

    def spans(self, transport: str | None = None) -> list[dict[str, Any]]:
        return flatten_spans(self.requests("traces", transport))

    def metrics(self, transport: str | None = None) -> dict[str, list[dict[str, Any]]]:
        return flatten_metrics(self.requests("metrics", transport))

    def clear(self) -> None:
        with self._lock:
            self._received.clear()

    def wait_for(self, predicate: Callable[[OTLPReceiver], bool], timeout: float = 10.0) -> bool:
        """Wait until ``predicate(self)`` holds (re-checked on every arrival); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    # --- transports ---

    def _servicer(self, name: str, signal: _Signal) -> Any:
        receiver = self

        class Servicer(signal.servicer):  # type: ignore[misc, valid-type]
            def Export(self, request: Message, context: grpc.ServicerContext) -> Message:  # noqa: N802
                answer = receiver._current_answer(name)
                if answer.grpc_code is not None:
                    if answer.retry_after_s is not None:
                        detail = AnyProto()
                        detail.Pack(
                            error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=answer.retry_after_s))
                        )
                        status = status_pb2.Status(
                            code=answer.grpc_code.value[0], message="test receiver", details=[detail]
                        )
                        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
                    context.abort(answer.grpc_code, "test receiver")
                headers = {key.lower(): value for key, value in context.invocation_metadata()}
                receiver._store(Received(name, "grpc", headers, request))
                return signal.response()

        return Servicer()

    def _http_handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self
        routes = {_HTTP_PATHS.get(name, f"/v1/{name}"): (name, signal) for name, signal in _SIGNALS.items()}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with receiver._lock:
                    receiver._connections.add(self.connection)

            def finish(self) -> None:
                with receiver._lock:
                    receiver._connections.discard(self.connection)
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- keep test output clean
                return

            def _reply(self, status: int, body: bytes = b"", retry_after_s: int | None = None) -> None:
                try:
                    self.send_response(status)
                    if retry_after_s is not None:
                        self.send_header("Retry-After", str(retry_after_s))
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (a hang outlasted its timeout)
                    self.close_connection = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                route = routes.get(self.path)
                if route is None:
                    self._reply(404)
                    return
                name, signal = route
                decompress = _DECOMPRESS.get(self.headers.get("Content-Encoding", "").lower())
                if decompress is None:
                    self._reply(415)
                    return
                try:
                    message = signal.request.FromString(decompress(body))
                except (DecodeError, OSError, zlib.error):
                    self._reply(400)
                    return
                answer = receiver._current_answer(name)
                if answer.http_status != 200:
                    self._reply(answer.http_status, retry_after_s=answer.retry_after_s)
                    return
                headers = {key.lower(): value for key, value in self.headers.items()}
                receiver._store(Received(name, "http", headers, message))
                self._reply(200, signal.response().SerializeToString())

        return Handler


# --- flattening: protobuf requests -> plain dicts ---


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in attributes}


def flatten_spans(requests: Iterable[trace_service_pb2.ExportTraceServiceRequest]) -> list[dict[str, Any]]:
    spans = []
    for request in requests:
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "kind": Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex() or None,
                            "start_ns": span.start_time_unix_nano,
                            "end_ns": span.end_time_unix_nano,
                            "status_code": Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
                            "status_message": span.status.message,
                            "attributes": _attributes(span.attributes),
                            "links": [
                                {
                                    "trace_id": link.trace_id.hex(),
                                    "span_id": link.span_id.hex(),
                                    "attributes": _attributes(link.attributes),
                                }
                                for link in span.links
                            ],
                            "scope": scope_spans.scope.name,
                            "resource": resource,
                        }
                    )
    return spans


def _temporality(value: int) -> str:
    return AggregationTemporality.Name(value).removeprefix("AGGREGATION_TEMPORALITY_")


def flatten_metrics(
    requests: Iterable[metrics_service_pb2.ExportMetricsServiceRequest],
) -> dict[str, list[dict[str, Any]]]:
    """Points per metric name. Every point has ``type`` (sum/gauge/histogram), ``attributes``,
    ``resource``, ``scope`` (its instrumentation scope's name), ``unit``, ``start_ns``,
    ``time_ns``; sums and gauges add ``value`` (sums also ``monotonic`` and ``temporality``),
    histograms ``count``, ``sum``, ``min``, ``max``, ``bucket_counts``, ``explicit_bounds`` and
    ``temporality``."""
    metrics: dict[str, list[dict[str, Any]]] = {}
    for request in requests:
        for resource_metrics in request.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    if kind not in ("sum", "gauge", "histogram"):
                        raise ValueError(f"flatten_metrics does not handle {kind} ({metric.name})")
                    data = getattr(metric, kind)
                    for point in data.data_points:
                        flat: dict[str, Any] = {
                            "type": kind,
                            "attributes": _attributes(point.attributes),
                            "resource": resource,
                            "scope": scope_metrics.scope.name,
                            "unit": metric.unit,
                            "start_ns": point.start_time_unix_nano,
                            "time_ns": point.time_unix_nano,
                        }
                        if kind == "histogram":
                            flat.update(
                                count=point.count,
                                sum=point.sum,
                                min=point.min,
                                max=point.max,
                                bucket_counts=list(point.bucket_counts),
                                explicit_bounds=list(point.explicit_bounds),
                            )
                        else:
                            flat["value"] = getattr(point, point.WhichOneof("value"))
                        if kind == "sum":
                            flat["monotonic"] = data.is_monotonic
                        if kind != "gauge":
                            flat["temporality"] = _temporality(data.aggregation_temporality)
                        metrics.setdefault(metric.name, []).append(flat)
    return metrics


def latest_total(metrics: dict[str, list[dict[str, Any]]], name: str, **attributes: Any) -> float:
    """A cumulative metric's total: each series' latest point (its value, or its count for a
    histogram), summed over the series, of every resource, whose attributes match ``attributes``."""
    latest: dict[tuple, dict[str, Any]] = {}
    for point in metrics.get(name, []):
        if all(point["attributes"].get(k) == v for k, v in attributes.items()):
            series = (point["resource"].get("service.instance.id"), tuple(sorted(point["attributes"].items())))
            if series not in latest or point["time_ns"] >= latest[series]["time_ns"]:
                latest[series] = point
    return sum(p["count"] if p["type"] == "histogram" else p["value"] for p in latest.values())


def _jsonl(path: Path, message_type: type[Message]) -> list[Message]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [from_json_line(line, message_type()) for line in lines if line.strip()]


def load_file_spans(path: Path) -> list[dict[str, Any]]:
    """Flatten a file exporter's ``traces.jsonl`` (or the directory holding it) like ``spans()``."""
    path = Path(path)
    return flatten_spans(
        _jsonl(path / TRACES_FILE if path.is_dir() else path, trace_service_pb2.ExportTraceServiceRequest)
    )


def load_file_metrics(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Flatten a file exporter's ``metrics.jsonl`` (or the directory holding it) like ``metrics()``."""
    path = Path(path)
    return flatten_metrics(
        _jsonl(path / METRICS_FILE if path.is_dir() else path, metrics_service_pb2.ExportMetricsServiceRequest)
    )
