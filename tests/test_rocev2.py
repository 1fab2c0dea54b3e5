"""RoCEv2 naming and metrics from kernel counts (otel_ebpf/rocev2.py), without BPF."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import ResourceMetrics

from otel_ebpf.protocol import InstrumentKind
from otel_ebpf.rocev2 import LATENCY_BOUNDARIES_S, Flow, FlowCounts, OpcodeCounts, RoceMetrics, address, opcode_name

FLOW = Flow("eth1", False, "10.0.0.2", "10.0.0.1", 0x11)
DELTA = frozenset({InstrumentKind.COUNTER})


def test_opcode_names_match_scapys_independent_table() -> None:
    roce = pytest.importorskip("scapy.contrib.roce")
    for transport in roce._transports:  # noqa: SLF001 — scapy's table is the independent reference
        for operation in roce._ops:  # noqa: SLF001
            code, name = roce.opcode(transport, operation)
            assert opcode_name(code) == name
    assert opcode_name(roce.CNP_OPCODE) == "CNP"


@pytest.mark.parametrize(
    ("opcode", "name"),
    [(0xA4, "XRC_SEND_ONLY"), (0x17, "RC_SEND_ONLY_WITH_INVALIDATE"), (0x15, "0x15"), (0x84, "0x84"), (0xFF, "0xff")],
)
def test_opcodes_outside_scapys_table(opcode: int, name: str) -> None:
    assert opcode_name(opcode) == name


def test_addresses_ipv4_mapped_and_ipv6() -> None:
    assert address(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])) == "10.0.0.1"
    assert address(bytes.fromhex("fd000000000000000000000000000001")) == "fd00::1"


def _values(collected: ResourceMetrics) -> dict[tuple, int]:
    return {
        (metric.name, tuple(sorted(point.attributes.items()))): point.value
        for scope in collected.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }


def test_counts_become_series_of_the_node_resource_and_zeros_none() -> None:
    metrics = RoceMetrics({"host.name": "node-1"}, max_series=100)
    naks = (0, 2, 0, 0, 1, 0, 0, 0)  # RNR x2, remote access error x1
    metrics.record([OpcodeCounts(FLOW, 0x04, 3, 300), FlowCounts(FLOW, 1, 0, 2, (5, *naks[1:]))], 10)
    collected = metrics.collect(20, frozenset())
    assert collected is not None
    assert dict(collected.resource.attributes) == {"host.name": "node-1"}
    flow = FLOW.attributes()
    assert flow == {
        "network.interface.name": "eth1",
        "network.io.direction": "receive",
        "source.address": "10.0.0.2",
        "destination.address": "10.0.0.1",
        "roce.dest_qp": 0x11,
    }

    def series(name: str, **more: object) -> tuple:
        return (name, tuple(sorted({**flow, **more}.items())))

    assert _values(collected) == {
        series("otel_ebpf.roce.packets", **{"roce.opcode": "RC_SEND_ONLY"}): 3,
        series("otel_ebpf.roce.bytes", **{"roce.opcode": "RC_SEND_ONLY"}): 300,
        series("otel_ebpf.roce.psn.gaps"): 1,
        series("otel_ebpf.roce.ecn.ce"): 2,
        series("otel_ebpf.roce.acks"): 5,
        series("otel_ebpf.roce.naks", **{"roce.nak.code": "rnr"}): 2,
        series("otel_ebpf.roce.naks", **{"roce.nak.code": "remote_access_error"}): 1,
    }


def test_cumulative_series_add_up_and_delta_series_restart() -> None:
    for delta, second in ((frozenset(), 5), (DELTA, 2)):
        metrics = RoceMetrics({}, max_series=100)
        metrics.record([OpcodeCounts(FLOW, 0x11, 3, 0)], 1)
        metrics.collect(2, delta)
        metrics.record([OpcodeCounts(FLOW, 0x11, 2, 0)], 3)
        collected = metrics.collect(4, delta)
        assert collected is not None
        packets = [v for (name, _), v in _values(collected).items() if name == "otel_ebpf.roce.packets"]
        assert packets == [second]


def test_series_past_the_cap_fold_into_overflow_and_are_counted() -> None:
    metrics = RoceMetrics({}, max_series=2)
    metrics.record([OpcodeCounts(Flow("eth1", True, "a", "b", qp), 0x04, 1, 10) for qp in range(3)], 1)
    assert metrics.take_overflowed() == 4  # the third flow's packets and bytes
    assert metrics.take_overflowed() == 0


def test_ack_latencies_merge_into_a_histogram_in_seconds() -> None:
    metrics = RoceMetrics({}, max_series=100)
    buckets = [0] * (len(LATENCY_BOUNDARIES_S) + 1)
    buckets[3] = 2  # two latencies of 4.1 to 8.2 us
    buckets[-1] = 1  # one above 1.07 s
    metrics.record([FlowCounts(FLOW, 0, 0, 0, (0,) * 8, tuple(buckets), 2_012_000_000, 5000, 2_000_000_000)], 1)
    collected = metrics.collect(2, frozenset())
    assert collected is not None
    [metric] = collected.scope_metrics[0].metrics
    [point] = metric.data.data_points
    assert (metric.name, metric.unit) == ("otel_ebpf.roce.ack.latency", "s")
    assert point.explicit_bounds[:2] == [1.024e-6, 2.048e-6]
    assert point.explicit_bounds[-1] == 1024 * 2**20 / 1e9
    assert (point.count, point.sum, point.min, point.max) == (3, 2.012, 5e-6, 2.0)
    assert list(point.bucket_counts) == buckets
    assert dict(point.attributes) == FLOW.attributes()


def test_forgotten_flows_lose_their_series_and_free_the_cap() -> None:
    metrics = RoceMetrics({}, max_series=4)
    other = Flow("eth1", False, "10.0.0.3", "10.0.0.1", 0x11)
    metrics.record([OpcodeCounts(FLOW, 0x04, 1, 10), FlowCounts(FLOW, 0, 0, 0, (1, 1, 0, 0, 0, 0, 0, 0))], 1)
    metrics.forget([FLOW])
    metrics.record([OpcodeCounts(other, 0x04, 2, 20)], 2)
    collected = metrics.collect(3, frozenset())
    assert collected is not None
    assert {dict(attributes)["source.address"] for _, attributes in _values(collected)} == {"10.0.0.3"}
    assert metrics.take_overflowed() == 0


def test_a_forgotten_opcode_leaves_the_flows_other_series() -> None:
    metrics = RoceMetrics({}, max_series=100)
    metrics.record([OpcodeCounts(FLOW, 0x04, 1, 10), OpcodeCounts(FLOW, 0x0A, 1, 10)], 1)
    metrics.forget([], [(FLOW, 0x04)])
    collected = metrics.collect(2, frozenset())
    assert collected is not None
    assert {dict(attributes)["roce.opcode"] for _, attributes in _values(collected)} == {"RC_RDMA_WRITE_ONLY"}
