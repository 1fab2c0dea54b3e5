"""The shape every probe has (:class:`Probe`) and what every probe does to load its BPF program
(:func:`load_program`): assemble its source, compile it with BCC (saying what failed, then giving
the compiler's memory back), write its ``settings`` array and the processes it starts with in its
``targets`` map (:class:`TargetTable`)."""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any, Protocol, TypeVar, runtime_checkable

from .compiler_memory import release_compiler_memory

SET_AGENT_TGID, SET_FILTER_PIDS = 0, 1  # the settings slots bpf/targets.h gives every program that includes it
# BCC keeps the tables of every module of the process in one static map (its "shared table
# storage", a std::map without a lock): two modules made or freed at once, on two threads, can
# corrupt it. The agent frees its probes side by side when it stops (the socket probe on a thread
# of its own): it crashed there with SIGSEGV, now and then, while the RDMA probe was freed too.
_BCC_MODULES = threading.Lock()
_LOCAL_INCLUDE = re.compile(r'\s*#\s*include\s+"([A-Za-z0-9_.]+\.h)"')
RecordT = TypeVar("RecordT", covariant=True)


@runtime_checkable
class Probe(Protocol[RecordT]):
    """What the agent's loop does with a probe: ``start`` loads and attaches (``RuntimeError``
    saying what failed), ``poll`` waits up to ``timeout_ms`` and returns the records that arrived,
    ``kernel_stats`` totals the kernel's drop counters since start (``otel_ebpf.kernel.drops``),
    ``close`` detaches and frees the program."""

    def start(self) -> None: ...

    def poll(self, timeout_ms: int) -> Sequence[RecordT]: ...

    def kernel_stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


