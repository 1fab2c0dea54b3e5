"""Verbs calls -> metrics and queue-pair records (no BPF), the record decoding, and the choice of
symbols to hook (default versions only) on the stand-in and on Debian's real libibverbs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.probes.verbs import default_symbols, is_verbs_library
from otel_ebpf.rdma.calls import (
    ATTR_AV,
    ATTR_DEST_QPN,
    ATTR_PORT,
    ATTR_STATE,
    FUNCTIONS,
    RECORD,
    QpState,
    VerbsCall,
    decode,
    format_gid,
)
from otel_ebpf.rdma.views import VerbsViews
from otel_ebpf.selfmetrics import SelfMetrics
from tests.rdma import sysfs_tree
from tests.rdma.standin import build

PID = 4242
RC = 2
UD = 4
GID_0 = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
GID_1 = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])
REAL_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")


def _call(function: str, ret: int = 0x1000, **fields: Any) -> VerbsCall:
    defaults = {"object": 0x2000, "length": 0, "device": "mlx5_0"}
    return VerbsCall(1_000, 10, fields.pop("pid", PID), 7, function, ret, **{**defaults, **fields})


def _modify(qp: int, qp_num: int, before: int, after: int, mask: int = ATTR_STATE, **fields: Any) -> VerbsCall:
    return _call(
        "ibv_modify_qp",
        0,
        object=qp,
        qp_num=qp_num,
        qp_type=fields.pop("qp_type", RC),
        qp_state=before,
        attr_mask=mask,
        attr_qp_state=after,
        **fields,
    )


def _connect(views: VerbsViews, qp: int, qp_num: int, device: str, remote_num: int, remote_gid: bytes) -> None:
    views.handle(_call("ibv_create_qp", qp, device=device, qp_num=qp_num, qp_type=RC))
    views.handle(_modify(qp, qp_num, QpState.RESET, QpState.INIT, ATTR_STATE | ATTR_PORT, port_num=1, device=device))
    views.handle(
        _modify(
            qp,
            qp_num,
            QpState.INIT,
            QpState.RTR,
            ATTR_STATE | ATTR_AV | ATTR_DEST_QPN,
            dest_qp_num=remote_num,
            is_global=True,
            dgid=remote_gid,
            sgid_index=3,
            ah_port_num=1,
            device=device,
        )
    )
    views.handle(_modify(qp, qp_num, QpState.RTR, QpState.RTS, device=device))


def _views(tmp_path: Path, **kwargs: Any) -> tuple[VerbsViews, SelfMetrics]:
    selfmetrics = SelfMetrics()
    root = sysfs_tree.build(tmp_path / "sys")
    return VerbsViews(lambda pid: {"process.pid": pid}, selfmetrics, root, **kwargs), selfmetrics


def _series(views: VerbsViews) -> dict[tuple[str, tuple], int]:
    points = {}
    for resource in views.collect_metrics(2_000):
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    pid = resource.resource.attributes["process.pid"]
                    points[(metric.name, pid, tuple(sorted(point.attributes.items())))] = point.value
    return points


def test_a_connected_pair_carries_both_halves_and_they_join(tmp_path: Path) -> None:
    views, _ = _views(tmp_path)
    _connect(views, 0xA0, 0x100, "mlx5_0", 0x101, GID_1)
    _connect(views, 0xB0, 0x101, "mlx5_1", 0x100, GID_0)
    logs = views.take_logs()
    assert [r.log_record.event_name for r in logs] == ["rdma.qp.created"] + ["rdma.qp.state_changed"] * 3 + [
        "rdma.qp.created"
    ] + ["rdma.qp.state_changed"] * 3
    a, b = dict(logs[3].log_record.attributes), dict(logs[7].log_record.attributes)
    assert a == {
        "rdma.device.name": "mlx5_0",
        "rdma.qp.num": 0x100,
        "rdma.qp.type": "RC",
        "rdma.port": 1,
        "rdma.local.gid": "0000:0000:0000:0000:0000:ffff:0a00:0001",
        "rdma.remote.qp.num": 0x101,
        "rdma.remote.gid": "0000:0000:0000:0000:0000:ffff:0a00:0002",
        "rdma.qp.state": "RTS",
        "rdma.qp.previous_state": "RTR",
    }
    assert a["rdma.local.gid"] == b["rdma.remote.gid"] and a["rdma.qp.num"] == b["rdma.remote.qp.num"]
    assert b["rdma.local.gid"] == a["rdma.remote.gid"] and b["rdma.qp.num"] == a["rdma.remote.qp.num"]
    # before RTR the pair is not known yet
    assert "rdma.remote.qp.num" not in dict(logs[1].log_record.attributes)
    assert logs[2].log_record.body == (
        "RDMA queue pair 256 (RC, mlx5_0 port 1): INIT -> RTR, remote QP 257 at 0000:0000:0000:0000:0000:ffff:0a00:0002"
    )


def test_infiniband_without_grh_pairs_by_lid(tmp_path: Path) -> None:
    views, _ = _views(tmp_path)
    views.handle(_call("ibv_create_qp", 0xA0, qp_num=9, qp_type=RC))
    views.handle(
        _modify(0xA0, 9, QpState.INIT, QpState.RTR, ATTR_STATE | ATTR_AV | ATTR_DEST_QPN, dest_qp_num=77, dlid=0x1B)
    )
    attributes = dict(views.take_logs()[-1].log_record.attributes)
    assert attributes["rdma.remote.lid"] == 0x1B and attributes["rdma.remote.qp.num"] == 77
    assert "rdma.remote.gid" not in attributes and "rdma.local.gid" not in attributes


def test_metrics_count_calls_bytes_objects_and_transitions(tmp_path: Path) -> None:
    views, selfmetrics = _views(tmp_path)
    views.handle(_call("ibv_open_device", 0xC0))
    views.handle(_call("ibv_alloc_pd", 0xD0))
    views.handle(_call("ibv_reg_mr", 0xE0, length=4096))
    views.handle(_call("ibv_reg_mr_iova2", 0xE1, length=1 << 20))
    views.handle(_call("ibv_dereg_mr", 0, object=0xE0, length=4096))
    views.handle(_call("ibv_reg_dmabuf_mr", 0, length=8192))  # failed: NULL
    views.handle(_call("ibv_create_qp", 0xF0, qp_num=5, qp_type=UD))
    views.handle(_modify(0xF0, 5, QpState.RESET, QpState.INIT, qp_type=UD))
    views.handle(dataclasses.replace(_modify(0xF0, 5, QpState.INIT, QpState.SQD, qp_type=UD), ret=22))  # EINVAL
    views.handle(_modify(0xF0, 5, QpState.INIT, QpState.INIT, mask=ATTR_PORT, qp_type=UD, port_num=1))  # no state
    views.handle(_call("ibv_destroy_qp", 0, object=0xF0, qp_num=5, qp_type=UD, qp_state=QpState.INIT))
    views.handle(_call("ibv_destroy_cq", 0, object=0x999))  # made before the agent attached
    series = _series(views)
    device = (("rdma.device.name", "mlx5_0"),)
    assert series[("rdma.memory.registered", PID, device)] == 4096 + (1 << 20)
    assert series[("rdma.memory.deregistered", PID, device)] == 4096
    objects = {attrs[1][1]: v for (name, _, attrs), v in series.items() if name == "rdma.objects"}
    assert objects == {"context": 1, "pd": 1, "mr": 1, "qp": 0}
    calls = {dict(attrs).get("error.type"): v for (name, _, attrs), v in series.items() if "modify" in str(attrs)}
    assert calls == {None: 2, "EINVAL": 1}
    dmabuf = ("rdma.verbs.calls", PID, (("error.type", "null"), *device, ("rdma.verbs.function", "ibv_reg_dmabuf_mr")))
    assert series[dmabuf] == 1
    transitions = [attrs for (name, _, attrs), _ in series.items() if name == "rdma.qp.transitions"]
    assert transitions == [
        (*device, ("rdma.qp.previous_state", "RESET"), ("rdma.qp.state", "INIT"), ("rdma.qp.type", "UD"))
    ]
    assert selfmetrics.snapshot()["otel_ebpf.rdma.objects.untracked"] == 1


def test_a_queue_pair_made_before_the_agent_is_known_by_its_struct(tmp_path: Path) -> None:
    views, _ = _views(tmp_path)
    views.handle(_modify(0xA0, 12, QpState.RTS, QpState.ERR))
    record = views.take_logs()[0]
    assert record.log_record.severity_text == "WARN"
    assert dict(record.log_record.attributes)["rdma.qp.previous_state"] == "RTS"
    assert record.resource.attributes["process.pid"] == PID


def test_followed_objects_are_bounded(tmp_path: Path) -> None:
    views, selfmetrics = _views(tmp_path, max_objects=2)
    for pointer in (1, 2, 3):
        views.handle(_call("ibv_alloc_pd", pointer))
    assert selfmetrics.snapshot()["otel_ebpf.rdma.objects.untracked"] == 1


def test_an_exited_process_is_collected_once_more_then_forgotten(tmp_path: Path) -> None:
    views, _ = _views(tmp_path)
    views.handle(_call("ibv_alloc_pd", 0xD0, pid=1))
    views.handle(_call("ibv_alloc_pd", 0xD0, pid=2))
    views.processes_exited([1])
    assert {pid for _, pid, _ in _series(views)} == {1, 2}
    assert {pid for _, pid, _ in _series(views)} == {2}


def test_decode_reads_what_the_kernel_wrote() -> None:
    call = _modify(0xA0, 0x123456, QpState.INIT, QpState.RTR, ATTR_STATE | ATTR_AV, dgid=GID_1, dlid=3, sgid_index=3)
    call = dataclasses.replace(
        call, is_global=True, ah_port_num=1, port_num=2, dest_qp_num=0xABCDEF, providers=(0x7F10, 0x7F20, 0x7F30)
    )
    values = dataclasses.astuple(call)
    raw = RECORD.pack(
        call.ts_ns,
        call.duration_ns,
        0x7FFF0000,  # sp
        call.ret,
        call.object,
        call.length,
        *call.providers,
        call.pid,
        call.tid,
        FUNCTIONS.index(call.function),
        0,  # depth
        *values[9:15],
        call.dlid,
        1,
        call.ah_port_num,
        call.sgid_index,
        call.port_num,
        call.dgid,
        call.device.encode().ljust(64, b"\0"),
    )
    assert decode(raw + bytes(4), 0) == call  # the C struct is padded to 8 bytes
    assert decode(raw[:-1], 0) is None
    unknown = bytearray(raw)
    unknown[80:82] = len(FUNCTIONS).to_bytes(2, "little")  # op
    assert decode(bytes(unknown), 0) is None


def test_error_types() -> None:
    assert _call("ibv_modify_qp", 22).error_type == "EINVAL"
    assert _call("ibv_modify_qp", (1 << 32) - 12).error_type == "ENOMEM"  # -ENOMEM in the low 32 bits
    assert _call("ibv_modify_qp", 0).error_type is None
    assert _call("ibv_open_device", 0).error_type == "null"
    assert format_gid(GID_0) == "0000:0000:0000:0000:0000:ffff:0a00:0001"


def test_only_default_symbol_versions_are_chosen() -> None:
    library = build.build() / build.LIBRARY
    found = default_symbols(str(library))
    assert set(found) == set(FUNCTIONS)
    compat = default_symbols(str(library), ["ibv_open_device"])
    # the stand-in's 1.0 entry point (ibv_open_device@IBVERBS_1.0) is another function
    assert compat == {"ibv_open_device": found["ibv_open_device"]}
    assert is_verbs_library(str(library)) and not is_verbs_library("/usr/lib/libibverbs-helper.so")
    assert default_symbols("/nonexistent") == {}


def test_debians_libibverbs_has_every_hooked_function() -> None:
    if not REAL_LIBRARY.exists():
        pytest.skip("libibverbs1 is not installed (scripts/bootstrap.sh installs it)")  # a failure under CI=true
    assert set(default_symbols(str(REAL_LIBRARY))) == set(FUNCTIONS)
