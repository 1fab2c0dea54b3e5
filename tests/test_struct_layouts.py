"""The Python side's record layouts against the C structs the BPF programs write and read.

Each C struct comes from the BPF source itself: the file is run through the C preprocessor with the
``-D`` flags its probe compiles it with (kernel includes left out: no struct here uses them), the
``struct name { ... };`` blocks are cut out of the result, and gcc compiles them, with stub
typedefs for ``u8`` … ``s64``, into a program that prints the size of each struct and the offset
and size of each member. The Python side is read from the modules (``struct.Struct`` formats,
``ctypes`` structures, field names). Nothing here restates a layout, so a field added, removed or
resized on one side only fails. gcc lays these structs out as clang does for the BPF target: every
member is naturally aligned and pointers are 8 bytes on both.
"""

# ruff: noqa: SLF001 — the layouts under test are the probes' private struct.Struct and ctypes types

from __future__ import annotations

import ast
import ctypes
import functools
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf import model_guard
from otel_ebpf.config import CaptureConfig
from otel_ebpf.probes import cpu, gpu, gpu_records, http_red, loading, socket, verbs
from otel_ebpf.probes import model_guard as model_guard_probe
from otel_ebpf.profiles import cpython

BPF = Path(__file__).resolve().parent.parent / "bpf"
GCC = shutil.which("gcc")

pytestmark = pytest.mark.skipif(GCC is None, reason="gcc is not installed (scripts/bootstrap.sh)")

_STUBS = """\
#include <stddef.h>
#include <stdio.h>
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char s8;
typedef short s16;
typedef int s32;
typedef long long s64;
"""
_STRUCT = re.compile(r"^struct (\w+) \{", re.MULTILINE)
_MEMBER = re.compile(r"^(?P<type>.*?[\s*])(?P<name>\w+)\s*(?P<dims>(?:\[[^\]]*\])*)$", re.DOTALL)


@dataclass(frozen=True)
class Member:
    name: str
    type: str  # as declared, without the array dimensions: "u32", "struct py_frame", "const char *"
    offset: int
    size: int
    element: int  # size of one element; == size for a scalar

    @property
    def is_array(self) -> bool:
        return self.element != self.size or "[" in self.type

    @property
    def kind(self) -> str:
        """The kind of value: "u" / "s" (unsigned / signed integers), "bytes" (an array of bytes), "struct"."""
        if self.type.startswith("struct "):
            return "struct"
        if self.element == 1 and self.size > 1:
            return "bytes"
        return "s" if re.fullmatch(r"s\d+|int|long", self.type) else "u"

    @property
    def is_pad(self) -> bool:
        return self.name.lstrip("_").startswith("pad")


@dataclass(frozen=True)
class CStruct:
    name: str
    size: int
    members: tuple[Member, ...]


def _members(body: str) -> list[tuple[str, str, str]]:
    """(type, name, dimensions) of each member of a struct body."""
    found = []
    for declaration in body.split(";"):
        declaration = " ".join(declaration.split())
        if not declaration:
            continue
        match = _MEMBER.match(declaration)
        assert match, f"cannot parse the member declaration {declaration!r}"
        found.append((match["type"].strip(), match["name"], match["dims"]))
    return found


