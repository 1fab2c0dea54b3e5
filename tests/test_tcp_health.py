"""TCP health counts: the kernel's per-CPU totals (bpf/tcp_health.c) turned into reports of what
grew, their series' attributes, and their way into a process's metrics and recordings."""

from __future__ import annotations

import ctypes
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.pipeline.events import ProcessInfo, TcpFlow, TcpHealthCounts
from otel_ebpf.pipeline.metrics import DELTA_KINDS
from otel_ebpf.pipeline.telemetry import Telemetry
from otel_ebpf.probes.tcp_health import (
    KFREE_SKB,
    RTT_TRACEPOINT,
    TRACEPOINTS,
    TcpHealthReader,
    drop_reasons,
    missing_tracepoints,
    retransmit_reports_failures,
)
from otel_ebpf.protocol import Role
from otel_ebpf.recording import decode_event, encode_event
from otel_ebpf.selfmetrics import SelfMetrics
from otel_ebpf.tcp_metrics import RTT_BOUNDARIES_S, series_attributes
from tests.test_struct_layouts import GCC, c_structs

NBUCKETS = len(RTT_BOUNDARIES_S) + 1


class Key(ctypes.Structure):
    """Stands in for BCC's type of ``struct tcp_series_key``."""

    _fields_ = [
        ("tgid", ctypes.c_uint32),
        ("server_port", ctypes.c_uint16),
        ("role", ctypes.c_uint8),
        ("pad", ctypes.c_uint8),
        ("family", ctypes.c_uint16),
        ("pad2", ctypes.c_uint16),
        ("peer_addr", ctypes.c_uint8 * 16),
    ]


class Series(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "retransmissions",
            "resets_sent",
            "resets_received",
            "rtt_count",
            "rtt_sum_us",
            "rtt_min_us",
            "rtt_max_us",
        )
    ] + [("rtt_buckets", ctypes.c_uint64 * NBUCKETS)]


class Table:
    """A per-CPU hash as BCC reads it: key -> one value per CPU (ctypes keys are unhashable)."""

    def __init__(self, *entries: tuple[Key, list[Series]]) -> None:
        self._entries = {bytes(key): (key, values) for key, values in entries}

    def __setitem__(self, key: Key, values: list[Series]) -> None:  # what the kernel does
        self._entries[bytes(key)] = (key, values)

    def items(self) -> list[tuple[Key, list[Series]]]:
        return list(self._entries.values())

    def __getitem__(self, key: Key) -> list[Series]:
        return self._entries[bytes(key)][1]

    def __delitem__(self, key: Key) -> None:
        del self._entries[bytes(key)]

    def __len__(self) -> int:
        return len(self._entries)


