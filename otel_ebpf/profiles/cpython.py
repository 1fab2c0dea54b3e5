"""CPython support: find the interpreter in a process, give the BPF frame walker its offsets, and
turn the code objects it reports into ``function (file:line)``.

Attach time (:func:`detect`): the process's maps name the ELF holding ``_PyRuntime`` (libpython,
or the ``python3.X`` executable when it is linked statically, as Debian's is); its dynamic symbol
table gives ``_PyRuntime``'s address (no debug symbols needed) and the file name or ``Py_Version``
the version. Layout offsets come from per-version tables for 3.10–3.12 (checked against pyenv's
DWARF-carrying builds with ``gdb ptype /o``) and, for 3.13+, from the ``_Py_DebugOffsets`` the
interpreter publishes at the start of ``_PyRuntime``.

Sample time (:class:`CodeResolver`): a code object address is read once from ``/proc/<pid>/mem``
(qualified name, file name, first line, line table) and cached; ``lasti`` maps to a line through
the 3.10 line table or the 3.11+ location table.

:func:`install` writes a process's :class:`PyProc` into the ``py_procs`` map of *any* BCC program
that includes ``bpf/python_stack.h``, which is how the GPU probes reuse the walker.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.profiles.model import Frame, FrameKind
from otel_ebpf.profiles.symbols import ElfImage, ProcessMaps, elf_image

log = logging.getLogger(__name__)

NO_OFFSET = 0xFFFF
PY_V310, PY_V311, PY_V312 = 310, 311, 312  # how frames are decoded; 3.13+ decode as 3.12
OWNED_BY_CSTACK = 3  # 3.12+: the shim frame each _PyEval_EvalFrameDefault call pushes first
STATUS_NOT_PYTHON, STATUS_OK, STATUS_NO_THREAD, STATUS_TRUNCATED = range(4)
MAX_CODE_OBJECTS = 65536
DEBUG_COOKIE = b"xdebugpy"
_INTERPRETER_FILE = re.compile(r"(?:^|/)(?:lib)?python(\d)\.(\d+)[^/]*$")


class PyProc(ctypes.Structure):
    """``struct py_proc`` of bpf/python_stack.h, field for field."""

    _fields_ = [
        ("runtime", ctypes.c_uint64),
        ("version", ctypes.c_uint32),
        ("runtime_interp_head", ctypes.c_uint16),
        ("interp_threads_head", ctypes.c_uint16),
        ("tstate_next", ctypes.c_uint16),
        ("tstate_native_tid", ctypes.c_uint16),
        ("tstate_frame", ctypes.c_uint16),
        ("cframe_current_frame", ctypes.c_uint16),
        ("frame_code", ctypes.c_uint16),
        ("frame_previous", ctypes.c_uint16),
        ("frame_instr", ctypes.c_uint16),
        ("frame_flags", ctypes.c_uint16),
        ("_pad", ctypes.c_uint16 * 3),
    ]


class PyFrame(ctypes.Structure):
    """``struct py_frame``: raw words, decoded by :meth:`CodeResolver.frames`."""

    _fields_ = [("code", ctypes.c_uint64), ("instr", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


RawPyFrame = tuple[int, int, int]  # (code, instr, flags) as the walker read them


def py_stack_type(max_frames: int = 64) -> type[ctypes.Structure]:
    """``struct py_stack`` for a program compiled with ``-DPY_MAX_FRAMES=max_frames``."""

    class PyStack(ctypes.Structure):
        _fields_ = [("depth", ctypes.c_uint32), ("status", ctypes.c_uint32), ("frames", PyFrame * max_frames)]

    return PyStack


@dataclass(frozen=True)
class Layout:
    """Offsets of one CPython minor version (bytes)."""

    walker: int
    runtime_interp_head: int
    interp_threads_head: int
    tstate_next: int
    tstate_native_tid: int
    tstate_frame: int
    cframe_current_frame: int
    frame_code: int
    frame_previous: int
    frame_instr: int
    frame_entry: int
    frame_owner: int
    code_adaptive: int
    # user-space only
    code_filename: int
    code_name: int  # co_qualname where the version has it
    code_firstlineno: int
    code_linetable: int
    unicode_ascii_size: int  # sizeof(PyASCIIObject)
    unicode_compact_size: int  # sizeof(PyCompactUnicodeObject)
    tstate_thread_id: int = NO_OFFSET  # pthread_t (3.10 thread mapping)

    @property
    def flags_window(self) -> int:
        """Start of the 8 bytes the walker copies for the entry/owner flags."""
        marker = self.frame_entry if self.frame_entry != NO_OFFSET else self.frame_owner
        return marker & ~7 if marker != NO_OFFSET else 0

    def is_entry(self, flags: int) -> bool:
        """3.11: the frame's ``is_entry`` byte (from the walker's flags window)."""
        return self.frame_entry != NO_OFFSET and bool((flags >> 8 * (self.frame_entry - self.flags_window)) & 0xFF)

    def is_shim(self, flags: int) -> bool:
        """3.12+: a frame owned by the C stack (pushed at each eval-loop entry, no code of its own)."""
        if self.frame_owner == NO_OFFSET:
            return False
        return (flags >> 8 * (self.frame_owner - self.flags_window)) & 0xFF == OWNED_BY_CSTACK


LAYOUTS: dict[tuple[int, int], Layout] = {
    (3, 10): Layout(
        PY_V310,
        runtime_interp_head=32,
        interp_threads_head=8,
        tstate_next=8,
        tstate_native_tid=NO_OFFSET,
        tstate_frame=24,
        cframe_current_frame=NO_OFFSET,
        frame_code=32,
        frame_previous=24,
        frame_instr=96,
        frame_entry=NO_OFFSET,
        frame_owner=NO_OFFSET,
        code_adaptive=0,
        code_filename=104,
        code_name=112,
        code_firstlineno=40,
        code_linetable=120,
        unicode_ascii_size=48,
        unicode_compact_size=72,
        tstate_thread_id=176,
    ),
    (3, 11): Layout(
        PY_V311,
        runtime_interp_head=40,
        interp_threads_head=16,
        tstate_next=8,
        tstate_native_tid=160,
        tstate_frame=56,
        cframe_current_frame=8,
        frame_code=32,
        frame_previous=48,
        frame_instr=56,
        frame_entry=68,
        frame_owner=NO_OFFSET,
        code_adaptive=184,
        code_filename=112,
        code_name=128,
        code_firstlineno=72,
        code_linetable=136,
        unicode_ascii_size=48,
        unicode_compact_size=72,
    ),
    (3, 12): Layout(
        PY_V312,
        runtime_interp_head=40,
        interp_threads_head=72,
        tstate_next=8,
        tstate_native_tid=144,
        tstate_frame=56,
        cframe_current_frame=0,
        frame_code=0,
        frame_previous=8,
        frame_instr=56,
        frame_entry=NO_OFFSET,
        frame_owner=70,
        code_adaptive=192,
        code_filename=112,
        code_name=128,
        code_firstlineno=68,
        code_linetable=136,
        unicode_ascii_size=40,
        unicode_compact_size=56,
    ),
}


def layout_from_debug_offsets(raw: bytes) -> Layout:
    """The layout a 3.13+ interpreter publishes in ``_Py_DebugOffsets`` (start of ``_PyRuntime``)."""
    if raw[:8] != DEBUG_COOKIE:
        raise ValueError("no _Py_DebugOffsets cookie at _PyRuntime")
    q = struct.unpack_from("<73Q", raw, 0)  # 584 bytes in 3.13; field i is at byte 8*i

    def at(offset: int) -> int:
        return q[offset // 8]

    return Layout(
        PY_V312,
        runtime_interp_head=at(40),
        interp_threads_head=at(72),
        tstate_next=at(168),
        tstate_native_tid=at(200),
        tstate_frame=at(184),
        cframe_current_frame=NO_OFFSET,
        frame_code=at(240),
        frame_previous=at(232),
        frame_instr=at(248),
        frame_entry=NO_OFFSET,
        frame_owner=at(264),
        code_adaptive=at(344),
        code_filename=at(280),
        code_name=at(296),
        code_firstlineno=at(312),
        code_linetable=at(304),
        unicode_ascii_size=at(560),
        unicode_compact_size=at(560) + 16,
    )


@dataclass
class PythonProcess:
    """A CPython process the walker can follow."""

    pid: int
    version: tuple[int, int]
    binary: str  # the ELF holding _PyRuntime, as mapped
    runtime: int  # _PyRuntime's address in the process
    layout: Layout
    pthread_tid_offset: int | None = None  # 3.10: where glibc's struct pthread keeps the tid

    def py_proc(self) -> PyProc:
        lay = self.layout
        return PyProc(
            self.runtime,
            self.version[0] * 100 + self.version[1],
            lay.runtime_interp_head,
            lay.interp_threads_head,
            lay.tstate_next,
            lay.tstate_native_tid,
            lay.tstate_frame,
            lay.cframe_current_frame,
            lay.frame_code,
            lay.frame_previous,
            lay.frame_instr,
            lay.flags_window,
        )


def _version_from_image(image: ElfImage, path: str) -> tuple[int, int] | None:
    match = _INTERPRETER_FILE.search(path)
    if match:
        return int(match.group(1)), int(match.group(2))
    return None


def _interpreter_mapping(maps: ProcessMaps) -> tuple[str, ElfImage] | None:
    """The mapped ELF that defines ``_PyRuntime``: libpython if there is one, else the executable."""
    candidates = {}
    for mapping in maps.mappings:
        name = os.path.basename(mapping.path)
        if mapping.path.startswith("/") and (_INTERPRETER_FILE.search(name) or name.startswith("python")):
            candidates.setdefault(mapping.path, mapping)
    for path in sorted(candidates, key=lambda p: "libpython" not in p):
        image = elf_image(maps.file_path(candidates[path]))
        if image is not None and "_PyRuntime" in image.symbols:
            return path, image
    return None


def read_memory(pid: int, address: int, size: int) -> bytes | None:
    """``size`` bytes of the process's memory, or None (unmapped, process gone)."""
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            data = mem.read(size)
    except (OSError, OverflowError, ValueError):
        return None
    return data if len(data) == size else None


