"""Finding TLS implementations in mapped files and attaching the SSL probes, once per file when
every process is traced, once per (file, target process) when some are chosen (no BPF needed)."""

from __future__ import annotations

import logging
import os
import shutil
import ssl  # noqa: F401 -- maps libssl into this process, as a Python TLS server would
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ebpf.probes import tls
from otel_ebpf.probes.tls import ENTRY_PROGRAMS, RETURN_PROGRAM, TLSAttacher, mapped_files, seen_by, system_libssl


def test_this_process_maps_the_system_libssl() -> None:
    (libssl,) = system_libssl()
    assert Path(libssl).name.startswith("libssl.so")
    assert libssl in {os.path.realpath(f) for f in mapped_files(os.getpid())}
    assert mapped_files(2**22) == set()  # no such process
    assert os.path.samefile(seen_by(os.getpid(), libssl), libssl)


class Recorder:
    """Stands in for BCC: symbol tables by file, the attach calls made and the probes still attached."""

    def __init__(self, symbols: dict[str, set[str]], failing: str | None = None, fail_after: int = 0) -> None:
        self.symbols = {os.stat(path).st_ino: found for path, found in symbols.items()}  # by file, not name
        self.failing = failing
        self.fail_after = fail_after  # probes on the failing file that attach before one fails
        self.attached: list[tuple[str, str, str, bool, int | None]] = []
        self.live: dict[int, tuple[str, str, str, bool, int | None]] = {}  # handle -> probe
        self.lookups: list[str] = []

    def lookup(self, path: str) -> set[str]:
        self.lookups.append(path)
        return self.symbols.get(os.stat(path).st_ino, set())

    def attach(self, path: str, symbol: str, program: str, is_return: bool, pid: int | None) -> int:
        if path == self.failing and sum(p[0] == path for p in self.live.values()) >= self.fail_after:
            raise Exception(f"could not attach to {symbol}")  # what BCC raises
        probe = (path, symbol, program, is_return, pid)
        self.attached.append(probe)
        handle = len(self.attached)
        self.live[handle] = probe
        return handle

    def detach(self, handle: object) -> None:
        del self.live[handle]  # KeyError: detached twice, or never attached

    def pairs(self) -> set[tuple[str, int | None]]:
        """(file, pid) pairs with probes attached now."""
        return {(path, pid) for path, _, _, _, pid in self.live.values()}


def test_each_file_is_hooked_once_with_the_symbols_it_has(tmp_path: Path) -> None:
    libssl, copy, cygrpc, libc, broken = (
        tmp_path / name
        for name in (
            "libssl.so.3",
            "libssl-copy.so",
            "cygrpc.cpython-311-x86_64-linux-gnu.so",
            "libc.so.6",
            "libssl-broken.so",
        )
    )
    for path in (libssl, cygrpc, libc, broken):
        path.write_bytes(b"\x7fELF")
    shutil.copy(libssl, copy)
    os.link(libssl, tmp_path / "libssl.so")  # the same file under another name
    recorder = Recorder(
        {
            str(libssl): {"SSL_read", "SSL_write", "SSL_read_ex", "SSL_write_ex", "SSL_do_handshake"},
            str(copy): {"SSL_read", "SSL_write"},
            str(broken): {"SSL_read", "SSL_write"},
        },
        failing=str(broken),
        fail_after=1,
    )
    attacher = TLSAttacher(recorder.lookup, recorder.attach, recorder.detach)
    assert not attacher.per_process
    attacher.scan([], [str(libssl), str(tmp_path / "libssl.so"), str(copy), str(cygrpc), str(libc), str(broken)])
    attacher.watch(os.getpid())  # every process traced: nothing to do per process
    attacher.scan([], [str(libssl), str(copy)])  # rescans attach nothing twice

    hooked = attacher.libraries.hooked
    assert hooked == {
        str(tmp_path / "libssl.so"): ("SSL_do_handshake", "SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex"),
        str(copy): ("SSL_read", "SSL_write"),
    }
    assert attacher.libraries.without_symbols == {str(cygrpc)}  # libc is no TLS library: not reported
    assert str(broken) in attacher.libraries.failed
    assert {path for path, _ in recorder.pairs()} == set(hooked)  # the broken file's first probe was taken back
    probes = list(recorder.live.values())
    assert all(pid is None for *_, pid in probes)  # for every process
    entries = [(p, s, prog) for p, s, prog, ret, _ in probes if not ret]
    returns = [(p, s, prog) for p, s, prog, ret, _ in probes if ret]
    assert sorted(entries) == sorted((p, s, ENTRY_PROGRAMS[s]) for p, symbols in hooked.items() for s in symbols)
    assert sorted(returns) == sorted((p, s, RETURN_PROGRAM) for p, symbols in hooked.items() for s in symbols)
    assert len(probes) == len(set(probes))
    assert attacher.attachments == {}


