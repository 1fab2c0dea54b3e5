"""Cgroup BPF programs attached through BPF links (``BPF_LINK_CREATE``, Linux 5.7+).

BCC attaches cgroup programs with ``BPF_PROG_ATTACH``, which outlives the process: a killed agent
would leave its programs on the cgroup, and the next one would add its own beside them. A link
is detached when its last file descriptor closes, so whatever way the agent ends, the kernel takes
the program off. Links also attach as ``BPF_F_ALLOW_MULTI`` does: beside the programs others put
there (systemd's IP accounting, a container runtime's firewall), never instead of them.
"""

from __future__ import annotations

import ctypes
import os
import struct

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_LINK_CREATE = 28
_ATTR_SIZE = 64
# enum bpf_attach_type
CGROUP_INET_INGRESS = 0
CGROUP_INET_EGRESS = 1


class CgroupLinkError(OSError):
    """The kernel would not link the program to the cgroup; the message says why."""


def link_cgroup(prog_fd: int, cgroup_dir: str, attach_type: int) -> int:
    """A link of program ``prog_fd`` to the cgroup at ``cgroup_dir`` for ``attach_type``; close
    the returned file descriptor to detach it."""
    number = _SYS_BPF.get(os.uname().machine)
    if number is None:
        raise CgroupLinkError(f"the bpf() syscall number for {os.uname().machine} is not known here")
    cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr = ctypes.create_string_buffer(_ATTR_SIZE)
        struct.pack_into("<IIII", attr, 0, prog_fd, cgroup_fd, attach_type, 0)  # link_create: prog, target, type, flags
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(number, _BPF_LINK_CREATE, attr, _ATTR_SIZE)
    finally:
        os.close(cgroup_fd)
    if fd < 0:
        errno = ctypes.get_errno()
        raise CgroupLinkError(errno, f"cannot link a cgroup program to {cgroup_dir}: {os.strerror(errno)}")
    return int(fd)