def detect(pid: int) -> PythonProcess | None:
    """The CPython interpreter running in ``pid`` (3.10+), or None when there is none we support."""
    maps = ProcessMaps(pid)
    if not maps.mappings:
        return None
    found = _interpreter_mapping(maps)
    if found is None:
        return None
    path, image = found
    version = _version_from_image(image, path)
    bias = maps.load_bias(path, image)
    if bias is None:
        return None
    runtime = image.symbols["_PyRuntime"] + bias
    if "Py_Version" in image.symbols:  # 3.11+: the exact version, whatever the file is called
        raw = read_memory(pid, image.symbols["Py_Version"] + bias, 4)
        if raw:
            hexversion = struct.unpack("<I", raw)[0]
            version = (hexversion >> 24, (hexversion >> 16) & 0xFF)
    if version is None or not (3, 10) <= version <= (3, 13):
        # 3.14 changed _Py_DebugOffsets and tags f_executable: not walked until supported
        return None
    if version >= (3, 13):
        raw = read_memory(pid, runtime, 584)
        if raw is None:
            return None
        try:
            layout = layout_from_debug_offsets(raw)
        except ValueError:
            return None
    else:
        layout = LAYOUTS.get(version)
        if layout is None:
            return None
    process = PythonProcess(pid, version, path, runtime, layout)
    return process


