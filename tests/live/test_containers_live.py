"""Live BPF: container and pod identity on the resources of real processes.

The test builds, in this machine's cgroup v2 hierarchy, the cgroup paths a kubelet and its
container runtime create (below a parent of its own, as a cgroup namespace would show them):
a containerd container under the systemd driver, whose runtime state file (the OCI bundle's
``config.json``) it also writes below a stand-in node root, and a CRI-O container under the
cgroupfs driver with no state file. A server runs in each, a CPU-bound one in the first; the
clients run outside any container. Spans and CPU profiles must carry exactly the identity of the
process's own container, and the clients none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.live.test_http_live import _wait_for_file
from tests.live.test_tls_live import _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver, _attributes

pytestmark = pytest.mark.bpf

CALLS = 6
CLIENT = f"""
import sys, urllib.request
print("ready", flush=True)
sys.stdin.readline()
for port in sys.argv[1:]:
    for i in range({CALLS}):
        path = "/work" if port == sys.argv[1] else f"/items/{{i}}"
        urllib.request.urlopen(f"http://127.0.0.1:{{port}}{{path}}").read()
"""


def _cgroup2_root() -> Path:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1])
    raise AssertionError("no cgroup v2 hierarchy mounted: the container identity test needs one")


def _remove_tree(top: Path) -> None:
    """cgroup directories go bottom-up, once their processes have exited."""
    for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        path.rmdir()
    top.rmdir()


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[dict[str, dict[str, str]]]:
    top = _cgroup2_root() / f"otel-ebpf-test-{uuid.uuid4().hex[:8]}"
    containerd_uid, crio_uid = str(uuid.uuid4()), str(uuid.uuid4())
    containerd_id, crio_id = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    underscored = containerd_uid.replace("-", "_")  # the systemd driver's slice names
    layout = {
        "containerd": {
            "cgroup": f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice"
            f"/cri-containerd-{containerd_id}.scope",
            "container.id": containerd_id,
            "k8s.pod.uid": containerd_uid,
        },
        "cri-o": {
            "cgroup": f"kubepods/besteffort/pod{crio_uid}/crio-{crio_id}",
            "container.id": crio_id,
            "k8s.pod.uid": crio_uid,
        },
    }
    for pod in layout.values():
        (top / pod["cgroup"]).mkdir(parents=True)
        pod["procs"] = str(top / pod["cgroup"] / "cgroup.procs")
    bundle = tmp_path / "node" / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{containerd_id}/config.json"
    bundle.parent.mkdir(parents=True)
    bundle.write_text(
        json.dumps(
            {
                "ociVersion": "1.1.0",
                "annotations": {
                    "io.kubernetes.cri.container-type": "container",
                    "io.kubernetes.cri.container-name": "model-server",
                    "io.kubernetes.cri.sandbox-name": "llm-7f9c-abcde",
                    "io.kubernetes.cri.sandbox-namespace": "serving",
                    "io.kubernetes.cri.sandbox-uid": containerd_uid,
                },
            }
        )
    )
    try:
        yield layout
    finally:
        _remove_tree(top)


def _in_cgroup(procs: str, *command: str) -> list[str]:
    """``command`` started inside the cgroup whose ``cgroup.procs`` is ``procs``, before it runs."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *command]


def test_spans_and_profiles_carry_their_own_pod(tmp_path: Path, pods: dict[str, dict[str, str]]) -> None:
    containerd, crio = pods["containerd"], pods["cri-o"]
    heavy = subprocess.Popen(
        _in_cgroup(
            containerd["procs"],
            sys.executable,
            str(REPO / "examples" / "cpu_heavy.py"),
            "serve",
            str(tmp_path / "heavy.port"),
            "--work-ms",
            "100",
        )
    )
    plain = subprocess.Popen(
        _in_cgroup(
            crio["procs"],
            sys.executable,
            str(REPO / "tests" / "live" / "http_workload.py"),
            "serve",
            str(tmp_path / "plain.port"),
        )
    )
    agent: subprocess.Popen | None = None
    try:
        ports = [_wait_for_file(tmp_path / "heavy.port", heavy), _wait_for_file(tmp_path / "plain.port", plain)]
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, *ports], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert client.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            agent = _start_agent(
                tmp_path,
                receiver,
                "auto",
                *("--pid", str(heavy.pid), "--pid", str(plain.pid), "--pid", str(client.pid), "--profile"),
                env={"OTEL_EBPF_HOST_ROOT": str(tmp_path / "node")},
                timeout=180,  # two BPF programs to compile on a busy machine
            )
            client.communicate("go\n", timeout=60)
            assert client.returncode == 0
            _stop(agent)
            assert receiver.wait_for(lambda r: len(r.spans()) >= 4 * CALLS and bool(r.requests("profiles")), 10)
            spans, profiles = receiver.spans(), receiver.requests("profiles")
    finally:
        for process in (heavy, plain, agent):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()

    by_pid: dict[int, list[dict]] = {}
    for span in spans:
        by_pid.setdefault(span["resource"]["process.pid"], []).append(span)
    assert {pid: len(found) for pid, found in by_pid.items()} == {
        heavy.pid: CALLS,
        plain.pid: CALLS,
        client.pid: 2 * CALLS,
    }
    heavy_resource = by_pid[heavy.pid][0]["resource"]
    assert {k: v for k, v in heavy_resource.items() if k.startswith(("container.", "k8s."))} == {
        "container.id": containerd["container.id"],
        "container.runtime.name": "containerd",
        "k8s.pod.uid": containerd["k8s.pod.uid"],
        "k8s.pod.name": "llm-7f9c-abcde",
        "k8s.namespace.name": "serving",
        "k8s.container.name": "model-server",
    }
    assert heavy_resource["service.name"] == "model-server"  # no OTEL_SERVICE_NAME: its container's name
    # no runtime state file for this one: what the cgroup path says, nothing guessed
    assert {k: v for k, v in by_pid[plain.pid][0]["resource"].items() if k.startswith(("container.", "k8s."))} == {
        "container.id": crio["container.id"],
        "container.runtime.name": "cri-o",
        "k8s.pod.uid": crio["k8s.pod.uid"],
    }
    assert not any(k.startswith(("container.", "k8s.")) for span in by_pid[client.pid] for k in span["resource"])

    # the CPU-bound server's profile is on the same resource as its spans
    resources = [_attributes(rp.resource.attributes) for request in profiles for rp in request.resource_profiles]
    heavy_profiles = [r for r in resources if r.get("process.pid") == heavy.pid]
    assert heavy_profiles
    assert all(
        r["container.id"] == containerd["container.id"] and r["k8s.pod.name"] == "llm-7f9c-abcde"
        for r in heavy_profiles
    )
