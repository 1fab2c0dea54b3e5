"""traceparent injection: attaches the sockops and sk_msg programs of ``bpf/inject_traceparent.c``
(compiled into the socket probe with ``-DINJECT``) and reads their counts.

The sockops program goes on the cgroup v2 root through a BPF link, so that the kernel detaches it
when the agent's process ends, however it ends: a program attached the older way stays on the
cgroup after a ``kill -9``. The sk_msg program is attached to the socket hash, which holds it; the
hash and its sockets are released with the probe's maps.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from ..model_guard import cgroup2_mount

# Outcomes counted by the kernel (INJ_* in bpf/inject_traceparent.c); all but the first two are
# refusals: the request left unchanged because it could not be rewritten safely.
OUTCOMES = (
    "injected",
    "already_present",
    "tls",
    "request_line",
    "head_split",
    "head_too_long",
    "kernel",
    "not_watched",
)
# enum bpf_attach_type (include/uapi/linux/bpf.h)
BPF_CGROUP_SOCK_OPS = 3
BPF_SK_MSG_VERDICT = 7


class Injection:
    """The attached programs of one socket probe; ``close`` detaches the sockops program."""

    def __init__(self, bpf: Any) -> None:
        from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc
        from bcc.libbcc import lib  # noqa: PLC0415

        self._bpf = bpf
        self._lib = lib
        lib.bpf_link_create.restype = ctypes.c_int
        lib.bpf_link_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        # Tail-called by every data syscall's exit: from here on, what they decide reaches user space.
        exit_fn = bpf.load_func("inject_exit", BPF.TRACEPOINT)
        bpf["inject_tail"][ctypes.c_int(0)] = ctypes.c_int(exit_fn.fd)
        sockops = bpf.load_func("inject_sockops", BPF.SOCK_OPS)
        verdict = bpf.load_func("inject_msg", BPF.SK_MSG)
        # BCC's tables have no class for a socket hash: its fd is asked for by name.
        sockets = lib.bpf_table_fd(bpf.module, b"inject_socks")
        _check(lib.bpf_prog_attach(verdict.fd, sockets, BPF_SK_MSG_VERDICT, 0), "the sk_msg program")
        cgroup = os.open(cgroup2_mount(), os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._link = _check(lib.bpf_link_create(sockops.fd, cgroup, BPF_CGROUP_SOCK_OPS, None), "sockops")
        finally:
            os.close(cgroup)

    def counts(self) -> dict[str, int]:
        """Requests by outcome since start (kernel totals)."""
        table = self._bpf["inject_stats"]
        return {outcome: sum(table[ctypes.c_int(i)]) for i, outcome in enumerate(OUTCOMES)}

    def close(self) -> None:
        os.close(self._link)


def _check(result: int, what: str) -> int:
    if result < 0:
        raise RuntimeError(f"traceparent injection: cannot attach {what}: {os.strerror(-result)}")
    return result