def install(table: Any, process: PythonProcess) -> None:
    """Put ``process`` into a BCC ``py_procs`` table (of any program including python_stack.h)."""
    table[ctypes.c_uint32(process.pid)] = process.py_proc()


def load_thread_states(bpf: Any, process: PythonProcess) -> int:
    """3.10: put the process's tid -> thread state map into the program's ``py_threads`` (3.11+
    find their thread states themselves). Returns how many threads were written."""
    if process.layout.walker != PY_V310:
        return 0
    table = bpf["py_threads"]
    states = thread_states(process)
    for tid, tstate in states.items():
        table[ctypes.c_uint32(tid)] = ctypes.c_uint64(tstate)
    return len(states)


def register(bpf: Any, pid: int) -> PythonProcess | None:
    """Detect the CPython in ``pid`` and make it walkable by a BCC program built with
    python_stack.h (``py_procs``, and ``py_threads`` for 3.10). None when it is not one we support."""
    process = detect(pid)
    if process is not None:
        install(bpf["py_procs"], process)
        load_thread_states(bpf, process)
    return process


def uninstall(table: Any, pid: int) -> None:
    try:
        del table[ctypes.c_uint32(pid)]
    except KeyError:
        pass


# ---- 3.10 thread states: tid -> PyThreadState* -------------------------------------------------


