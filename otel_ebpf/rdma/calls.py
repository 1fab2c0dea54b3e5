"""The libibverbs functions ``bpf/verbs_trace.c`` hooks, and how one call's record decodes.

One record per call, sent at its return: what the call was about (read at entry, while the
objects it names are valid) and what it made. Only the stable, exported API is hooked here: the
data path (``ibv_post_send``, ``ibv_poll_cq``) is inline in verbs.h and calls the provider
directly; a record names the provider's functions (its context's ops table), which
:mod:`.datapath` counts once hooked.
"""

from __future__ import annotations

import enum
import errno
import struct
from dataclasses import dataclass

# op -> symbol: bpf/verbs_trace.c, VERB(symbol, op, ...)
FUNCTIONS = (
    "ibv_get_device_list",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_reg_mr_iova",
    "ibv_reg_mr_iova2",
    "ibv_reg_dmabuf_mr",
    "ibv_dereg_mr",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_destroy_qp",
)
# Functions that return an int (0 or an errno value); the others return a pointer (NULL: failed).
RETURNS_INT = frozenset(
    {"ibv_close_device", "ibv_dealloc_pd", "ibv_dereg_mr", "ibv_destroy_cq", "ibv_modify_qp", "ibv_destroy_qp"}
)
REGISTERS_MEMORY = frozenset({"ibv_reg_mr", "ibv_reg_mr_iova", "ibv_reg_mr_iova2", "ibv_reg_dmabuf_mr"})


class QpState(enum.IntEnum):
    """enum ibv_qp_state"""

    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6
    UNKNOWN = 7


QP_TYPES = {
    2: "RC",
    3: "UC",
    4: "UD",
    8: "RAW_PACKET",
    9: "XRC_SEND",
    10: "XRC_RECV",
    0xFF: "DRIVER",
}  # enum ibv_qp_type

# enum ibv_qp_attr_mask: the members of ibv_modify_qp's attributes it sets
ATTR_STATE = 1 << 0
ATTR_PORT = 1 << 5
ATTR_AV = 1 << 7
ATTR_DEST_QPN = 1 << 20

# The provider functions a context's ops table names (struct ibv_context_ops), as a record carries them.
PROVIDER_FUNCTIONS = ("poll_cq", "post_send", "post_recv")

# struct verbs_call: ts, duration, sp, ret, object, length, poll_cq, post_send, post_recv; pid,
# tid; op, depth; qp_num, qp_type, qp_state, attr_mask, attr_qp_state, dest_qp_num; dlid,
# is_global, ah_port_num, sgid_index, port_num, padding; dgid; device
RECORD = struct.Struct("<9QIIHH6IHBBBB2x16s64s")


@dataclass(frozen=True)
class VerbsCall:
    """One returned call of a hooked function (the outermost, when calls of a family nest)."""

    ts_ns: int  # entry, Unix time
    duration_ns: int
    pid: int
    tid: int
    function: str
    ret: int
    object: int  # the first argument: the device, context, pd, mr, cq or qp it is about
    length: int  # bytes registered (argument) or deregistered (mr->length)
    device: str  # the device's name ("mlx5_0"), "" where the call has none
    qp_num: int = 0
    qp_type: int = 0
    qp_state: int = 0  # the queue pair's state when the call began
    attr_mask: int = 0
    attr_qp_state: int = 0
    dest_qp_num: int = 0
    dlid: int = 0
    is_global: bool = False
    ah_port_num: int = 0
    sgid_index: int = 0
    port_num: int = 0
    dgid: bytes = bytes(16)
    providers: tuple[int, ...] = (0, 0, 0)  # the addresses of PROVIDER_FUNCTIONS in the process; 0: unknown

    @property
    def failed(self) -> bool:
        if self.function in RETURNS_INT:
            return self.ret & 0xFFFFFFFF != 0
        return self.ret == 0

    @property
    def error_type(self) -> str | None:
        """``EINVAL`` (an int return's errno value), ``null`` (a pointer return), None: succeeded."""
        if not self.failed:
            return None
        if self.function not in RETURNS_INT:
            return "null"
        code = abs(struct.unpack("<i", struct.pack("<I", self.ret & 0xFFFFFFFF))[0])
        return errno.errorcode.get(code, str(code))


def decode(raw: bytes, clock_offset_ns: int) -> VerbsCall | None:
    """One ring-buffer record; None for a short one or an unknown op."""
    if len(raw) < RECORD.size:
        return None
    (
        ts,
        duration,
        _sp,
        ret,
        obj,
        length,
        poll_cq,
        post_send,
        post_recv,
        pid,
        tid,
        op,
        _depth,
        qp_num,
        qp_type,
        qp_state,
        attr_mask,
        attr_qp_state,
        dest_qp_num,
        dlid,
        is_global,
        ah_port_num,
        sgid_index,
        port_num,
        dgid,
        device,
    ) = RECORD.unpack_from(raw)
    if op >= len(FUNCTIONS):
        return None
    return VerbsCall(
        ts + clock_offset_ns,
        duration,
        pid,
        tid,
        FUNCTIONS[op],
        ret,
        obj,
        length,
        device.split(b"\0", 1)[0].decode(errors="replace"),
        qp_num,
        qp_type,
        qp_state,
        attr_mask,
        attr_qp_state,
        dest_qp_num,
        dlid,
        bool(is_global),
        ah_port_num,
        sgid_index,
        port_num,
        dgid,
        (poll_cq, post_send, post_recv),
    )


def format_gid(raw: bytes) -> str:
    """A GID as sysfs writes them (``fe80:0000:0000:0000:0202:c9ff:fe00:0001``): both halves of a
    queue pair print the same 16 bytes the same way, whatever their Python or kernel."""
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def state_name(state: int) -> str:
    try:
        return QpState(state).name
    except ValueError:
        return str(state)


def qp_type_name(qp_type: int) -> str:
    return QP_TYPES.get(qp_type, str(qp_type))
