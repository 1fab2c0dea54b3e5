"""The GPU probe's ring-buffer records (``bpf/gpu_trace.c``) decoded: entry records become
:class:`~otel_ebpf.gpu.calls.GpuCall` once :class:`CallPairing` has joined them with their return
records; exec and exit records become :class:`ProcessEvent`. Pure: no BPF, tested on bytes
(``tests/test_struct_layouts.py`` checks the formats against the C structs)."""

from __future__ import annotations

import dataclasses
import struct
from collections import OrderedDict
from dataclasses import dataclass

from ..gpu.calls import GpuCall

USER_FRAMES = 32
PY_MAX_FRAMES = 64  # python_stack.h's default
OP_EXEC, OP_EXIT = 0, 255
FLAG_USDT, FLAG_ENTRY, FLAG_RETURN, FLAG_NAME = 1, 2, 4, 8
KERNEL_NAME_LEN = 1024  # gpu_trace.c's: bytes of a kernel name a return record carries, NUL included

_HEADER = struct.Struct("<QQIIIiIi")  # ts, duration, pid, tid, op, ret, flags, user_len
_ARGS = struct.Struct("<7QQ")  # args[7], out
_OUT = struct.Struct("<Q")  # struct gpu_return: the header, then out (gpu_named_return: then the name)
_PY_HEADER = struct.Struct("<II")  # depth, status
_PY_FRAME = struct.Struct("<QQQ")  # code, instr, flags: struct py_frame of python_stack.h


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