@functools.cache
def c_structs(source: str | tuple[str, ...], defines: tuple[str, ...] = ()) -> dict[str, CStruct]:
    """Every struct of ``bpf/<source>`` (and the headers it includes; several sources: one after
    the other, as a probe appends them), compiled with ``defines``."""
    assert GCC is not None
    sources = (source,) if isinstance(source, str) else source
    text = "".join((BPF / name).read_text() for name in sources)
    text = re.sub(r"^#include <[^>]*>\s*$", "", text, flags=re.MULTILINE)
    flags = [f"-D{d}" for d in defines]
    expanded = subprocess.run(
        [GCC, "-E", "-P", "-I", str(BPF), *flags, "-x", "c", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    blocks: dict[str, tuple[str, list[tuple[str, str, str]]]] = {}
    for match in _STRUCT.finditer(expanded):
        end = expanded.index("};", match.end())
        body = expanded[match.end() : end]
        assert "{" not in body, f"struct {match[1]}: nested definitions are not handled"
        blocks[match[1]] = (expanded[match.start() : end + 2], _members(body))
    program = [_STUBS, *(block for block, _ in blocks.values()), "int main(void) {"]
    for name, (_, members) in blocks.items():
        program.append(f'printf("{name} - %zu\\n", sizeof(struct {name}));')
        for _, member, dims in members:
            field = f"((struct {name} *)0)->{member}"
            element = f"sizeof({field}[0])" if dims else f"sizeof({field})"
            program.append(
                f'printf("{name} {member} %zu %zu %zu\\n", '
                f"offsetof(struct {name}, {member}), sizeof({field}), {element});"
            )
    program.append("return 0; }")
    with tempfile.TemporaryDirectory() as tmp:
        c_file, binary = Path(tmp, "layouts.c"), Path(tmp, "layouts")
        c_file.write_text("\n".join(program))
        subprocess.run([GCC, "-o", str(binary), str(c_file)], check=True, capture_output=True, text=True)
        lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    sizes: dict[str, int] = {}
    offsets: dict[tuple[str, str], tuple[int, int, int]] = {}
    for line in lines:
        struct_name, member, *numbers = line.split()
        if member == "-":
            sizes[struct_name] = int(numbers[0])
        else:
            offset, size, element = map(int, numbers)
            offsets[struct_name, member] = (offset, size, element)
    return {
        name: CStruct(
            name,
            sizes[name],
            tuple(
                Member(member, type_ + ("[]" if dims else ""), *offsets[name, member])
                for type_, member, dims in members
            ),
        )
        for name, (_, members) in blocks.items()
    }


def _base_type(member: Member) -> str:
    return member.type.removesuffix("[]")


def leaves(structs: dict[str, CStruct], name: str, base: int = 0, prefix: str = "") -> list[tuple[int, int, str, str]]:
    """(offset, size, kind, path) of the scalar and array members of struct ``name``, nested structs
    flattened; an array of structs stays one leaf."""
    found = []
    for member in structs[name].members:
        path = prefix + member.name
        if member.kind == "struct" and not member.is_array:
            found += leaves(structs, _base_type(member).removeprefix("struct "), base + member.offset, path + ".")
        else:
            found.append((base + member.offset, member.size, member.kind, path))
    return found


def python_items(layout: struct.Struct | str, base: int = 0) -> tuple[list[tuple[int, int, str]], int]:
    """(offset, size, kind) of each field of a little-endian ``struct`` format, padding left out,
    and the offset where it ends. ``7Q`` is one field (an array), ``16s`` one of bytes."""
    fmt = layout.format if isinstance(layout, struct.Struct) else layout
    assert fmt[0] == "<", "records are little-endian with explicit padding"
    items, offset = [], base
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt[1:]):
        size = struct.calcsize(f"<{count}{code}")
        if code != "x":
            kind = "bytes" if code == "s" else ("s" if code in "bhilq" else "u")
            items.append((offset, size, kind))
        offset += size
    return items, offset


def assert_layout(
    structs: dict[str, CStruct], name: str, pieces: list[struct.Struct | str], then: str | None = None
) -> None:
    """The ``struct`` formats in ``pieces``, read one after the other, decode the C struct ``name``:
    the whole of it, or (``then``) everything before its member ``then`` (a payload, a path, an
    array of frames), which must start where they end."""
    items: list[tuple[int, int, str]] = []
    end = 0
    for piece in pieces:
        more, end = python_items(piece, end)
        items += more
    c_leaves = [leaf for leaf in leaves(structs, name) if leaf[0] < end]
    pads = {(offset, size) for offset, size, _, path in c_leaves if path.split(".")[-1].lstrip("_").startswith("pad")}
    expected = [(offset, size, kind) for offset, size, kind, path in c_leaves if (offset, size) not in pads]
    read = [item for item in items if item[:2] not in pads]  # a Python field may read a C pad (unused)
    assert read == expected, f"struct {name}: Python reads {read}, C has {[leaf for leaf in c_leaves]}"
    if then is None:
        assert end == structs[name].size, f"struct {name} is {structs[name].size} bytes, Python reads {end}"
    else:
        after = [leaf for leaf in leaves(structs, name) if leaf[3] == then]
        assert after and after[0][0] == end, f"struct {name}: {then} is at {after}, Python reads it at {end}"


def _ctypes_kind(typ: Any) -> str:
    if issubclass(typ, ctypes.Structure):
        return "struct"
    if issubclass(typ, ctypes.Array):
        element = typ._type_
        return "bytes" if ctypes.sizeof(element) == 1 else _ctypes_kind(element)
    return "s" if typ._type_ in "bhilq" else "u"


def assert_ctypes(structs: dict[str, CStruct], name: str, python: type[ctypes.Structure]) -> None:
    """A ctypes structure mirrors C struct ``name``: same members by name, offset, size and kind,
    nested structures too."""
    c = structs[name]
    theirs = [(m.name, m.offset, m.size, m.kind) for m in c.members]
    ours = []
    for field, typ in python._fields_:
        descriptor = getattr(python, field)
        ours.append((field, descriptor.offset, descriptor.size, _ctypes_kind(typ)))
        member = next((m for m in c.members if m.name == field), None)
        if member is not None and member.kind == "struct":
            nested = typ._type_ if issubclass(typ, ctypes.Array) else typ
            assert_ctypes(structs, _base_type(member).removeprefix("struct "), nested)
    assert ours == theirs, f"struct {name}: {python.__name__} has {ours}, C has {theirs}"
    assert ctypes.sizeof(python) == c.size


# ---- the socket probe: bpf/socket_trace.c -> probes/socket.py ----------------------------------


def _socket() -> dict[str, CStruct]:
    return c_structs("socket_trace.c", (f"PAYLOAD_CAP={CaptureConfig().payload_cap}", f"MAX_IOV={socket.MAX_IOV}"))


def test_socket_event_header() -> None:
    assert_layout(_socket(), "event_header", [socket._HEADER])


def test_socket_data_event() -> None:
    assert_layout(_socket(), "data_event", [socket._HEADER, socket._STREAM_DATA], then="data")


def test_socket_trace_event() -> None:
    assert_layout(_socket(), "trace_event", [socket._HEADER, socket._TRACE])


def test_socket_datagram_event() -> None:
    assert_layout(_socket(), "dgram_event", [socket._HEADER, socket._DATA, socket._DGRAM_PEER], then="data")


def test_socket_open_event() -> None:
    assert_layout(_socket(), "open_event", [socket._HEADER, socket._OPEN])


def _attributes(module: Any, *names: str) -> set[str]:
    """Attributes the module's code reads from variables called ``names``."""
    tree = ast.parse(Path(module.__file__).read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names
    }


def test_http_red_fields_exist() -> None:
    """BCC builds the key and value types of ``http_red`` from the C structs; the reader names
    their fields."""
    structs = _socket()
    keys = {m.name for m in structs["red_key"].members}
    values = {m.name for m in structs["red_value"].members}
    assert _attributes(http_red, "key") <= keys, _attributes(http_red, "key") - keys
    read = _attributes(http_red, "v")
    assert read and read <= values, read - values


# ---- the GPU probe: bpf/gpu_trace.c -> probes/gpu_records.py, probes/gpu.py ----------------------


def _gpu(python: bool) -> dict[str, CStruct]:
    defines = (f"USER_FRAMES={gpu_records.USER_FRAMES}",) + (("PYTHON_STACKS",) if python else ())
    return c_structs("gpu_trace.c", defines)


@pytest.mark.parametrize("python", [True, False], ids=["python-stacks", "no-python-stacks"])
def test_gpu_call_record(python: bool) -> None:
    structs = _gpu(python)
    user = f"<{gpu_records.USER_FRAMES}Q"  # decode() reads 8 * USER_FRAMES bytes of return addresses
    pieces = [gpu_records._HEADER, gpu_records._ARGS, user, gpu_records._PY_HEADER]
    if python:
        assert_layout(structs, "gpu_event", pieces, then="py.frames")
        assert_layout(structs, "py_frame", [gpu_records._PY_FRAME])
    else:
        assert_layout(structs, "gpu_event", pieces)
    assert gpu_records.event_size(gpu_records.PY_MAX_FRAMES if python else 0) == structs["gpu_event"].size


def test_gpu_return_record() -> None:
    assert_layout(_gpu(True), "gpu_return", [gpu_records._HEADER, gpu_records._OUT])


def test_gpu_usdt_spec_fields_exist() -> None:
    structs = _gpu(True)
    args = {m.name for m in structs["usdt_arg"].members}
    tree = ast.parse(Path(gpu.__file__).read_text())
    written = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Subscript)
        and isinstance(node.value.value, ast.Attribute)
        and node.value.value.attr == "args"
    }
    assert written and written <= args, written - args


