"""Native symbolization: user addresses through ELF symbol tables (pyelftools), kernel addresses
through ``/proc/kallsyms``.

- :class:`ProcessMaps` reads ``/proc/<pid>/maps`` (re-read when an address falls outside every
  mapping it knows: a library loaded since).
- :class:`ElfImage` is one ELF file: its function symbols from ``.symtab`` and ``.dynsym``
  (stripped files keep the dynamic ones), its GNU build id and its ``PT_LOAD`` segments. Images are
  cached per file identity (device, inode, size, mtime), so every process that maps libc shares one.
- :class:`Symbolizer` turns ``(pid, address)`` into a :class:`~otel_ebpf.profiles.model.Frame`:
  ``function`` from the nearest preceding symbol, else ``module+0xoffset`` where the offset is the
  address in the file's own virtual address space (what ``addr2line`` takes).

Files are read through ``/proc/<pid>/root`` so a process in another mount namespace (a container)
gets its own libraries, not the host's.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from otel_ebpf.profiles.model import Frame, FrameKind

log = logging.getLogger(__name__)

MAX_IMAGES = 256  # ELF images kept parsed (symbol tables are the agent's largest caches)
MAX_PROCESSES = 4096
MAX_FRAMES = 1 << 18  # (pid, address) -> frame entries; the cache starts over past it
STT_FUNC_TYPES = ("STT_FUNC", "STT_GNU_IFUNC")


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    offset: int  # file offset of ``start``
    path: str  # "" for anonymous memory; "[vdso]", "[stack]", ... for the kernel's
    executable: bool


def parse_maps(text: str) -> list[Mapping]:
    """Entries of a ``/proc/<pid>/maps`` file, in address order."""
    mappings = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        start, _, end = fields[0].partition("-")
        path = fields[5].strip() if len(fields) == 6 else ""
        path = path.removesuffix(" (deleted)")
        mappings.append(Mapping(int(start, 16), int(end, 16), int(fields[2], 16), path, "x" in fields[1]))
    return mappings


class ProcessMaps:
    """One process's memory map, sorted, with lookups by address."""

    def __init__(self, pid: int, proc: str = "/proc") -> None:
        self.pid = pid
        self._proc = proc
        self.mappings: list[Mapping] = []
        self._starts: list[int] = []
        self.refresh()

    def refresh(self) -> bool:
        try:
            text = Path(f"{self._proc}/{self.pid}/maps").read_text()
        except OSError:
            return False
        self.mappings = parse_maps(text)
        self._starts = [m.start for m in self.mappings]
        return True

    def find(self, address: int) -> Mapping | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self.mappings[i].end:
            return self.mappings[i]
        return None

    def file_path(self, mapping: Mapping) -> str:
        """Where this process's file can be opened from the agent's mount namespace."""
        return f"{self._proc}/{self.pid}/root{mapping.path}"

    def load_bias(self, path: str, image: ElfImage) -> int | None:
        """What to add to the file's virtual addresses to get this process's addresses."""
        for mapping in self.mappings:
            if mapping.path == path:
                vaddr = image.file_offset_to_vaddr(mapping.offset)
                if vaddr is not None:
                    return mapping.start - vaddr
        return None


