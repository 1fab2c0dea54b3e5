"""What the RTPS session reports: samples (PRODUCER/CONSUMER), service calls (CLIENT/SERVER) and
control traffic (metric points only). Each is both the session's message and the exchange: one
datagram's sample needs no partner, and a call's two halves are paired in the shared state."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from otel_ebpf.protocol import (
    ConnectionInfo,
    Direction,
    Exchange,
    InstrumentKind,
    InstrumentSpec,
    Message,
    MetricPoint,
    SpanDescription,
    SpanKind,
    StatusCode,
)

from .discovery import Endpoint
from .wire import guid_hex

SYSTEM = "dds"

SENT = "messaging.client.sent.messages"
CONSUMED = "messaging.client.consumed.messages"
BYTES = "dds.sample.size"
LATENCY = "dds.sample.latency"
FRAGMENTS = "dds.fragments"
RETRANSMISSIONS = "dds.retransmissions"
LOST = "dds.samples.lost"
NACKS = "dds.acknack.requested"
CLIENT_DURATION = "rpc.client.duration"
SERVER_DURATION = "rpc.server.duration"

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_DURATION_BUCKETS = (0, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000)

INSTRUMENTS = (
    InstrumentSpec(SENT, InstrumentKind.COUNTER, "{message}", "DDS samples published, per topic and participant"),
    InstrumentSpec(CONSUMED, InstrumentKind.COUNTER, "{message}", "DDS samples received, per topic and participant"),
    InstrumentSpec(
        BYTES,
        InstrumentKind.COUNTER,
        "By",
        "Serialized bytes of DDS samples, per topic and direction (network.io.direction)",
    ),
    InstrumentSpec(
        LATENCY,
        InstrumentKind.HISTOGRAM,
        "s",
        "Publish to receive latency of DDS samples, per topic (same-node send time, else the "
        "writer's INFO_TS source timestamp)",
        _LATENCY_BUCKETS,
    ),
    InstrumentSpec(FRAGMENTS, InstrumentKind.COUNTER, "{fragment}", "DATA_FRAG fragments of DDS samples, per topic"),
    InstrumentSpec(
        RETRANSMISSIONS,
        InstrumentKind.COUNTER,
        "{message}",
        "DDS samples resent after a reader's ACKNACK asked for them, per topic",
    ),
    InstrumentSpec(
        LOST, InstrumentKind.COUNTER, "{message}", "DDS samples a writer declared never to come (GAP), per topic"
    ),
    InstrumentSpec(
        NACKS,
        InstrumentKind.COUNTER,
        "{message}",
        "Samples readers asked to be resent (ACKNACK / NACK_FRAG), per topic",
    ),
    InstrumentSpec(
        CLIENT_DURATION, InstrumentKind.HISTOGRAM, "ms", "ROS 2 service calls, client side", _DURATION_BUCKETS
    ),
    InstrumentSpec(
        SERVER_DURATION, InstrumentKind.HISTOGRAM, "ms", "ROS 2 service calls, server side", _DURATION_BUCKETS
    ),
)


def topic_attributes(endpoint: Endpoint | None) -> dict[str, str]:
    """Destination attributes of a writer's topic; the ROS 2 name when it is one (a fresh dict)."""
    return dict(_topic_attributes(endpoint))


@functools.lru_cache(maxsize=4096)  # per endpoint, computed for every sample otherwise
def _topic_attributes(endpoint: Endpoint | None) -> dict[str, str]:
    if endpoint is None:
        return {"messaging.destination.name": "(unknown)"}
    attributes = {
        "messaging.destination.name": endpoint.ros_name or endpoint.topic,
        "dds.topic.name": endpoint.topic,
        "dds.type.name": endpoint.type_name,
    }
    if endpoint.ros_name is not None:
        key = "ros2.topic.name" if endpoint.ros_kind == "topic" else "ros2.service.name"
        attributes[key] = endpoint.ros_name
        if endpoint.ros_type:
            attributes["ros2.type"] = endpoint.ros_type
    return attributes


def _peer(conn: ConnectionInfo, attributes: dict) -> None:
    attributes["network.transport"] = "udp"
    if conn.peer is not None:
        attributes["network.peer.address"] = conn.peer.address
        attributes["network.peer.port"] = conn.peer.port