def power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def ring_buffer_pages(kb: int) -> int:
    """4 KiB pages for a ring buffer of about ``kb`` KiB: BPF wants a power of two."""
    return power_of_two_at_least(max(1, kb // 4))


PROC_PID_INIT_INO = 0xEFFFFFFC  # the initial PID namespace's inode number (include/linux/proc_ns.h)


def pid_namespace_flags(ns_path: str = "/proc/self/ns/pid") -> list[str]:
    """``-D`` flags that make the programs see pids as the agent's PID namespace numbers them
    (bpf/current_task.h), when that is not the initial namespace: an agent in a pod (sidecar
    mode) sees only its pod's processes, by the pids its /proc shows. None on the host."""
    st = os.stat(ns_path)
    if st.st_ino == PROC_PID_INIT_INO:
        return []
    return [f"-DPIDNS_DEV={st.st_dev}", f"-DPIDNS_INO={st.st_ino}"]


def program_source(parts: Iterable[str]) -> str:
    """The files ``parts`` of bpf/, one after another, with their headers inlined."""
    bpf_dir = resources.files("otel_ebpf.bpf")
    return inline_headers("".join(bpf_dir.joinpath(part).read_text() for part in parts))


Define = int | str | bool | None


def program_cflags(defines: Mapping[str, Define], cflags: Iterable[str] = ()) -> list[str]:
    """``-DNAME=value`` for each define (``True``: ``-DNAME``; ``False`` or ``None``: left out),
    then ``cflags``, then the flags of the agent's PID namespace (:func:`pid_namespace_flags`).
    Redefinitions are no warnings: a program defines defaults for what the probe may pass."""
    flags = [
        f"-D{name}" if value is True else f"-D{name}={value}"
        for name, value in defines.items()
        if value is not None and value is not False
    ]
    return [*flags, *cflags, "-Wno-macro-redefined", *pid_namespace_flags()]


def load_program(
    parts: Sequence[str],
    what: str,
    *,
    defines: Mapping[str, Define],
    cflags: Iterable[str] = (),
    verify: Iterable[str] = (),
    settings: Mapping[int, int] | None = None,
    targets: Iterable[int] = (),
) -> Any:
    """The BPF program made of the files ``parts`` of bpf/ (``what`` it is names it in errors),
    compiled with ``defines`` and ``cflags``; the uprobe programs named in ``verify`` loaded at
    once (BCC would load them at their first attach: the verifier's verdict comes now, as a
    ``RuntimeError`` like the compiler's); ``settings`` written (bpf/targets.h's and the program's
    own slots); ``targets`` in its ``targets`` map. Raises ``RuntimeError`` naming ``what``."""
    bpf = compile_program(program_source(parts), program_cflags(defines, cflags), what, verify)
    if settings:
        write_settings(bpf, settings)
    pids = list(targets)
    if pids:  # programs without bpf/targets.h have no such map
        TargetTable(bpf["targets"]).update(pids)
    return bpf


class TargetTable:
    """A map of pids (bpf/targets.h's ``targets``, or another u32 -> u8 one) and the pids user
    space put in it. The kernel may add some of its own (a traced process's children): ``in``
    asks the kernel."""

    def __init__(self, table: Any, present: Iterable[int] = ()) -> None:
        """``present``: pids already in the map (:func:`load_program` wrote them)."""
        self._table = table
        self.pids: set[int] = set(present)

    def add(self, pid: int) -> None:
        self.pids.add(pid)
        self._table[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def update(self, pids: Iterable[int]) -> None:
        for pid in pids:
            self.add(pid)

    def discard(self, pid: int) -> None:
        self.pids.discard(pid)
        self._table.pop(ctypes.c_uint32(pid), None)

    def replace(self, pids: set[int]) -> None:
        """Exactly ``pids`` (of those user space put there): the new ones in, the others out."""
        for pid in pids - self.pids:
            self.add(pid)
        for pid in self.pids - pids:
            self.discard(pid)

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, int) and self._table.get(ctypes.c_uint32(pid)) is not None

    def __len__(self) -> int:
        return len(self.pids)


def compile_program(source: str, cflags: list[str], what: str, verify: Iterable[str] = ()) -> Any:
    """``source`` compiled and loaded by BCC, with the uprobe programs ``verify`` through the
    verifier; ``RuntimeError`` naming ``what`` with BCC's verdict."""
    from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

    try:
        with _BCC_MODULES:
            bpf = BPF(text=source, cflags=cflags)
        for name in verify:
            bpf.load_func(name.encode(), BPF.KPROBE)
    except Exception as exc:  # BCC raises bare Exception with the compiler's verdict
        raise RuntimeError(f"cannot load the {what}: {exc} (run `otel-ebpf doctor`)") from exc
    release_compiler_memory()
    return bpf


def detach_programs(bpf: Any) -> None:
    """Detach ``bpf``'s uprobes and tracepoints; its maps stay readable. Each detach waits for the
    kernel (an RCU grace period, tens of milliseconds; a uprobe's more): one after another, a probe
    with dozens of them takes seconds to stop, past a container's grace period. Done side by side,
    the waits overlap (the calls release the GIL)."""
    detaches = [(bpf.detach_uprobe_event, name) for name in list(bpf.uprobe_fds)]
    detaches += [(bpf.detach_tracepoint, name) for name in list(bpf.tracepoint_fds)]
    if detaches:
        with ThreadPoolExecutor(max_workers=min(32, len(detaches))) as pool:
            for future in [pool.submit(detach, name) for detach, name in detaches]:
                future.exception()  # one that failed is left to cleanup(), which skips the rest


def close_program(bpf: Any) -> None:
    """Detach everything ``bpf`` attached, then free it (one module at a time: ``_BCC_MODULES``)."""
    detach_programs(bpf)
    with _BCC_MODULES:
        bpf.cleanup()


def write_settings(bpf: Any, values: Mapping[int, int]) -> None:
    """Fill the program's ``settings`` array (index → value, u32)."""
    settings = bpf["settings"]
    for index, value in values.items():
        settings[ctypes.c_int(index)] = ctypes.c_uint32(value)


def inline_headers(source: str) -> str:
    """``source`` with each ``#include "<header>"`` of a header in bpf/ replaced by its text.

    BCC rewrites map calls (``py_procs.lookup(...)``) only in the main file, not in included
    headers: a program whose headers use maps must be handed to ``BPF(text=...)`` through this."""
    bpf_dir = resources.files("otel_ebpf.bpf")
    lines = []
    for line in source.splitlines():
        match = _LOCAL_INCLUDE.match(line)
        header = bpf_dir.joinpath(match.group(1)) if match else None
        if header is not None and header.is_file():
            lines.append(inline_headers(header.read_text()))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"
