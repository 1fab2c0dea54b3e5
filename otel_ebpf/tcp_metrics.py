"""The instruments of TCP health (bpf/tcp_health.c) and the attributes of their series.

Names are under ``otel_ebpf.tcp.`` (no semantic convention covers them); attributes are the
semantic conventions' ``network.*`` and ``server.*`` ones. docs/network.md says what they count.
"""

from __future__ import annotations

from .pipeline.events import TcpHealthCounts
from .protocol import AttributeValue, InstrumentKind, InstrumentSpec, Role

RETRANSMISSIONS = "otel_ebpf.tcp.retransmissions"
RESETS = "otel_ebpf.tcp.resets"
RTT = "otel_ebpf.tcp.rtt"
DROPS = "otel_ebpf.tcp.drops"
DROP_REASON = "otel_ebpf.tcp.drop_reason"  # the kernel's name: SKB_DROP_REASON_<name>
# capture.tcp_flows (bpf/tcp_flows.c), named as system.network.io / system.network.packet.count
IO = "otel_ebpf.tcp.io"
PACKETS = "otel_ebpf.tcp.packet.count"
CGROUP = "otel_ebpf.cgroup.path"  # the sockets' cgroup v2 path (not the process's: see docs/network.md)
# bpf/tcp_health.c rtt_bucket(): 2^4 .. 2^23 microseconds (16 us .. 8.4 s), upper-inclusive
RTT_BOUNDARIES_S = tuple((1 << i) / 1e6 for i in range(4, 24))

INSTRUMENTS = (
    InstrumentSpec(RETRANSMISSIONS, InstrumentKind.COUNTER, "{segment}", "TCP segments retransmitted"),
    InstrumentSpec(RESETS, InstrumentKind.COUNTER, "{reset}", "TCP resets, sent (transmit) or received (receive)"),
    InstrumentSpec(
        RTT,
        InstrumentKind.HISTOGRAM,
        "s",
        "Smoothed TCP round-trip time, sampled when the process reads (at most every 100 ms per socket)",
        RTT_BOUNDARIES_S,
    ),
    InstrumentSpec(DROPS, InstrumentKind.COUNTER, "{packet}", "Packets the kernel dropped, by its drop reason"),
    InstrumentSpec(IO, InstrumentKind.COUNTER, "By", "Bytes of TCP packets, from the IP header on, sent or received"),
    InstrumentSpec(PACKETS, InstrumentKind.COUNTER, "{packet}", "TCP packets (segments) sent or received"),
)


def series_attributes(counts: TcpHealthCounts) -> dict[str, AttributeValue]:
    """The peer and the server port; a client's peer port is the server port, a server's peers'
    ports are ephemeral (one series per client address, not per connection)."""
    attributes: dict[str, AttributeValue] = {"network.transport": "tcp"}
    if counts.peer_address:
        attributes["network.peer.address"] = counts.peer_address
    if counts.server_port:
        attributes["server.port"] = counts.server_port
        if counts.role is Role.CLIENT:
            attributes["network.peer.port"] = counts.server_port
    return attributes
