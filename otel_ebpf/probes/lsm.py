"""Whether this kernel lets a BPF LSM program load, asked the smallest way possible.

`bpf` in /sys/kernel/security/lsm is necessary but not sufficient: a kernel can list it and still
refuse programs that attach through BPF trampolines (LSM, fentry) — this repository's reference
machine answers EPERM before the verifier runs. BCC reports any load failure as "Need super-user
privileges", which sends users the wrong way; this loads a two-instruction program (``return 0``)
for one hook with the raw ``bpf()`` call and reports the kernel's own errno. Standard library only,
so ``otel-ebpf doctor`` can use it from a bare source tree.
"""

from __future__ import annotations

import ctypes
import os
import struct

from .btf import Btf, BtfError

_SYS_BPF = 321  # x86-64
_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_LSM = 29
_BPF_LSM_MAC = 27
_ATTR_SIZE = 128
_RETURN_ZERO = (0xB7, 0x95)  # mov r0, 0; exit
_LOG_SIZE = 4096


class LoadNotTriedError(RuntimeError):
    """The load could not be tried here: no BTF, no such hook, an architecture the check does not know."""


def lsm_load_error(hook: str = "file_open", btf: Btf | None = None) -> str | None:
    """None when a BPF LSM program for ``hook`` loads here; otherwise why not, in words."""
    try:
        return lsm_load_refusal(hook, btf)
    except (LoadNotTriedError, BtfError) as exc:
        return str(exc)


def lsm_load_refusal(hook: str = "file_open", btf: Btf | None = None) -> str | None:
    """None when a BPF LSM program for ``hook`` loads here; otherwise the kernel's answer to the
    load, in words. ``LoadNotTriedError`` or ``BtfError`` when it could not be tried."""
    if os.uname().machine != "x86_64":
        raise LoadNotTriedError(
            f"the load check knows the bpf() syscall number for x86-64 only, not {os.uname().machine}"
        )
    target = (btf or Btf.from_file()).func_id(f"bpf_lsm_{hook}")
    libc = ctypes.CDLL(None, use_errno=True)
    insns = (ctypes.c_uint64 * 2)(*_RETURN_ZERO)
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(_LOG_SIZE)
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    # union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level, log_size,
    # log_buf ... expected_attach_type at 68, attach_btf_id at 108
    struct.pack_into(
        "<IIQQIIQ",
        attr,
        0,
        _BPF_PROG_TYPE_LSM,
        len(_RETURN_ZERO),
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        1,
        _LOG_SIZE,
        ctypes.addressof(log),
    )
    struct.pack_into("<I", attr, 68, _BPF_LSM_MAC)
    struct.pack_into("<I", attr, 108, target)
    fd = libc.syscall(_SYS_BPF, _BPF_PROG_LOAD, attr, _ATTR_SIZE)
    if fd >= 0:
        os.close(fd)
        return None
    errno = ctypes.get_errno()
    verdict = log.value.decode(errors="replace").strip()
    why = f"the kernel refused a BPF LSM program for {hook}: {os.strerror(errno)} (errno {errno})"
    if verdict:
        return f"{why}; verifier: {verdict.splitlines()[-1]}"
    if errno == 1:
        return (
            f"{why} before verifying it: either this process lacks CAP_BPF, CAP_PERFMON or "
            "CAP_MAC_ADMIN, or the kernel does not allow programs attached through BPF trampolines "
            "(LSM, fentry) even if it lists bpf among its LSMs"
        )
    return why
