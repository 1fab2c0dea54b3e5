"""Live BPF: the RDMA verbs data path on the stand-in's provider, as a real OTLP receiver gets it.

The driver (tests/rdma/standin/driver.c, ``data``) connects two RC queue pairs across the two
pretend devices and a third to a queue pair that does not exist, then — once the agent has hooked
the provider functions its contexts' ops tables name — posts receives and work requests of every
opcode through verbs.h's inline ``ibv_post_recv`` / ``ibv_post_send`` and polls every completion
with ``ibv_poll_cq``. Its ledger is what it posted and what its polls returned (three RNR and two
retry-exceeded errors among them); the agent's metrics must equal it exactly, per queue pair and
with the pair's attributes. Completions appear :data:`DELAY_US` after their post (the stand-in
provider's clock): every latency lies between that and a few seconds more.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.live.test_rdma_live import GID, _driver, _last, _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver
from tests.rdma import sysfs_tree
from tests.rdma.standin import build

pytestmark = pytest.mark.bpf
DELAY_US = 5000
COMPLETIONS = 3 * 7 + 2 + 6  # rc0's work requests, the lost queue pair's, rc1's receives


def _send(driver, line: str = "go") -> None:  # noqa: ANN001 — a Popen with text pipes
    driver.stdin.write(f"{line}\n")
    driver.stdin.flush()


def _self_metric(receiver: OTLPReceiver, name: str) -> float:
    return max((p["value"] for p in receiver.metrics().get(name, [])), default=0)


def _by(series: dict[tuple, float], *keys: str) -> dict[tuple, float]:
    """Series reduced to the attributes ``keys`` ("-" where one is absent), their values added."""
    reduced: Counter = Counter()
    for attributes, value in series.items():
        found = dict(attributes)
        reduced[tuple(found.get(key, "-") for key in keys)] += value
    return dict(reduced)


def _ledger(ledger: dict[str, int], prefix: str) -> dict[tuple, int]:
    """``"<prefix> <qpn> <words...>"`` entries as ((qpn, *words), value)."""
    found = {}
    for key, value in ledger.items():
        kind, qpn, *rest = key.split()
        if kind == prefix:
            found[(int(qpn), *rest)] = value
    return found


def test_standin_data_path_is_counted_exactly(tmp_path: Path) -> None:
    root = sysfs_tree.build(tmp_path / "infiniband")
    driver = _driver(build.DRIVER, "data", env={"STANDIN_COMPLETION_DELAY_US": str(DELAY_US)})
    try:
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, driver.pid, root)
            try:
                _send(driver)
                assert json.loads(driver.stdout.readline()) == {"connected": True}
                # the contexts' records named the provider's three functions: hooked before any post
                hooked = lambda r: _self_metric(r, "otel_ebpf.rdma.provider_functions") == 3  # noqa: E731
                assert receiver.wait_for(hooked, timeout=30)
                _send(driver)
                summary = json.loads(driver.stdout.readline())
                pid = summary["pid"]
                polled = lambda r: sum(_last(r.metrics(), "rdma.completions", pid).values()) == COMPLETIONS  # noqa: E731
                assert receiver.wait_for(polled, timeout=30)
            finally:
                stderr = _stop(agent)
            metrics = receiver.metrics()
        driver.communicate("exit\n", timeout=30)
        assert driver.returncode == 0
    finally:
        driver.kill()
        driver.wait()

    ledger, rc0, rc1, lost = summary["ledger"], summary["rc0"], summary["rc1"], summary["lost"]
    assert stderr.count("RDMA: hooked provider ") == 3, stderr
    posted = _last(metrics, "rdma.work_requests", pid)
    assert _by(posted, "rdma.qp.num", "rdma.wr.opcode") == _ledger(ledger, "posted")
    posted_bytes = _last(metrics, "rdma.work_requests.bytes", pid)
    assert _by(posted_bytes, "rdma.qp.num", "rdma.wr.opcode") == _ledger(ledger, "posted_bytes")
    completions = _last(metrics, "rdma.completions", pid)
    assert _by(completions, "rdma.qp.num", "rdma.wc.opcode", "rdma.wc.status") == _ledger(ledger, "completed")
    completed_bytes = _last(metrics, "rdma.completions.bytes", pid)
    assert _by(completed_bytes, "rdma.qp.num", "rdma.wc.opcode", "rdma.wc.status") == _ledger(ledger, "completed_bytes")
    errors = {k: v for k, v in _by(completions, "rdma.qp.num", "rdma.wc.status").items() if k[1] != "SUCCESS"}
    assert errors == {(rc0, "RNR_RETRY_EXC_ERR"): 3, (lost, "RETRY_EXC_ERR"): 2}

    # every series carries its queue pair's pair: rc0 and rc1 join, the lost one names its absent peer
    pairs = {
        (rc0, "mlx5_0", rc1, "mlx5_1"),
        (rc1, "mlx5_1", rc0, "mlx5_0"),
        (lost, "mlx5_0", 0xDEAD, "mlx5_1"),
    }
    for series in (posted, completions):
        for attributes in series:
            found = dict(attributes)
            assert (
                found["rdma.qp.num"],
                found["rdma.device.name"],
                found["rdma.remote.qp.num"],
                next(d for d, g in GID.items() if g == found["rdma.remote.gid"]),
            ) in pairs
            assert found["rdma.local.gid"] == GID[found["rdma.device.name"]]

    # latency: every completion matched its post; none sooner than the provider's delay
    latency = {}
    for point in metrics["rdma.completion.latency"]:
        if point["resource"].get("process.pid") == pid:
            qpn = point["attributes"]["rdma.qp.num"]
            if qpn not in latency or point["time_ns"] >= latency[qpn]["time_ns"]:
                latency[qpn] = point
    assert {qpn: point["count"] for qpn, point in latency.items()} == {rc0: 21, lost: 2, rc1: 6}
    delay_s = DELAY_US / 1e6
    for point in latency.values():
        assert delay_s <= point["min"] <= point["max"] < delay_s + 5
        bounds = point["explicit_bounds"]  # bucket i: up to bounds[i]; the last, above them all
        below = [n for n, bound in zip(point["bucket_counts"][: len(bounds)], bounds, strict=True) if bound < delay_s]
        assert sum(below) == 0, point
        assert delay_s * point["count"] <= point["sum"] < (delay_s + 5) * point["count"]
    drops = {p["attributes"]["reason"]: p["value"] for p in metrics["otel_ebpf.kernel.drops"]}
    for reason in (
        "verbs_data_table_full",
        "verbs_pending_table_full",
        "verbs_completions_unmatched",
        "verbs_wr_list_cut",
        "verbs_sge_list_cut",
        "verbs_wc_array_cut",
    ):
        assert drops[reason] == 0, reason
