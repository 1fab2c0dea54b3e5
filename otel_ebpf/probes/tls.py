"""Finding the TLS libraries processes use and attaching the SSL probes (``bpf/tls_trace.c``).

A uprobe is set on a file (an inode and an offset), but the kernel plants its breakpoint only in
the processes it is attached for: attached for no process in particular, in every process that
maps the file, now or later; attached for one process (``pid``), in that one alone. A process with
the breakpoint traps into the kernel on every SSL call, traced or not — the BPF program's filter
runs only after the trap — so the attacher has two modes, chosen by what the agent traces:

- **Every process** (no ``--pid``/``--exe``): each distinct file that implements OpenSSL's API —
  the system libssl, a copy bundled in a wheel, an executable or extension with OpenSSL or
  BoringSSL linked in statically — is hooked once, for all processes.
- **Chosen processes** (``targets`` given): each such file is hooked once *per target process*,
  so processes outside the selection keep running untrapped (an HTTPS server on the node is not
  slowed down by an agent tracing something else). The system libssl is hooked for every target
  even before it maps the file, so a target that loads it late (Python imports ``ssl`` on first
  use, a shell execs curl) is covered from its first call. Targets that appear later (children
  forked by a target, execs matching ``--exe``) are hooked at the next poll once the probe layer
  says so (:meth:`TLSAttacher.watch`); a target that exits has its probes detached
  (:meth:`TLSAttacher.forget`), and the periodic rescan drops those the kernel no longer traces
  (an exit event lost to a full ring buffer). At most ``max_attachments`` (file, process) pairs
  are hooked at once; pairs past the cap are counted (:attr:`TLSLibraries.refused`), logged, and
  retried at later rescans.

Processes load libraries late, so mapped files are rescanned periodically. A file without the
symbols (BoringSSL inside grpcio's stripped ``cygrpc*.so``) cannot be hooked; it is remembered and
reported, not retried.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# symbol -> the BPF function its entry runs; every one returns through ssl_return
ENTRY_PROGRAMS = {
    "SSL_read": "ssl_read_enter",
    "SSL_read_ex": "ssl_read_ex_enter",
    "SSL_write": "ssl_write_enter",
    "SSL_write_ex": "ssl_write_ex_enter",
    "SSL_do_handshake": "ssl_handshake_enter",
    "SSL_connect": "ssl_handshake_enter",
    "SSL_accept": "ssl_handshake_enter",
}
RETURN_PROGRAM = "ssl_return"
REQUIRED = ("SSL_read", "SSL_write")  # without these a file is no TLS implementation we can read
RESCAN_S = 2.0
# (file, process) pairs hooked at once when tracing chosen processes. A pair is up to 14 uprobes
# (7 symbols, entry and return): 32 pairs stay well inside BCC's quota of open probes
# (BCC_PROBE_LIMIT, default 1000, shared with the GPU probes), and detaching costs the kernel
# ~0.1 s per uprobe (RCU grace periods), paid again for what is still attached when the agent stops.
MAX_PROCESS_ATTACHMENTS = 32
# Mapped files worth a symbol lookup: TLS libraries by name, and modules known to embed one. Other
# files (executables included) are looked up once each, as statically linked OpenSSL can be anywhere.
_TLS_NAME = re.compile(r"(^|/)lib(ssl|boringssl)[^/]*\.so|cygrpc[^/]*\.so$")
SYMBOL_PATTERN = "^(%s)$" % "|".join(ENTRY_PROGRAMS)

SymbolLookup = Callable[[str], set[str]]  # file -> which of ENTRY_PROGRAMS' symbols it defines
# (file, symbol, program, is_return, pid) -> a handle for Detach; pid None: every process mapping the file
Attach = Callable[[str, str, str, bool, int | None], object]
Detach = Callable[[object], None]  # takes back what one Attach call attached
Identity = tuple[int, int]  # (device, inode): one file whatever the name it is reached by


@dataclass
class TLSLibraries:
    """What the attacher found: files hooked (with the symbols they had) and files without symbols.

    Tracing chosen processes, ``hooked`` lists the files hooked for at least one process so far,
    and ``refused`` counts the (file, process) pairs the cap turned away."""

    hooked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    without_symbols: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # file -> why attaching failed
    refused: int = 0


@dataclass
class _Process:
    """A target process's attachments (tracing chosen processes)."""

    files: dict[Identity, tuple[str, list[object]]] = field(default_factory=dict)  # -> (path, handles)
    refused: set[Identity] = field(default_factory=set)  # counted once, retried at rescans
    failed: set[Identity] = field(default_factory=set)  # not retried