# ---- per process ---------------------------------------------------------------------------------


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """Three real processes (their /proc/<pid>/root is this file system)."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


class Node:
    """Which files each process maps, which processes the kernel traces, and the clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.maps: dict[int, set[str]] = {}
        self.traced: set[int] = set()
        self.now = 1000.0
        monkeypatch.setattr(tls, "mapped_files", lambda pid: set(self.maps.get(pid, ())))
        monkeypatch.setattr(tls.time, "monotonic", lambda: self.now)

    def is_target(self, pid: int) -> bool:
        return pid in self.traced

    def next_rescan(self) -> None:
        self.now += tls.RESCAN_S


@pytest.fixture
def libraries(tmp_path: Path) -> dict[str, Path]:
    files = {name: tmp_path / name for name in ("libssl.so.3", "libssl-wheel.so", "libcrypto.so.3", "cygrpc.so")}
    for i, path in enumerate(files.values()):
        path.write_bytes(b"\x7fELF" + bytes([i]))
    return files


def _recorder(libraries: dict[str, Path], **kwargs: object) -> Recorder:
    return Recorder(
        {
            str(libraries["libssl.so.3"]): {"SSL_read", "SSL_write", "SSL_read_ex", "SSL_write_ex"},
            str(libraries["libssl-wheel.so"]): {"SSL_read", "SSL_write"},
        },
        **kwargs,
    )


