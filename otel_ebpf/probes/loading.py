"""What every probe does to load its BPF program: size its ring buffer, compile it with BCC (saying
what failed, then giving the compiler's memory back) and write its ``settings`` array."""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from .compiler_memory import release_compiler_memory

SET_AGENT_TGID, SET_FILTER_PIDS = 0, 1  # the settings slots bpf/targets.h gives every program that includes it
_LOCAL_INCLUDE = re.compile(r'\s*#\s*include\s+"([A-Za-z0-9_.]+\.h)"')


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


def compile_program(source: str, cflags: list[str], what: str) -> Any:
    """``source`` compiled and loaded by BCC; ``RuntimeError`` naming ``what`` with BCC's verdict."""
    from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

    try:
        bpf = BPF(text=source, cflags=cflags)
    except Exception as exc:  # BCC raises bare Exception with the compiler's verdict
        raise RuntimeError(f"cannot load the {what}: {exc} (run `otel-ebpf doctor`)") from exc
    release_compiler_memory()
    return bpf


def close_program(bpf: Any) -> None:
    """Detach everything ``bpf`` attached, then free it. Each detach waits for the kernel (an RCU
    grace period, tens of milliseconds; a uprobe's more): one after another, a probe with dozens
    of them takes seconds to stop, past a container's grace period. Done side by side, the waits
    overlap (the calls release the GIL)."""
    detaches = [(bpf.detach_uprobe_event, name) for name in list(bpf.uprobe_fds)]
    detaches += [(bpf.detach_tracepoint, name) for name in list(bpf.tracepoint_fds)]
    if detaches:
        with ThreadPoolExecutor(max_workers=min(32, len(detaches))) as pool:
            for future in [pool.submit(detach, name) for detach, name in detaches]:
                future.exception()  # one that failed is left to cleanup(), which skips the rest
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
