"""What every probe does to load its BPF program: size its ring buffer, compile it with BCC (saying
what failed, then giving the compiler's memory back) and write its ``settings`` array."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from .compiler_memory import release_compiler_memory

_LOCAL_INCLUDE = re.compile(r'\s*#\s*include\s+"([A-Za-z0-9_.]+\.h)"')


def power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def ring_buffer_pages(kb: int) -> int:
    """4 KiB pages for a ring buffer of about ``kb`` KiB: BPF wants a power of two."""
    return power_of_two_at_least(max(1, kb // 4))


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
