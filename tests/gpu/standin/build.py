"""Builds the stand-in CUDA driver, runtime and NCCL libraries (and kernels' host stubs) from the
C and C++ sources beside this file, and the native programs that call them.

The stand-ins carry the real sonames (``libcuda.so.1``, ``libcudart.so.12``, ``libnccl.so.2``) and
symbol names, so the agent discovers and hooks them exactly as it would the real ones. Builds are
cached by a hash of the sources (and compiler flags) in a folder under the system temporary
directory, shared by tests, the demo and the benchmark.

Run as a script it prints the folder: ``python tests/gpu/standin/build.py``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# -fno-omit-frame-pointer (leaf functions too), -fno-shrink-wrap: every function begins with
# `push %rbp`, as the real libcudart's do — the instruction uprobes emulate; a first instruction
# they must single-step out of line (a rip-relative load) costs several microseconds more a hit.
# -fno-optimize-sibling-calls: cudaMalloc *calls* cuMemAlloc_v2 as the real runtime does (it has
# work left after the driver returns), instead of jumping to it — a tail call under a uretprobe
# takes the kernel's slow path (~17 us here, against ~2 us for a plain call).
CFLAGS = [
    "-O2",
    "-g",
    "-fPIC",
    "-shared",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-fno-shrink-wrap",
    "-fno-optimize-sibling-calls",
    "-Wall",
    "-Werror",
]
LIBRARIES = {  # soname -> (source, extra link arguments)
    "libcuda.so.1": ("cuda_driver.c", []),
    "libcudart.so.12": ("cudart.c", ["-L{out}", "-l:libcuda.so.1", "-Wl,-rpath,$ORIGIN"]),
    "libnccl.so.2": ("nccl.c", []),
    "libc10_cuda.so": ("c10_cuda.c", []),
    "libstandin_kernels.so": ("kernels.cpp", []),  # C++: the host stubs carry mangled names
    "libnvidia-ml.so.1": ("nvml.c", []),
}
# native programs -> (source, link arguments): linked against the stand-ins in the same folder
PROGRAMS = {
    "launch_ledger": ("launch_ledger.cpp", ["-L{out}", "-l:libcudart.so.12", "-l:libcuda.so.1", "-Wl,-rpath,$ORIGIN"]),
}
PROGRAM_CFLAGS = [flag for flag in CFLAGS if flag not in ("-fPIC", "-shared")]


def _digest() -> str:
    h = hashlib.sha256(" ".join(CFLAGS).encode())
    for name, (source, extra) in sorted({**LIBRARIES, **PROGRAMS}.items()):
        h.update(name.encode() + b"\0" + (HERE / source).read_bytes() + " ".join(extra).encode())
    h.update((HERE / "sdt.h").read_bytes())
    return h.hexdigest()[:16]


def build(out: Path | None = None) -> Path:
    """The folder holding the built stand-ins (built now unless already there)."""
    out = out or Path(tempfile.gettempdir()) / f"otel-ebpf-gpu-standin-{_digest()}"
    if all((out / name).exists() for name in (*LIBRARIES, *PROGRAMS)):
        return out
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out))  # concurrent builders must not see half-written files
    for name, (source, extra) in LIBRARIES.items():  # dict order: the driver before the runtime
        link = [arg.format(out=staging) for arg in extra]
        subprocess.run(
            ["gcc", *CFLAGS, f"-Wl,-soname,{name}", "-o", str(staging / name), str(HERE / source), *link],
            check=True,
            capture_output=True,
            text=True,
        )
    for name, (source, extra) in PROGRAMS.items():  # after the libraries they link
        link = [arg.format(out=staging) for arg in extra]
        subprocess.run(
            ["gcc", *PROGRAM_CFLAGS, "-o", str(staging / name), str(HERE / source), *link],
            check=True,
            capture_output=True,
            text=True,
        )
    for name in (*LIBRARIES, *PROGRAMS):
        os.replace(staging / name, out / name)
    staging.rmdir()
    return out


if __name__ == "__main__":
    sys.stdout.write(f"{build()}\n")
