"""Helpers for the HTTP/2 tests: what they compare, on top of the shared ones (the plugin kit,
otel_ebpf.protocol_testing)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.pipeline import Pipeline
from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import Event
from otel_ebpf.pipeline.reorder import EventReorderer
from otel_ebpf.pipeline.telemetry import Telemetry
from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, Role, load_protocols
from otel_ebpf.protocol_testing import Chunk, Replay, as_role, load_recording
from otel_ebpf.protocol_testing import replay as replay_with
from otel_ebpf.protocols.http2 import HTTP2, HTTP2Exchange
from otel_ebpf.protocols.http2.types import pseudo
from otel_ebpf.selfmetrics import SelfMetrics

DATA = Path(__file__).parent / "data" / "http2"
RECORDINGS = sorted(path.stem for path in DATA.glob("*.json"))
SERVER_CONN = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 50051), Endpoint("127.0.0.1", 40000))
CLIENT_CONN = ConnectionInfo(Role.CLIENT, Endpoint("127.0.0.1", 40000), Endpoint("127.0.0.1", 50051))


def load(name: str, role: Role = Role.SERVER) -> list[Chunk]:
    """A recording as seen by the process of ``role``."""
    return as_role(load_recording(DATA / f"{name}.json"), role)


def conn(role: Role) -> ConnectionInfo:
    return SERVER_CONN if role is Role.SERVER else CLIENT_CONN


def replay(
    chunks: Sequence[Chunk], role: Role = Role.SERVER, protocol: HTTP2 | None = None, close: bool = True
) -> Replay:
    return replay_with(chunks, role, protocol or HTTP2(), close, check_starts)


def pipeline_spans(events: list[Event]) -> list[ReadableSpan]:
    """The spans the agent's pipeline makes of ``events``, with every installed plugin."""
    protocols = load_protocols()
    selfmetrics = SelfMetrics()
    telemetry = Telemetry(protocols, "node-1", {}, selfmetrics)
    pipeline = Pipeline(
        ConnectionTracker(protocols, selfmetrics),
        telemetry,
        selfmetrics,
        reorderer=EventReorderer(selfmetrics, window_ns=0),
    )
    pipeline.handle(events)
    pipeline.flush()
    return telemetry.take_spans()


def check_starts(run: Replay) -> None:
    """Every request announced once, before its exchange, with the span's start time and the
    request's decoded header fields as carrier, on its stream; starts unique on the connection."""
    role = run.session.role
    requests = Direction.INGRESS if role is Role.SERVER else Direction.EGRESS
    announced = {(s.start_ns, s.stream): s for s in run.starts}
    assert len(announced) == len(run.starts) == len({s.start_ns for s in run.starts})
    for exchange in run.exchanges:
        if not isinstance(exchange, HTTP2Exchange):
            continue  # a declined h2c upgrade: HTTP/1 announces its own requests
        request = exchange.request
        start = announced.get((request.start_ns, request.stream))
        if start is not None:
            assert start.carrier == request.headers
            assert exchange.span(conn(role)).start_ns == start.start_ns
    assert all(s.direction is requests for s in run.starts)


def grpc_status(exchange: HTTP2Exchange) -> int | None:
    return None if exchange.call is None else exchange.call.status


def summary(exchange: HTTP2Exchange) -> tuple:
    """What the tests compare: everything the session decided about one stream."""
    request, response = exchange.request, exchange.response
    return (
        request.stream,
        pseudo(request.headers, ":method"),
        pseudo(request.headers, ":path"),
        request.body_size,
        request.messages,
        request.start_ns,
        None
        if response is None
        else (
            response.status,
            response.body_size,
            response.messages,
            grpc_status(exchange),
            response.reset,
            response.incomplete,
        ),
        exchange.end_ns,
    )
