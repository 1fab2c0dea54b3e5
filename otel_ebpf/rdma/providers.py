"""Where a provider's function lives: an address in a process (from its context's ops table) as
the file and ELF virtual address a uprobe takes.

A provider (``libmlx5``, ``librxe``, ...) is loaded by libibverbs with ``dlopen``; its data-path
functions are file-local (no symbol), and are found only through ``ctx->ops``. A uprobe belongs to
a file and an offset, so each function is hooked once for every process that maps the file.
"""

from __future__ import annotations

from typing import NamedTuple


class Place(NamedTuple):
    path: str  # as the process names it in /proc/PID/maps
    offset: int  # in the file


def place_of(maps: str, address: int) -> Place | None:
    """The file and offset ``address`` falls in, from the text of ``/proc/PID/maps``; None when it
    is not in a file's mapping (anonymous memory, JIT code, a file since deleted)."""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].endswith(" (deleted)"):
            continue
        start, _, end = parts[0].partition("-")
        low, high = int(start, 16), int(end, 16)
        if low <= address < high:
            return Place(parts[5], address - low + int(parts[2], 16))
    return None


def virtual_address(path: str, offset: int) -> int | None:
    """The ELF virtual address of file ``offset`` (what BCC's ``attach_uprobe(addr=...)`` takes):
    through the loadable segment that maps it; None for a file that is not ELF or has none."""
    from elftools.common.exceptions import ELFError  # noqa: PLC0415 — only when a provider is found
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415

    try:
        with open(path, "rb") as stream:
            for segment in ELFFile(stream).iter_segments():
                if segment["p_type"] != "PT_LOAD":
                    continue
                start = segment["p_offset"]
                if start <= offset < start + segment["p_filesz"]:
                    return int(offset - start + segment["p_vaddr"])
    except (OSError, ELFError, ValueError):
        return None
    return None
