"""RDMA port counters from sysfs, and the local addresses a queue pair's half is known by.

The kernel publishes each RDMA port's counters as one file per counter:
``<root>/<device>/ports/<port>/counters/<name>`` (the IBTA PortCounters every device has:
``port_xmit_data``, ``port_rcv_packets``, ``symbol_error``, ...) and
``.../hw_counters/<name>`` (the driver's own: ``out_of_sequence``, ``packet_seq_err``,
``local_ack_timeout_err``, ``np_cnp_sent``, ``rp_cnp_handled``, ...). They are only read, never
written (writing some resets them). ``root`` is ``/sys/class/infiniband`` unless configured (a
test points it at a tree it builds; a container at the host's).

:func:`read_ports` does the file reads; :class:`PortMetrics` turns readings into series and knows
nothing of files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.metrics.export import ResourceMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import __version__
from ..pipeline.metrics import ProcessMetrics
from ..protocol import AttributeValue, InstrumentKind, InstrumentSpec, MetricPoint
from .calls import format_gid

SCOPE = InstrumentationScope("otel_ebpf.rdma.ports", __version__)
GROUPS = ("counters", "hw_counters")
NOT_COUNTERS = frozenset({"lifespan"})  # hw_counters/lifespan: how long the driver caches them (ms), a setting
# counters/ files with instruments of their own: name -> (instrument, direction, multiplier)
DATA_WORDS = 4  # port_xmit_data / port_rcv_data count 32-bit words (IBTA PortCounters)
NAMED = {
    "port_xmit_data": ("rdma.port.io", "transmit", DATA_WORDS),
    "port_rcv_data": ("rdma.port.io", "receive", DATA_WORDS),
    "port_xmit_packets": ("rdma.port.packets", "transmit", 1),
    "port_rcv_packets": ("rdma.port.packets", "receive", 1),
}
_C = InstrumentKind.COUNTER
INSTRUMENTS = {
    spec.name: spec
    for spec in (
        InstrumentSpec("rdma.port.io", _C, "By", "Bytes the port sent and received (its data counters, in words, x4)"),
        InstrumentSpec("rdma.port.packets", _C, "{packet}", "Packets the port sent and received"),
        InstrumentSpec("rdma.port.counter", _C, "{event}", "Every other counter of the port, by file name"),
    )
}


@dataclass(frozen=True)
class PortCounter:
    device: str
    port: int
    group: str  # "counters" or "hw_counters"
    name: str
    value: int  # since the driver loaded (or the counter was last reset)


def read_ports(root: Path) -> list[PortCounter]:
    """Every counter of every port under ``root``; nothing where there is no such directory. A
    file that is not a number (or unreadable: some need a device that answers) is left out."""
    found = []
    for device in _entries(root):
        for port in _entries(root / device / "ports"):
            if not port.isdigit():
                continue
            for group in GROUPS:
                folder = root / device / "ports" / port / group
                for name in _entries(folder):
                    if name in NOT_COUNTERS:
                        continue
                    value = _number(folder / name)
                    if value is not None:
                        found.append(PortCounter(device, int(port), group, name, value))
    return found


def local_gid(root: Path, device: str, port: int, index: int) -> str | None:
    """The port's GID at ``index`` (``ports/<port>/gids/<index>``), as :func:`format_gid` writes it."""
    try:
        text = (root / device / "ports" / str(port) / "gids" / str(index)).read_text().strip()
        raw = bytes.fromhex(text.replace(":", ""))
    except (OSError, ValueError):
        return None
    return format_gid(raw) if len(raw) == 16 else None


def local_lid(root: Path, device: str, port: int) -> int | None:
    """The port's LID (``ports/<port>/lid``, ``0x1``): InfiniBand; 0 on RoCE."""
    try:
        return int((root / device / "ports" / str(port) / "lid").read_text().strip(), 0)
    except (OSError, ValueError):
        return None


def _entries(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class PortMetrics:
    """Readings -> the node's ``rdma.port.*`` series. The files hold totals since the driver
    loaded: each read adds what grew since the previous one (the whole total at the first); a
    total that went down (reset, or a 32-bit counter wrapped) adds what it reads now."""

    def __init__(self, node_resource: Mapping[str, AttributeValue]) -> None:
        self._metrics = ProcessMetrics(Resource(dict(node_resource)), INSTRUMENTS)
        self._seen: dict[tuple[str, int, str, str], int] = {}

    def record(self, counters: Iterable[PortCounter], now_ns: int) -> None:
        for counter in counters:
            key = (counter.device, counter.port, counter.group, counter.name)
            first = key not in self._seen
            before = self._seen.get(key, 0)
            self._seen[key] = counter.value
            grown = counter.value - before if counter.value >= before else counter.value
            if grown or first:  # a series from the first read on, zero or not
                self._metrics.record(SCOPE, _point(counter, grown), now_ns)

    def collect(self, now_ns: int, delta: frozenset[InstrumentKind]) -> ResourceMetrics | None:
        return self._metrics.collect(now_ns, delta)


def _point(counter: PortCounter, grown: int) -> MetricPoint:
    attributes: dict[str, AttributeValue] = {"rdma.device.name": counter.device, "rdma.port": counter.port}
    named = NAMED.get(counter.name) if counter.group == "counters" else None
    if named is not None:
        instrument, direction, multiplier = named
        return MetricPoint(instrument, grown * multiplier, {**attributes, "network.io.direction": direction})
    return MetricPoint(
        "rdma.port.counter",
        grown,
        {**attributes, "rdma.counter.group": counter.group, "rdma.counter.name": counter.name},
    )


def port_counter_source(
    root: Path, node_resource: Mapping[str, AttributeValue], delta: frozenset[InstrumentKind]
) -> Callable[[int], list[ResourceMetrics]] | None:
    """A metric source of the agent reading ``root`` at each collection; None where there is no
    such directory (no RDMA device, or ib_core not loaded): nothing to report."""
    if not root.is_dir():
        return None
    metrics = PortMetrics(node_resource)

    def collect(now_ns: int) -> list[ResourceMetrics]:
        metrics.record(read_ports(root), now_ns)
        collected = metrics.collect(now_ns, delta)
        return [collected] if collected is not None else []

    return collect
