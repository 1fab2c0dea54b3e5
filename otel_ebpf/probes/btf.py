"""Struct member offsets from the running kernel's BTF (``/sys/kernel/btf/vmlinux``).

BCC compiles against whatever kernel headers are installed, which need not match the running
kernel's struct layouts; a program that must read kernel structs (the model-file guard) takes its
offsets from here instead and gets them as ``-D`` constants. The format is the kernel's
(Documentation/bpf/btf.rst): a header, a type section of variable-length records, a string section.
Only what lookups need is kept: struct/union names, their members, the types they refer to, and
function names (the attach target of an LSM program is a function's type id).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")

_MAGIC = 0xEB9F
_HEADER = struct.Struct("<HBBIIIII")
_TYPE = struct.Struct("<III")
_MEMBER = struct.Struct("<III")

_INT, _PTR, _ARRAY, _STRUCT, _UNION, _ENUM, _FWD, _TYPEDEF, _VOLATILE, _CONST, _RESTRICT = range(1, 12)
_FUNC, _FUNC_PROTO, _VAR, _DATASEC, _FLOAT, _DECL_TAG, _TYPE_TAG, _ENUM64 = range(12, 20)
# Bytes after the 12-byte common record: fixed, and per vlen item.
_EXTRA = {
    _INT: (4, 0),
    _ARRAY: (12, 0),
    _STRUCT: (0, 12),
    _UNION: (0, 12),
    _ENUM: (0, 8),
    _FUNC_PROTO: (0, 8),
    _VAR: (4, 0),
    _DATASEC: (0, 12),
    _DECL_TAG: (4, 0),
    _ENUM64: (0, 12),
}
_MODIFIERS = (_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG)


class BtfError(RuntimeError):
    """The BTF is missing, malformed, or lacks a struct or member asked for."""


@dataclass(frozen=True)
class _Type:
    kind: int
    name: str
    ref: int  # the referred type (pointers, modifiers); 0 for others
    members: tuple[tuple[str, int, int], ...]  # (name, type id, bit offset) for structs/unions


class Btf:
    """The types of one BTF blob, looked up by struct name."""

    def __init__(self, data: bytes) -> None:
        if len(data) < _HEADER.size:
            raise BtfError("BTF too short")
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise BtfError(f"not BTF (magic {magic:#x}; big-endian BTF is not supported)")
        strings = data[hdr_len + str_off : hdr_len + str_off + str_len]
        self._types: list[_Type | None] = [None]  # type id 0 is void
        self._structs: dict[str, int] = {}
        self._funcs: dict[str, int] = {}
        position, end = hdr_len + type_off, hdr_len + type_off + type_len
        while position < end:
            name_off, info, size_or_type = _TYPE.unpack_from(data, position)
            position += _TYPE.size
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            fixed, per_item = _EXTRA.get(kind, (0, 0))
            members: tuple[tuple[str, int, int], ...] = ()
            if kind in (_STRUCT, _UNION):
                bitfields = bool(info >> 31)
                members = tuple(
                    (_string(strings, m_name), m_type, m_offset & 0xFFFFFF if bitfields else m_offset)
                    for m_name, m_type, m_offset in (_MEMBER.unpack_from(data, position + 12 * i) for i in range(vlen))
                )
            position += fixed + per_item * vlen
            name = _string(strings, name_off)
            ref = size_or_type if kind == _PTR or kind in _MODIFIERS else 0
            self._types.append(_Type(kind, name, ref, members))
            if kind == _STRUCT and name and name not in self._structs:
                self._structs[name] = len(self._types) - 1
            elif kind == _FUNC and name:
                self._funcs.setdefault(name, len(self._types) - 1)
        if position != end:
            raise BtfError("BTF type section is malformed")

    @classmethod
    def from_file(cls, path: Path = VMLINUX) -> Btf:
        try:
            return cls(path.read_bytes())
        except OSError as exc:
            raise BtfError(f"cannot read {path}: {exc.strerror} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)") from None

    def func_id(self, name: str) -> int:
        """The type id of kernel function ``name`` (what a BTF-attached program names as its target)."""
        try:
            return self._funcs[name]
        except KeyError:
            raise BtfError(f"function {name} not in the kernel's BTF") from None

    def offset(self, struct_name: str, member: str) -> int:
        """Byte offset of ``member`` in ``struct struct_name``, looking through anonymous
        structs and unions (``file.f_path`` sits in one on recent kernels)."""
        type_id = self._structs.get(struct_name)
        if type_id is None:
            raise BtfError(f"struct {struct_name} not in the kernel's BTF")
        found = self._find(type_id, member)
        if found is None:
            raise BtfError(f"struct {struct_name} has no member {member}")
        if found % 8:
            raise BtfError(f"{struct_name}.{member} is a bitfield")
        return found // 8

    def _find(self, type_id: int, member: str) -> int | None:
        for name, member_type, bit_offset in self._resolve(type_id).members:
            if name == member:
                return bit_offset
            if not name:
                inner = self._find(member_type, member)
                if inner is not None:
                    return bit_offset + inner
        return None

    def _resolve(self, type_id: int) -> _Type:
        """The struct or union behind typedefs and qualifiers."""
        for _ in range(32):  # a chain of modifiers is short; a loop means corrupt BTF
            entry = self._types[type_id]
            if entry is None or entry.kind not in _MODIFIERS:
                break
            type_id = entry.ref
        if entry is None or entry.kind not in (_STRUCT, _UNION):
            raise BtfError(f"BTF type {type_id} is not a struct or union")
        return entry


def _string(strings: bytes, offset: int) -> str:
    end = strings.find(b"\0", offset)
    return strings[offset : end if end >= 0 else len(strings)].decode("ascii", "replace")