# ---- the CPU profiler: bpf/cpu_profile.c + python_stack.h -> probes/cpu.py, profiles/cpython.py --


def _cpu() -> dict[str, CStruct]:
    return c_structs(
        "cpu_profile.c",
        (
            f"USER_FRAMES={cpu.USER_FRAMES}",
            f"KERNEL_FRAMES={cpu.KERNEL_FRAMES}",
            f"PY_MAX_FRAMES={cpu.PY_MAX_FRAMES}",
        ),
    )


def test_cpu_sample() -> None:
    assert_ctypes(_cpu(), "sample", cpu._Sample)


def test_python_process_table() -> None:
    assert_ctypes(_cpu(), "py_proc", cpython.PyProc)
    assert_ctypes(_cpu(), "py_frame", cpython.PyFrame)


# ---- the model guard: bpf/model_guard.c -> model_guard.py, probes/model_guard.py ----------------


def _guard() -> dict[str, CStruct]:
    return c_structs("model_guard.c")


def test_model_guard_open_record() -> None:
    assert_layout(_guard(), "open_record", [model_guard.RECORD], then="path")


@pytest.mark.parametrize(
    ("name", "python"),
    [
        ("ext_key", model_guard_probe._ExtKey),
        ("prefix", model_guard_probe._Prefix),
        ("exe_key", model_guard_probe._ExeKey),
    ],
)
def test_model_guard_rule_keys(name: str, python: type[ctypes.Structure]) -> None:
    assert_ctypes(_guard(), name, python)