def _read_u64(pid: int, address: int) -> int | None:
    raw = read_memory(pid, address, 8)
    return struct.unpack("<Q", raw)[0] if raw else None


def thread_states(process: PythonProcess, limit: int = 256) -> dict[int, int]:
    """tid -> thread state address, for 3.10 (whose thread states know only their pthread_t).

    glibc's ``pthread_t`` is the address of its ``struct pthread``, which holds the kernel tid; the
    tid's offset is found once on the main thread, whose tid is the pid."""
    lay, pid = process.layout, process.pid
    interp = _read_u64(pid, process.runtime + lay.runtime_interp_head)
    tstate = _read_u64(pid, interp + lay.interp_threads_head) if interp else None
    states: list[tuple[int, int]] = []
    while tstate and len(states) < limit:
        pthread = _read_u64(pid, tstate + lay.tstate_thread_id)
        if pthread:
            states.append((tstate, pthread))
        tstate = _read_u64(pid, tstate + lay.tstate_next)
    if process.pthread_tid_offset is None:
        for _, pthread in states:
            raw = read_memory(pid, pthread, 1024)
            if raw is None:
                continue
            for offset in range(0, 1024, 4):
                if struct.unpack_from("<i", raw, offset)[0] == pid:
                    process.pthread_tid_offset = offset
                    break
            if process.pthread_tid_offset is not None:
                break
    if process.pthread_tid_offset is None:
        return {}
    result = {}
    for tstate, pthread in states:
        raw = read_memory(pid, pthread + process.pthread_tid_offset, 4)
        if raw:
            result[struct.unpack("<i", raw)[0]] = tstate
    return result


# ---- code objects -> frames -------------------------------------------------------------------


@dataclass
class CodeInfo:
    name: str
    filename: str
    firstlineno: int
    linetable: bytes
    lines: dict[int, int] = field(default_factory=dict)  # lasti -> line, memoized


def read_unicode(pid: int, address: int, layout: Layout, limit: int = 1024) -> str | None:
    """A ``str`` object's text (compact strings: every identifier and file name)."""
    head = read_memory(pid, address, 36)
    if head is None:
        return None
    length, state = struct.unpack_from("<q", head, 16)[0], struct.unpack_from("<I", head, 32)[0]
    kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or length < 0 or kind not in (1, 2, 4):
        return None
    length = min(length, limit)
    data_at = address + (layout.unicode_ascii_size if ascii_ else layout.unicode_compact_size)
    raw = read_memory(pid, data_at, length * kind)
    if raw is None:
        return None
    encoding = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    return raw.decode(encoding, errors="replace")


def read_bytes_object(pid: int, address: int, limit: int = 1 << 16) -> bytes | None:
    head = read_memory(pid, address, 24)
    if head is None:
        return None
    size = struct.unpack_from("<q", head, 16)[0]
    if size < 0 or size > limit:
        return None
    return read_memory(pid, address + 32, size) if size else b""


