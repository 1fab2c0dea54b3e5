"""The data path without BPF: a provider function's address placed in its file (maps text, the
stand-in's ELF segments), and the kernel's counts recorded per queue pair with the pair's
attributes (docs/rdma.md)."""

from __future__ import annotations

from pathlib import Path

from otel_ebpf.probes.verbs import default_symbols
from otel_ebpf.rdma.datapath import LATENCY_BOUNDARIES_S, OPCODE_NONE, Completions, Latencies, WorkRequests
from otel_ebpf.rdma.providers import Place, place_of, virtual_address
from tests.rdma.standin import build
from tests.rdma.test_views import GID_1, PID, _connect, _views

MAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 1234 /usr/bin/driver
7f0000000000-7f0000001000 r--p 00000000 08:01 99 /usr/lib/libmlx5.so.1.25
7f0000001000-7f0000005000 r-xp 00001000 08:01 99 /usr/lib/libmlx5.so.1.25
7f0000005000-7f0000006000 rw-p 00000000 00:00 0
7f0000006000-7f0000007000 r-xp 00002000 08:01 77 /tmp/gone.so (deleted)
"""


def test_an_address_is_placed_in_its_files_mapping() -> None:
    assert place_of(MAPS, 0x7F0000001234) == Place("/usr/lib/libmlx5.so.1.25", 0x1234)
    assert place_of(MAPS, 0x7F0000004FFF) == Place("/usr/lib/libmlx5.so.1.25", 0x4FFF)
    assert place_of(MAPS, 0x7F0000005010) is None  # anonymous
    assert place_of(MAPS, 0x7F0000006010) is None  # deleted
    assert place_of(MAPS, 0x1000) is None


def test_a_file_offset_is_the_elf_address_of_its_segment() -> None:
    library = build.build() / build.LIBRARY
    # the stand-in's text segment: an exported function's ELF address, taken as a file offset, maps back
    address = default_symbols(str(library), ["ibv_open_device"])["ibv_open_device"]
    assert virtual_address(str(library), address) == address
    assert virtual_address("/nonexistent", 0x1000) is None
    assert virtual_address(str(Path(__file__)), 0) is None  # not ELF


def test_data_counts_carry_the_queue_pairs_pair(tmp_path: Path) -> None:
    views, _ = _views(tmp_path)
    _connect(views, 0xA0, 0x100, "mlx5_0", 0x101, GID_1)
    buckets = [0] * (len(LATENCY_BOUNDARIES_S) + 1)
    buckets[13] = 2  # up to 8.4 ms
    views.record_data(
        [
            WorkRequests(PID, 0x100, 2, 3, 3000),
            WorkRequests(PID, 0x100, 128, 1, 4096),
            Completions(PID, 0x100, 0, 0, 2, 2000),
            Completions(PID, 0x100, OPCODE_NONE, 13, 1, 0),
            Completions(PID, 0x999, 128, 0, 1, 64),  # a queue pair made before the agent attached
            Latencies(PID, 0x100, tuple(buckets), 11_000_000, 5_000_000, 6_000_000),
        ],
        1_500,
    )
    pair = {
        "rdma.device.name": "mlx5_0",
        "rdma.qp.num": 0x100,
        "rdma.qp.type": "RC",
        "rdma.port": 1,
        "rdma.local.gid": "0000:0000:0000:0000:0000:ffff:0a00:0001",
        "rdma.remote.qp.num": 0x101,
        "rdma.remote.gid": "0000:0000:0000:0000:0000:ffff:0a00:0002",
    }
    points = {}
    for resource in views.collect_metrics(2_000):
        for metric in resource.scope_metrics[0].metrics:
            for point in metric.data.data_points:
                points[(metric.name, tuple(sorted(point.attributes.items())))] = point

    def at(name: str, **extra: object) -> object:
        return points[(name, tuple(sorted({**pair, **extra}.items())))]

    assert at("rdma.work_requests", **{"rdma.wr.opcode": "SEND"}).value == 3
    assert at("rdma.work_requests.bytes", **{"rdma.wr.opcode": "RECV"}).value == 4096
    assert at("rdma.completions", **{"rdma.wc.opcode": "SEND", "rdma.wc.status": "SUCCESS"}).value == 2
    assert at("rdma.completions", **{"rdma.wc.status": "RNR_RETRY_EXC_ERR"}).value == 1  # no opcode: undefined
    unknown = (("rdma.qp.num", 0x999), ("rdma.wc.opcode", "RECV"), ("rdma.wc.status", "SUCCESS"))
    assert points[("rdma.completions", unknown)].value == 1
    latency = at("rdma.completion.latency")
    assert (latency.count, latency.sum, latency.min, latency.max) == (2, 0.011, 0.005, 0.006)
    assert list(latency.bucket_counts) == buckets
