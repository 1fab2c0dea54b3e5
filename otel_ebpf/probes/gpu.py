"""GPU probe: finds CUDA, NCCL and PyTorch libraries in target processes, hooks them with
``bpf/gpu_trace.c``, and yields decoded :class:`~otel_ebpf.gpu.calls.GpuCall` records.

Discovery works like the TLS probe's (:mod:`.tls`): a uprobe belongs to a file, so every distinct
file (device, inode) that processes map executable code from is looked at once. A file is hooked
for whichever of the functions in :data:`~otel_ebpf.gpu.calls.FUNCTION_SYMBOLS` it defines —
``libcudart.so.12`` from a wheel, the driver's ``libcuda.so.1``, ``libnccl.so.2``, or any
executable or library with cudart linked in statically — and for PyTorch's USDT probes
(``pytorch:malloc`` / ``pytorch:free`` in ``libc10_cuda.so``), found in its ``.note.stapsdt``.
Processes load these libraries late (``import torch`` seconds after exec), so maps are rescanned
every :data:`RESCAN_S` and at once when a process execs; nobody restarts anything.

USDT probes are semaphore-gated: they are attached with the kernel's reference-counter support
(``ref_ctr_offset``), which raises the semaphore in every process that maps the file, now or
later. Where each probe's arguments live is build-specific ("8@%rax", "-4@-20(%rbp)"): the notes
are parsed here and the locations handed to BPF through ``usdt_specs``; each of a few slots has
its own BPF programs, so libraries built differently can be hooked side by side.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import re
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .. import procfs
from ..config import AgentConfig, TargetsConfig
from ..containers import ContainerResolver
from ..gpu.calls import BY_SYMBOL, FUNCTION_SYMBOLS, OPS, USDT_PROBES, GpuCall, Library
from ..resources import ProcessResources
from ..selfmetrics import SelfMetrics
from .compiler_memory import release_compiler_memory
from .loading import inline_headers, pid_namespace_flags, ring_buffer_pages, write_settings
from .tls import mapped_files

log = logging.getLogger(__name__)

RESCAN_S = 1.0
USER_FRAMES = 32
PY_MAX_FRAMES = 64  # python_stack.h's default
USDT_SLOTS = 8  # programs usdt_torch_{malloc,free}_N in gpu_trace.c
SET_FILTER_PIDS, SET_AGENT_TGID, SET_STACKS = 0, 1, 2
STACKS_NATIVE, STACKS_PYTHON = 1, 2
STAT_NAMES = ("gpu_ringbuf_full", "gpu_nested_calls", "gpu_returns_without_entry", "gpu_python_stack_truncated")
OP_EXEC, OP_EXIT = 0, 255
FLAG_USDT, FLAG_ENTRY, FLAG_RETURN, FLAG_NAME = 1, 2, 4, 8
KERNEL_NAME_LEN = 1024  # gpu_trace.c's: bytes of a kernel name a return record carries, NUL included
SYMBOL_PATTERN = "^(%s)$" % "|".join(FUNCTION_SYMBOLS)
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

_HEADER = struct.Struct("<QQIIIiIi")  # ts, duration, pid, tid, op, ret, flags, user_len
_ARGS = struct.Struct("<7QQ")  # args[7], out
_OUT = struct.Struct("<Q")  # struct gpu_return: the header, then out (gpu_named_return: then the name)
_PY_HEADER = struct.Struct("<II")  # depth, status
_PY_FRAME = struct.Struct("<QQQ")  # code, instr, flags: struct py_frame of python_stack.h


# ---- USDT notes ------------------------------------------------------------------------------


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


# ---- discovery ---------------------------------------------------------------------------------


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


def _gpu_symbols(path: str) -> set[str]:
    """Which hooked functions ``path`` defines (BCC reads its symbol tables)."""
    from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

    try:
        found = BPF.get_user_functions_and_addresses(path.encode(), SYMBOL_PATTERN.encode())
        return {name.decode() for name, _ in found}
    except Exception:  # noqa: BLE001 — not an ELF file, or unreadable: no symbols
        return set()


# ---- decoding ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessEvent:
    ts_ns: int
    pid: int
    exited: bool  # False: exec


def event_size(py_frames: int) -> int:
    """Bytes of a record with ``py_frames`` Python frames."""
    return _HEADER.size + _ARGS.size + 8 * USER_FRAMES + _PY_HEADER.size + _PY_FRAME.size * py_frames


@dataclass(frozen=True)
class CallReturn:
    """The return record of a call whose entry came as a :class:`GpuCall` with ``ret`` unset."""

    ts_ns: int  # the entry's, to pair with it
    pid: int
    tid: int
    op: int
    ret: int
    duration_ns: int
    out: int
    name: str = ""  # the kernel name the call was given (FLAG_NAME)


def decode(raw: bytes, clock_offset_ns: int, py_frames: int) -> GpuCall | CallReturn | ProcessEvent | None:
    """One ring-buffer record. ``py_frames`` is the PY_MAX_FRAMES the program was built with; an
    entry record carries only the Python frames there are (``depth``)."""
    if len(raw) < _HEADER.size:
        return None
    ts, duration, pid, tid, op, ret, flags, user_len = _HEADER.unpack_from(raw)
    ts += clock_offset_ns
    if flags & FLAG_RETURN:
        if len(raw) < _HEADER.size + _OUT.size:
            return None
        name = raw[_HEADER.size + _OUT.size :].split(b"\0", 1)[0] if flags & FLAG_NAME else b""
        out = _OUT.unpack_from(raw, _HEADER.size)[0]
        return CallReturn(ts, pid, tid, op, ret, duration, out, name.decode(errors="replace"))
    if op in (OP_EXEC, OP_EXIT):
        return ProcessEvent(ts, pid, op == OP_EXIT)
    if len(raw) < event_size(0):
        return None
    values = _ARGS.unpack_from(raw, _HEADER.size)
    pos = _HEADER.size + _ARGS.size
    user = struct.unpack_from(f"<{max(0, min(user_len, 8 * USER_FRAMES)) // 8}Q", raw, pos) if user_len > 0 else ()
    pos += 8 * USER_FRAMES
    depth, status = _PY_HEADER.unpack_from(raw, pos)
    pos += _PY_HEADER.size
    depth = min(depth, py_frames, (len(raw) - pos) // _PY_FRAME.size)
    python = tuple(_PY_FRAME.unpack_from(raw, pos + i * _PY_FRAME.size) for i in range(depth))
    return GpuCall(
        ts, 0 if flags & FLAG_USDT else duration, pid, tid, op, ret, values[:7], values[7], user, python, status
    )


class CallPairing:
    """Joins entry records with their return records on (tid, op, entry time). Bounded: an entry
    whose return never comes (the thread died in the call, or the return record was lost) is
    dropped once ``capacity`` newer entries wait, and counted; so is a return without its entry."""

    def __init__(self, capacity: int = 65536) -> None:
        self._waiting: OrderedDict[tuple[int, int, int], GpuCall] = OrderedDict()
        self._capacity = capacity
        self.entries_unpaired = 0
        self.returns_unpaired = 0

    def entry(self, call: GpuCall) -> None:
        self._waiting[(call.tid, call.op, call.ts_ns)] = call
        if len(self._waiting) > self._capacity:
            self._waiting.popitem(last=False)
            self.entries_unpaired += 1

    def complete(self, ret: CallReturn) -> GpuCall | None:
        call = self._waiting.pop((ret.tid, ret.op, ret.ts_ns), None)
        if call is None:
            self.returns_unpaired += 1
            return None
        return dataclasses.replace(call, ret=ret.ret, duration_ns=ret.duration_ns, out=ret.out, name=ret.name)


# ---- the probe ---------------------------------------------------------------------------------


class _BccUprobes:
    """libbcc's ``bpf_attach_uprobe`` with its last parameter, ``ref_ctr_offset`` (the USDT
    semaphore), which BCC's Python binding leaves out."""

    def __init__(self) -> None:
        from bcc.libbcc import lib  # noqa: PLC0415

        self._attach = ctypes.CFUNCTYPE(
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_uint32,
        )(("bpf_attach_uprobe", lib))

    def attach(self, bpf: Any, fn_name: str, path: str, offset: int, ref_ctr_offset: int) -> None:
        from bcc import BPF  # noqa: PLC0415

        fn = bpf.load_func(fn_name.encode(), BPF.KPROBE)
        ev_name = bpf._get_uprobe_evname(b"p", path.encode(), offset, -1)  # noqa: SLF001
        fd = self._attach(fn.fd, 0, ev_name, path.encode(), offset, -1, ref_ctr_offset)
        if fd < 0:
            raise RuntimeError(f"cannot attach USDT probe at {path}+0x{offset:x}")
        bpf._add_uprobe_fd(ev_name, fd)  # noqa: SLF001 — detached by cleanup()


