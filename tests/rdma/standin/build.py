"""Builds the stand-in ``libibverbs.so.1`` and the verbs driver program from the C beside this file.

The stand-in carries the real soname, symbol versions (``ibv_create_qp@@IBVERBS_1.1`` and the
1.0 compatibility ``ibv_create_qp@IBVERBS_1.0``), signatures and struct layouts, so the agent
finds and hooks it as it would the real library. The driver is compiled against the system's
``infiniband/verbs.h`` (Debian's ``libibverbs-dev``, scripts/bootstrap.sh): the stand-in's structs
meet a program built with the real header. Two drivers are linked: one to the stand-in (its
folder in the run path), one to the real ``libibverbs.so.1``; and ``libstandin_net.so``, a pretend
NCCL network transport on the stand-in (``collective_net.c``). Builds are cached by a hash of the
sources in a folder under the system temporary directory.

Run as a script it prints the folder: ``python tests/rdma/standin/build.py``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERBS_HEADER = Path("/usr/include/infiniband/verbs.h")
LIBRARY = "libibverbs.so.1"
DRIVER = "verbs_driver"  # linked to the stand-in
REAL_DRIVER = "verbs_driver_real"  # linked to the system's libibverbs.so.1
NET = "libstandin_net.so"  # the stand-in NCCL's network transport, on the stand-in
CFLAGS = ["-O2", "-g", "-Wall", "-Werror"]


def _digest() -> str:
    h = hashlib.sha256(" ".join(CFLAGS).encode())
    for name in ("libibverbs.c", "libibverbs.map", "driver.c", "collective_net.c"):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


def build(out: Path | None = None) -> Path:
    """The folder holding the stand-in and the drivers (built now unless already there)."""
    if not VERBS_HEADER.exists():
        raise RuntimeError(f"{VERBS_HEADER} is missing: install libibverbs-dev (scripts/bootstrap.sh)")
    out = out or Path(tempfile.gettempdir()) / f"otel-ebpf-verbs-standin-{_digest()}"
    products = (LIBRARY, DRIVER, REAL_DRIVER, NET)
    if all((out / name).exists() for name in products):
        return out
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out))  # concurrent builders must not see half-written files
    commands = [
        [
            *CFLAGS,
            "-fPIC",
            "-shared",
            f"-Wl,-soname,{LIBRARY}",
            f"-Wl,--version-script={HERE / 'libibverbs.map'}",
            "-o",
            str(staging / LIBRARY),
            str(HERE / "libibverbs.c"),
        ],
        # the run path names the final folder: the driver finds the stand-in there once moved
        [
            *CFLAGS,
            "-o",
            str(staging / DRIVER),
            str(HERE / "driver.c"),
            f"-L{staging}",
            f"-l:{LIBRARY}",
            f"-Wl,-rpath,{out}",
        ],
        [*CFLAGS, "-o", str(staging / REAL_DRIVER), str(HERE / "driver.c"), "-libverbs"],
        [
            *CFLAGS,
            "-fPIC",
            "-shared",
            "-pthread",
            "-o",
            str(staging / NET),
            str(HERE / "collective_net.c"),
            f"-L{staging}",
            f"-l:{LIBRARY}",
            f"-Wl,-rpath,{out}",
        ],
    ]
    for command in commands:
        subprocess.run(["gcc", *command], check=True, capture_output=True, text=True)
    for name in products:
        os.replace(staging / name, out / name)
    staging.rmdir()
    return out


if __name__ == "__main__":
    sys.stdout.write(f"{build()}\n")
