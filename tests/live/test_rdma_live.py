"""Live BPF: the RDMA verbs control path on the stand-in libibverbs and on Debian's real one, and
the port counters of a sysfs-shaped tree, as a real OTLP receiver gets them from the agent.

The driver (tests/rdma/standin/driver.c, built against the system's verbs.h) keeps a ledger of
every verbs call it makes; the metrics the receiver got must equal it exactly: calls per function,
device and error, bytes registered and deregistered per device, objects held per kind and device,
queue-pair transitions. Its two RC queue pairs are connected to each other across the two
pretend devices: the log records of each carry the pair, and the two halves join.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import AGENT, REPO
from tests.live.test_gpu_live import _logs
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import OTLPReceiver, flatten_metrics
from tests.rdma import sysfs_tree
from tests.rdma.standin import build

pytestmark = pytest.mark.bpf
GID = {"mlx5_0": "0000:0000:0000:0000:0000:ffff:0a00:0001", "mlx5_1": "0000:0000:0000:0000:0000:ffff:0a00:0002"}


def _start_agent(tmp: Path, receiver: OTLPReceiver, pid: int, sysfs_root: Path) -> subprocess.Popen:
    ready = tmp / "agent.ready"
    agent = subprocess.Popen(
        [
            *AGENT,
            "run",
            "--pid",
            str(pid),
            "--exporter",
            "otlp",
            "--otlp-endpoint",
            receiver.grpc_endpoint,
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "OTEL_EBPF_RDMA_VERBS": "true",
            "OTEL_EBPF_RDMA_SYSFS_ROOT": str(sysfs_root),
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_EBPF_GPU": "false",
        },
    )
    _wait_for_file(ready, agent)
    return agent


def _stop(agent: subprocess.Popen) -> str:
    agent.send_signal(signal.SIGINT)
    stderr = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, stderr
    return stderr


def _last(metrics: dict[str, list[dict[str, Any]]], name: str, pid: int | None = None) -> dict[tuple, Any]:
    """The latest value of each series of ``name`` (of process ``pid``, or of the node): by its attributes."""
    latest: dict[tuple, dict[str, Any]] = {}
    for point in metrics.get(name, []):
        if point["resource"].get("process.pid") != pid:
            continue
        key = tuple(sorted(point["attributes"].items()))
        if key not in latest or point["time_ns"] >= latest[key]["time_ns"]:
            latest[key] = point
    return {key: point["value"] for key, point in latest.items()}


def _driver(program: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    driver = subprocess.Popen(
        [str(build.build() / program), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert driver.stdout.readline() == "ready\n"  # the library is mapped before the agent starts
    return driver


def _traced(
    tmp: Path, driver: subprocess.Popen, sysfs_root: Path, during: Any = None
) -> tuple[dict[str, Any], str, dict, list]:
    """Attach the agent to ``driver``, let it run its calls, read its ledger line, stop the agent
    (``during(receiver)`` first, with the agent running: it may end the driver) and collect what
    the receiver got."""
    try:
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp, receiver, driver.pid, sysfs_root)
            try:
                driver.stdin.write("go\n")
                driver.stdin.flush()
                summary = json.loads(driver.stdout.readline())
                if during is not None:
                    during(receiver)
            finally:
                stderr = _stop(agent)
            assert receiver.wait_for(lambda r: bool(r.metrics()), timeout=15)
            result = summary, stderr, receiver.metrics(), _logs(receiver)
        if driver.returncode is None:  # told to exit by ``during`` already, or now
            driver.communicate("exit\n", timeout=30)
        assert driver.returncode == 0
        return result
    finally:
        driver.kill()
        driver.wait()


def test_standin_verbs_ledger_and_port_counters_are_seen_exactly(tmp_path: Path) -> None:
    root = sysfs_tree.build(tmp_path / "infiniband")
    grown: dict[str, int] = {}

    def traffic(receiver: OTLPReceiver) -> None:
        """Counters move while the agent reads them: the next collections carry the growth."""
        seen = lambda r: bool(_last(r.metrics(), "rdma.port.io"))  # noqa: E731
        assert receiver.wait_for(seen, timeout=15)
        grown["xmit"] = sysfs_tree.bump(root, "mlx5_0", "counters", "port_xmit_data", 1000)
        grown["cnp"] = sysfs_tree.bump(root, "mlx5_0", "hw_counters", "np_cnp_sent", 4)
        time.sleep(1.5)  # three metric intervals

    summary, stderr, metrics, logs = _traced(tmp_path, _driver(build.DRIVER, "ledger"), root, traffic)
    pid, ledger = summary["pid"], summary["ledger"]
    assert re.search(r"RDMA: hooked \S+/libibverbs\.so\.1 \(15 verbs functions\)", stderr), stderr

    calls = {}
    for key, count in ledger.items():
        if key.startswith("calls "):
            _, function, *rest = key.split()
            attributes = {"rdma.verbs.function": function}
            if rest:
                attributes["rdma.device.name"] = rest[0]
            if len(rest) > 1:
                attributes["error.type"] = rest[1]
            calls[tuple(sorted(attributes.items()))] = count
    assert _last(metrics, "rdma.verbs.calls", pid) == calls
    for name, prefix in (("rdma.memory.registered", "registered "), ("rdma.memory.deregistered", "deregistered ")):
        expected = {
            (("rdma.device.name", k.removeprefix(prefix)),): v for k, v in ledger.items() if k.startswith(prefix)
        }
        assert _last(metrics, name, pid) == expected, name
    objects = {
        (("rdma.device.name", key.split()[1]), ("rdma.object.kind", key.split()[2])): held
        for key, held in ledger.items()
        if key.startswith("objects ")
    }
    assert _last(metrics, "rdma.objects", pid) == objects
    transitions = {}
    for key, count in ledger.items():
        if key.startswith("transition "):
            _, device, qp_type, move = key.split()
            before, after = move.split("->")
            transitions[
                (
                    ("rdma.device.name", device),
                    ("rdma.qp.previous_state", before),
                    ("rdma.qp.state", after),
                    ("rdma.qp.type", qp_type),
                )
            ] = count
    assert _last(metrics, "rdma.qp.transitions", pid) == transitions
    drops = {p["attributes"]["reason"]: p["value"] for p in metrics["otel_ebpf.kernel.drops"]}  # the agent's own
    assert drops["verbs_ringbuf_full"] == 0 and drops["verbs_returns_without_entry"] == 0

    # queue pairs: every lifecycle step, and the pair once connected
    rc0, rc1, ud = ledger["qpn rc0"], ledger["qpn rc1"], ledger["qpn ud"]
    records = [r for r in logs if r["event_name"].startswith("rdma.qp.")]
    assert {r["resource"]["process.pid"] for r in records} == {pid}
    steps = [(r["attributes"]["rdma.qp.num"], r["event_name"], r["attributes"]["rdma.qp.state"]) for r in records]
    assert sorted(steps) == sorted(
        [
            *[(qpn, "rdma.qp.created", "RESET") for qpn in (rc0, rc1, ud)],
            *[(qpn, "rdma.qp.state_changed", state) for qpn in (rc0, rc1, ud) for state in ("INIT", "RTR", "RTS")],
            (rc1, "rdma.qp.destroyed", "RTS"),
            (ud, "rdma.qp.destroyed", "RTS"),
        ]
    )
    connected = {
        r["attributes"]["rdma.qp.num"]: r["attributes"]
        for r in records
        if r["event_name"] == "rdma.qp.state_changed" and r["attributes"]["rdma.qp.state"] == "RTS"
    }
    for local, remote, device, peer in ((rc0, rc1, "mlx5_0", "mlx5_1"), (rc1, rc0, "mlx5_1", "mlx5_0")):
        assert connected[local] == {
            "rdma.device.name": device,
            "rdma.qp.num": local,
            "rdma.qp.type": "RC",
            "rdma.port": 1,
            "rdma.local.gid": GID[device],
            "rdma.remote.qp.num": remote,
            "rdma.remote.gid": GID[peer],
            "rdma.qp.state": "RTS",
            "rdma.qp.previous_state": "RTR",
        }
    # the two halves join: each one's local end is the other's remote end
    a, b = connected[rc0], connected[rc1]
    assert (a["rdma.local.gid"], a["rdma.qp.num"]) == (b["rdma.remote.gid"], b["rdma.remote.qp.num"])
    assert (b["rdma.local.gid"], b["rdma.qp.num"]) == (a["rdma.remote.gid"], a["rdma.remote.qp.num"])
    assert "rdma.remote.qp.num" not in connected[ud]  # UD: addressed per work request

    # port counters: the node's, as read, then grown
    port = (("rdma.device.name", "mlx5_0"), ("rdma.port", 1))
    io = _last(metrics, "rdma.port.io")
    assert io[(("network.io.direction", "transmit"), *port)] == grown["xmit"] * 4
    assert (
        io[(("network.io.direction", "receive"), *port)]
        == sysfs_tree.COUNTERS["mlx5_0"]["counters"]["port_rcv_data"] * 4
    )
    counters = _last(metrics, "rdma.port.counter")
    cnp = (("rdma.counter.group", "hw_counters"), ("rdma.counter.name", "np_cnp_sent"), *port)
    assert counters[cnp] == grown["cnp"]
    assert not [key for key in counters if ("rdma.counter.name", "lifespan") in key]


def test_debians_libibverbs_is_hooked(tmp_path: Path) -> None:
    """The real library: its default symbol versions hooked; without an RDMA device every
    ibv_get_device_list finds nothing, and each call is still counted. The program exits while
    the agent runs: its series are exported once more, then forgotten."""
    calls = 5
    driver = _driver(build.REAL_DRIVER, "list", str(calls))

    def exit_first(receiver: OTLPReceiver) -> None:
        driver.communicate("exit\n", timeout=30)

        def forgotten(r: OTLPReceiver) -> bool:  # a rescan found it gone: exported once more, then no more
            exports = [flatten_metrics([request]) for request in r.requests("metrics")]
            return any("rdma.verbs.calls" in e for e in exports) and "rdma.verbs.calls" not in exports[-1]

        assert receiver.wait_for(forgotten, timeout=30)

    summary, stderr, metrics, _ = _traced(tmp_path, driver, tmp_path / "no-such-sysfs", exit_first)
    assert summary["calls"] == calls and summary["devices"] == 0
    assert re.search(r"RDMA: hooked /\S*/libibverbs\.so\.1[.\d]* \(15 verbs functions\)", stderr), stderr
    assert "RDMA port counters: none" in stderr
    listed = _last(metrics, "rdma.verbs.calls", summary["pid"])
    assert {dict(k)["rdma.verbs.function"] for k in listed} == {"ibv_get_device_list"}
    assert sum(listed.values()) == calls
