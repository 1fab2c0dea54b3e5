"""A node for live tests that need two: a PID namespace of its own, inside a network namespace, so
that an agent started in it (sidecar mode) sees that node's processes and no other's."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import REPO


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


class NodeProcess(subprocess.Popen):
    """A command started in a node by ``nsenter``, which forks it into the node's PID namespace and
    waits for it but forwards no signal: signals go to the command itself, so an agent stopped by
    SIGINT makes its final flush (and nsenter then exits with its status)."""

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            for child in _children(self.pid):
                os.kill(child, sig)


def pid_in_node(process: subprocess.Popen) -> int:
    """The pid a node numbers the command of ``process`` (a ``NodeProcess``) with: what its agent
    exports as ``process.pid``."""
    (child,) = _children(process.pid)
    for line in Path(f"/proc/{child}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid in /proc/{child}/status")


class Node:
    """Starts commands in a node, given its PID namespace's init (host pid)."""

    def __init__(self, init: int) -> None:
        # --wd: entering the mount namespace sets the working directory to its root, and the peers
        # run as `python -m tests.live...` from the repository
        self._enter = ["nsenter", f"--target={init}", "--pid", "--mount", "--net", f"--wd={REPO}", "--"]

    def popen(self, args: Sequence[str], **kwargs: Any) -> NodeProcess:
        """``subprocess.Popen`` of ``args`` inside the node."""
        return NodeProcess([*self._enter, *args], **kwargs)


@contextmanager
def node(netns: str | None = None) -> Iterator[Node]:
    """A node in network namespace ``netns`` (the root one when None). Every process in it dies when
    the context ends, however it ends: the PID namespace's init is killed with its holder."""
    # not `ip netns exec`: it mounts a new /sys, hiding the tracing, BPF and cgroup file systems under it
    enter_net = ["nsenter", f"--net=/var/run/netns/{netns}"] if netns else []
    holder = subprocess.Popen(
        [*enter_net, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "infinity"]
    )
    try:
        deadline = time.monotonic() + 10
        while not (init := _children(holder.pid)):
            assert holder.poll() is None and time.monotonic() < deadline, "the node's PID namespace did not start"
            time.sleep(0.01)
        yield Node(init[0])
    finally:
        holder.kill()
        holder.wait()
