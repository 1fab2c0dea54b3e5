"""RoCEv2 counts as metrics: what the kernel counted per queue-pair flow (``bpf/roce.c``), turned
into the ``otel_ebpf.roce.*`` instruments of one node resource (docs/roce.md).

Pure: :class:`RoceMetrics` takes the growth of each kernel series since the previous read
(:class:`OpcodeCounts`, :class:`FlowCounts`) and knows nothing of BPF, so decoding and naming are
tested without root.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import ResourceMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from . import __version__
from .pipeline.metrics import ProcessMetrics
from .protocol import AttributeValue, InstrumentKind, InstrumentSpec, MetricPoint

# IBTA vol. 1, 9.2: the top 3 bits of a BTH opcode are the transport, the low 5 the operation
TRANSPORTS = {0: "RC", 1: "UC", 2: "RD", 3: "UD", 5: "XRC"}
OPERATIONS = {
    0x00: "SEND_FIRST",
    0x01: "SEND_MIDDLE",
    0x02: "SEND_LAST",
    0x03: "SEND_LAST_WITH_IMMEDIATE",
    0x04: "SEND_ONLY",
    0x05: "SEND_ONLY_WITH_IMMEDIATE",
    0x06: "RDMA_WRITE_FIRST",
    0x07: "RDMA_WRITE_MIDDLE",
    0x08: "RDMA_WRITE_LAST",
    0x09: "RDMA_WRITE_LAST_WITH_IMMEDIATE",
    0x0A: "RDMA_WRITE_ONLY",
    0x0B: "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    0x0C: "RDMA_READ_REQUEST",
    0x0D: "RDMA_READ_RESPONSE_FIRST",
    0x0E: "RDMA_READ_RESPONSE_MIDDLE",
    0x0F: "RDMA_READ_RESPONSE_LAST",
    0x10: "RDMA_READ_RESPONSE_ONLY",
    0x11: "ACKNOWLEDGE",
    0x12: "ATOMIC_ACKNOWLEDGE",
    0x13: "COMPARE_SWAP",
    0x14: "FETCH_ADD",
    0x16: "SEND_LAST_WITH_INVALIDATE",
    0x17: "SEND_ONLY_WITH_INVALIDATE",
}
CNP_OPCODE = 0x81  # RoCEv2 Congestion Notification Packet (annex A17.9.3)

# bpf/roce.c, syndrome_class(): roce_qps.aeth[] index -> what the AETH said. Index 0 is an ACK, the
# others NAKs (the RNR NAK and the NAK codes 0..4 of IBTA 9.7.5.1.1; reserved syndromes last).
SYNDROMES = (
    "ack",
    "rnr",
    "psn_sequence_error",
    "invalid_request",
    "remote_access_error",
    "remote_operational_error",
    "invalid_rd_request",
    "reserved",
)

# bpf/roce.c, roce_qps.ack_latency[]: bucket i holds latencies up to 1024 ns << i; the last, the rest
LATENCY_BOUNDARIES_S = tuple((1024 << i) / 1e9 for i in range(21))

INSTRUMENTS = (
    InstrumentSpec("otel_ebpf.roce.packets", InstrumentKind.COUNTER, "{packet}", "RoCEv2 packets, by BTH opcode"),
    InstrumentSpec("otel_ebpf.roce.bytes", InstrumentKind.COUNTER, "By", "RoCEv2 frame bytes, by BTH opcode"),
    InstrumentSpec(
        "otel_ebpf.roce.psn.gaps", InstrumentKind.COUNTER, "{gap}", "Request PSNs that skipped ahead (lost packets)"
    ),
    InstrumentSpec(
        "otel_ebpf.roce.psn.duplicates",
        InstrumentKind.COUNTER,
        "{packet}",
        "Requests whose PSN was already seen (retransmissions)",
    ),
    InstrumentSpec("otel_ebpf.roce.acks", InstrumentKind.COUNTER, "{packet}", "Packets whose AETH is an ACK"),
    InstrumentSpec("otel_ebpf.roce.naks", InstrumentKind.COUNTER, "{packet}", "Packets whose AETH is a NAK, by code"),
    InstrumentSpec(
        "otel_ebpf.roce.ecn.ce", InstrumentKind.COUNTER, "{packet}", "RoCEv2 packets marked Congestion Experienced"
    ),
    InstrumentSpec(
        "otel_ebpf.roce.ack.latency",
        InstrumentKind.HISTOGRAM,
        "s",
        "From a request that asked for an ACK (or a READ request) to the ACK (or READ response) with its PSN",
        LATENCY_BOUNDARIES_S,
    ),
)
SCOPE = InstrumentationScope("otel_ebpf.roce", __version__)


def opcode_name(opcode: int) -> str:
    """``RC_SEND_ONLY``, ``CNP``, ...; an opcode no transport defines as its hex value."""
    if opcode == CNP_OPCODE:
        return "CNP"
    transport = TRANSPORTS.get(opcode >> 5)
    operation = OPERATIONS.get(opcode & 0x1F)
    if transport is None or operation is None:
        return f"0x{opcode:02x}"
    return f"{transport}_{operation}"


def address(raw: bytes) -> str:
    """16 bytes from the kernel's key: IPv6, or IPv4 mapped into it."""
    ip = ipaddress.IPv6Address(raw)
    return str(ip.ipv4_mapped or ip)


