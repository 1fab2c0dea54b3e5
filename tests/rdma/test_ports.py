"""Port counters from a sysfs-shaped tree: what is read, how it becomes series, what is left out."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.metrics.export import ResourceMetrics

from otel_ebpf.rdma.ports import PortCounter, PortMetrics, local_gid, local_lid, port_counter_source, read_ports
from tests.rdma import sysfs_tree
from tests.rdma.sysfs_tree import COUNTERS


def _points(collected: ResourceMetrics) -> dict[tuple[str, tuple], int]:
    points = {}
    for scope in collected.scope_metrics:
        for metric in scope.metrics:
            for point in metric.data.data_points:
                points[(metric.name, tuple(sorted(point.attributes.items())))] = point.value
    return points


def test_every_counter_of_every_port_is_read_and_nothing_else(tmp_path: Path) -> None:
    root = sysfs_tree.build(tmp_path)
    found = {(c.device, c.port, c.group, c.name): c.value for c in read_ports(root)}
    expected = {
        (device, 1, group, name): value
        for device, groups in COUNTERS.items()
        for group, values in groups.items()
        for name, value in values.items()
        if name != "lifespan"
    }
    assert found == expected


def test_no_tree_reads_nothing(tmp_path: Path) -> None:
    assert read_ports(tmp_path / "absent") == []
    assert port_counter_source(tmp_path / "absent", {}, frozenset()) is None


def test_a_file_that_is_not_a_number_is_left_out(tmp_path: Path) -> None:
    root = sysfs_tree.build(tmp_path)
    (root / "mlx5_1" / "ports" / "1" / "hw_counters" / "odd").write_text("N/A\n")
    (root / "mlx5_1" / "ports" / "notaport").mkdir()
    assert not [c for c in read_ports(root) if c.name == "odd"]


def test_series_grow_by_what_the_files_grew(tmp_path: Path) -> None:
    root = sysfs_tree.build(tmp_path)
    collect = port_counter_source(root, {"host.name": "node"}, frozenset())
    assert collect is not None
    first = _points(collect(1)[0])
    transmit = (("network.io.direction", "transmit"), ("rdma.device.name", "mlx5_0"), ("rdma.port", 1))
    assert first[("rdma.port.io", transmit)] == 250_000 * 4  # words of 4 bytes
    assert first[("rdma.port.packets", transmit)] == 4000
    cnp = (
        ("rdma.counter.group", "hw_counters"),
        ("rdma.counter.name", "np_cnp_sent"),
        ("rdma.device.name", "mlx5_0"),
        ("rdma.port", 1),
    )
    assert first[("rdma.port.counter", cnp)] == 7
    symbol_errors = (
        ("rdma.counter.group", "counters"),
        ("rdma.counter.name", "symbol_error"),
        ("rdma.device.name", "mlx5_0"),
        ("rdma.port", 1),
    )
    assert first[("rdma.port.counter", symbol_errors)] == 0  # a series from the first read on
    sysfs_tree.bump(root, "mlx5_0", "counters", "port_xmit_data", 100)
    sysfs_tree.bump(root, "mlx5_0", "hw_counters", "np_cnp_sent", 2)
    second = _points(collect(2)[0])
    assert second[("rdma.port.io", transmit)] == 250_100 * 4
    assert second[("rdma.port.counter", cnp)] == 9
    assert second[("rdma.port.counter", symbol_errors)] == 0


def test_a_counter_that_went_down_adds_what_it_reads_now() -> None:
    metrics = PortMetrics({})
    key = ("mlx5_0", 1, "hw_counters", "out_of_sequence")
    metrics.record([PortCounter(*key, 10)], 1)
    metrics.record([PortCounter(*key, 3)], 2)  # reset (or wrapped) in between
    collected = metrics.collect(3, frozenset())
    assert collected is not None
    assert list(_points(collected).values()) == [13]


def test_local_addresses(tmp_path: Path) -> None:
    root = sysfs_tree.build(tmp_path)
    assert local_gid(root, "mlx5_0", 1, 3) == "0000:0000:0000:0000:0000:ffff:0a00:0001"
    assert local_gid(root, "mlx5_0", 1, 9) is None
    assert local_gid(root, "mlx5_9", 1, 0) is None
    assert local_lid(root, "mlx5_0", 1) == 0
    (root / "mlx5_1" / "ports" / "1" / "lid").write_text("0x1a\n")
    assert local_lid(root, "mlx5_1", 1) == 0x1A


def test_doctor_says_which_devices_there_are(tmp_path: Path) -> None:
    from otel_ebpf.doctor import check_rdma_devices

    absent = check_rdma_devices(str(tmp_path / "absent"))
    assert absent.ok and not absent.required and "none in" in absent.detail
    present = check_rdma_devices(str(sysfs_tree.build(tmp_path / "sys")))
    assert present.detail.startswith("mlx5_0, mlx5_1 (port counters from ")
