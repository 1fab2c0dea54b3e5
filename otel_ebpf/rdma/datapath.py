"""The verbs data path as ``bpf/verbs_trace.c`` counts it: work requests posted (the provider's
``post_send`` and ``post_recv``) and completions polled (its ``poll_cq``), per process, queue pair,
opcode and status, and the time from a work request's post to the poll that returned its
completion (docs/rdma.md). The kernel keeps running totals; the probe hands over what grew.

Names are those of verbs.h's enums without their prefix: ``SEND``, ``RDMA_WRITE`` (``enum
ibv_wr_opcode``), ``RECV`` (``enum ibv_wc_opcode``), ``RETRY_EXC_ERR`` (``enum ibv_wc_status``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol import InstrumentKind, InstrumentSpec

# enum ibv_wr_opcode; RECV: a receive posted (ibv_post_recv), as bpf/verbs_trace.c's OPCODE_RECV
WR_OPCODES = {
    0: "RDMA_WRITE",
    1: "RDMA_WRITE_WITH_IMM",
    2: "SEND",
    3: "SEND_WITH_IMM",
    4: "RDMA_READ",
    5: "ATOMIC_CMP_AND_SWP",
    6: "ATOMIC_FETCH_AND_ADD",
    7: "LOCAL_INV",
    8: "BIND_MW",
    9: "SEND_WITH_INV",
    10: "TSO",
    11: "DRIVER1",
    15: "ATOMIC_WRITE",
    128: "RECV",
}
# enum ibv_wc_opcode
WC_OPCODES = {
    0: "SEND",
    1: "RDMA_WRITE",
    2: "RDMA_READ",
    3: "COMP_SWAP",
    4: "FETCH_ADD",
    5: "BIND_MW",
    6: "LOCAL_INV",
    7: "TSO",
    9: "ATOMIC_WRITE",
    128: "RECV",
    129: "RECV_RDMA_WITH_IMM",
    130: "TM_ADD",
    131: "TM_DEL",
    132: "TM_SYNC",
    133: "TM_RECV",
    134: "TM_NO_TAG",
    135: "DRIVER1",
    136: "DRIVER2",
    137: "DRIVER3",
}
OPCODE_NONE = 0xFFFF  # a failed completion's opcode: verbs.h leaves it undefined
# enum ibv_wc_status, in order
WC_STATUSES = (
    "SUCCESS",
    "LOC_LEN_ERR",
    "LOC_QP_OP_ERR",
    "LOC_EEC_OP_ERR",
    "LOC_PROT_ERR",
    "WR_FLUSH_ERR",
    "MW_BIND_ERR",
    "BAD_RESP_ERR",
    "LOC_ACCESS_ERR",
    "REM_INV_REQ_ERR",
    "REM_ACCESS_ERR",
    "REM_OP_ERR",
    "RETRY_EXC_ERR",
    "RNR_RETRY_EXC_ERR",
    "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR",
    "REM_ABORT_ERR",
    "INV_EECN_ERR",
    "INV_EEC_STATE_ERR",
    "FATAL_ERR",
    "RESP_TIMEOUT_ERR",
    "GENERAL_ERR",
    "TM_ERR",
    "TM_RNDV_INCOMPLETE",
)
# bpf/verbs_trace.c, struct latency: slot i holds latencies up to 1024 ns << i; the last, the rest
LATENCY_SLOTS = 25
LATENCY_BOUNDARIES_S = tuple((1024 << i) / 1e9 for i in range(LATENCY_SLOTS - 1))

_C = InstrumentKind.COUNTER
INSTRUMENTS = (
    InstrumentSpec("rdma.work_requests", _C, "{request}", "Work requests posted (ibv_post_send, ibv_post_recv)"),
    InstrumentSpec("rdma.work_requests.bytes", _C, "By", "Bytes of the work requests posted (their SGE lengths)"),
    InstrumentSpec("rdma.completions", _C, "{completion}", "Completions polled (ibv_poll_cq), by status"),
    InstrumentSpec("rdma.completions.bytes", _C, "By", "byte_len of the successful completions polled"),
    InstrumentSpec(
        "rdma.completion.latency",
        InstrumentKind.HISTOGRAM,
        "s",
        "From a work request's post to the ibv_poll_cq that returned its completion",
        LATENCY_BOUNDARIES_S,
    ),
)


def _name(names: dict[int, str], value: int) -> str:
    return names.get(value, str(value))


def status_name(status: int) -> str:
    return WC_STATUSES[status] if 0 <= status < len(WC_STATUSES) else str(status)


@dataclass(frozen=True)
class WorkRequests:
    """Work requests of one opcode a process posted on one queue pair, since the last read."""

    pid: int
    qp_num: int
    opcode: int  # enum ibv_wr_opcode, or 128: receives
    count: int
    bytes: int

    def attributes(self) -> dict[str, str]:
        return {"rdma.wr.opcode": _name(WR_OPCODES, self.opcode)}


@dataclass(frozen=True)
class Completions:
    """Completions of one opcode and status a process polled for one queue pair, since the last read."""

    pid: int
    qp_num: int
    opcode: int  # enum ibv_wc_opcode; OPCODE_NONE for a failed one
    status: int  # enum ibv_wc_status
    count: int
    bytes: int

    def attributes(self) -> dict[str, str]:
        attributes = {"rdma.wc.status": status_name(self.status)}
        if self.opcode != OPCODE_NONE:
            attributes["rdma.wc.opcode"] = _name(WC_OPCODES, self.opcode)
        return attributes


@dataclass(frozen=True)
class Latencies:
    """Completion latencies of one queue pair, since the last read: counts per LATENCY_BOUNDARIES_S
    bucket (one more: above), their sum, and the least and most over the queue pair's life."""

    pid: int
    qp_num: int
    buckets: tuple[int, ...]
    sum_ns: int
    min_ns: int
    max_ns: int


DataCounts = WorkRequests | Completions | Latencies