@dataclass(frozen=True)
class Flow:
    """One direction of a queue pair as the wire shows it, on one interface."""

    interface: str
    transmit: bool
    source: str
    destination: str
    dest_qp: int

    def attributes(self) -> dict[str, AttributeValue]:
        return {
            "network.interface.name": self.interface,
            "network.io.direction": "transmit" if self.transmit else "receive",
            "source.address": self.source,
            "destination.address": self.destination,
            "roce.dest_qp": self.dest_qp,
        }


@dataclass(frozen=True)
class OpcodeCounts:
    """Growth of one (flow, opcode) series since the previous read."""

    flow: Flow
    opcode: int
    packets: int
    bytes: int


@dataclass(frozen=True)
class FlowCounts:
    """Growth of one flow's sequence, acknowledgement and congestion counts since the previous read."""

    flow: Flow
    psn_gaps: int
    psn_duplicates: int
    ecn_ce: int
    syndromes: tuple[int, ...]  # by SYNDROMES index
    latency: tuple[int, ...] = ()  # ACK latencies by LATENCY_BOUNDARIES_S bucket (one more: above)
    latency_sum_ns: int = 0
    latency_min_ns: int = 0  # over the flow's life, as the kernel keeps them
    latency_max_ns: int = 0


_FLOW_KEYS = frozenset(Flow("", False, "", "", 0).attributes())


def _flow_key(flow: Flow) -> tuple:
    """The flow's part of a series' attributes, as ProcessMetrics keeps them (sorted)."""
    return tuple(sorted(flow.attributes().items()))


class RoceMetrics:
    """The ``otel_ebpf.roce.*`` series of the node (not of a process: RoCE traffic bypasses sockets)."""

    def __init__(self, resource: Mapping[str, AttributeValue], max_series: int) -> None:
        self._metrics = ProcessMetrics(Resource(resource), {spec.name: spec for spec in INSTRUMENTS}, max_series)

    def record(self, counts: Iterable[OpcodeCounts | FlowCounts], now_ns: int) -> None:
        for item in counts:
            for point in _points(item):
                if point.value:
                    self._metrics.record(SCOPE, point, now_ns)
            if isinstance(item, FlowCounts) and any(item.latency):
                self._metrics.merge_histogram(
                    SCOPE,
                    "otel_ebpf.roce.ack.latency",
                    item.flow.attributes(),
                    sum(item.latency),
                    item.latency_sum_ns / 1e9,
                    item.latency,
                    item.latency_min_ns / 1e9,
                    item.latency_max_ns / 1e9,
                    now_ns,
                )

    def forget(self, flows: Iterable[Flow], opcodes: Iterable[tuple[Flow, int]] = ()) -> None:
        """Drop every series of ``flows``, and the opcode series of ``opcodes``: gone from the
        kernel's tables (idle too long), so that queue pairs long gone do not fill the cap."""
        gone = {_flow_key(flow) for flow in flows}
        gone_opcodes = {(_flow_key(flow), opcode_name(opcode)) for flow, opcode in opcodes}
        if not gone and not gone_opcodes:
            return

        def matches(attributes: tuple) -> bool:
            flow = tuple(a for a in attributes if a[0] in _FLOW_KEYS)
            return flow in gone or (flow, dict(attributes).get("roce.opcode")) in gone_opcodes

        self._metrics.forget(matches)

    def collect(self, now_ns: int, delta: frozenset[InstrumentKind]) -> ResourceMetrics | None:
        return self._metrics.collect(now_ns, delta)

    def take_overflowed(self) -> int:
        """Points folded into the overflow series since the last call."""
        overflowed, self._metrics.overflowed = self._metrics.overflowed, 0
        return overflowed


def _points(item: OpcodeCounts | FlowCounts) -> Iterable[MetricPoint]:
    attributes = item.flow.attributes()
    if isinstance(item, OpcodeCounts):
        by_opcode = {**attributes, "roce.opcode": opcode_name(item.opcode)}
        yield MetricPoint("otel_ebpf.roce.packets", item.packets, by_opcode)
        yield MetricPoint("otel_ebpf.roce.bytes", item.bytes, by_opcode)
        return
    yield MetricPoint("otel_ebpf.roce.psn.gaps", item.psn_gaps, attributes)
    yield MetricPoint("otel_ebpf.roce.psn.duplicates", item.psn_duplicates, attributes)
    yield MetricPoint("otel_ebpf.roce.ecn.ce", item.ecn_ce, attributes)
    acks, *naks = item.syndromes
    yield MetricPoint("otel_ebpf.roce.acks", acks, attributes)
    for code, count in zip(SYNDROMES[1:], naks, strict=True):
        yield MetricPoint("otel_ebpf.roce.naks", count, {**attributes, "roce.nak.code": code})
