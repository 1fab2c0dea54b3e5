"""Live BPF: tracing chosen processes, the SSL probes trap in those processes only.

A uprobe works by writing a breakpoint (``int3``, 0xCC) over the first instruction of the probed
function in the memory of the processes it is attached for; a process without it cannot trap, so
it pays nothing. These tests read that byte at each SSL entry point through ``/proc/<pid>/mem``:
the agent traces one client by ``--pid``, while an untraced client of the same untraced server, all
three on the same libssl file, do HTTPS the whole time.

That file is a copy of the system libssl in a mount namespace of its own (as in a container): an
agent tracing every process elsewhere on the node (another test run) hooks the files it can open
by the names in ``/proc/<pid>/maps``, which this one it cannot, so its breakpoints do not blur the
reading. The agent under test reaches the copy through ``/proc/<pid>/root``, as it does a
container's files.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ebpf.probes.tls import ENTRY_PROGRAMS, SYMBOL_PATTERN, system_libssl
from tests.live.test_http_live import _wait_for_file
from tests.live.test_tls_live import WORKLOAD, _certificates, _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
CALLS = 20
INT3 = 0xCC
# A target that forks a child doing HTTPS: the child's first request may come before the agent
# has learnt of the child; the others come after a pause.
FORKING_CLIENT = r"""
import http.client, os, ssl, sys, time
port, ca, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
child = os.fork()
if child:
    print(child, flush=True)
    os.waitpid(child, 0)
    sys.exit(0)
conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=ca))
def get(path):
    conn.request("GET", path)
    conn.getresponse().read()
get("/child/first")
time.sleep(1)
for i in range(count):
    get(f"/child/{i}")
os._exit(0)
"""


def _libssl() -> str:
    (path,) = system_libssl()
    return path


def _file_offset(path: str, vaddr: int) -> int:
    """Where the code at ``vaddr`` lies in the ELF file (its PT_LOAD program headers)."""
    with open(path, "rb") as f:
        header = f.read(64)
        (phoff,) = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
        if p_type == 1 and p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    raise AssertionError(f"0x{vaddr:x} is in no loaded segment of {path}")


def _entry_points(path: str) -> dict[str, int]:
    """SSL entry point -> its file offset, for each that ``path`` defines."""
    from bcc import BPF

    return {
        name.decode(): _file_offset(path, addr)
        for name, addr in BPF.get_user_functions_and_addresses(path, SYMBOL_PATTERN)
    }


def _planted(pid: int, path: str, entry_points: dict[str, int]) -> set[str]:
    """The entry points of ``path`` (as ``pid`` names it) where process ``pid`` has a breakpoint
    (uprobe) in memory."""
    mappings = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() == path:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                mappings.append((start, end, int(parts[2], 16)))
    assert mappings, f"process {pid} does not map {path}"
    planted = set()
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for symbol, offset in entry_points.items():
            ((start, _, map_offset),) = [m for m in mappings if m[2] <= offset < m[2] + m[1] - m[0]]
            mem.seek(start + offset - map_offset)
            if mem.read(1)[0] == INT3:
                planted.add(symbol)
    return planted


def _perf_event_fds(pid: int) -> int:
    """How many perf events (one per uprobe, tracepoint, ...) process ``pid`` holds open."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
        except OSError:
            pass
    return count


