"""A veth pair between the root network namespace and a new one, for tests that need real packets
on a real interface: one end (``outer``) stays here, the other (``inner``) lives in the namespace."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_SERIAL = itertools.count()
_SEND_PCAP = (
    "import sys\nfrom scapy.all import rdpcap, sendp\nsendp(rdpcap(sys.argv[1]), iface=sys.argv[2], verbose=False)"
)


@dataclass(frozen=True)
class VethPair:
    namespace: str
    outer: str  # in the root namespace
    inner: str  # in ``namespace``
    outer_ipv4: str
    inner_ipv4: str
    outer_ipv6: str
    inner_ipv6: str

    def mac(self, interface: str) -> str:
        where = [] if interface == self.outer else ["ip", "netns", "exec", self.namespace]
        return subprocess.check_output([*where, "cat", f"/sys/class/net/{interface}/address"], text=True).strip()

    def send_from_inside(self, pcap: Path) -> None:
        """Send every frame of ``pcap`` out of ``inner``, from inside the namespace (scapy's sendp)."""
        subprocess.run(
            ["ip", "netns", "exec", self.namespace, sys.executable, "-c", _SEND_PCAP, str(pcap), self.inner], check=True
        )


def _ip(*args: str, namespace: str | None = None) -> None:
    where = ["-n", namespace] if namespace else []
    subprocess.run(["ip", *where, *args], check=True, capture_output=True)


@contextmanager
def veth_pair(prefix: str, subnet: int) -> Iterator[VethPair]:
    """``prefix`` names the namespace and interfaces, with this process's pid (parallel runs do not
    collide) and a serial number (scapy remembers an interface by name: a new one gets a new name);
    ``subnet``: addresses 10.``subnet``.0.1/.2 and fd00:``subnet``::1/::2."""
    tag = f"{prefix}{os.getpid() % 100000}{next(_SERIAL)}"
    pair = VethPair(
        f"{tag}ns",
        f"{tag}o",
        f"{tag}i",
        f"10.{subnet}.0.1",
        f"10.{subnet}.0.2",
        f"fd00:{subnet:x}::1",
        f"fd00:{subnet:x}::2",
    )
    try:
        _ip("netns", "add", pair.namespace)
        _ip("link", "add", pair.outer, "type", "veth", "peer", "name", pair.inner, "netns", pair.namespace)
        _ip("addr", "add", f"{pair.outer_ipv4}/24", "dev", pair.outer)
        _ip("addr", "add", f"{pair.outer_ipv6}/64", "dev", pair.outer, "nodad")
        _ip("link", "set", pair.outer, "up")
        _ip("addr", "add", f"{pair.inner_ipv4}/24", "dev", pair.inner, namespace=pair.namespace)
        _ip("addr", "add", f"{pair.inner_ipv6}/64", "dev", pair.inner, "nodad", namespace=pair.namespace)
        _ip("link", "set", pair.inner, "up", namespace=pair.namespace)
        _ip("link", "set", "lo", "up", namespace=pair.namespace)
        yield pair
    finally:
        subprocess.run(["ip", "link", "del", pair.outer], capture_output=True)  # takes its peer with it
        subprocess.run(["ip", "netns", "del", pair.namespace], capture_output=True)