class ElfImage:
    """Function symbols, build id and load segments of one ELF file."""

    def __init__(self, path: str) -> None:
        from elftools.common.exceptions import ELFError  # noqa: PLC0415 -- heavy import, only when used
        from elftools.elf.elffile import ELFFile  # noqa: PLC0415

        self.path = path
        self.build_id = ""
        self.segments: list[tuple[int, int, int, int]] = []  # (p_offset, p_filesz, p_vaddr, p_memsz)
        self.symbols: dict[str, int] = {}  # name -> value, every defined symbol (data too)
        functions: dict[int, tuple[int, str]] = {}  # address -> (size, name)
        with open(path, "rb") as stream:
            try:
                elf = ELFFile(stream)
                for segment in elf.iter_segments():
                    if segment["p_type"] == "PT_LOAD":
                        self.segments.append(
                            (segment["p_offset"], segment["p_filesz"], segment["p_vaddr"], segment["p_memsz"])
                        )
                    elif segment["p_type"] == "PT_NOTE":
                        for note in segment.iter_notes():
                            if note["n_type"] == "NT_GNU_BUILD_ID":
                                self.build_id = note["n_desc"]
                for name in (".symtab", ".dynsym"):
                    section = elf.get_section_by_name(name)
                    if section is None or not hasattr(section, "iter_symbols"):
                        continue
                    for symbol in section.iter_symbols():
                        value = symbol["st_value"]
                        if not value or symbol["st_shndx"] == "SHN_UNDEF" or not symbol.name:
                            continue
                        self.symbols.setdefault(symbol.name, value)
                        if symbol["st_info"]["type"] in STT_FUNC_TYPES:
                            size = symbol["st_size"]
                            known = functions.get(value)
                            # Prefer the sized, non-underscore alias (memcpy over __memcpy_avx...).
                            if (
                                known is None
                                or (known[0] == 0 and size)
                                or (known[1].startswith("_") and not symbol.name.startswith("_") and size)
                            ):
                                functions[value] = (size, symbol.name)
            except ELFError as exc:
                raise OSError(f"{path}: not an ELF file ({exc})") from None
        self._addresses = sorted(functions)
        self._functions = [functions[a] for a in self._addresses]

    def file_offset_to_vaddr(self, offset: int) -> int | None:
        for p_offset, p_filesz, p_vaddr, _ in self.segments:
            if p_offset <= offset < p_offset + max(p_filesz, 1):
                return offset - p_offset + p_vaddr
        # A mapping may start on the page before its segment's (unaligned) file offset.
        for p_offset, _, p_vaddr, _ in self.segments:
            if p_offset & ~0xFFF == offset:
                return p_vaddr - (p_offset - offset)
        return None

    def function_at(self, vaddr: int) -> tuple[str, int] | None:
        """(name, offset into it) of the function holding ``vaddr``, or None."""
        i = bisect.bisect_right(self._addresses, vaddr) - 1
        if i < 0:
            return None
        start = self._addresses[i]
        size, name = self._functions[i]
        if size and vaddr >= start + size:
            # Past the end of the last sized symbol: in a gap (stripped static function, PLT).
            return None
        return name, vaddr - start


class _ImageCache:
    """Parsed images by file identity, LRU-bounded."""

    def __init__(self, capacity: int = MAX_IMAGES) -> None:
        self._capacity = capacity
        self._images: OrderedDict[tuple[int, int, int, int], ElfImage | None] = OrderedDict()

    def get(self, path: str) -> ElfImage | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._images:
            self._images.move_to_end(key)
            return self._images[key]
        try:
            image: ElfImage | None = ElfImage(path)
        except OSError as exc:
            log.debug("cannot read symbols of %s: %s", path, exc)
            image = None
        self._images[key] = image
        if len(self._images) > self._capacity:
            self._images.popitem(last=False)
        return image


IMAGES = _ImageCache()


def elf_image(path: str) -> ElfImage | None:
    """The (cached) parsed ELF file at ``path``, None when it cannot be read."""
    return IMAGES.get(path)


class KernelSymbols:
    """``/proc/kallsyms``, read once (addresses are zero without root or with kptr_restrict=2)."""

    def __init__(self, path: str = "/proc/kallsyms") -> None:
        entries: list[tuple[int, str]] = []
        try:
            with open(path) as stream:
                for line in stream:
                    fields = line.split()
                    if len(fields) >= 3 and fields[1] in "tTwW":
                        address = int(fields[0], 16)
                        if address:
                            name = fields[2] if len(fields) == 3 else f"{fields[2]} {fields[3]}"
                            entries.append((address, name))
        except OSError as exc:
            log.warning("cannot read %s: kernel frames stay unnamed (%s)", path, exc)
        entries.sort()
        self._addresses = [a for a, _ in entries]
        self._names = [n for _, n in entries]

    def __len__(self) -> int:
        return len(self._addresses)

    def name(self, address: int) -> str | None:
        i = bisect.bisect_right(self._addresses, address) - 1
        return self._names[i] if i >= 0 else None