def system_libssl() -> list[str]:
    """The libssl files the dynamic linker knows (``ldconfig -p``)."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = re.findall(r"^\s*libssl\.so[.\d]*\s.*=>\s*(\S+)$", listing, re.M)
    return sorted({os.path.realpath(path) for path in found})


def mapped_files(pid: int) -> set[str]:
    """Files ``pid`` maps executable code from (its executable and shared objects), named as the
    process sees them (inside its own mount namespace)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    files = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/") and not parts[5].endswith(" (deleted)"):
            files.add(parts[5])
    return files


def seen_by(pid: int, path: str) -> str:
    """``path`` as process ``pid`` resolves it (a container's own files), readable from here.
    BCC attaches a uprobe for a process to the same name."""
    return f"/proc/{pid}/root{path}"


class TLSAttacher:
    """Attaches the SSL probes to the TLS implementations that processes map: once per file when
    every process is traced, once per (file, target process) when ``targets`` is given.

    ``targets(pid)`` says whether the agent still traces ``pid`` (the kernel's own table, which
    children join at fork and exiting processes leave); giving it selects per-process probes.
    """

    def __init__(
        self,
        symbols: SymbolLookup,
        attach: Attach,
        detach: Detach | None = None,
        *,
        targets: Callable[[int], bool] | None = None,
        max_attachments: int = MAX_PROCESS_ATTACHMENTS,
    ) -> None:
        if targets is not None and detach is None:
            raise ValueError("per-process probes need a detach callback")
        self._symbols = symbols
        self._attach = attach
        self._detach = detach
        self._targets = targets
        self.max_attachments = max_attachments
        self.libraries = TLSLibraries()
        self._seen: set[Identity] = set()  # per file: every file looked at
        self._file_symbols: dict[Identity, tuple[str, ...]] = {}  # () for no TLS implementation
        self._next_scan = 0.0
        # per process
        self._processes: dict[int, _Process] = {}
        self._pending: set[int] = set()  # targets to look at in the next scan, due at once
        self._everywhere: list[str] = []  # files every target gets (the system libssl)
        self._attached = 0  # (file, process) pairs

    @property
    def per_process(self) -> bool:
        """Whether probes are attached per target process (else once per file, for all)."""
        return self._targets is not None

    @property
    def attachments(self) -> dict[int, set[str]]:
        """Per process: the files hooked for each target process."""
        return {pid: {path for path, _ in proc.files.values()} for pid, proc in self._processes.items() if proc.files}

    def watch(self, pid: int) -> None:
        """``pid`` is (or, after an exec, is again) a target: look at its files in the next scan,
        which is then due. Tracing every process, the files' probes cover it already."""
        if self.per_process:
            self._pending.add(pid)

    def forget(self, pid: int) -> None:
        """``pid`` exited (or is no longer traced): detach its probes."""
        self._pending.discard(pid)
        proc = self._processes.pop(pid, None)
        if proc is None:
            return
        for path, handles in proc.files.values():
            self._release(handles)
            log.debug("TLS: unhooked %s for process %d", path, pid)
        self._attached -= len(proc.files)

    def scan_due(self) -> bool:
        return bool(self._pending) or time.monotonic() >= self._next_scan

    def scan(self, pids: Iterable[int], extra_files: Iterable[str] = ()) -> None:
        """Hook what is new. Every process traced: the files ``pids`` map (and ``extra_files``)
        that have TLS. Chosen processes: ``pids`` are targets; each target gets the TLS files it
        maps and ``extra_files`` (remembered for later targets) hooked for it. Between periodic
        rescans only the targets watched since are looked at."""
        now = time.monotonic()
        periodic = now >= self._next_scan
        if periodic:
            self._next_scan = now + RESCAN_S
        if not self.per_process:
            self._scan_files(pids, extra_files)
            return
        self._everywhere += [path for path in extra_files if path not in self._everywhere]
        self._pending.update(pid for pid in pids if pid not in self._processes)
        todo, self._pending = self._pending | (self._processes.keys() if periodic else set()), set()
        for pid in sorted(todo):
            if self._targets(pid):
                self._cover(pid)
            else:  # gone, even if its exit event never came
                self.forget(pid)

    # ---- every process: per file -----------------------------------------------------------------

    def _scan_files(self, pids: Iterable[int], extra_files: Iterable[str]) -> None:
        candidates = set(extra_files)
        for pid in pids:
            candidates |= mapped_files(pid)
        for path in sorted(candidates):
            try:
                st = os.stat(path)
            except OSError:
                continue
            identity = (st.st_dev, st.st_ino)
            if identity in self._seen:
                continue
            self._seen.add(identity)
            symbols = self._tls_symbols(identity, path, path)
            if not symbols:
                continue
            try:
                self._attach_file(path, symbols, None)
            except Exception as exc:  # BCC raises bare Exception naming the failure
                self.libraries.failed[path] = str(exc)
                log.warning("TLS: cannot attach to %s: %s", path, exc)
                continue
            self.libraries.hooked[path] = symbols
            log.info("TLS: hooked %s (%s)", path, ", ".join(symbols))

    # ---- chosen processes: per (file, process) ---------------------------------------------------

    def _cover(self, pid: int) -> None:
        """Hook, for ``pid``, the TLS files it maps and those every target gets."""
        proc = self._processes.setdefault(pid, _Process())
        for path in [*self._everywhere, *sorted(mapped_files(pid) - set(self._everywhere))]:
            try:
                st = os.stat(seen_by(pid, path))
            except OSError:
                continue  # gone, or no such file in the process's file system
            identity = (st.st_dev, st.st_ino)
            if identity in proc.files or identity in proc.failed:
                continue
            symbols = self._tls_symbols(identity, path, seen_by(pid, path))
            if not symbols:
                continue
            if self._attached >= self.max_attachments:
                self._refuse(proc, identity, path, pid)
                continue
            try:
                handles = self._attach_file(path, symbols, pid)
            except Exception as exc:  # BCC raises bare Exception naming the failure
                if not self._targets(pid) or not os.path.exists(f"/proc/{pid}"):
                    log.debug("TLS: process %d exited before its probes were attached", pid)
                    self.forget(pid)
                    return
                proc.failed.add(identity)
                self.libraries.failed[path] = str(exc)
                log.warning("TLS: cannot attach to %s for process %d: %s", path, pid, exc)
                continue
            proc.files[identity] = (path, handles)
            proc.refused.discard(identity)
            self._attached += 1
            if path in self.libraries.hooked:
                log.debug("TLS: hooked %s for process %d", path, pid)
            else:
                self.libraries.hooked[path] = symbols
                log.info(
                    "TLS: hooked %s (%s) for process %d (per target process: others do not trap)",
                    path,
                    ", ".join(symbols),
                    pid,
                )

    def _refuse(self, proc: _Process, identity: Identity, path: str, pid: int) -> None:
        if identity in proc.refused:
            return  # counted already; tried again at every rescan
        proc.refused.add(identity)
        self.libraries.refused += 1
        level = logging.WARNING if self.libraries.refused == 1 else logging.DEBUG  # then counted only
        log.log(
            level,
            "TLS: %d (library, process) pairs hooked already, the most allowed: %s is not hooked "
            "for process %d, whose TLS is not captured until other targets exit",
            self.max_attachments,
            path,
            pid,
        )

    # ---- shared ----------------------------------------------------------------------------------

    def _tls_symbols(self, identity: Identity, path: str, readable: str) -> tuple[str, ...]:
        """The SSL entry points the file defines, () when it is no TLS implementation we can read
        (looked up once per file)."""
        if identity not in self._file_symbols:
            symbols = tuple(sorted(self._symbols(readable) & ENTRY_PROGRAMS.keys()))
            if not all(required in symbols for required in REQUIRED):
                symbols = ()
                if _TLS_NAME.search(path):
                    self.libraries.without_symbols.add(path)
                    log.info("TLS: %s has no SSL_read/SSL_write symbols (stripped, static): not captured", path)
            self._file_symbols[identity] = symbols
        return self._file_symbols[identity]

    def _attach_file(self, path: str, symbols: tuple[str, ...], pid: int | None) -> list[object]:
        """Entry and return probes on every symbol; on failure, none of them stays."""
        handles: list[object] = []
        try:
            for symbol in symbols:
                handles.append(self._attach(path, symbol, ENTRY_PROGRAMS[symbol], False, pid))
                handles.append(self._attach(path, symbol, RETURN_PROGRAM, True, pid))
        except Exception:
            self._release(handles)
            raise
        return handles

    def _release(self, handles: list[object]) -> None:
        if self._detach is None:
            return
        for handle in handles:
            try:
                self._detach(handle)
            except Exception as exc:  # noqa: BLE001 — one probe that will not go must not keep the others
                log.warning("TLS: cannot detach a probe: %s", exc)
