"""Which files of which processes the GPU probe hooks.

Discovery works like the TLS probe's (:mod:`.tls`): a uprobe belongs to a file, so every distinct
file (device, inode) that processes map executable code from is looked at once. A file is hooked
for whichever of the functions in :data:`~otel_ebpf.gpu.calls.FUNCTION_SYMBOLS` it defines —
``libcudart.so.12`` from a wheel, the driver's ``libcuda.so.1``, ``libnccl.so.2``, or any
executable or library with cudart linked in statically — and for PyTorch's USDT probes
(``pytorch:malloc`` / ``pytorch:free`` in ``libc10_cuda.so``), found in its ``.note.stapsdt``
(:mod:`.usdt`). Processes load these libraries late (``import torch`` seconds after exec), so maps
are rescanned every :data:`RESCAN_S` and at once when a process execs; nobody restarts anything.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..gpu.calls import BY_SYMBOL, FUNCTION_SYMBOLS, USDT_PROBES
from .tls import mapped_files
from .usdt import UsdtProbe

log = logging.getLogger(__name__)

RESCAN_S = 1.0
SYMBOL_PATTERN = "^(%s)$" % "|".join(FUNCTION_SYMBOLS)
GPU_LIBRARY_NAME = re.compile(rb"/(libcudart|libcuda|libnccl|libc10_cuda|libtorch_cuda)[^/\n]*\.so")


@dataclass
class GpuLibraries:
    """What the attacher found: files hooked (with the functions and probes they had)."""

    hooked: dict[str, tuple[str, ...]] = field(default_factory=dict)  # path -> symbols / provider:name
    failed: dict[str, str] = field(default_factory=dict)  # path -> why attaching failed

    def by_library(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for symbols in self.hooked.values():
            for library in {BY_SYMBOL[s].library.value for s in symbols}:
                counts[library] = counts.get(library, 0) + 1
        return counts


SymbolLookup = Callable[[str], set[str]]  # file -> which FUNCTION_SYMBOLS it defines
UsdtLookup = Callable[[str], list[UsdtProbe]]
AttachFunction = Callable[[str, str], None]  # (file, symbol): entry and return probes
AttachUsdt = Callable[[str, UsdtProbe], None]


class GpuAttacher:
    """Hooks every GPU library the given processes map, once per file."""

    def __init__(
        self, symbols: SymbolLookup, usdt: UsdtLookup, attach: AttachFunction, attach_usdt: AttachUsdt
    ) -> None:
        self._symbols = symbols
        self._usdt = usdt
        self._attach = attach
        self._attach_usdt = attach_usdt
        self.libraries = GpuLibraries()
        self._seen: set[tuple[int, int]] = set()
        self._hooked: set[tuple[int, int]] = set()
        self._next_scan = 0.0

    def scan(self, pids: Iterable[int], reschedule: bool = True) -> set[int]:
        """Look at the files ``pids`` map; hook the new ones with GPU entry points. Returns the
        pids that map a hooked file. ``reschedule``: this is the periodic rescan of every target."""
        if reschedule:
            self._next_scan = time.monotonic() + RESCAN_S
        files_of = {pid: mapped_files(pid) for pid in pids}
        identities: dict[str, tuple[int, int] | None] = {}
        for path in sorted(set().union(*files_of.values()) if files_of else ()):
            try:
                st = os.stat(path)
            except OSError:
                identities[path] = None
                continue
            identity = identities[path] = (st.st_dev, st.st_ino)
            if identity in self._seen:
                continue
            self._seen.add(identity)
            if self._consider(path):
                self._hooked.add(identity)
        return {pid for pid, files in files_of.items() if any(identities.get(f) in self._hooked for f in files)}

    def scan_due(self) -> bool:
        return time.monotonic() >= self._next_scan

    def _consider(self, path: str) -> bool:
        symbols = sorted(self._symbols(path) & set(FUNCTION_SYMBOLS))
        probes = [p for p in self._usdt(path) if (p.provider, p.name) in USDT_PROBES]
        if not symbols and not probes:
            return False
        done: list[str] = []
        try:
            for symbol in symbols:
                self._attach(path, symbol)
                done.append(symbol)
            for probe in probes:
                self._attach_usdt(path, probe)
                done.append(f"{probe.provider}:{probe.name}")
        except Exception as exc:  # noqa: BLE001 — BCC raises bare Exception naming the failure
            self.libraries.failed[path] = str(exc)
            log.warning("GPU: cannot attach to %s: %s", path, exc)
            if not done:
                return False
        self.libraries.hooked[path] = tuple(done)
        log.info(
            "GPU: hooked %s (%d functions%s)",
            path,
            len(symbols),
            f", USDT {', '.join(d for d in done if ':' in d)}" if probes else "",
        )
        return True


def gpu_symbols(path: str) -> set[str]:
    """Which hooked functions ``path`` defines (BCC reads its symbol tables)."""
    from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

    try:
        found = BPF.get_user_functions_and_addresses(path.encode(), SYMBOL_PATTERN.encode())
        return {name.decode() for name, _ in found}
    except Exception:  # noqa: BLE001 — not an ELF file, or unreadable: no symbols
        return set()


def maps_gpu_library(pid: int) -> bool:
    """Whether ``pid`` maps a GPU library by its usual file name (``gpu.enabled: auto`` waits for
    one before compiling the probe; statically linked cudart needs ``gpu.enabled: true``)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            return GPU_LIBRARY_NAME.search(maps.read()) is not None
    except OSError:
        return False
