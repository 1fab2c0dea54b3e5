"""Socket addresses as the BPF programs hand them over: a family and 16 raw bytes."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os

from ..protocol import Endpoint

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10


def endpoint(family: int, raw: bytes, port: int) -> Endpoint:
    """The endpoint for an IPv4 (first 4 bytes) or IPv6 address; IPv4-mapped ones as IPv4."""
    return Endpoint(_address_text(family, raw), port)


# A node's connections come from and go to few addresses (loopback, its pods, its peers), and
# under connection churn every one of them is formatted again: ipaddress takes ~1.3 µs per address.
@functools.lru_cache(maxsize=4096)
def _address_text(family: int, raw: bytes) -> str:
    addr = ipaddress.IPv4Address(raw[:4]) if family == AF_INET else ipaddress.IPv6Address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return str(addr)


def unix_ends(local_socket: bytes, peer_socket: bytes, path: bytes, path_of_peer: bool) -> tuple[Endpoint, Endpoint]:
    """(local, peer) of a unix stream connection: each socket's kernel address in the first 8 bytes
    of its address field, kept only as a keyed hash (no kernel address leaves the agent: exports and
    recordings hold the hash), and the one path the kernel read, the local socket's or
    (``path_of_peer``) the peer's. A path ends at its NUL byte; an abstract name (a leading NUL
    byte, then all of its bytes) is written ``@name``, as ``ss`` does."""
    abstract = path[:1] == b"\0"
    name = "@" + path[1:].decode(errors="replace") if abstract else path.split(b"\0", 1)[0].decode(errors="replace")
    local = Endpoint("" if path_of_peer else name, 0, _socket_id(local_socket[:8]))
    peer = Endpoint(name if path_of_peer else "", 0, _socket_id(peer_socket[:8]))
    return local, peer


_SOCKET_KEY = os.urandom(16)


def _socket_id(address: bytes) -> int:
    """A kernel socket's identity for this agent's run: 0 for none (a peer already gone)."""
    if not any(address):
        return 0
    return int.from_bytes(hashlib.blake2b(address, digest_size=8, key=_SOCKET_KEY).digest(), "little") or 1
