"""Socket addresses as the BPF programs hand them over: a family and 16 raw bytes."""

from __future__ import annotations

import ipaddress

from ..protocol import Endpoint

AF_INET, AF_INET6 = 2, 10


def endpoint(family: int, raw: bytes, port: int) -> Endpoint:
    """The endpoint for an IPv4 (first 4 bytes) or IPv6 address; IPv4-mapped ones as IPv4."""
    addr = ipaddress.IPv4Address(raw[:4]) if family == AF_INET else ipaddress.IPv6Address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return Endpoint(str(addr), port)
