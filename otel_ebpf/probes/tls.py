"""Finding the TLS libraries processes use and attaching the SSL probes (``bpf/tls_trace.c``).

A uprobe belongs to a file, not to a process: attached once to ``libssl.so.3`` it fires in every
process that maps that file, now or later. So the attacher's job is to find each distinct file
that implements OpenSSL's API — the system libssl, a copy bundled in a wheel, an executable or
extension with OpenSSL or BoringSSL linked in statically — and attach to it once. Processes load
libssl late (Python imports ``ssl`` on first use), so mapped files are rescanned periodically.
A file without the symbols (BoringSSL inside grpcio's stripped ``cygrpc*.so``) cannot be hooked;
it is remembered and reported, not retried.
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
# Mapped files worth a symbol lookup: TLS libraries by name, and modules known to embed one. Other
# files (executables included) are looked up once each, as statically linked OpenSSL can be anywhere.
_TLS_NAME = re.compile(r"(^|/)lib(ssl|boringssl)[^/]*\.so|cygrpc[^/]*\.so$")
SYMBOL_PATTERN = "^(%s)$" % "|".join(ENTRY_PROGRAMS)

SymbolLookup = Callable[[str], set[str]]  # file -> which of ENTRY_PROGRAMS' symbols it defines
Attach = Callable[[str, str, str, bool], None]  # (file, symbol, program, is_return)


@dataclass
class TLSLibraries:
    """What the attacher found: files hooked (with the symbols they had) and files without symbols."""

    hooked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    without_symbols: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # file -> why attaching failed


def system_libssl() -> list[str]:
    """The libssl files the dynamic linker knows (``ldconfig -p``)."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = re.findall(r"^\s*libssl\.so[.\d]*\s.*=>\s*(\S+)$", listing, re.M)
    return sorted({os.path.realpath(path) for path in found})


def mapped_files(pid: int) -> set[str]:
    """Files ``pid`` maps executable code from (its executable and shared objects)."""
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


class TLSAttacher:
    """Attaches the SSL probes to every TLS implementation the given processes map, once per file."""

    def __init__(self, symbols: SymbolLookup, attach: Attach) -> None:
        self._symbols = symbols
        self._attach = attach
        self.libraries = TLSLibraries()
        self._seen: set[tuple[int, int]] = set()  # (device, inode) of every file looked at
        self._next_scan = 0.0

    def scan(self, pids: Iterable[int], extra_files: Iterable[str] = ()) -> None:
        """Look at the files ``pids`` map (and ``extra_files``); hook those new ones that have TLS."""
        self._next_scan = time.monotonic() + RESCAN_S
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
            self._consider(path)

    def scan_due(self) -> bool:
        return time.monotonic() >= self._next_scan

    def _consider(self, path: str) -> None:
        symbols = tuple(sorted(self._symbols(path) & ENTRY_PROGRAMS.keys()))
        if not all(required in symbols for required in REQUIRED):
            if _TLS_NAME.search(path):
                self.libraries.without_symbols.add(path)
                log.info("TLS: %s has no SSL_read/SSL_write symbols (stripped, static): not captured", path)
            return
        try:
            for symbol in symbols:
                self._attach(path, symbol, ENTRY_PROGRAMS[symbol], False)
                self._attach(path, symbol, RETURN_PROGRAM, True)
        except Exception as exc:  # BCC raises bare Exception naming the failure
            self.libraries.failed[path] = str(exc)
            log.warning("TLS: cannot attach to %s: %s", path, exc)
            return
        self.libraries.hooked[path] = symbols
        log.info("TLS: hooked %s (%s)", path, ", ".join(symbols))
