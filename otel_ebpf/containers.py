"""Which container and Kubernetes pod a process runs in, from what the node itself states.

Two sources, never a guess:

* the process's cgroup path (``/proc/<pid>/cgroup``), which the container runtime and the
  kubelet name after the container id and the pod uid. The layouts differ by cgroup driver:

  ============================  ======================================================================
  kubelet cgroupfs driver       ``/kubepods/burstable/pod<uid>/<id>`` (containerd, Docker),
                                ``/kubepods/pod<uid>/crio-<id>`` (CRI-O)
  kubelet systemd driver        ``/kubepods.slice/kubepods-besteffort.slice/``
                                ``kubepods-besteffort-pod<uid with _>.slice/cri-containerd-<id>.scope``
                                (``crio-<id>.scope``, ``docker-<id>.scope``)
  outside Kubernetes            ``/docker/<id>``, ``/system.slice/docker-<id>.scope``,
                                ``/machine.slice/libpod-<id>.scope`` (Podman)
  ============================  ======================================================================

  The same path appears on the cgroup v2 line (``0::``) and, on hybrid hosts, on v1 lines; a
  cgroup namespace only shortens its head, never the container's own components.

* the container runtime's state files on the node, which carry the pod's and container's names
  as the kubelet passed them (annotations in containerd's and CRI-O's OCI ``config.json``, labels
  in Docker's ``config.v2.json``). They are read once per container, under ``root`` (``/`` on the
  node; the host's root mounted into the agent's container, e.g. ``/host``, in a DaemonSet).

A process outside any container gets nothing. Attribute names follow the OpenTelemetry resource
conventions (``container.*``, ``k8s.*``).
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

# <id> is the runtime's 64-hex container id, optionally with the runtime's prefix and systemd's suffix
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?$")
# the pod's uid: with dashes under cgroupfs, with underscores in systemd slice names
_POD = re.compile(
    r"(?:^|[-/])pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
_RUNTIME_OF_PREFIX = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman"}
# containerd keeps each Kubernetes container's OCI bundle under its "k8s.io" namespace
_CONTAINERD_BUNDLE = "run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json"
_CRIO_CONFIG = "run/containers/storage/overlay-containers/{id}/userdata/config.json"
_DOCKER_CONFIG = "var/lib/docker/containers/{id}/config.v2.json"
# The kubelet's names, as each runtime records them
_CONTAINERD_KEYS = {
    "k8s.pod.name": "io.kubernetes.cri.sandbox-name",
    "k8s.namespace.name": "io.kubernetes.cri.sandbox-namespace",
    "k8s.container.name": "io.kubernetes.cri.container-name",
    "k8s.pod.uid": "io.kubernetes.cri.sandbox-uid",
}
_KUBELET_LABELS = {  # CRI-O annotations and Docker labels
    "k8s.pod.name": "io.kubernetes.pod.name",
    "k8s.namespace.name": "io.kubernetes.pod.namespace",
    "k8s.container.name": "io.kubernetes.container.name",
    "k8s.pod.uid": "io.kubernetes.pod.uid",
}
MAX_STATE_BYTES = 4 << 20  # a runtime state file larger than this is not read (an OCI spec is ~20 KiB)


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a cgroup path says: the container id, the runtime when the path names it, the pod."""

    container_id: str
    runtime: str | None = None
    pod_uid: str | None = None


def identity_from_cgroup(text: str) -> CgroupIdentity | None:
    """The container of a process from its ``/proc/<pid>/cgroup`` text; None outside containers.

    The cgroup v2 line comes first (it is the one the runtime manages on a v2 host); on hybrid
    hosts a v1 line can name the container when the v2 path does not.
    """
    lines = text.splitlines()
    for line in sorted(lines, key=lambda line: not line.startswith("0::")):
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        found = _identity_from_path(path)
        if found is not None:
            return found
    return None


def _identity_from_path(path: str) -> CgroupIdentity | None:
    components = [part for part in path.split("/") if part]
    # the innermost container component: a process in a nested cgroup (…/<id>/init) still belongs to it
    for index in range(len(components) - 1, -1, -1):
        match = _CONTAINER.match(components[index])
        if match is None:
            continue
        prefix, container_id = match.groups()
        pod_uid = None
        for part in components[:index]:
            pod = _POD.search(part)
            if pod is not None:
                pod_uid = pod.group(1).replace("_", "-")
        return CgroupIdentity(container_id, _RUNTIME_OF_PREFIX.get(prefix or ""), pod_uid)
    return None


def _read_json(path: str) -> object:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_STATE_BYTES:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _names(found: object, keys: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(found, dict):
        return {}
    return {attribute: value for attribute, key in keys.items() if isinstance(value := found.get(key), str) and value}


def runtime_names(container_id: str, root: str = "/") -> tuple[str | None, dict[str, str]]:
    """(runtime, names) the container runtime's state files under ``root`` give for a container:
    ``k8s.pod.name``, ``k8s.namespace.name``, ``k8s.container.name``, ``k8s.pod.uid`` as the
    kubelet passed them, ``container.name`` for a plain Docker container. ``(None, {})`` when no
    runtime on the node knows the id (or ``root`` is not the node's)."""
    spec = _read_json(os.path.join(root, _CONTAINERD_BUNDLE.format(id=container_id)))
    if isinstance(spec, dict):
        return "containerd", _names(spec.get("annotations"), _CONTAINERD_KEYS)
    spec = _read_json(os.path.join(root, _CRIO_CONFIG.format(id=container_id)))
    if isinstance(spec, dict):
        return "cri-o", _names(spec.get("annotations"), _KUBELET_LABELS)
    config = _read_json(os.path.join(root, _DOCKER_CONFIG.format(id=container_id)))
    if isinstance(config, dict):
        inner = config.get("Config")
        names = _names(inner.get("Labels") if isinstance(inner, dict) else None, _KUBELET_LABELS)
        name = config.get("Name")
        if not names and isinstance(name, str) and name.strip("/"):
            names["container.name"] = name.strip("/")
        return "docker", names
    return None, {}


class ContainerResolver:
    """Resource attributes of a process's container, with the runtime's files read once per
    container (at most ``max_containers`` remembered, least recently used forgotten)."""

    def __init__(self, root: str = "/", max_containers: int = 1024) -> None:
        self._root = root
        self._max = max_containers
        self._known: OrderedDict[str, dict[str, str]] = OrderedDict()

    def attributes(self, cgroup_text: str) -> dict[str, str]:
        identity = identity_from_cgroup(cgroup_text)
        if identity is None:
            return {}
        known = self._known.get(identity.container_id)
        if known is None:
            known = self._resolve(identity)
            self._known[identity.container_id] = known
            if len(self._known) > self._max:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(identity.container_id)
        return dict(known)

    def _resolve(self, identity: CgroupIdentity) -> dict[str, str]:
        runtime, names = runtime_names(identity.container_id, self._root)
        attributes = {"container.id": identity.container_id}
        if runtime or identity.runtime:
            attributes["container.runtime.name"] = str(identity.runtime or runtime)
        if identity.pod_uid is not None:
            names.pop("k8s.pod.uid", None)  # the cgroup path is the kubelet's own word for it
            attributes["k8s.pod.uid"] = identity.pod_uid
        attributes.update(names)
        return attributes
