"""Live BPF: an agent killed with SIGKILL leaves nothing behind, and the next one starts cleanly.

Everything the agent attaches (tracepoints, uprobes, perf events) is held by its file descriptors,
so the kernel takes it all back when the process dies, however it dies: no BPF program of the
killed agent may stay loaded, no uprobe event may stay registered, and an agent started right
after it attaches and traces as usual (issue 16, item 8).
"""

from __future__ import annotations

import ctypes
import errno
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.live.file_agent import start_file_agent, stop_file_agent
from tests.otlp_receiver import load_file_spans

pytestmark = pytest.mark.bpf

SYS_BPF = 321  # x86-64
BPF_PROG_GET_NEXT_ID = 11
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")
PEERS = [sys.executable, "-m", "tests.live.keepalive_peers"]
CALLS = 3


class _NextId(ctypes.Structure):
    """The part of ``union bpf_attr`` that BPF_PROG_GET_NEXT_ID reads and writes."""

    _fields_ = [("start_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


def loaded_programs() -> set[int]:
    """The ids of every BPF program loaded on the machine (the kernel's own enumeration)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ids, attr = set(), _NextId()
    while libc.syscall(SYS_BPF, BPF_PROG_GET_NEXT_ID, ctypes.byref(attr), ctypes.sizeof(attr)) == 0:
        ids.add(attr.next_id)
        attr.start_id = attr.next_id
    assert ctypes.get_errno() == errno.ENOENT, errno.errorcode.get(ctypes.get_errno())
    return ids


def _uprobe_events() -> list[str]:
    return UPROBE_EVENTS.read_text().splitlines() if UPROBE_EVENTS.exists() else []


def test_a_killed_agent_leaves_no_program_or_probe_and_the_next_one_traces(tmp_path: Path) -> None:
    server = subprocess.Popen([*PEERS, "serve", "127.0.0.1"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        port = server.stdout.readline().split()[1]
        before, events_before = loaded_programs(), _uprobe_events()
        for run in ("first", "second"):
            (tmp_path / run).mkdir()
        agent = start_file_agent(tmp_path / "first", server.pid, "")
        theirs = loaded_programs() - before
        assert len(theirs) >= 10, "the agent loaded no programs: the test would prove nothing"
        agent.kill()
        agent.wait()
        deadline = time.monotonic() + 20  # freed once the last reference goes (an RCU grace period)
        while theirs & loaded_programs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not theirs & loaded_programs(), "programs of the killed agent are still loaded"
        assert _uprobe_events() == events_before

        agent = start_file_agent(tmp_path / "second", server.pid, "")
        subprocess.run([*PEERS, "client", "127.0.0.1", port, "/after-kill", str(CALLS)], cwd=REPO, check=True)
        time.sleep(1)  # the next poll
        stop_file_agent(agent)
        agent = None
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        server.kill()
        server.wait()
    spans = load_file_spans(tmp_path / "second" / "out")
    assert [(s["kind"], s["attributes"]["url.path"]) for s in spans] == [("SERVER", "/after-kill")] * CALLS