class DropKey(ctypes.Structure):
    """Stands in for BCC's type of ``struct tcp_drop_key``."""

    _fields_ = [("series", Key), ("reason", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class DropTable(Table):
    """``tcp_drops``: a per-CPU hash of plain counters."""

    def __init__(self, *entries: tuple[DropKey, list[int]]) -> None:
        self._entries = {bytes(key): (key, values) for key, values in entries}


class FlowKey(ctypes.Structure):
    """Stands in for BCC's type of ``struct tcp_flow_key`` (bpf/tcp_flows.c)."""

    _fields_ = [("series", Key), ("pad", ctypes.c_uint32), ("cgroup", ctypes.c_uint64)]


class Flow(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64) for name in ("bytes_sent", "bytes_received", "packets_sent", "packets_received")
    ]


class FlowTable(Table):
    """``tcp_flows``: a per-CPU hash of ``struct tcp_flow``."""

    def __init__(self, *entries: tuple[FlowKey, list[Flow]]) -> None:
        self._entries = {bytes(key): (key, values) for key, values in entries}


def _key(pid: int, role: int, address: str, port: int) -> Key:
    addr = ipaddress.ip_address(address)
    raw = addr.packed.ljust(16, b"\0")
    return Key(pid, port, role, 0, 2 if addr.version == 4 else 10, 0, (ctypes.c_uint8 * 16)(*raw))


def _series(**values: int) -> Series:
    series = Series(**{k: v for k, v in values.items() if k != "buckets"})
    for i, n in values.get("buckets", {}).items():
        series.rtt_buckets[i] = n
    return series


def test_the_cpus_are_summed_and_only_growth_is_reported() -> None:
    key = _key(42, 1, "10.0.0.1", 443)
    cpu0 = _series(retransmissions=2, rtt_count=1, rtt_sum_us=300, rtt_min_us=300, rtt_max_us=300, buckets={5: 1})
    table = Table((key, [cpu0, _series(resets_received=1)]))
    reader = TcpHealthReader(table)
    first = reader.read(1000)
    buckets = tuple(int(i == 5) for i in range(NBUCKETS))
    assert first == [TcpHealthCounts(1000, 42, Role.CLIENT, "10.0.0.1", 443, 2, 0, 1, 1, 300, buckets, 300, 300)]
    assert reader.read(2000) == []  # nothing grew
    table[key][1].retransmissions = 3
    (grown,) = reader.read(3000)
    assert (grown.retransmissions, grown.resets_received, grown.rtt_count) == (3, 0, 0)
    assert grown.rtt_buckets == (0,) * NBUCKETS


def test_an_exited_process_is_read_once_more_then_deleted() -> None:
    key = _key(7, 2, "192.168.1.9", 8080)
    table = Table((key, [_series(resets_sent=1)]))
    reader = TcpHealthReader(table)
    reader.process_exited(7)
    (last,) = reader.read(1)
    assert (last.pid, last.role, last.resets_sent, last.server_port) == (7, Role.SERVER, 1, 8080)
    assert not table
    # a socket it left behind retransmits its FIN: counted from zero, reported, deleted again
    table[key] = [_series(retransmissions=1)]
    (orphan,) = reader.read(2)
    assert (orphan.pid, orphan.retransmissions) == (7, 1)
    assert not table


def test_drops_join_their_series_report_by_reason_and_only_what_grew() -> None:
    busy, quiet = _key(42, 2, "10.0.0.2", 8080), _key(42, 1, "10.0.0.3", 443)
    table = Table((busy, [_series(retransmissions=1)]))
    drops = DropTable(
        (DropKey(busy, 5), [2, 1]),
        (DropKey(busy, 2), [1]),
        (DropKey(quiet, 999), [4]),  # a reason this kernel's format did not name
    )
    reader = TcpHealthReader(table, drops, {2: "NOT_SPECIFIED", 5: "SOCKET_FILTER"})
    first = {(r.server_port, r.retransmissions, r.drops) for r in reader.read(1)}
    assert first == {(8080, 1, (("NOT_SPECIFIED", 1), ("SOCKET_FILTER", 3))), (443, 0, (("999", 4),))}
    drops[DropKey(busy, 5)] = [2, 4]
    (grown,) = reader.read(2)
    assert (grown.server_port, grown.retransmissions, grown.drops, grown.rtt_buckets) == (
        8080,
        0,
        (("SOCKET_FILTER", 3),),
        (0,) * NBUCKETS,
    )
    reader.process_exited(42)
    reader.read(3)
    assert not table and not drops


def test_flows_join_their_series_by_cgroup_and_report_what_grew() -> None:
    busy, quiet = _key(42, 2, "10.0.0.2", 8080), _key(42, 1, "10.0.0.3", 443)
    table = Table((busy, [_series(retransmissions=1)]))
    flows = FlowTable(
        (FlowKey(busy, 0, 7), [Flow(1000, 200, 10, 4), Flow(500, 0, 5, 0)]),
        (FlowKey(busy, 0, 9), [Flow(0, 60, 0, 1)]),
        (FlowKey(quiet, 0, 404), [Flow(52, 0, 1, 0)]),  # a cgroup gone by the time it was read
    )
    paths = {7: "/kubepods.slice/pod-a", 9: "/system.slice/b.service"}
    reader = TcpHealthReader(table, flows=flows, cgroup_path=lambda cgroup: paths.get(cgroup, ""))
    first = {(r.server_port, r.retransmissions, r.flows) for r in reader.read(1)}
    assert first == {
        (
            8080,
            1,
            (TcpFlow("/kubepods.slice/pod-a", 1500, 200, 15, 4), TcpFlow("/system.slice/b.service", 0, 60, 0, 1)),
        ),
        (443, 0, (TcpFlow("", 52, 0, 1, 0),)),  # flows only: nothing else of the series grew
    }
    flows[FlowKey(busy, 0, 7)] = [Flow(1000, 200, 10, 4), Flow(600, 52, 6, 1)]
    (grown,) = reader.read(2)
    assert (grown.server_port, grown.retransmissions, grown.flows) == (8080, 0, (TcpFlow(paths[7], 100, 52, 1, 1),))
    assert reader.read(3) == []
    reader.process_exited(42)
    reader.read(4)
    assert not table and not flows


def test_drop_reasons_are_named_as_the_kernel_prints_them(tmp_path: Path) -> None:
    fmt = tmp_path / "format"
    fields = "\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n"
    reason = "\tfield:enum skb_drop_reason reason;\toffset:36;\tsize:4;\tsigned:0;\n"
    printed = 'print fmt: "...", __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 5, "SOCKET_FILTER" })\n'
    fmt.write_text(fields + "\tfield:void * rx_sk;\toffset:24;\tsize:8;\tsigned:0;\n" + reason + printed)
    assert drop_reasons(fmt) == {2: "NOT_SPECIFIED", 5: "SOCKET_FILTER"}
    fmt.write_text(fields + reason + printed)  # before Linux 6.8: no socket to tell whose the drop was
    assert drop_reasons(fmt) is None
    assert drop_reasons(tmp_path / "missing") is None


def test_failed_retransmissions_are_told_apart_where_the_kernel_reports_them(tmp_path: Path) -> None:
    tracepoint = tmp_path / "tcp_retransmit_skb"
    tracepoint.mkdir()
    fields = "\tfield:const void * skaddr;\toffset:16;\tsize:8;\tsigned:0;\n"
    (tracepoint / "format").write_text(fields)
    assert not retransmit_reports_failures(tmp_path)
    (tracepoint / "format").write_text(fields + "\tfield:int err;\toffset:76;\tsize:4;\tsigned:1;\n")
    assert retransmit_reports_failures(tmp_path)
    assert not retransmit_reports_failures(tmp_path / "missing")


@pytest.mark.bpf  # tracefs is root's
def test_this_kernel_names_its_drop_reasons() -> None:
    reasons = drop_reasons(KFREE_SKB)
    assert reasons is not None and reasons[2] == "NOT_SPECIFIED" and "SOCKET_FILTER" in reasons.values()


@pytest.mark.parametrize(
    ("family", "raw", "expected"),
    [
        (10, ipaddress.IPv6Address("::ffff:10.1.2.3").packed, "10.1.2.3"),
        (10, ipaddress.IPv6Address("fd00::5").packed, "fd00::5"),
        (0, bytes(16), ""),  # the kernel never showed the handshake
    ],
)
def test_peer_addresses(family: int, raw: bytes, expected: str) -> None:
    key = Key(1, 0 if not family else 80, 1, 0, family, 0, (ctypes.c_uint8 * 16)(*raw))
    (report,) = TcpHealthReader(Table((key, [_series(retransmissions=1)]))).read(1)
    assert report.peer_address == expected


def _counts(role: Role, peer: str = "10.0.0.1", port: int = 443, **values: Any) -> TcpHealthCounts:
    counters = (
        "retransmissions",
        "resets_sent",
        "resets_received",
        "rtt_count",
        "rtt_sum_us",
        "rtt_min_us",
        "rtt_max_us",
    )
    fields: dict[str, Any] = {**dict.fromkeys(counters, 0), "rtt_buckets": (0,) * NBUCKETS, **values}
    return TcpHealthCounts(5, 42, role, peer, port, **fields)


def test_a_client_series_names_the_peer_port_a_server_series_does_not() -> None:
    assert series_attributes(_counts(Role.CLIENT)) == {
        "network.transport": "tcp",
        "network.peer.address": "10.0.0.1",
        "network.peer.port": 443,
        "server.port": 443,
    }
    assert series_attributes(_counts(Role.SERVER, "10.0.0.9", 8080)) == {
        "network.transport": "tcp",
        "network.peer.address": "10.0.0.9",
        "server.port": 8080,
    }
    assert series_attributes(_counts(Role.SERVER, "", 0)) == {"network.transport": "tcp"}


def test_counts_become_the_process_metrics() -> None:
    telemetry = Telemetry([], "host", {}, SelfMetrics(), delta_kinds=DELTA_KINDS["cumulative"])
    telemetry.process_info(ProcessInfo(1, 42, "/usr/bin/curl", "curl", {}))
    buckets = tuple(2 if i == 3 else 0 for i in range(NBUCKETS))  # 64 us < rtt <= 128 us
    rtt = {"rtt_count": 2, "rtt_sum_us": 200, "rtt_buckets": buckets, "rtt_min_us": 90, "rtt_max_us": 110}
    telemetry.tcp_health(_counts(Role.CLIENT, retransmissions=3, resets_received=1, **rtt))
    telemetry.tcp_health(_counts(Role.CLIENT, retransmissions=1, drops=(("SOCKET_FILTER", 2), ("TCP_OLD_DATA", 1))))
    telemetry.tcp_health(_counts(Role.CLIENT, drops=(("SOCKET_FILTER", 3),)))
    (resource,) = telemetry.collect_metrics(10)
    assert resource.resource.attributes["process.pid"] == 42
    metrics = {m.name: m for scope in resource.scope_metrics for m in scope.metrics}
    assert {scope.scope.name for scope in resource.scope_metrics} == {"otel_ebpf.tcp"}
    (retransmitted,) = metrics["otel_ebpf.tcp.retransmissions"].data.data_points
    assert retransmitted.value == 4
    (reset,) = metrics["otel_ebpf.tcp.resets"].data.data_points
    assert (reset.value, reset.attributes["network.io.direction"]) == (1, "receive")
    dropped = {
        p.attributes["otel_ebpf.tcp.drop_reason"]: p.value for p in metrics["otel_ebpf.tcp.drops"].data.data_points
    }
    assert dropped == {"SOCKET_FILTER": 5, "TCP_OLD_DATA": 1}
    (rtt,) = metrics["otel_ebpf.tcp.rtt"].data.data_points
    assert (rtt.count, rtt.sum, rtt.min, rtt.max) == (2, 200e-6, 90e-6, 110e-6)
    assert list(rtt.explicit_bounds) == list(RTT_BOUNDARIES_S)
    assert rtt.bucket_counts[3] == 2 and RTT_BOUNDARIES_S[2] < 100e-6 <= RTT_BOUNDARIES_S[3]


def test_flows_become_bytes_and_packets_each_way_by_cgroup() -> None:
    telemetry = Telemetry([], "host", {}, SelfMetrics(), delta_kinds=DELTA_KINDS["cumulative"])
    telemetry.process_info(ProcessInfo(1, 42, "/usr/bin/curl", "curl", {}))
    telemetry.tcp_health(_counts(Role.CLIENT, flows=(TcpFlow("/a.slice", 1052, 0, 2, 0), TcpFlow("", 0, 104, 0, 2))))
    telemetry.tcp_health(_counts(Role.CLIENT, flows=(TcpFlow("/a.slice", 552, 52, 1, 1),)))
    (resource,) = telemetry.collect_metrics(10)
    metrics = {m.name: m for scope in resource.scope_metrics for m in scope.metrics}
    series = series_attributes(_counts(Role.CLIENT))
    for name, unit, expected in (
        (
            "otel_ebpf.tcp.io",
            "By",
            {("/a.slice", "transmit"): 1604, ("/a.slice", "receive"): 52, (None, "receive"): 104},
        ),
        (
            "otel_ebpf.tcp.packet.count",
            "{packet}",
            {("/a.slice", "transmit"): 3, ("/a.slice", "receive"): 1, (None, "receive"): 2},
        ),
    ):
        points = metrics[name].data.data_points
        assert metrics[name].unit == unit and metrics[name].data.is_monotonic
        assert {
            (p.attributes.get("otel_ebpf.cgroup.path"), p.attributes["network.io.direction"]): p.value for p in points
        } == expected
        for point in points:
            assert {k: v for k, v in point.attributes.items() if k in series} == series


def test_counts_survive_a_recording() -> None:
    counts = _counts(Role.SERVER, rtt_count=1, rtt_buckets=(1,) + (0,) * (NBUCKETS - 1), drops=(("NOMEM", 2),))
    assert decode_event(encode_event(counts)) == counts
    older = encode_event(_counts(Role.SERVER)).replace(',"drops":[]', "")  # a recording from before drops
    assert decode_event(older) == _counts(Role.SERVER)
    flowing = _counts(Role.CLIENT, flows=(TcpFlow("/a.slice", 1052, 52, 2, 1), TcpFlow("", 0, 60, 0, 1)))
    assert decode_event(encode_event(flowing)) == flowing
    before_flows = encode_event(_counts(Role.CLIENT)).replace(',"flows":[]', "")
    assert decode_event(before_flows) == _counts(Role.CLIENT)


@pytest.mark.skipif(GCC is None, reason="gcc is not installed (scripts/bootstrap.sh)")
def test_the_kernel_structs_have_what_the_reader_reads() -> None:
    structs = c_structs("tcp_health.c")
    assert [(m.name, m.size) for m in structs["tcp_series_key"].members] == [
        (name, ctypes.sizeof(typ)) for name, typ in Key._fields_
    ]
    assert [(m.name, m.size) for m in structs["tcp_series"].members] == [
        (name, ctypes.sizeof(typ)) for name, typ in Series._fields_
    ]
    drop_key = c_structs("tcp_health.c", ("TCP_DROPS",))["tcp_drop_key"]
    assert [(m.name, m.size) for m in drop_key.members] == [
        (name, ctypes.sizeof(typ)) for name, typ in DropKey._fields_
    ]
    flows = c_structs(("tcp_health.c", "tcp_flows.c"), ("TCP_FLOWS",))
    for struct, stand_in in (("tcp_flow_key", FlowKey), ("tcp_flow", Flow)):
        assert [(m.name, m.offset, m.size) for m in flows[struct].members] == [
            (name, getattr(stand_in, name).offset, ctypes.sizeof(typ)) for name, typ in stand_in._fields_
        ]
        assert flows[struct].size == ctypes.sizeof(stand_in)


def test_a_kernel_without_the_tracepoints_or_their_socket_is_named(tmp_path: Path) -> None:
    for name in (*TRACEPOINTS, RTT_TRACEPOINT):
        (tmp_path / name).mkdir()
        (tmp_path / name / "format").write_text("\tfield:const void * skaddr;\toffset:16;\tsize:8;\tsigned:0;\n")
    assert missing_tracepoints(True, tmp_path) == []
    (tmp_path / "tcp_probe" / "format").write_text("\tfield:__u32 srtt;\toffset:100;\tsize:4;\tsigned:0;\n")
    (tmp_path / "tcp_destroy_sock" / "format").unlink()
    assert missing_tracepoints(True, tmp_path) == ["tcp_destroy_sock", "tcp_probe.skaddr"]
    # sampled at reads, the RTT needs no tcp_probe
    assert missing_tracepoints(False, tmp_path) == ["tcp_destroy_sock"]


@pytest.mark.bpf  # tracefs is root's
def test_this_kernel_has_them() -> None:
    assert missing_tracepoints(True) == []
