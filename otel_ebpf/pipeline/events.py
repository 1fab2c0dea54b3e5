"""Typed events: what the probes hand to the user-space pipeline.

Everything downstream of these events is a pure function of the event stream plus configuration
(docs/architecture.md, "Deterministic after the ring buffer"), so the probe layer puts every fact
the pipeline needs into an event — including what it learned from ``/proc`` (process identity,
tuples of sockets that predate the agent). Timestamps are Unix-epoch nanoseconds, converted from
the kernel clock by the probe layer.

A connection is ``(pid, fd, generation)``: the generation changes when an fd is closed and reused.

Events are values: nothing changes one once made. They are plain (not frozen) dataclasses because
one is made per syscall, and a frozen dataclass costs five times as much to construct.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from ..protocol import Direction, Endpoint, Role, Transport

ConnKey = tuple[int, int, int]  # (pid, fd, generation)


@dataclass(slots=True)
class ProcessInfo:
    """Identity of an observed process, sent before its first connection event."""

    timestamp_ns: int
    pid: int
    executable: str  # full path of the executable, "" when unknown
    command_line: str
    # the process's own OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, from /proc/<pid>/environ
    environment: dict[str, str] = field(default_factory=dict)
    # container.* and k8s.* resource attributes the node states for it (containers.py)
    container: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ConnOpen:
    timestamp_ns: int
    pid: int
    fd: int
    generation: int
    role: Role | None  # from accept/connect; None for sockets that predate the agent
    local: Endpoint | None
    peer: Endpoint | None
    transport: Transport = Transport.TCP
    # TCP: the initial sequence numbers of the client's and the server's SYN, which both ends see
    # alike (through NAT too); None when the kernel did not see the handshake
    client_isn: int | None = None
    server_isn: int | None = None

    @property
    def key(self) -> ConnKey:
        return (self.pid, self.fd, self.generation)


@dataclass(slots=True)
class ConnData:
    """Bytes one syscall moved on a connection: ``data`` is the captured prefix of ``length``.

    ``tls``: the plaintext of a TLS connection, from the SSL probes (the ciphertext that the
    syscalls moved is never reported once the connection is known to be TLS).

    On a UDP socket one event is one whole datagram (all its iovecs gathered) and ``peer`` is the
    address it was sent to or received from (None when the syscall named none: a connected
    socket). TCP events leave ``peer`` None: the connection's tuple says it once.

    ``after_loss``: the kernel lost events of this connection just before this one (ring buffer
    full) and counted the exchanges they belonged to as shed; what the pipeline holds of them is
    incomplete and is dropped.

    ``retransmissions``: TCP segments the connection's socket retransmitted up to this syscall
    (with TCP health on; 0 otherwise), so that an exchange knows how many happened while it was
    in flight.

    ``tail``: the syscall's last bytes, which the kernel read apart from the captured prefix
    because they end a chunked HTTP/1 body; the bytes between prefix and tail are not captured."""

    timestamp_ns: int
    pid: int
    tid: int
    fd: int
    generation: int
    direction: Direction
    length: int
    data: bytes
    tls: bool = False
    peer: Endpoint | None = None
    after_loss: bool = False
    retransmissions: int = 0
    tail: bytes = b""

    @property
    def key(self) -> ConnKey:
        return (self.pid, self.fd, self.generation)


@dataclass(slots=True)
class KernelTrace:
    """The ids the kernel decided for a request (``trace.inject_traceparent``, docs/kubernetes.md):
    the one whose first bytes are the data event of connection (pid, fd, generation) stamped
    ``start_ns``. For a CLIENT request, the trace and span of the ``traceparent`` it inserted on the
    wire; for a SERVER request, its trace only (``span_id`` 0), which its thread's calls carry on.
    Trace assembly must use them.

    The kernel reports them after that data event; ``timestamp_ns`` is one nanosecond before
    ``start_ns`` so that the pipeline's reordering hands them over first."""

    timestamp_ns: int
    pid: int
    fd: int
    generation: int
    start_ns: int
    trace_id: int
    span_id: int
    sampled: bool

    @property
    def key(self) -> ConnKey:
        return (self.pid, self.fd, self.generation)


@dataclass(slots=True)
class ConnClose:
    timestamp_ns: int
    pid: int
    fd: int
    generation: int
    after_loss: bool = False  # as in ConnData
    # its socket moved bytes outside the syscalls (io_uring, splice): requests still waiting for a
    # response may have been answered there, unseen
    unseen_io: bool = False
    # the SSL probes named its socket: TLS the agent decrypts, even if no plaintext came
    tls: bool = False

    @property
    def key(self) -> ConnKey:
        return (self.pid, self.fd, self.generation)


@dataclass(slots=True)
class ProcessExit:
    timestamp_ns: int
    pid: int


# The attribute of what a process left at its exit (spans of exchanges its exit cut, profile
# samples), exported then rather than at the end of an interval.
EXITED: Mapping[str, bool] = MappingProxyType({"otel_ebpf.process.exited": True})


@dataclass(slots=True)
class KernelLoss:
    """Events the kernel could not deliver since the previous report (ring buffer full)."""

    timestamp_ns: int
    events: int


@dataclass(slots=True)
class HttpRequestCounts:
    """HTTP/1 requests of one series that the kernel counted since its previous report, exactly,
    whether or not their bytes were copied (bpf/http1_summary.h): count, summed duration and the
    ``http.*.request.duration`` histogram buckets (semantic-convention boundaries, then +Inf)."""

    timestamp_ns: int
    pid: int
    role: Role
    method: str  # as sent, or "_OTHER"
    status: int
    version: str  # "1.0" or "1.1"
    tls: bool
    server_address: str  # the peer, for a client; "" for a server (opt-in there)
    server_port: int
    count: int
    sum_ns: int
    buckets: tuple[int, ...]
    min_ns: int  # over every request of the series since the agent started
    max_ns: int


class TcpFlow(NamedTuple):
    """Bytes (from the IP header on) and packets (segments) a series' sockets of one cgroup sent
    and received (bpf/tcp_flows.c)."""

    cgroup: str  # the sockets' cgroup v2 path ("/system.slice/x.service"); "" when it was gone
    bytes_sent: int
    bytes_received: int
    packets_sent: int
    packets_received: int


@dataclass(slots=True)
class TcpHealthCounts:
    """What the kernel counted for one series of a process's TCP connections (its role, the peer's
    address, the server port) since its previous report (bpf/tcp_health.c): retransmitted
    segments, resets each way, the smoothed RTT sampled at the process's reads, in buckets of
    ``otel_ebpf.tcp.rtt`` (:data:`otel_ebpf.tcp_metrics.RTT_BOUNDARIES_S`, then +Inf), packets
    the kernel dropped, by its reason, and with ``capture.tcp_flows`` the bytes and packets moved,
    by cgroup."""

    timestamp_ns: int
    pid: int
    role: Role
    peer_address: str  # "" when the kernel never showed the connection's handshake
    server_port: int  # 0 likewise
    retransmissions: int
    resets_sent: int
    resets_received: int
    rtt_count: int
    rtt_sum_us: int
    rtt_buckets: tuple[int, ...]
    rtt_min_us: int  # over the series' whole life
    rtt_max_us: int
    drops: tuple[tuple[str, int], ...] = ()  # (the kernel's drop reason, packets), by reason
    flows: tuple[TcpFlow, ...] = ()  # by cgroup


Event = (
    ProcessInfo
    | ConnOpen
    | ConnData
    | KernelTrace
    | ConnClose
    | ProcessExit
    | KernelLoss
    | HttpRequestCounts
    | TcpHealthCounts
)
