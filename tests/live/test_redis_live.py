"""Live BPF: the out-of-tree Redis plugin (examples/plugins/otel-ebpf-redis), pip-installed into a
folder of its own and put on the agent's PYTHONPATH (the test's virtualenv stays as it was), traced
against a real redis-server driven by redis-py, both processes followed by pid.

Exactly one CLIENT and one SERVER span per command, the pipeline's included, with the database
semantic conventions; the client side also gives db.client.operation.duration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
PLUGIN = REPO / "examples" / "plugins" / "otel-ebpf-redis"
WORKLOAD = [sys.executable, str(Path(__file__).with_name("redis_workload.py"))]
sys.path.insert(0, str(PLUGIN / "tests"))
from redis_server import RedisServer  # noqa: E402

# The workload's commands. Before them redis-py opens each of its two connections with a handshake
# that depends on its version (8.x: HELLO 3, CLIENT MAINT_NOTIFICATIONS, CLIENT SETINFO twice, the
# last three answered ERR by Debian's Redis 7.0): those are checked to match between the two sides,
# not against a list.
HANDSHAKE = ("HELLO", "CLIENT ", "AUTH")
EXPECTED = Counter(
    {
        ("SET", "SET ? ?", None, None): 2,
        ("GET", "GET ?", None, None): 2,
        ("INCRBY", "INCRBY ? ?", None, None): 2,
        ("HSET", "HSET ? ? ?", None, None): 1,
        ("DEL", "DEL ?", None, None): 1,
        ("LPUSH", "LPUSH ? ?", "WRONGTYPE", None): 1,
        ("SELECT", "SELECT ?", None, None): 1,
        ("SET", "SET ? ?", None, "1"): 1,
    }
)


def _is_handshake(span: dict) -> bool:
    return str(span["attributes"].get("db.operation.name")).startswith(HANDSHAKE)


def _key(span: dict) -> tuple:
    a = span["attributes"]
    return a.get("db.operation.name"), a.get("db.query.text"), a.get("db.response.status_code"), a.get("db.namespace")


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"agent exited early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("live-redis")
    site = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(PLUGIN),
        ],
        check=True,
        timeout=300,
        cwd=tmp,
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    with OTLPReceiver() as receiver, RedisServer(tmp) as server:
        client = subprocess.Popen(
            [*WORKLOAD, str(server.port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert client.stdout.readline() == "ready\n"
        ready = tmp / "ready"
        agent = subprocess.Popen(
            [
                *AGENT,
                "run",
                "--pid",
                str(client.pid),
                "--pid",
                str(server.proc.pid),
                "--port",
                str(server.port),
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
            env={**env, "OTEL_EBPF_PROTOCOLS": "redis"},
        )
        try:
            _wait_for(ready, agent)
            out, _ = client.communicate("go\n", timeout=120)
            assert client.returncode == 0 and out.endswith("done\n"), out
            want = 2 * sum(EXPECTED.values())
            receiver.wait_for(lambda r: len(r.spans()) >= want, timeout=60)
        finally:
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=60)[1]
        assert agent.returncode == 0, stderr
        receiver.wait_for(lambda r: "db.client.operation.duration" in r.metrics(), timeout=30)
        yield server, client, receiver.spans(), receiver.metrics()


def test_plugin_installed_by_pip_is_what_the_agent_loaded(live: tuple) -> None:
    _, _, spans, _ = live
    assert spans and all(s["attributes"]["db.system.name"] == "redis" for s in spans)


@pytest.mark.parametrize("kind", ["CLIENT", "SERVER"])
def test_one_span_per_command_on_each_side(live: tuple, kind: str) -> None:
    server, client, spans, _ = live
    side = [s for s in spans if s["kind"] == kind]
    got = Counter(_key(s) for s in side if not _is_handshake(s))
    assert got == EXPECTED, f"{kind}: missing {EXPECTED - got}, unexpected {got - EXPECTED}"
    handshakes = {
        k: Counter(_key(s) for s in spans if s["kind"] == k and _is_handshake(s)) for k in ("CLIENT", "SERVER")
    }
    assert handshakes["CLIENT"] == handshakes["SERVER"]
    pid = client.pid if kind == "CLIENT" else server.proc.pid
    assert {s["resource"]["process.pid"] for s in side} == {pid}
    for s in side:
        a = s["attributes"]
        assert s["name"] == a["db.operation.name"]
        assert (a["server.address"], a["server.port"]) == ("127.0.0.1", server.port)
        assert a["network.peer.address"] == "127.0.0.1"
        assert (a["network.peer.port"] == server.port) == (kind == "CLIENT")
        assert s["status_code"] == ("ERROR" if "error.type" in a else "UNSET")
        assert a.get("error.type") == a.get("db.response.status_code")


def test_client_operation_duration(live: tuple) -> None:
    """The histogram counts every client command once (cumulative: the last export of each
    attribute set holds the totals)."""
    server, _, spans, metrics = live
    latest: dict[tuple, dict] = {}
    for point in metrics["db.client.operation.duration"]:
        assert point["unit"] == "s" and point["attributes"]["db.system.name"] == "redis"
        assert point["attributes"]["server.port"] == server.port
        key = tuple(sorted(point["attributes"].items()))
        if key not in latest or point["time_ns"] > latest[key]["time_ns"]:
            latest[key] = point
    by_op: Counter = Counter()
    for point in latest.values():
        by_op[point["attributes"]["db.operation.name"]] += point["count"]
    assert by_op == Counter(s["attributes"]["db.operation.name"] for s in spans if s["kind"] == "CLIENT")
    for (op, *_), n in EXPECTED.items():
        assert by_op[op] >= n