def _wait_until(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _idle_ssl_process(wrap: list[str] | None = None) -> subprocess.Popen:
    """A process that maps libssl and waits for its stdin to close."""
    proc = subprocess.Popen(
        [*(wrap or []), sys.executable, "-c", "import ssl, sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


class PrivateLibssl:
    """A copy of the system libssl on a tmpfs mounted in a mount namespace of its own; ``wrap``
    runs a command in that namespace, loading the copy. The command keeps its pid."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.path = str(directory / Path(_libssl()).name)
        self._holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"mount -t tmpfs otel-ebpf-test {directory} && cp {_libssl()} {directory}/ && echo ready && exec sleep 3600",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._holder.stdout.readline() == "ready\n"
        assert not os.path.exists(self.path)  # not from here
        self.wrap = ["nsenter", f"--target={self._holder.pid}", "--mount", "--", "env", f"LD_LIBRARY_PATH={directory}"]

    def close(self) -> None:
        self._holder.kill()
        self._holder.wait()


@pytest.fixture
def private_libssl(tmp_path: Path) -> Iterator[PrivateLibssl]:
    copy = PrivateLibssl(tmp_path / "private")
    yield copy
    copy.close()


def test_only_the_traced_processes_trap(tmp_path: Path, private_libssl: PrivateLibssl) -> None:
    libssl, wrap = private_libssl.path, private_libssl.wrap
    entry_points = _entry_points(_libssl())  # the copy's are the same
    assert set(entry_points) == set(ENTRY_PROGRAMS)
    assert all(open(_libssl(), "rb").read()[offset] != INT3 for offset in entry_points.values())
    ca, cert, key = _certificates(tmp_path)
    server = subprocess.Popen([*wrap, *WORKLOAD, "https-serve", str(tmp_path / "port"), cert, key])  # untraced
    clients: list[subprocess.Popen] = []
    try:
        port = int(_wait_for_file(tmp_path / "port", server))
        for _ in ("traced", "untraced"):
            client = subprocess.Popen(
                [*wrap, *WORKLOAD, "https-client", str(port), ca, str(CALLS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert json.loads(client.stdout.readline())["status"] == 200  # a TLS connection, before the agent
            assert client.stdout.readline() == "ready\n"
            clients.append(client)
        traced, untraced = clients
        leaver = _idle_ssl_process(wrap)  # traced too, and exits while the agent runs
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, "tracepoints", f"--pid={traced.pid}", f"--pid={leaver.pid}")
            try:
                assert _planted(traced.pid, libssl, entry_points) == set(ENTRY_PROGRAMS)
                assert _planted(leaver.pid, libssl, entry_points) == set(ENTRY_PROGRAMS)
                assert _planted(untraced.pid, libssl, entry_points) == set()
                assert _planted(server.pid, libssl, entry_points) == set()

                # A target that exits takes its probes with it: an entry and a return probe on
                # each entry point of two files, the libssl it maps and the system one, which
                # every target gets in case it loads it later.
                before = _perf_event_fds(agent.pid)
                leaver.stdin.close()
                leaver.wait(timeout=10)
                _wait_until(
                    lambda: _perf_event_fds(agent.pid) == before - 2 * 2 * len(entry_points),
                    30,
                    f"the agent kept the exited target's probes ({_perf_event_fds(agent.pid)} of {before})",
                )

                # Both clients do HTTPS with the untraced server, at the same time.
                for client in clients:
                    client.stdin.write("go\n")
                    client.stdin.flush()
                outputs = [client.communicate(timeout=60)[0] for client in clients]
                assert [client.returncode for client in clients] == [0, 0]
                assert [len(out.splitlines()) for out in outputs] == [CALLS, CALLS]
                # the untraced ones got no breakpoint while they made SSL calls either
                assert _planted(server.pid, libssl, entry_points) == set()
            finally:
                stderr = _stop(agent)
            receiver.wait_for(lambda r: len(r.spans()) >= CALLS, timeout=10)
            spans = receiver.spans()
    finally:
        for proc in (server, *clients):
            proc.kill()
            proc.wait()

    assert f"TLS: hooked {libssl} " in stderr and f"for process {traced.pid}" in stderr
    # the traced client's calls, all of them and nothing else: the server and the other client are not traced
    assert {s["resource"]["process.pid"] for s in spans} == {traced.pid}
    paths = sorted(s["attributes"]["url.full"].split("/", 3)[3] for s in spans if s["kind"] == "CLIENT")
    assert paths == sorted(json.loads(line)["path"].lstrip("/") for line in outputs[0].splitlines())


def test_tracing_every_process_hooks_the_library_in_all(tmp_path: Path) -> None:
    """The other mode, and the reading above is no accident: without --pid/--exe every process
    mapping the system libssl carries the breakpoints. (Whether they go when the agent stops is
    not asserted: an agent of another test run on the node may have hooked the same file.)"""
    libssl = _libssl()
    entry_points = _entry_points(libssl)
    bystander = _idle_ssl_process()
    try:
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, "tracepoints")
            try:
                assert _planted(bystander.pid, libssl, entry_points) == set(ENTRY_PROGRAMS)
            finally:
                _stop(agent)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_child_of_a_target_is_hooked_when_it_shows_up(tmp_path: Path, private_libssl: PrivateLibssl) -> None:
    """A child forked by a target is a target (the kernel's table inherits it); the agent hooks
    libssl for it when it sees the child's first connection."""
    libssl, wrap = private_libssl.path, private_libssl.wrap
    entry_points = _entry_points(_libssl())
    ca, cert, key = _certificates(tmp_path)
    server = subprocess.Popen([*wrap, *WORKLOAD, "https-serve", str(tmp_path / "port"), cert, key])  # untraced
    script = tmp_path / "forking_client.py"
    script.write_text(FORKING_CLIENT)
    try:
        port = int(_wait_for_file(tmp_path / "port", server))
        parent = subprocess.Popen(
            [*wrap, sys.executable, str(script), str(port), ca, str(CALLS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert parent.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, "tracepoints", f"--pid={parent.pid}")
            try:
                parent.stdin.write("go\n")
                parent.stdin.flush()
                child = int(parent.stdout.readline())
                _wait_until(
                    lambda: _planted(child, libssl, entry_points) == set(ENTRY_PROGRAMS),
                    5,
                    "the child got no probes of its own",
                )
                parent.communicate(timeout=60)
                assert parent.returncode == 0
                assert _planted(server.pid, libssl, entry_points) == set()
            finally:
                _stop(agent)
            receiver.wait_for(lambda r: len(r.spans()) >= CALLS, timeout=10)
            spans = receiver.spans()
    finally:
        server.kill()
        server.wait()

    paths = {
        "/" + s["attributes"]["url.full"].split("/", 3)[3]
        for s in spans
        if s["kind"] == "CLIENT" and s["resource"]["process.pid"] == child
    }
    assert paths - {"/child/first"} == {f"/child/{i}" for i in range(CALLS)}