# ---- settings[] slots: bpf/targets.h and each program's own -> loading.py and each probe ----------


def c_settings(source: str) -> dict[str, int]:
    """The ``SET_*`` slot numbers ``bpf/<source>`` (and the headers it includes) defines."""
    assert GCC is not None
    text = re.sub(r"^#include <[^>]*>\s*$", "", (BPF / source).read_text(), flags=re.MULTILINE)
    macros = subprocess.run(
        [GCC, "-E", "-dM", "-I", str(BPF), "-x", "c", "-"], input=text, capture_output=True, text=True, check=True
    ).stdout
    return {m[1]: int(m[2]) for m in re.finditer(r"^#define (SET_\w+) (\d+)$", macros, re.MULTILINE)}


@pytest.mark.parametrize(
    ("source", "module"),
    [("socket_trace.c", socket), ("gpu_trace.c", gpu), ("cpu_profile.c", cpu), ("verbs_trace.c", verbs)],
)
def test_settings_slots_match(source: str, module: Any) -> None:
    """Every ``SET_*`` number the probe writes is the slot the program reads, the two that
    targets.h shares (written through loading.py's numbers) included."""
    slots = c_settings(source)
    assert {"SET_AGENT_TGID", "SET_FILTER_PIDS"} <= slots.keys()
    for python in (module, loading):
        numbers = {name: getattr(python, name) for name in dir(python) if name.startswith("SET_")}
        assert numbers and {name: slots.get(name) for name in numbers} == numbers, python.__name__


def test_model_guard_settings_slot_matches() -> None:
    """The model guard's program has no targets.h: its one slot, enforce or audit."""
    assert c_settings("model_guard.c")["SET_ENFORCE"] == model_guard_probe.SET_ENFORCE


# ---- the extraction itself ---------------------------------------------------------------------


def test_every_struct_is_extracted() -> None:
    """The parser sees the structs it is meant to: a block it stopped finding would fail above
    with a KeyError, but say so here by name."""
    assert {"event_header", "data_event", "dgram_event", "open_event", "red_key", "red_value"} <= set(_socket())
    assert {"gpu_event", "gpu_return", "py_stack", "usdt_arg"} <= set(_gpu(False))
    assert {"sample", "py_proc", "py_frame", "py_stack"} <= set(_cpu())
    assert {"open_record", "ext_key", "prefix", "exe_key"} <= set(_guard())
