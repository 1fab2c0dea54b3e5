"""Paths of cgroup v2 ids: the id the kernel gives BPF (``bpf_skb_cgroup_id``,
``bpf_get_current_cgroup_id``) is the inode number of the cgroup's directory under the cgroup v2
mount, so a path is found by walking that tree for the inode.

A walk happens only for an id not seen before, stops where the id is found, and remembers every
directory it passed (least recently used forgotten past ``max_known``), so a node's cgroups are
walked about once. An id no longer in the tree (the cgroup was removed) has no path: ``""``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

MAX_KNOWN = 4096  # ids remembered
MAX_WALK = 100_000  # directories one walk looks at, at most (a Kubernetes node has a few thousand)


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> Path:
    """Where the cgroup v2 hierarchy is mounted; ``ValueError`` when it is not."""
    for line in Path(mounts).read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    raise ValueError("no cgroup v2 hierarchy is mounted")


class CgroupPaths:
    def __init__(self, mount: Path, max_known: int = MAX_KNOWN, max_walk: int = MAX_WALK) -> None:
        """``mount``: where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on a v2 host,
        ``/sys/fs/cgroup/unified`` on a hybrid one)."""
        self._mount = str(mount)
        self._max_known = max_known
        self._max_walk = max_walk
        self._known: OrderedDict[int, str] = OrderedDict()

    def path(self, cgroup_id: int) -> str:
        """The cgroup's path as ``/proc/<pid>/cgroup`` writes it (``/`` for the root,
        ``/system.slice/ssh.service``), or ``""`` when no cgroup has that id now."""
        found = self._known.get(cgroup_id)
        if found is None:
            found = self._walk(cgroup_id)
            self._remember(cgroup_id, found)
        self._known.move_to_end(cgroup_id)
        return found

    def _remember(self, cgroup_id: int, path: str) -> None:
        self._known[cgroup_id] = path
        self._known.move_to_end(cgroup_id)
        if len(self._known) > self._max_known:
            self._known.popitem(last=False)

    def _walk(self, cgroup_id: int) -> str:
        pending = [self._mount]
        seen = 0
        while pending and seen < self._max_walk:
            directory = pending.pop()
            seen += 1
            try:
                inode = os.stat(directory).st_ino
                entries = list(os.scandir(directory))
            except OSError:  # removed while we walked
                continue
            relative = os.path.relpath(directory, self._mount)
            path = "/" if relative == "." else "/" + relative
            self._remember(inode, path)
            if inode == cgroup_id:
                return path
            pending.extend(entry.path for entry in entries if entry.is_dir(follow_symlinks=False))
        return ""