def _varint(table: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while i < len(table):
        byte = table[i]
        i += 1
        value |= (byte & 63) << shift
        shift += 6
        if not byte & 64:
            break
    return value, i


def _svarint(table: bytes, i: int) -> tuple[int, int]:
    value, i = _varint(table, i)
    return (-(value >> 1) if value & 1 else value >> 1), i


def line_311(table: bytes, firstlineno: int, lasti: int) -> int:
    """Line of instruction ``lasti`` (code units) from a 3.11+ location table (Objects/locations.md)."""
    if lasti < 0:
        return firstlineno
    line, unit, i = firstlineno, 0, 0
    while i < len(table):
        first = table[i]
        i += 1
        code, length = (first >> 3) & 15, (first & 7) + 1
        this_line: int | None = line
        if code == 15:  # no location
            this_line = None
        elif code == 14:  # long form
            delta, i = _svarint(table, i)
            line += delta
            this_line = line
            for _ in range(3):
                _, i = _varint(table, i)
        elif code == 13:  # no column
            delta, i = _svarint(table, i)
            line += delta
            this_line = line
        elif code >= 10:  # one-line form: line delta in the code, then two column bytes
            line += code - 10
            this_line = line
            i += 2
        else:  # short form: same line, one column byte
            i += 1
        if unit <= lasti < unit + length:
            return this_line if this_line is not None else 0
        unit += length
    return 0


def line_310(table: bytes, firstlineno: int, lasti: int) -> int:
    """Line of instruction ``lasti`` (code units) from a 3.10 line table (byte-offset deltas)."""
    if lasti < 0:
        return firstlineno
    target, start, line = lasti * 2, 0, firstlineno
    for i in range(0, len(table) - 1, 2):
        sdelta, ldelta = table[i], struct.unpack_from("b", table, i + 1)[0]
        end = start + sdelta
        if ldelta != -128:
            line += ldelta
        if start <= target < end:
            return line if ldelta != -128 else 0
        start = end
    return 0


class CodeResolver:
    """(pid, code object, lasti) -> Python :class:`Frame`, reading each code object once."""

    def __init__(self, capacity: int = MAX_CODE_OBJECTS) -> None:
        self._capacity = capacity
        self._codes: OrderedDict[tuple[int, int], CodeInfo | None] = OrderedDict()
        self.errors = 0  # code objects that could not be read (exited process, freed object)

    def forget(self, pid: int) -> None:
        for key in [k for k in self._codes if k[0] == pid]:
            del self._codes[key]

    def code(self, process: PythonProcess, address: int) -> CodeInfo | None:
        key = (process.pid, address)
        if key in self._codes:
            self._codes.move_to_end(key)
            return self._codes[key]
        info = self._read(process, address)
        if info is None:
            self.errors += 1
        self._codes[key] = info
        if len(self._codes) > self._capacity:
            self._codes.popitem(last=False)
        return info

    @staticmethod
    def _read(process: PythonProcess, address: int) -> CodeInfo | None:
        lay, pid = process.layout, process.pid
        fields = read_memory(pid, address, max(lay.code_linetable, lay.code_name, lay.code_filename) + 8)
        if fields is None:
            return None

        def ptr(offset: int) -> int:
            return struct.unpack_from("<Q", fields, offset)[0]

        name = read_unicode(pid, ptr(lay.code_name), lay)
        filename = read_unicode(pid, ptr(lay.code_filename), lay)
        if name is None or filename is None:
            return None
        firstlineno = struct.unpack_from("<i", fields, lay.code_firstlineno)[0]
        linetable = read_bytes_object(pid, ptr(lay.code_linetable)) or b""
        return CodeInfo(name, filename, firstlineno, linetable)

    def frames(self, process: PythonProcess, raw: Sequence[RawPyFrame]) -> tuple[list[Frame], list[bool]]:
        """Decode the walker's frames (leaf first): Python frames, and for each whether it is the
        first frame of a ``_PyEval_EvalFrameDefault`` call (what :func:`merge.merge` splices on)."""
        lay = process.layout
        frames: list[Frame] = []
        entries: list[bool] = []
        for code, instr, flags in raw:
            if lay.walker == PY_V310:
                lasti = ctypes.c_int32(instr & 0xFFFFFFFF).value
                frames.append(self.frame(process, code, lasti))
                entries.append(True)  # one eval call per 3.10 frame
                continue
            if lay.is_shim(flags):
                if entries:
                    entries[-1] = True
                continue
            if not code:
                break
            lasti = (instr - code - lay.code_adaptive) // 2 if instr else -1
            frames.append(self.frame(process, code, lasti))
            entries.append(lay.is_entry(flags))
        return frames, entries

    def frame(self, process: PythonProcess, address: int, lasti: int) -> Frame:
        info = self.code(process, address)
        if info is None:
            return Frame(f"<unknown code 0x{address:x}>", kind=FrameKind.PYTHON, resolved=False)
        line = info.lines.get(lasti)
        if line is None:
            table_line = line_310 if process.layout.walker == PY_V310 else line_311
            line = table_line(info.linetable, info.firstlineno, lasti)
            if len(info.lines) < 4096:
                info.lines[lasti] = line
        return Frame(info.name, file=info.filename, line=line, kind=FrameKind.PYTHON)