@dataclass(frozen=True, slots=True)
class Sample(Message, Exchange):
    """One sample published (EGRESS, a PRODUCER span) or received (INGRESS, CONSUMER)."""

    direction: Direction
    start_ns: int
    end_ns: int
    writer_guid: bytes
    sn: int
    endpoint: Endpoint | None  # what discovery said of the writer; None: unknown writer
    sample_size: int
    fragments: int  # DATA_FRAG fragments the sample was cut into (0: one DATA)
    participant: bytes  # the observed process's participant (GUID prefix), b"" when unknown
    latency_ns: int | None = None  # publish -> receive, for a received sample
    key_only: bool = False

    @property
    def message_start(self) -> tuple[Direction, Hashable]:
        return (self.direction, ("sample", self.writer_guid, self.sn))

    def _topic(self) -> dict[str, str]:
        attributes = topic_attributes(self.endpoint)
        attributes["messaging.system"] = SYSTEM
        if self.participant:
            attributes["dds.participant.guid"] = guid_hex(self.participant)
        return attributes

    def span(self, conn: ConnectionInfo) -> SpanDescription:
        send = self.direction is Direction.EGRESS
        attributes: dict = self._topic()
        attributes.pop("dds.participant.guid", None)
        attributes.update(
            {
                "messaging.operation.type": "send" if send else "receive",
                "messaging.operation.name": "publish" if send else "receive",
                "messaging.message.id": f"{guid_hex(self.writer_guid)}:{self.sn}",
                "messaging.message.body.size": self.sample_size,
                "dds.writer.guid": guid_hex(self.writer_guid),
                "dds.sequence_number": self.sn,
            }
        )
        if self.fragments:
            attributes["dds.fragment.count"] = self.fragments
        if self.key_only:
            attributes["dds.key_only"] = True
        if self.participant:
            attributes["dds.participant.guid"] = guid_hex(self.participant)
        _peer(conn, attributes)
        name = f"{'send' if send else 'receive'} {attributes['messaging.destination.name']}"
        kind = SpanKind.PRODUCER if send else SpanKind.CONSUMER
        return SpanDescription(name, kind, self.start_ns, self.end_ns, attributes)

    def metric_points(self, conn: ConnectionInfo) -> Iterable[MetricPoint]:
        attributes = self._topic()
        send = self.direction is Direction.EGRESS
        points = [
            MetricPoint(SENT if send else CONSUMED, 1, attributes),
            MetricPoint(
                BYTES, self.sample_size, {**attributes, "network.io.direction": "transmit" if send else "receive"}
            ),
        ]
        if self.fragments:
            points.append(
                MetricPoint(
                    FRAGMENTS, self.fragments, {**attributes, "network.io.direction": "transmit" if send else "receive"}
                )
            )
        if self.latency_ns is not None:
            points.append(MetricPoint(LATENCY, self.latency_ns / 1e9, attributes))
        return points


@dataclass(frozen=True, slots=True)
class Call(Message, Exchange):
    """A ROS 2 service call seen from the client (CLIENT span: request sent, reply received) or
    the server (SERVER span: request received, reply sent), paired through rmw_cyclonedds's
    16-byte request header (client GUID, sequence number)."""

    direction: Direction  # the request's direction: EGRESS at the client, INGRESS at the server
    start_ns: int
    end_ns: int
    client_guid: int
    sequence: int
    request: Endpoint | None
    reply: Endpoint | None
    request_size: int
    reply_size: int | None  # None: never answered (flushed)

    @property
    def message_start(self) -> tuple[Direction, Hashable]:
        return (self.direction, ("call", self.client_guid, self.sequence))

    @property
    def service(self) -> str:
        for endpoint in (self.request, self.reply):
            if endpoint is not None and endpoint.ros_name:
                return endpoint.ros_name
        return "(unknown service)"

    def span(self, conn: ConnectionInfo) -> SpanDescription:
        client = self.direction is Direction.EGRESS
        attributes: dict = {
            "rpc.system": "ros2",
            "rpc.service": self.service,
            "ros2.service.name": self.service,
            "messaging.system": SYSTEM,
            "dds.request.client_guid": f"{self.client_guid:016x}",
            "dds.request.sequence_number": self.sequence,
            "rpc.request.size": self.request_size,
        }
        if self.request is not None:
            attributes["dds.request.topic.name"] = self.request.topic
            attributes["dds.request.type.name"] = self.request.type_name
            if self.request.ros_type:
                attributes["ros2.type"] = self.request.ros_type
        if self.reply is not None:
            attributes["dds.reply.topic.name"] = self.reply.topic
        if self.reply_size is not None:
            attributes["rpc.response.size"] = self.reply_size
        else:
            attributes["error.type"] = "no_reply"
        _peer(conn, attributes)
        status = StatusCode.ERROR if self.reply_size is None and client else StatusCode.UNSET
        return SpanDescription(
            self.service, SpanKind.CLIENT if client else SpanKind.SERVER, self.start_ns, self.end_ns, attributes, status
        )

    def metric_points(self, conn: ConnectionInfo) -> Iterable[MetricPoint]:
        client = self.direction is Direction.EGRESS
        attributes = {"rpc.system": "ros2", "rpc.service": self.service}
        return [
            MetricPoint(CLIENT_DURATION if client else SERVER_DURATION, (self.end_ns - self.start_ns) / 1e6, attributes)
        ]


@dataclass(frozen=True, slots=True)
class Control(Message, Exchange):
    """Reliability traffic of one datagram for one writer: retransmitted, requested and lost
    samples. Metric points only."""

    direction: Direction
    start_ns: int
    end_ns: int
    endpoint: Endpoint | None
    participant: bytes
    retransmissions: int = 0
    requested: int = 0
    lost: int = 0
    emits_span = False  # class attribute, not a field: overrides Exchange.emits_span

    def span(self, conn: ConnectionInfo) -> SpanDescription:  # never called: emits_span is False
        return SpanDescription("dds control", SpanKind.INTERNAL, self.start_ns, self.end_ns, {})

    def metric_points(self, conn: ConnectionInfo) -> Iterable[MetricPoint]:
        attributes = topic_attributes(self.endpoint)
        attributes["messaging.system"] = SYSTEM
        if self.participant:
            attributes["dds.participant.guid"] = guid_hex(self.participant)
        points = []
        for name, value in ((RETRANSMISSIONS, self.retransmissions), (NACKS, self.requested), (LOST, self.lost)):
            if value:
                points.append(MetricPoint(name, value, attributes))
        return points
