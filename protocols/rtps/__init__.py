"""RTPS (DDS, ROS 2) over UDP: samples as PRODUCER/CONSUMER spans, services as CLIENT/SERVER.

``wire`` parses one datagram (every submessage kind, both endiannesses, parameter lists),
``discovery`` learns from SPDP/SEDP what each writer is (topic, type, participant; ROS 2 names
restored), ``session`` turns a socket's datagrams into samples, calls and control traffic, sharing
node-wide state through the protocol instance, and ``types`` describes them as spans and metrics.

Where the shared state lives: the plugin API gives a session one socket's bytes, but a writer is
named by a SEDP sample that another socket (often of another process) carried, a request leaves
from one socket and its reply arrives on another, and a consumer's latency needs its producer's
send time. So the :class:`RTPS` instance, created once per agent, owns one bounded
:class:`~otel_ebpf.protocols.rtps.session.RTPSState`, and every session it creates holds a
reference to it (``new_process_session`` also tells the session its process). Its counters are
exported through :meth:`RTPS.drops` as ``otel_ebpf.protocol.drops{protocol="rtps"}``.

Options (``protocols.rtps`` in the agent configuration):

``max_endpoints``
    Writers and readers remembered from discovery (default 16384; LRU).
``max_samples``
    Samples remembered for deduplication and latency (default 65536; LRU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_ebpf.protocol import NO_MATCH, Direction, Protocol, Role, Sniff, Transport

from .session import FragmentStitcher, RTPSSession, RTPSState
from .types import INSTRUMENTS, Call, Control, Sample
from .wire import HEADER_SIZE, MAGIC

__all__ = ["RTPS", "Call", "Control", "FragmentStitcher", "RTPSSession", "RTPSState", "Sample"]


def _positive(options: dict[str, Any], name: str, default: int) -> int:
    value = options.pop(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: must be a positive integer")
    return value


class RTPS(Protocol):
    name = "rtps"
    transports = frozenset({Transport.UDP})
    instruments = INSTRUMENTS

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        max_endpoints = _positive(options, "max_endpoints", 16384)
        max_samples = _positive(options, "max_samples", 65536)
        super().__init__(options)
        self.state = RTPSState(max_endpoints=max_endpoints, max_samples=max_samples)

    def sniff(self, direction: Direction, data: bytes) -> Sniff:
        """The "RTPS" magic, protocol version 2.x and a whole header: a datagram comes whole, so
        a shorter one is no RTPS (Cyclone's 16-byte multicast probes, for one)."""
        if len(data) >= HEADER_SIZE and data[:4] == MAGIC and data[4] == 2:
            return Sniff(True)
        return NO_MATCH

    def new_session(self, role: Role) -> RTPSSession:
        return RTPSSession(self.state, 0)

    def new_process_session(self, role: Role, process: int) -> RTPSSession:
        return RTPSSession(self.state, process)

    def new_stitcher(self, role: Role) -> FragmentStitcher:
        return FragmentStitcher()

    def drops(self) -> dict[str, int]:
        return self.state.drops()
