"""Two network namespaces joined by a veth pair, and a TC classifier that drops every Nth data
segment to one TCP port as it arrives: real loss on a real link, for live tests of what the kernel reports."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VethLink:
    server_ns: str
    client_ns: str
    server_addr: str
    client_addr: str
    server_dev: str  # the server's end of the pair, in server_ns
    client_dev: str

    def exec_in(self, ns: str) -> list[str]:
        """The command prefix that runs a program in namespace ``ns``."""
        return ["ip", "netns", "exec", ns]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def veth_link() -> Iterator[VethLink]:
    """Namespaces ``otel-tcp-<pid>-{s,c}`` with 10.231.0.1 (server) and 10.231.0.2 (client),
    deleted on the way out whatever happened (their veth ends go with them)."""
    tag = os.getpid() % 100000
    link = VethLink(f"otel-tcp-{tag}-s", f"otel-tcp-{tag}-c", "10.231.0.1", "10.231.0.2", f"ots{tag}", f"otc{tag}")
    try:
        for ns in (link.server_ns, link.client_ns):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        peer = ("peer", "name", link.server_dev, "netns", link.server_ns)
        _ip("link", "add", link.client_dev, "netns", link.client_ns, "type", "veth", *peer)
        ends = (
            (link.server_ns, link.server_dev, link.server_addr),
            (link.client_ns, link.client_dev, link.client_addr),
        )
        for ns, dev, addr in ends:
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield link
    finally:
        for ns in (link.server_ns, link.client_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# Drops every DROP_EVERY-th IPv4 TCP segment with payload whose destination port is DPORT (the
# count is global, not per CPU: the test wants loss it can rely on, not an exact pattern).
_DROPPER = r"""
#include <uapi/linux/pkt_cls.h>
BPF_ARRAY(seen, u64, 1);

int drop_nth(struct __sk_buff *skb) {
    u8 ip[20];
    u8 tcp[14];
    u16 ethertype;
    if (bpf_skb_load_bytes(skb, 12, &ethertype, 2) || ethertype != __constant_htons(0x0800) ||
        bpf_skb_load_bytes(skb, 14, ip, 20) || ip[9] != 6)
        return TC_ACT_OK;
    u32 ihl = (ip[0] & 0xf) * 4;
    u32 total = (ip[2] << 8) | ip[3];
    if (ihl < 20 || ihl > 60 || bpf_skb_load_bytes(skb, 14 + ihl, tcp, 14))
        return TC_ACT_OK;
    u32 dport = (tcp[2] << 8) | tcp[3];
    u32 doff = (tcp[12] >> 4) * 4;
    if (dport != DPORT || total <= ihl + doff)
        return TC_ACT_OK;
    u32 zero = 0;
    u64 *n = seen.lookup(&zero);
    if (!n)
        return TC_ACT_OK;
    u64 count = __sync_fetch_and_add(n, 1) + 1;
    return count % DROP_EVERY == 0 ? TC_ACT_SHOT : TC_ACT_OK;
}
"""


@contextmanager
def dropping_every_nth(link: VethLink, dport: int, every: int, pin_dir: Path) -> Iterator[None]:
    """The classifier on the server's ingress, for as long as the block runs: segments lost on
    the way, which the sender learns of only as TCP does (dropped at its own egress, they would
    fail the send, and be sent again as new). BCC loads it; tc attaches it from a pin in a BPF
    filesystem mounted at ``pin_dir`` (tc takes no fd)."""
    from bcc import BPF
    from bcc.libbcc import lib

    bpf = BPF(text=_DROPPER.encode(), cflags=[f"-DDPORT={dport}", f"-DDROP_EVERY={every}"])
    program = bpf.load_func(b"drop_nth", BPF.SCHED_CLS)
    pin_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "bpf", str(pin_dir)], check=True)
    try:
        pin = pin_dir / "drop_nth"
        if lib.bpf_obj_pin(program.fd, str(pin).encode()) != 0:
            raise OSError(f"cannot pin the classifier at {pin}")
        tc = [*link.exec_in(link.server_ns), "tc"]
        subprocess.run([*tc, "qdisc", "add", "dev", link.server_dev, "clsact"], check=True)
        subprocess.run(
            [
                *tc,
                "filter",
                "add",
                "dev",
                link.server_dev,
                "ingress",
                "bpf",
                "object-pinned",
                str(pin),
                "direct-action",
            ],
            check=True,
        )
        yield
    finally:
        subprocess.run(["umount", str(pin_dir)], capture_output=True)
        bpf.cleanup()
