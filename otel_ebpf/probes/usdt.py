"""USDT (SystemTap SDT) probes: where a file's ``.note.stapsdt`` says each probe and its arguments
are, and how to attach one that is semaphore-gated.

Such probes are attached with the kernel's reference-counter support (``ref_ctr_offset``), which
raises the semaphore in every process that maps the file, now or later. Where each probe's
arguments live is build-specific ("8@%rax", "-4@-20(%rbp)"): the notes are parsed here and the
locations handed to the BPF program, which reads them itself (``usdt_specs`` in
``bpf/gpu_trace.c``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import re
import struct
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# x86-64 register names (64/32/16/8-bit) -> the index gpu_trace.c's reg_value() reads
_REGISTERS = {
    **{
        name: i
        for i, names in enumerate(
            (
                ("rax", "eax", "ax", "al"),
                ("rbx", "ebx", "bx", "bl"),
                ("rcx", "ecx", "cx", "cl"),
                ("rdx", "edx", "dx", "dl"),
                ("rsi", "esi", "si", "sil"),
                ("rdi", "edi", "di", "dil"),
                ("rbp", "ebp", "bp", "bpl"),
                ("rsp", "esp", "sp", "spl"),
            )
        )
        for name in names
    },
    **{f"r{n}{suffix}": n for n in range(8, 16) for suffix in ("", "d", "w", "b")},
    "rip": 16,
}


@dataclass(frozen=True)
class UsdtArg:
    size: int  # bytes; negative = signed
    kind: int  # 1 register, 2 memory at register + offset, 3 constant
    reg: int = 0
    value: int = 0  # offset or constant


@dataclass(frozen=True)
class UsdtProbe:
    provider: str
    name: str
    offset: int  # file offset of the probe's nop: where the uprobe goes
    semaphore_offset: int  # file offset of the semaphore (0: none)
    args: tuple[UsdtArg, ...]


_ARG = re.compile(r"^(-?\d+)@(?:\$(-?\d+)|%(\w+)|(-?\d*)\(%(\w+)\))$")


def parse_usdt_args(text: str) -> tuple[UsdtArg, ...]:
    """``"8@%rax -4@-20(%rbp) 8@$5"`` -> locations. Raises ValueError on what we cannot read
    (index registers, segment prefixes: not emitted for these probes by the compilers we know)."""
    args = []
    for token in text.split():
        match = _ARG.match(token)
        if not match:
            raise ValueError(f"unsupported USDT argument {token!r}")
        size, constant, reg, offset, base = match.groups()
        if constant is not None:
            args.append(UsdtArg(int(size), 3, 0, int(constant)))
        elif reg is not None:
            if reg not in _REGISTERS:
                raise ValueError(f"unsupported register in {token!r}")
            args.append(UsdtArg(int(size), 1, _REGISTERS[reg]))
        else:
            if base not in _REGISTERS:
                raise ValueError(f"unsupported register in {token!r}")
            args.append(UsdtArg(int(size), 2, _REGISTERS[base], int(offset or 0)))
    return tuple(args)


def read_usdt_probes(path: str) -> list[UsdtProbe]:
    """The SystemTap SDT probes in ``path``'s ``.note.stapsdt`` (none for a non-ELF file)."""
    from elftools.common.exceptions import ELFError  # noqa: PLC0415 — only when a file is looked at
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415

    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            notes = elf.get_section_by_name(".note.stapsdt")
            if notes is None:
                return []
            base_section = elf.get_section_by_name(".stapsdt.base")
            segments = [
                (s["p_vaddr"], s["p_memsz"], s["p_offset"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"
            ]
            data = notes.data()
            base_addr = base_section["sh_addr"] if base_section is not None else None
    except (OSError, ELFError, ValueError):
        return []

    def file_offset(vaddr: int) -> int | None:
        for start, size, offset in segments:
            if start <= vaddr < start + size:
                return vaddr - start + offset
        return None

    probes = []
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        pos += 12
        name = data[pos : pos + namesz]
        pos += (namesz + 3) & ~3
        desc = data[pos : pos + descsz]
        pos += (descsz + 3) & ~3
        if ntype != 3 or not name.startswith(b"stapsdt") or len(desc) < 24:
            continue
        pc, note_base, semaphore = struct.unpack_from("<QQQ", desc)
        strings = desc[24:].split(b"\0")
        if len(strings) < 3:
            continue
        if base_addr is not None and note_base:  # prelinked or moved: shift by the same amount
            pc += base_addr - note_base
            if semaphore:
                semaphore += base_addr - note_base
        pc_offset = file_offset(pc)
        if pc_offset is None:
            continue
        try:
            args = parse_usdt_args(strings[2].decode())
        except ValueError as exc:
            log.info("GPU: %s: USDT %s:%s skipped: %s", path, strings[0].decode(), strings[1].decode(), exc)
            continue
        probes.append(
            UsdtProbe(
                strings[0].decode(),
                strings[1].decode(),
                pc_offset,
                file_offset(semaphore) or 0 if semaphore else 0,
                args,
            )
        )
    return probes


@functools.cache
def _bpf_attach_uprobe() -> Any:
    """libbcc's ``bpf_attach_uprobe`` with its last parameter, ``ref_ctr_offset`` (the USDT
    semaphore), which BCC's Python binding leaves out."""
    from bcc.libbcc import lib  # noqa: PLC0415 — only the probe layer needs bcc

    return ctypes.CFUNCTYPE(
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_uint32,
    )(("bpf_attach_uprobe", lib))


def attach_usdt(bpf: Any, fn_name: str, path: str, offset: int, ref_ctr_offset: int) -> None:
    """Attach ``bpf``'s program ``fn_name`` at ``path`` + ``offset``, raising the semaphore at
    ``ref_ctr_offset`` (0: none) while attached; detached by ``bpf.cleanup()``."""
    from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

    fn = bpf.load_func(fn_name.encode(), BPF.KPROBE)
    ev_name = bpf._get_uprobe_evname(b"p", path.encode(), offset, -1)  # noqa: SLF001
    fd = _bpf_attach_uprobe()(fn.fd, 0, ev_name, path.encode(), offset, -1, ref_ctr_offset)
    if fd < 0:
        raise RuntimeError(f"cannot attach USDT probe at {path}+0x{offset:x}")
    bpf._add_uprobe_fd(ev_name, fd)  # noqa: SLF001 — detached by cleanup()
