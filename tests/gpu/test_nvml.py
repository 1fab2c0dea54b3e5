"""NVML readings -> GPU device series (otel_ebpf/gpu/nvml.py, NvmlMetrics), without a GPU."""

from __future__ import annotations

from typing import Any

from otel_ebpf.gpu.nvml import DeviceReading, NvmlMetrics
from otel_ebpf.protocol import InstrumentKind

S = 1_000_000_000
NODE = {"host.name": "gpu-node-1"}
H200 = DeviceReading(
    0,
    "GPU-0",
    "NVIDIA H200",
    utilization=(37, 12),
    memory=(20 << 30, 141 << 30),
    power_mw=523_000,
    clocks_mhz={"sm": 1980, "memory": 3201},
    ecc_totals={"ecc_corrected": 5, "ecc_uncorrected": 0},
    processes=((4242, 3 << 30),),
)
L4 = DeviceReading(1, "GPU-1", "NVIDIA L4", utilization=(80, 45), xids=(79,))


def resource_of(pid: int) -> dict[str, Any]:
    return {"service.name": f"proc-{pid}", "process.pid": pid}


def points(metrics: NvmlMetrics, now_ns: int, delta: frozenset = frozenset()) -> dict[tuple, Any]:
    """(resource pid or None, metric, hw.id, extra attribute) -> (kind, value)."""
    out = {}
    for resource_metrics in metrics.collect(now_ns, delta):
        pid = resource_metrics.resource.attributes.get("process.pid")
        for scope in resource_metrics.scope_metrics:
            assert scope.scope.name == "otel_ebpf.gpu.nvml"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attrs = dict(point.attributes)
                    extra = attrs.get("hw.gpu.clock") or attrs.get("error.type")
                    out[(pid, metric.name, attrs["hw.id"], extra)] = (type(metric.data).__name__, point.value)
    return out


def test_device_state_is_named_by_the_hardware_conventions() -> None:
    metrics = NvmlMetrics(NODE, resource_of)
    metrics.record([H200, L4], 10 * S)
    got = points(metrics, 11 * S)
    assert got == {
        (None, "hw.gpu.utilization", "GPU-0", None): ("Gauge", 0.37),
        (None, "hw.gpu.memory.utilization", "GPU-0", None): ("Gauge", 0.12),
        (None, "hw.gpu.memory.usage", "GPU-0", None): ("Sum", 20 << 30),
        (None, "hw.gpu.memory.limit", "GPU-0", None): ("Sum", 141 << 30),
        (None, "hw.power", "GPU-0", None): ("Gauge", 523),
        (None, "otel_ebpf.gpu.clock.frequency", "GPU-0", "sm"): ("Gauge", 1980 * 10**6),
        (None, "otel_ebpf.gpu.clock.frequency", "GPU-0", "memory"): ("Gauge", 3201 * 10**6),
        (None, "hw.errors", "GPU-0", "ecc_corrected"): ("Sum", 5),
        (4242, "otel_ebpf.gpu.process.memory.usage", "GPU-0", None): ("Sum", 3 << 30),
        # the L4 says less: no memory, power or clocks, and one XID
        (None, "hw.gpu.utilization", "GPU-1", None): ("Gauge", 0.8),
        (None, "hw.gpu.memory.utilization", "GPU-1", None): ("Gauge", 0.45),
        (None, "hw.errors", "GPU-1", "xid_79"): ("Sum", 1),
    }


def test_readings_replace_each_other_and_error_totals_count_only_what_grew() -> None:
    metrics = NvmlMetrics(NODE, resource_of)
    metrics.record([H200], 10 * S)
    later = DeviceReading(
        0,
        "GPU-0",
        "NVIDIA H200",
        utilization=(90, 70),
        ecc_totals={"ecc_corrected": 8, "ecc_uncorrected": 1},
        processes=((777, 1 << 30),),  # 4242 let go of the device
    )
    metrics.record([later], 20 * S)
    got = points(metrics, 21 * S)
    assert got[(None, "hw.gpu.utilization", "GPU-0", None)] == ("Gauge", 0.9)
    assert got[(None, "hw.errors", "GPU-0", "ecc_corrected")] == ("Sum", 8)  # 5, then 3 more
    assert got[(None, "hw.errors", "GPU-0", "ecc_uncorrected")] == ("Sum", 1)
    assert got[(777, "otel_ebpf.gpu.process.memory.usage", "GPU-0", None)] == ("Sum", 1 << 30)
    assert not any(key[0] == 4242 for key in got)


def test_delta_temporality_reports_error_counts_per_interval_and_readings_as_they_are() -> None:
    delta = frozenset({InstrumentKind.COUNTER, InstrumentKind.HISTOGRAM})
    metrics = NvmlMetrics(NODE, resource_of)
    metrics.record([H200], 10 * S)
    assert points(metrics, 11 * S, delta)[(None, "hw.errors", "GPU-0", "ecc_corrected")] == ("Sum", 5)
    metrics.record([H200], 20 * S)  # nothing grew
    got = points(metrics, 21 * S, delta)
    assert (None, "hw.errors", "GPU-0", "ecc_corrected") not in got
    assert got[(None, "hw.gpu.memory.usage", "GPU-0", None)] == ("Sum", 20 << 30)


def test_a_driver_library_that_is_not_there_is_said_not_raised() -> None:
    from otel_ebpf.gpu.nvml import open_reader
    from otel_ebpf.selfmetrics import SelfMetrics

    reader, why = open_reader("/nonexistent/libnvidia-ml.so.1", SelfMetrics())
    assert reader is None and why.startswith("cannot load /nonexistent/libnvidia-ml.so.1")
