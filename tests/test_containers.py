"""Container and pod identity from cgroup paths and container runtimes' state files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_ebpf.containers import ContainerResolver, identity_from_cgroup, runtime_names
from otel_ebpf.pipeline.events import ProcessInfo
from otel_ebpf.pipeline.telemetry import process_resource_attributes
from otel_ebpf.recording import decode_event, encode_event

CID = "3f4e1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
UID = "6b1e4a9c-2d3f-4e5a-8b7c-9d0e1f2a3b4c"
UNDERSCORED = UID.replace("-", "_")

# (cgroup file text, container id, runtime from the path, pod uid)
LAYOUTS = [
    # kubelet systemd driver, cgroup v2: containerd / CRI-O / Docker
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CID,
        "containerd",
        UID,
    ),
    (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice/crio-{CID}.scope\n",
        CID,
        "cri-o",
        UID,
    ),
    # Guaranteed QoS: no QoS slice
    (f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/docker-{CID}.scope\n", CID, "docker", UID),
    # kubelet cgroupfs driver, cgroup v1 (hybrid host): containerd's bare id, CRI-O's prefix
    (
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n0::/\n",
        CID,
        None,
        UID,
    ),
    (f"0::/kubepods/pod{UID}/crio-{CID}\n", CID, "cri-o", UID),
    # outside Kubernetes
    (f"0::/system.slice/docker-{CID}.scope\n", CID, "docker", None),
    (f"4:memory:/docker/{CID}\n0::/\n", CID, None, None),
    (f"0::/machine.slice/libpod-{CID}.scope/container\n", CID, "podman", None),
    # seen from inside a cgroup namespace: the head is cut, the container's components stay
    (f"0::/../../kubepods-besteffort-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n", CID, "containerd", UID),
]


@pytest.mark.parametrize(("text", "container_id", "runtime", "pod_uid"), LAYOUTS)
def test_each_runtime_and_driver_layout(text: str, container_id: str, runtime: str | None, pod_uid: str | None) -> None:
    identity = identity_from_cgroup(text)
    assert identity is not None
    assert (identity.container_id, identity.runtime, identity.pod_uid) == (container_id, runtime, pod_uid)


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-0.slice/session-3.scope\n",
        "0::/\n",
        "0::/system.slice/containerd.service\n",
        # CRI-O's monitor process sits beside the container, in a scope named after it: not the container
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/crio-conmon-{CID}.scope\n",
        # a pod's cgroup itself (the kubelet's), without a container below it
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice\n",
        f"0::/kubepods/burstable/pod{UID}/{CID[:63]}\n",  # not a 64-hex id
        "",
    ],
)
def test_no_container_named(text: str) -> None:
    assert identity_from_cgroup(text) is None


def test_v2_line_is_preferred_over_v1() -> None:
    other = "a" * 64
    text = f"4:memory:/docker/{other}\n0::/system.slice/docker-{CID}.scope\n"
    identity = identity_from_cgroup(text)
    assert identity is not None and identity.container_id == CID


def _write(root: Path, relative: str, document: object) -> None:
    path = root / relative
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(document))


def test_containerd_bundle_names(tmp_path: Path) -> None:
    _write(
        tmp_path,
        f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}/config.json",
        {
            "ociVersion": "1.1.0",
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.container-name": "vllm",
                "io.kubernetes.cri.sandbox-name": "llama-7b-5d8f9c-x2x7q",
                "io.kubernetes.cri.sandbox-namespace": "serving",
                "io.kubernetes.cri.sandbox-uid": UID,
            },
        },
    )
    assert runtime_names(CID, str(tmp_path)) == (
        "containerd",
        {
            "k8s.pod.name": "llama-7b-5d8f9c-x2x7q",
            "k8s.namespace.name": "serving",
            "k8s.container.name": "vllm",
            "k8s.pod.uid": UID,
        },
    )


def test_crio_and_docker_names(tmp_path: Path) -> None:
    crio = "c" * 64
    _write(
        tmp_path,
        f"run/containers/storage/overlay-containers/{crio}/userdata/config.json",
        {
            "annotations": {
                "io.kubernetes.pod.name": "trainer-0",
                "io.kubernetes.pod.namespace": "ml",
                "io.kubernetes.container.name": "torch",
                "io.kubernetes.cri-o.Spoofed": "false",
            },
        },
    )
    assert runtime_names(crio, str(tmp_path)) == (
        "cri-o",
        {
            "k8s.pod.name": "trainer-0",
            "k8s.namespace.name": "ml",
            "k8s.container.name": "torch",
        },
    )
    docker = "d" * 64
    _write(
        tmp_path,
        f"var/lib/docker/containers/{docker}/config.v2.json",
        {"Name": "/redis-cache", "Config": {"Labels": {"maintainer": "x"}}},
    )
    assert runtime_names(docker, str(tmp_path)) == ("docker", {"container.name": "redis-cache"})


def test_unreadable_or_hostile_state_files_give_no_names(tmp_path: Path) -> None:
    (tmp_path / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}").mkdir(parents=True)
    (tmp_path / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}/config.json").write_text("{not json")
    assert runtime_names(CID, str(tmp_path)) == (None, {})
    other = "e" * 64
    _write(
        tmp_path,
        f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{other}/config.json",
        {"annotations": {"io.kubernetes.cri.sandbox-name": 7, "io.kubernetes.cri.container-name": ["x"]}},
    )
    assert runtime_names(other, str(tmp_path)) == ("containerd", {})
    assert runtime_names("f" * 64, str(tmp_path / "missing")) == (None, {})


def test_resolver_reads_each_container_once_and_is_bounded(tmp_path: Path) -> None:
    path = f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}/config.json"
    _write(tmp_path, path, {"annotations": {"io.kubernetes.cri.sandbox-name": "first"}})
    resolver = ContainerResolver(str(tmp_path), max_containers=2)
    text = LAYOUTS[0][0]
    assert resolver.attributes(text) == {
        "container.id": CID,
        "container.runtime.name": "containerd",
        "k8s.pod.uid": UID,
        "k8s.pod.name": "first",
    }
    (tmp_path / path).write_text(json.dumps({"annotations": {"io.kubernetes.cri.sandbox-name": "second"}}))
    assert resolver.attributes(text)["k8s.pod.name"] == "first"  # remembered
    for n in range(2):  # two other containers push the first one out
        resolver.attributes(f"0::/docker/{str(n) * 64}\n")
    assert resolver.attributes(text)["k8s.pod.name"] == "second"
    assert resolver.attributes("0::/user.slice\n") == {}


def test_process_resource_carries_the_container_and_its_own_variables_win() -> None:
    container = {"container.id": CID, "k8s.pod.uid": UID, "k8s.pod.name": "from-runtime"}
    info = ProcessInfo(
        1, 42, "/usr/bin/python3", "python3 serve.py", {"OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=from-env"}, container
    )
    attributes = process_resource_attributes(info, "node-1")
    assert attributes["container.id"] == CID and attributes["k8s.pod.uid"] == UID
    assert attributes["k8s.pod.name"] == "from-env"
    assert "container.id" not in process_resource_attributes(ProcessInfo(1, 43, "", "sh", {}), "node-1")


@pytest.mark.parametrize(
    ("environment", "container", "service"),
    [
        ({}, {}, "python3.11"),
        ({}, {"container.id": CID, "container.name": "nostalgic_turing"}, "python3.11"),  # docker run
        ({}, {"container.id": CID, "k8s.pod.name": "api-7f9c-abcde", "k8s.container.name": "vllm"}, "vllm"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=chat"}, {"k8s.container.name": "vllm"}, "chat"),
        ({"OTEL_SERVICE_NAME": "chat-api"}, {"k8s.container.name": "vllm"}, "chat-api"),
    ],
)
def test_service_name_is_the_process_own_then_its_pod_container_then_its_executable(
    environment: dict[str, str], container: dict[str, str], service: str
) -> None:
    info = ProcessInfo(1, 42, "/usr/bin/python3.11", "python3.11 -m vllm.entrypoints", environment, container)
    assert process_resource_attributes(info, "node-1")["service.name"] == service


def test_recordings_keep_the_container_and_older_ones_still_load() -> None:
    info = ProcessInfo(1, 42, "/bin/x", "x", {}, {"container.id": CID})
    assert decode_event(encode_event(info)) == info
    older = json.loads(encode_event(info))
    del older["container"]
    assert decode_event(json.dumps(older)).container == {}