class GpuProbe:
    """Kernel side of the GPU views. ``poll`` returns decoded calls and process events."""

    def __init__(
        self, targets: TargetsConfig, *, stacks: str = "python", ring_buffer_kb: int = 4096, max_targets: int = 1024
    ) -> None:
        self.targets = targets
        self.stacks = stacks  # "none", "native", "python" (native + Python)
        self.ring_buffer_kb = ring_buffer_kb
        self.max_targets = max_targets
        self.python_stacks = False  # whether the loaded program walks Python frames
        self._py_frames = 0
        self._bpf: Any = None  # the BPF program (bcc.BPF, untyped: see loading.compile_program) once started
        self._attacher: GpuAttacher | None = None
        self._usdt_slots: dict[tuple[int, int], int] = {}  # (dev, ino) of a file -> slot
        self._usdt_attach = None
        self._out: list[GpuCall | ProcessEvent] = []
        self._target_pids: set[int] = set()
        self.gpu_pids: set[int] = set()  # processes that map a hooked library (their stacks matter)
        self._pairing = CallPairing()
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()

    def start(self) -> None:
        """Compile, configure, attach to what target processes map now. Raises RuntimeError."""
        from bcc import BPF  # noqa: PLC0415

        bpf_dir = resources.files("otel_ebpf.bpf")
        source = inline_headers(bpf_dir.joinpath("gpu_trace.c").read_text())
        pages = ring_buffer_pages(self.ring_buffer_kb)
        cflags = [
            f"-DRINGBUF_PAGES={pages}",
            f"-DUSER_FRAMES={USER_FRAMES}",
            f"-DKERNEL_NAME_LEN={KERNEL_NAME_LEN}",
            f"-DMAX_TARGETS={self.max_targets}",
            "-Wno-macro-redefined",
            *pid_namespace_flags(),
        ]
        attempts = [True, False] if self.stacks == "python" else [False]
        error: Exception | None = None
        for python in attempts:
            try:
                bpf = BPF(text=source, cflags=cflags + (["-DPYTHON_STACKS"] if python else []))
                bpf.load_func(b"enter_cudaMalloc", BPF.KPROBE)  # the verifier's verdict, now
                bpf.load_func(b"usdt_torch_malloc_0", BPF.KPROBE)
            except Exception as exc:  # noqa: BLE001 — BCC raises bare Exception with the compiler's or verifier's verdict
                error = exc
                if python:
                    log.warning(
                        "GPU: Python stacks unavailable (python_stack.h did not load: %s); native stacks only",
                        str(exc).splitlines()[0] if str(exc) else exc,
                    )
                continue
            self._bpf, self.python_stacks = bpf, python
            self._py_frames = PY_MAX_FRAMES if python else 0
            break
        if self._bpf is None:
            raise RuntimeError(f"cannot load the GPU probe: {error} (run `otel-ebpf doctor`)") from error
        release_compiler_memory()
        mode = {"none": 0, "native": STACKS_NATIVE, "python": STACKS_NATIVE | STACKS_PYTHON}[self.stacks]
        write_settings(
            self._bpf, {SET_AGENT_TGID: os.getpid(), SET_FILTER_PIDS: self.targets.selects_processes, SET_STACKS: mode}
        )
        for pid in {*self.targets.pids, *procfs.matching_pids(self.targets.executables)}:
            self.add_target(pid)
        self._bpf["gpu_events"].open_ring_buffer(self._on_event)
        self._usdt_attach = _BccUprobes()
        self._attacher = GpuAttacher(_gpu_symbols, read_usdt_probes, self._attach_function, self._attach_usdt)
        self.gpu_pids |= self._attacher.scan(self._scan_pids())

    @property
    def bpf(self) -> Any:
        """The loaded BPF object (its ``py_procs`` / ``py_threads`` maps are filled by the
        CPython stack support)."""
        return self._bpf

    @property
    def libraries(self) -> GpuLibraries:
        assert self._attacher is not None
        return self._attacher.libraries

    def _scan_pids(self) -> set[int]:
        if self.targets.selects_processes:
            return {pid for pid in self._target_pids if os.path.exists(f"/proc/{pid}")}
        return set(procfs.iter_pids()) - {os.getpid()}

    def add_target(self, pid: int) -> None:
        self._target_pids.add(pid)
        self._bpf["targets"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def _attach_function(self, path: str, symbol: str) -> None:
        self._bpf.attach_uprobe(name=path, sym=symbol, fn_name=f"enter_{symbol}")
        self._bpf.attach_uretprobe(name=path, sym=symbol, fn_name=f"return_{symbol}")

    def _attach_usdt(self, path: str, probe: UsdtProbe) -> None:
        st = os.stat(path)
        slot = self._usdt_slots.get((st.st_dev, st.st_ino))
        if slot is None:
            if len(self._usdt_slots) >= USDT_SLOTS:
                raise RuntimeError(f"more than {USDT_SLOTS} differently built PyTorch libraries; {path} not hooked")
            slot = self._usdt_slots[(st.st_dev, st.st_ino)] = len(self._usdt_slots)
        is_free = probe.name == "free"
        spec = self._bpf["usdt_specs"].Leaf()
        for i, arg in enumerate(probe.args[:4]):
            spec.args[i].kind, spec.args[i].reg, spec.args[i].value = arg.kind, arg.reg, arg.value
        self._bpf["usdt_specs"][ctypes.c_int(slot * 2 + int(is_free))] = spec
        program = f"usdt_torch_{probe.name}_{slot}"
        self._usdt_attach.attach(self._bpf, program, path, probe.offset, probe.semaphore_offset)

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def poll(self, timeout_ms: int) -> list[GpuCall | ProcessEvent]:
        """Wait up to ``timeout_ms`` for events; return what arrived. Rescans maps when due."""
        self._bpf.ring_buffer_poll(timeout_ms)
        self._bpf.ring_buffer_consume()
        out, self._out = self._out, []
        execs = {e.pid for e in out if isinstance(e, ProcessEvent) and not e.exited}
        if execs and self.targets.executables:
            for pid in execs:
                if procfs.executable_matches(pid, self.targets.executables):
                    self.add_target(pid)
        if self._attacher.scan_due():
            self.gpu_pids = self._attacher.scan(self._scan_pids())
        elif execs:
            # A fresh image maps its libraries at once; dlopen-ed ones come with the next rescan.
            self.gpu_pids |= self._attacher.scan(
                execs & self._target_pids if self.targets.selects_processes else execs, False
            )
        return out

    def _on_event(self, _ctx: int, data: int, size: int) -> None:
        event = decode(ctypes.string_at(data, size), self.clock_offset_ns, self._py_frames)
        if isinstance(event, CallReturn):
            event = self._pairing.complete(event)
        elif isinstance(event, GpuCall) and not OPS[event.op].usdt:
            self._pairing.entry(event)  # completed by its return record
            return
        if event is not None:
            self._out.append(event)

    def kernel_stats(self) -> dict[str, int]:
        table = self._bpf["stats"]
        stats = {name: sum(table[ctypes.c_int(i)]) for i, name in enumerate(STAT_NAMES)}
        stats["gpu_entries_without_return"] = self._pairing.entries_unpaired
        stats["gpu_returns_unpaired"] = self._pairing.returns_unpaired
        return stats


class StackCache:
    """Resolved stacks by their raw form, bounded (LRU): a training loop repeats few stacks."""

    def __init__(self, resolve: Callable[[GpuCall], tuple], capacity: int = 50_000) -> None:
        self._resolve = resolve
        self._cache: OrderedDict[tuple, tuple] = OrderedDict()
        self._capacity = capacity

    def __call__(self, call: GpuCall) -> tuple:
        key = (call.pid, call.user_stack, call.python_stack)
        stack = self._cache.get(key)
        if stack is None:
            stack = self._cache[key] = self._resolve(call)
            if len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return stack

    def forget(self, pid: int) -> None:
        for key in [k for k in self._cache if k[0] == pid]:
            del self._cache[key]


def native_stack(symbolizer: object, call: GpuCall) -> tuple:
    """Frames of the native stack, leaf first (return addresses point after the call: minus one)."""
    frames = []
    for i, address in enumerate(call.user_stack):
        frames.append(symbolizer.user_frame(call.pid, address if i == 0 else address - 1))
    return tuple(frames)


# ---- what the agent drives -------------------------------------------------------------------

GPU_LIBRARY_NAME = re.compile(rb"/(libcudart|libcuda|libnccl|libc10_cuda|libtorch_cuda)[^/\n]*\.so")
AUTO_FULL_RESCAN_S = 10.0  # gpu.enabled=auto: every process's maps this often, new processes every second
MAX_PENDING = 10_000  # NCCL calls waiting for trace assembly; past it they go unlinked-or-linked now


def maps_gpu_library(pid: int) -> bool:
    """Whether ``pid`` maps a GPU library by its usual file name (``gpu.enabled: auto`` waits for
    one before compiling the probe; statically linked cudart needs ``gpu.enabled: true``)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            return GPU_LIBRARY_NAME.search(maps.read()) is not None
    except OSError:
        return False


class GpuMonitor:
    """The GPU probe, stack resolution and :class:`~otel_ebpf.gpu.views.GpuViews`, as the agent
    drives them: ``poll`` often, ``collect_metrics`` / ``take_profiles`` / ``check_leaks`` on
    their intervals, ``close`` at the end.

    ``mode`` is ``gpu.enabled``: ``true`` loads the probe now; ``auto`` loads it once a target
    process maps a GPU library by name (so an agent on a machine without GPU work pays nothing).
    """

    def __init__(
        self,
        config: AgentConfig,
        selfmetrics: SelfMetrics,
        host_name: str,
        delta_kinds: frozenset = frozenset(),
        profile_sink: object | None = None,
        link_for: Callable[[int, int], tuple[int, int] | None] | None = None,
        export_spans: Callable[[list], None] | None = None,
    ) -> None:
        """``profile_sink``: a :class:`~otel_ebpf.profiles.exporter.ProfileSink` to share (the CPU
        profiler's, which owns it); by default the monitor builds and owns its own.
        ``link_for(pid, tid)``: the (trace id, span id) of the request a thread serves now (the
        trace assembler's); NCCL calls made under one become its child spans, handed to
        ``export_spans``."""
        from ..gpu.views import GpuViews, GpuViewsConfig  # noqa: PLC0415
        from ..profiles.symbols import Symbolizer  # noqa: PLC0415

        self.config = config
        self.mode = config.gpu.enabled
        self._selfmetrics = selfmetrics
        self.probe = GpuProbe(
            config.targets,
            stacks=config.gpu.stacks,
            ring_buffer_kb=config.gpu.ring_buffer_kb,
            max_targets=config.capture.max_processes,
        )
        self._symbolizer = Symbolizer()
        self._code_resolver = None
        self._pythons: dict[int, object | None] = {}  # pid -> cpython.PythonProcess (None: not CPython)
        self._resources = ProcessResources(
            config.resource.attributes, host_name, ContainerResolver(str(config.resource.host_root))
        )
        self._stacks = StackCache(self._resolve_stack)
        views_config = GpuViewsConfig(
            leak_age_ns=int(config.gpu.leak_age_s * 1e9),
            leak_min_count=config.gpu.leak_min_allocations,
            max_allocations=config.gpu.max_allocations,
            max_stacks=config.gpu.max_stacks,
        )
        self.views = GpuViews(
            self._stacks, self._resources.of, selfmetrics, views_config, delta_kinds, self._kernel_name
        )
        self.started = False
        self._next_check = 0.0
        self._next_full_check = 0.0
        self._checked: set[int] = set()
        self._owns_profile_sink = profile_sink is None
        self._profile_sink = profile_sink
        self._log_sink = None
        self._next_profiles = time.monotonic() + config.gpu.interval_s
        self._leak_check_s = max(0.1, min(config.gpu.interval_s, config.gpu.leak_age_s / 4))
        self._next_leak_check = time.monotonic() + self._leak_check_s
        self._next_stats = 0.0
        self._link_for = link_for
        self._export_spans = export_spans
        self._pending_nccl: deque[GpuCall] = deque()  # waiting for trace assembly to catch up

    def start(self) -> None:
        """Load now (``true``), or when a target maps a GPU library (``auto``)."""
        if self.mode == "true" or self._gpu_library_appeared():
            self._load()

    def _gpu_library_appeared(self) -> bool:
        """``auto``: whether a target maps a GPU library now. New processes are looked at every
        call, all of them every AUTO_FULL_RESCAN_S (a running job may import torch late)."""
        pids = self._candidate_pids()
        now = time.monotonic()
        if now >= self._next_full_check:
            self._next_full_check = now + AUTO_FULL_RESCAN_S
            fresh = pids
        else:
            fresh = pids - self._checked
        self._checked = pids
        return any(maps_gpu_library(pid) for pid in fresh)

    def _candidate_pids(self) -> set[int]:
        targets = self.config.targets
        if targets.pids or targets.executables:
            return {*targets.pids, *procfs.matching_pids(targets.executables)}
        return set(procfs.iter_pids()) - {os.getpid()}

    def _load(self) -> None:
        from ..exporters.logs import build_log_sink  # noqa: PLC0415
        from ..profiles.exporter import build_profile_sink  # noqa: PLC0415

        self.probe.start()
        if self._profile_sink is None:
            self._profile_sink = build_profile_sink(self.config, self._selfmetrics)
        self._log_sink = build_log_sink(self.config, self._selfmetrics)
        self.started = True
        log.info(
            "GPU probe attached (stacks: %s%s)",
            self.config.gpu.stacks,
            "" if self.probe.python_stacks or self.config.gpu.stacks != "python" else ", Python frames unavailable",
        )
        self._install_pythons()

    def poll(self, timeout_ms: int = 0, horizon_ns: int | None = None) -> int:
        """Handle what the kernel sent; returns the number of calls. ``horizon_ns``: how far (Unix
        time) trace assembly has seen socket events — NCCL calls after it wait, so that the
        request their thread was serving *then* is known (see ``link_for``)."""
        if not self.started:
            if self.mode == "auto" and time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + RESCAN_S
                if self._gpu_library_appeared():
                    self._load()
            return 0
        calls = 0
        exited: list[int] = []
        for event in self.probe.poll(timeout_ms):
            if isinstance(event, ProcessEvent):
                if event.exited:
                    exited.append(event.pid)
                else:  # a new image: what we knew of the pid is stale
                    self._forget(event.pid)
                    self.views.image_replaced(event.pid)
                continue
            calls += 1
            self.views.handle(event)
            if self._link_for is not None and event.spec.library is Library.NCCL:
                self._pending_nccl.append(event)
        self._selfmetrics.add("otel_ebpf.gpu.calls", calls)
        self._nccl_spans(horizon_ns)
        if exited:
            self._exported_at_exit(exited)
        self._install_pythons()
        self._periodic()
        return calls

    def _nccl_spans(self, horizon_ns: int | None) -> None:
        from ..gpu.spans import collective_span  # noqa: PLC0415

        spans = []
        pending = self._pending_nccl
        while pending and (horizon_ns is None or pending[0].ts_ns <= horizon_ns or len(pending) > MAX_PENDING):
            call = pending.popleft()
            parent = self._link_for(call.pid, call.tid)
            if parent is None:
                continue
            spec = call.spec
            rank = self.views.rank_of(call.pid, call.arg(spec.comm_arg)) if spec.comm_arg is not None else None
            span = collective_span(call, parent, self._resources.of(call.pid), rank)
            if span is not None:
                spans.append(span)
        if spans:
            self._export_spans(spans)

    def _periodic(self, final: bool = False) -> None:
        now = time.monotonic()
        if final or now >= self._next_leak_check:
            self._next_leak_check = now + self._leak_check_s
            self._log_sink.export(self.views.check_leaks(time.time_ns()))
        if final or now >= self._next_profiles:
            self._next_profiles = now + self.config.gpu.interval_s
            self._profile_sink.export(self.views.take_profiles(time.time_ns()))
        if final or now >= self._next_stats:  # per-CPU map reads: not every poll
            self._next_stats = now + 1.0
            for reason, total in self.kernel_stats().items():
                self._selfmetrics.set("otel_ebpf.kernel.drops", total, {"reason": reason})

    def _exported_at_exit(self, pids: list[int]) -> None:
        """Exited processes' GPU state, exported now: a process that leaks and exits between two
        intervals would otherwise leave no in-use profile at all."""
        self._profile_sink.export(self.views.processes_exited(pids, time.time_ns()))
        for pid in pids:
            self._forget(pid)

    def _forget(self, pid: int) -> None:
        self._pythons.pop(pid, None)
        self._resources.pop(pid)
        self._stacks.forget(pid)
        self._symbolizer.forget(pid)
        if self._code_resolver is not None:
            self._code_resolver.forget(pid)

    def _install_pythons(self) -> None:
        """Python stacks need the interpreter's address and layout per process, in py_procs."""
        if not self.probe.python_stacks:
            return
        from ..profiles import cpython  # noqa: PLC0415

        for pid in self.probe.gpu_pids - self._pythons.keys():
            process = cpython.detect(pid)
            self._pythons[pid] = process
            if process is None:
                continue
            cpython.install(self.probe.bpf["py_procs"], process)
            if process.layout.walker == cpython.PY_V310:
                for tid, tstate in cpython.thread_states(process).items():
                    self.probe.bpf["py_threads"][ctypes.c_uint32(tid)] = ctypes.c_uint64(tstate)

    def _kernel_name(self, pid: int, address: int) -> str | None:
        """What nvcc's host stub at ``address`` is named after: its kernel (demangled)."""
        frame = self._symbolizer.user_frame(pid, address)
        return frame.function if frame.resolved else None

    def _resolve_stack(self, call: GpuCall) -> tuple:
        from ..profiles import merge  # noqa: PLC0415

        native = native_stack(self._symbolizer, call)
        process = self._pythons.get(call.pid)
        if process is None or not call.python_stack:
            return native
        if self._code_resolver is None:
            from ..profiles.cpython import CodeResolver  # noqa: PLC0415

            self._code_resolver = CodeResolver()
        python, entries = self._code_resolver.frames(process, call.python_stack)
        return merge.merge((), native, python, entries, process.binary)

    def collect_metrics(self, now_ns: int) -> list:
        return self.views.collect_metrics(now_ns)

    def take_profiles(self, now_ns: int) -> list:
        return self.views.take_profiles(now_ns)

    def check_leaks(self, now_ns: int) -> list:
        return self.views.check_leaks(now_ns)

    def kernel_stats(self) -> dict[str, int]:
        if not self.started:
            return {}
        stats = self.probe.kernel_stats()
        for library, count in self.probe.libraries.by_library().items():
            self._selfmetrics.set("otel_ebpf.gpu.libraries", count, {"library": library})
        return stats

    def close(self, timeout_s: float = 5.0) -> None:
        """Take what the kernel still holds, export the last profiles and leak reports, detach."""
        if self.started:
            self.poll(0)
            self._nccl_spans(None)
            self._periodic(final=True)
            self.probe.close()
            self._log_sink.shutdown(timeout_s)
            if self._owns_profile_sink:
                self._profile_sink.shutdown(timeout_s)


__all__ = [
    "CallPairing",
    "CallReturn",
    "GpuAttacher",
    "GpuLibraries",
    "GpuMonitor",
    "GpuProbe",
    "ProcessEvent",
    "StackCache",
    "UsdtProbe",
    "decode",
    "maps_gpu_library",
    "native_stack",
    "parse_usdt_args",
    "read_usdt_probes",
]
