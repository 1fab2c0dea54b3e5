"""Native symbolization (otel_ebpf/profiles/symbols.py) on this very process and its libraries."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

from otel_ebpf.profiles.model import FrameKind
from otel_ebpf.profiles.symbols import ElfImage, KernelSymbols, Symbolizer, parse_maps


def _libc_address(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value


def test_libc_functions_by_name_with_build_id() -> None:
    symbolizer = Symbolizer()
    for name in ("getpid", "qsort"):
        frame = symbolizer.user_frame(os.getpid(), _libc_address(name) + 1)
        assert frame.function.lstrip("_") == name, frame
        assert frame.kind is FrameKind.NATIVE and "libc" in frame.module and frame.resolved
        assert re.fullmatch(r"[0-9a-f]{40}", frame.build_id)


def test_build_id_matches_readelf() -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    path = os.path.realpath(sys.executable)
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True).stdout
    match = re.search(r"Build ID: ([0-9a-f]+)", out)
    if match is None:
        pytest.skip(f"{path} has no build id")
    assert ElfImage(path).build_id == match.group(1)


def test_unknown_addresses_are_module_plus_offset() -> None:
    symbolizer = Symbolizer()
    frame = symbolizer.user_frame(os.getpid(), 0x10)  # nothing is mapped at page 0
    assert frame.function == "[unknown]+0x10" and not frame.resolved and frame.module == ""
    # an address in a mapped file past its last symbol reads module+0xoffset
    maps = symbolizer.maps(os.getpid())
    libc = next(m for m in maps.mappings if "libc" in m.path and m.executable)
    frame = symbolizer.user_frame(os.getpid(), libc.end - 1)
    assert frame.function.startswith(os.path.basename(libc.path)) or frame.resolved


def test_parse_maps() -> None:
    text = (
        "55d0c0000000-55d0c0001000 r-xp 00001000 08:01 123 /usr/bin/x (deleted)\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n"
        "7ffd00030000-7ffd00031000 r--p 00000000 00:00 0\n"
    )
    maps = parse_maps(text)
    assert [(m.path, m.executable, m.offset) for m in maps] == [
        ("/usr/bin/x", True, 0x1000),
        ("[stack]", False, 0),
        ("", False, 0),
    ]


def test_kernel_symbols(tmp_path) -> None:
    fake = tmp_path / "kallsyms"
    fake.write_text(
        "ffffffff81000000 T _stext\nffffffff81000100 t do_thing\nffffffff81000200 D data\n"
        "ffffffffc0000000 t mod_func [mymod]\n"
    )
    symbols = KernelSymbols(str(fake))
    assert symbols.name(0xFFFFFFFF81000150) == "do_thing"
    assert symbols.name(0xFFFFFFFFC0000010) == "mod_func [mymod]"
    assert symbols.name(0x10) is None
    frame = Symbolizer(kallsyms=str(fake)).kernel_frame(0xFFFFFFFF81000104)
    assert (frame.function, frame.kind) == ("do_thing", FrameKind.KERNEL)
