"""C++ names of native frames, demangled by the C++ runtime (otel_ebpf/profiles/demangle.py)."""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

from otel_ebpf.profiles.demangle import demangle
from otel_ebpf.profiles.symbols import Symbolizer

MANGLED = [
    "_ZN2at6native10add_kernelERNS_18TensorIteratorBaseERKN3c106ScalarE",
    "_ZNSt6vectorIiSaIiEE9push_backERKi.isra.0",  # a GCC clone suffix
    "_ZN4ncclL9commAllocEPP8ncclCommii",  # internal linkage (a static function)
    "_ZZN5torch8autograd6Engine11thread_initEiRKSt10shared_ptrINS0_10ReadyQueueEEbENKUlvE_clEv",  # a lambda
    "_ZN3c1010TensorImplD2Ev",  # a destructor
]


@pytest.mark.parametrize("name", MANGLED)
def test_same_as_cxxfilt(name: str) -> None:
    expected = subprocess.run(["c++filt", name], capture_output=True, text=True, check=True).stdout.strip()
    assert expected != name  # c++filt itself could read it
    assert demangle(name) == expected


@pytest.mark.parametrize("name", ["main", "PyEval_EvalFrameDefault", "_Zjunk", "_Z", "", "_start"])
def test_other_names_unchanged(name: str) -> None:
    assert demangle(name) == name


def test_native_frames_of_a_cxx_library_are_demangled() -> None:
    """A function of libstdc++ itself, mapped in this process, symbolized from its ELF file."""
    runtime = ctypes.CDLL("libstdc++.so.6")
    address = ctypes.cast(runtime["_ZNSt6chrono3_V212system_clock3nowEv"], ctypes.c_void_p).value
    frame = Symbolizer().user_frame(os.getpid(), address + 1)
    assert frame.function == "std::chrono::_V2::system_clock::now()"
    assert "libstdc++" in frame.module