def test_targets_get_their_own_probes_and_untraced_processes_none(
    libraries: dict[str, Path], sleepers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(monkeypatch)
    system, wheel, crypto = (str(libraries[n]) for n in ("libssl.so.3", "libssl-wheel.so", "libcrypto.so.3"))
    first, second, bystander = sleepers
    node.maps = {first: {system, crypto}, second: {wheel, crypto}, bystander: {system}}
    node.traced = {first, second}
    recorder = _recorder(libraries)
    attacher = TLSAttacher(recorder.lookup, recorder.attach, recorder.detach, targets=node.is_target)
    assert attacher.per_process
    attacher.scan([first, second], [system])

    # the system libssl for every target, mapped or not; other TLS files for those that map them
    assert recorder.pairs() == {(system, first), (system, second), (wheel, second)}
    assert attacher.attachments == {first: {system}, second: {system, wheel}}
    assert all(pid is not None for *_, pid in recorder.attached)  # never for every process
    assert len([p for p in recorder.live.values() if p[:1] == (system,) and p[4] == first]) == 8  # 4 symbols x 2
    assert attacher.libraries.hooked == {
        system: ("SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex"),
        wheel: ("SSL_read", "SSL_write"),
    }
    assert attacher.libraries.refused == 0
    # each file's symbols are read once, through the process's own root
    assert sorted(recorder.lookups) == sorted([seen_by(first, system), seen_by(first, crypto), seen_by(second, wheel)])

    attached = len(recorder.attached)
    attacher.scan([first, second])  # a rescan attaches nothing twice
    node.next_rescan()
    attacher.scan([first, second])
    assert len(recorder.attached) == attached


def test_targets_that_come_later_and_targets_that_go(
    libraries: dict[str, Path], sleepers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(monkeypatch)
    system, wheel = str(libraries["libssl.so.3"]), str(libraries["libssl-wheel.so"])
    first, child, other = sleepers
    node.traced = {first}
    recorder = _recorder(libraries)
    attacher = TLSAttacher(recorder.lookup, recorder.attach, recorder.detach, targets=node.is_target)
    attacher.scan([first], [system])
    assert not attacher.scan_due()

    node.traced.add(child)  # forked by a target: the agent learns of it from its events
    attacher.watch(child)
    assert attacher.scan_due()  # at once, not at the next periodic rescan
    attacher.scan([first])
    assert recorder.pairs() == {(system, first), (system, child)}
    assert not attacher.scan_due()

    node.maps[first] = {wheel}  # loaded later: found by the periodic rescan
    attacher.scan([first])
    assert (wheel, first) not in recorder.pairs()
    node.next_rescan()
    assert attacher.scan_due()
    attacher.scan([first])
    assert recorder.pairs() == {(system, first), (wheel, first), (system, child)}

    node.traced.discard(first)  # exited: the kernel forgets it, the agent gets its exit event
    attacher.forget(first)
    assert recorder.pairs() == {(system, child)}
    attacher.forget(first)  # a second exit event, or one for a process never hooked: nothing to do
    attacher.forget(other)
    attacher.scan([first, child])  # pids the agent still believes in
    assert recorder.pairs() == {(system, child)}

    node.traced.discard(child)  # exited, and its exit event was lost: the periodic rescan notices
    attacher.scan([first, child])
    assert recorder.pairs() == {(system, child)}
    node.next_rescan()
    attacher.scan([first, child])
    assert recorder.pairs() == set()
    assert attacher.attachments == {}

    attacher.watch(other)  # watched, but not (or no longer) traced by the time of the scan: nothing
    attacher.scan([])
    assert recorder.pairs() == set()


def test_attachments_are_capped_counted_and_retried(
    libraries: dict[str, Path], sleepers: list[int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(monkeypatch)
    system, wheel = str(libraries["libssl.so.3"]), str(libraries["libssl-wheel.so"])
    first, second, third = sleepers
    node.maps = {first: {wheel}}
    node.traced = {first, second, third}
    recorder = _recorder(libraries)
    attacher = TLSAttacher(recorder.lookup, recorder.attach, recorder.detach, targets=node.is_target, max_attachments=3)
    with caplog.at_level(logging.DEBUG, logger="otel_ebpf.probes.tls"):
        attacher.scan([first, second, third], [system])
    assert recorder.pairs() == {(system, first), (wheel, first), (system, second)}
    assert attacher.libraries.refused == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"process {third}" in warnings[0].getMessage()

    node.next_rescan()
    attacher.scan([first, second, third])  # still full: tried again, not counted again
    assert attacher.libraries.refused == 1
    attacher.forget(first)
    node.next_rescan()
    attacher.scan([second, third])  # room again
    assert recorder.pairs() == {(system, second), (system, third)}
    assert attacher.libraries.refused == 1


def test_a_failed_attachment_leaves_nothing_and_is_not_retried(
    libraries: dict[str, Path], sleepers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(monkeypatch)
    system, wheel = str(libraries["libssl.so.3"]), str(libraries["libssl-wheel.so"])
    first, gone, _ = sleepers
    node.maps = {first: {wheel}, gone: {wheel}}
    node.traced = {first}
    recorder = _recorder(libraries, failing=wheel, fail_after=1)
    attacher = TLSAttacher(recorder.lookup, recorder.attach, recorder.detach, targets=node.is_target)
    attacher.scan([first], [system])
    assert recorder.pairs() == {(system, first)}  # the wheel's first probe was taken back
    assert "could not attach" in attacher.libraries.failed[wheel]
    attempts = len(recorder.attached)
    node.next_rescan()
    attacher.scan([first])
    assert len(recorder.attached) == attempts

    # A target that exits while its probes are being attached is no failure.
    attach = recorder.attach

    def exiting(path: str, symbol: str, program: str, is_return: bool, pid: int | None) -> int:
        if pid == gone and any(p[4] == gone for p in recorder.live.values()):
            node.traced.discard(gone)
            raise Exception("could not determine address of symbol")  # BCC, the process gone
        return attach(path, symbol, program, is_return, pid)

    attacher._attach = exiting  # noqa: SLF001
    node.traced.add(gone)
    attacher.watch(gone)
    attacher.scan([])
    assert list(attacher.libraries.failed) == [wheel]  # as before
    assert gone not in attacher.attachments
    assert all(pid != gone for *_, pid in recorder.live.values())


def test_per_process_probes_need_a_detach() -> None:
    with pytest.raises(ValueError, match="detach"):
        TLSAttacher(lambda path: set(), lambda *args: None, targets=lambda pid: True)