class Symbolizer:
    """Frames for native and kernel addresses, with per-process maps and per-file symbol caches."""

    def __init__(self, proc: str = "/proc", kallsyms: str = "/proc/kallsyms") -> None:
        self._proc = proc
        self._kallsyms_path = kallsyms
        self._kernel: KernelSymbols | None = None
        self._maps: OrderedDict[int, ProcessMaps] = OrderedDict()
        self._frames: dict[tuple[int, int], Frame] = {}  # (pid, address) -> frame, cleared with forget()

    def maps(self, pid: int) -> ProcessMaps:
        maps = self._maps.get(pid)
        if maps is None:
            maps = self._maps[pid] = ProcessMaps(pid, self._proc)
            if len(self._maps) > MAX_PROCESSES:
                old, _ = self._maps.popitem(last=False)
                self._drop_frames(old)
        else:
            self._maps.move_to_end(pid)
        return maps

    def forget(self, pid: int) -> None:
        """The process exited (or its pid may be reused): drop what was learnt about it."""
        self._maps.pop(pid, None)
        self._drop_frames(pid)

    def _drop_frames(self, pid: int) -> None:
        for key in [k for k in self._frames if k[0] == pid]:
            del self._frames[key]

    def kernel_frame(self, address: int) -> Frame:
        if self._kernel is None:
            self._kernel = KernelSymbols(self._kallsyms_path)
        name = self._kernel.name(address)
        return Frame(name or f"[kernel]+0x{address:x}", module="[kernel.kallsyms]", kind=FrameKind.KERNEL)

    def user_frame(self, pid: int, address: int) -> Frame:
        key = (pid, address)
        frame = self._frames.get(key)
        if frame is None:
            if len(self._frames) >= MAX_FRAMES:
                self._frames.clear()
            frame = self._frames[key] = self._resolve(pid, address)
        return frame

    def mapping(self, pid: int, address: int) -> Mapping | None:
        maps = self.maps(pid)
        mapping = maps.find(address)
        if mapping is None and maps.refresh():
            mapping = maps.find(address)
        return mapping

    def _resolve(self, pid: int, address: int) -> Frame:
        maps = self.maps(pid)
        mapping = self.mapping(pid, address)
        if mapping is None or not mapping.executable:
            return Frame(f"[unknown]+0x{address:x}", kind=FrameKind.NATIVE, address=address, resolved=False)
        if not mapping.path.startswith("/"):
            # [vdso], anonymous JIT code, ...
            name = mapping.path or "[anon]"
            return Frame(
                f"{name}+0x{address - mapping.start:x}",
                module=name,
                kind=FrameKind.NATIVE,
                address=address - mapping.start,
                resolved=False,
            )
        image = elf_image(maps.file_path(mapping))
        module = os.path.basename(mapping.path)
        file_offset = address - mapping.start + mapping.offset
        vaddr = image.file_offset_to_vaddr(file_offset) if image is not None else None
        if vaddr is None:
            return Frame(
                f"{module}+0x{file_offset:x}",
                module=mapping.path,
                kind=FrameKind.NATIVE,
                address=file_offset,
                resolved=False,
            )
        found = image.function_at(vaddr)
        if found is None:
            return Frame(
                f"{module}+0x{vaddr:x}",
                module=mapping.path,
                kind=FrameKind.NATIVE,
                address=vaddr,
                build_id=image.build_id,
                resolved=False,
            )
        return Frame(found[0], module=mapping.path, kind=FrameKind.NATIVE, address=vaddr, build_id=image.build_id)
