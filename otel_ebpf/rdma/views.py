"""Verbs calls -> per-process metrics and queue-pair log records (docs/rdma.md).

Objects are followed by (process, pointer): a context, protection domain, memory region,
completion queue or queue pair counts in ``rdma.objects`` from the call that made it to the one
that destroys it. A queue pair also keeps what its ``ibv_modify_qp`` calls said — the port (at
INIT), the remote queue pair number and address (at RTR) — and every lifecycle step goes out as a
log record carrying the pair: local (process, device, port, QP number, GID) and remote (GID or
LID, QP number). The agent on the other node emits the mirror image, so a backend joins the two
halves on ``rdma.local.gid`` = ``rdma.remote.gid`` and ``rdma.qp.num`` = ``rdma.remote.qp.num``.

The data path's counts (:mod:`.datapath`) are recorded per queue pair with the same attributes
(the pair, where its ``ibv_modify_qp`` calls were seen), so work requests, completions, their
errors and latencies join the pair's log records.

Pure: calls in, OTLP data classes out; the sysfs root is only read for the local GID and LID.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.metrics.export import ResourceMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import __version__
from ..pipeline.metrics import ProcessMetrics
from ..protocol import AttributeValue, InstrumentKind, InstrumentSpec, MetricPoint
from ..selfmetrics import SelfMetrics
from . import datapath
from .calls import (
    ATTR_AV,
    ATTR_DEST_QPN,
    ATTR_PORT,
    ATTR_STATE,
    REGISTERS_MEMORY,
    QpState,
    VerbsCall,
    format_gid,
    qp_type_name,
    state_name,
)
from .ports import local_gid, local_lid

SCOPE = InstrumentationScope("otel_ebpf.rdma", __version__)
_C, _U = InstrumentKind.COUNTER, InstrumentKind.UP_DOWN_COUNTER
INSTRUMENTS = {
    spec.name: spec
    for spec in (
        InstrumentSpec("rdma.verbs.calls", _C, "{call}", "Hooked libibverbs calls, by function, device and error"),
        InstrumentSpec("rdma.memory.registered", _C, "By", "Memory registered (ibv_reg_mr and its variants)"),
        InstrumentSpec("rdma.memory.deregistered", _C, "By", "Memory deregistered (ibv_dereg_mr)"),
        InstrumentSpec("rdma.objects", _U, "{object}", "Verbs objects the process holds, of those made while traced"),
        InstrumentSpec("rdma.qp.transitions", _C, "{transition}", "Queue pair state changes (ibv_modify_qp)"),
        *datapath.INSTRUMENTS,
    )
}
# function -> the kind of object it makes (from its return) or destroys (its first argument)
CREATES = {
    "ibv_open_device": "context",
    "ibv_alloc_pd": "pd",
    "ibv_create_cq": "cq",
    "ibv_create_qp": "qp",
    **dict.fromkeys(REGISTERS_MEMORY, "mr"),
}
DESTROYS = {
    "ibv_close_device": "context",
    "ibv_dealloc_pd": "pd",
    "ibv_dereg_mr": "mr",
    "ibv_destroy_cq": "cq",
    "ibv_destroy_qp": "qp",
}


@dataclass
class QueuePair:
    """One queue pair, as its calls described it."""

    device: str
    num: int
    qp_type: int
    state: int = QpState.RESET
    port: int = 0
    local_gid: str | None = None
    local_lid: int | None = None
    remote_num: int | None = None
    remote_gid: str | None = None
    remote_lid: int | None = None

    def attributes(self) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            "rdma.device.name": self.device,
            "rdma.qp.num": self.num,
            "rdma.qp.type": qp_type_name(self.qp_type),
        }
        optional = {
            "rdma.port": self.port or None,
            "rdma.local.gid": self.local_gid,
            "rdma.local.lid": self.local_lid or None,
            "rdma.remote.qp.num": self.remote_num,
            "rdma.remote.gid": self.remote_gid,
            "rdma.remote.lid": self.remote_lid or None,
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        return attributes

    @property
    def pair_name(self) -> str:
        """``device/qpn``, and ``->remote/remote qpn`` once connected (the remote: its GID, or
        ``lid:N`` on InfiniBand without a global route header)."""
        local = f"{self.device}/{self.num}"
        if self.remote_num is None:
            return local
        remote = self.remote_gid or (f"lid:{self.remote_lid}" if self.remote_lid else "?")
        return f"{local}->{remote}/{self.remote_num}"

    def connect(self, call: VerbsCall, sysfs_root: Path) -> None:
        """What an ``ibv_modify_qp`` (usually the one to RTR) says about the path and the peer."""
        if call.attr_mask & ATTR_PORT and call.port_num:
            self.port = call.port_num
        if call.attr_mask & ATTR_DEST_QPN:
            self.remote_num = call.dest_qp_num
        if call.attr_mask & ATTR_AV:
            self.port = self.port or call.ah_port_num
            self.remote_lid = call.dlid
            if call.is_global:
                self.remote_gid = format_gid(call.dgid)
                self.local_gid = local_gid(sysfs_root, self.device, self.port, call.sgid_index)
            self.local_lid = local_lid(sysfs_root, self.device, self.port)


class VerbsViews:
    """Per-process ``rdma.*`` metrics and ``rdma.qp.*`` log records from :class:`VerbsCall` values."""

    def __init__(
        self,
        resource_of: Callable[[int], Mapping[str, Any]],
        selfmetrics: SelfMetrics,
        sysfs_root: Path,
        delta: frozenset[InstrumentKind] = frozenset(),
        max_objects: int = 65536,
    ) -> None:
        self._resource_of = resource_of
        self._selfmetrics = selfmetrics
        self._sysfs_root = sysfs_root
        self._delta = delta
        self._max_objects = max_objects
        self._metrics: dict[int, ProcessMetrics] = {}
        self._objects: OrderedDict[tuple[int, int], tuple[str, str]] = OrderedDict()  # (pid, ptr) -> kind, device
        self._qps: dict[tuple[int, int], QueuePair] = {}  # (pid, qp pointer); bounded with _objects
        self._exited: set[int] = set()
        self._logs: list[ReadableLogRecord] = []

    def handle(self, call: VerbsCall) -> None:
        attributes: dict[str, AttributeValue] = {"rdma.verbs.function": call.function}
        if call.device:
            attributes["rdma.device.name"] = call.device
        if call.error_type is not None:
            attributes["error.type"] = call.error_type
        self._record(call, "rdma.verbs.calls", 1, attributes)
        if call.failed:
            return
        device = {"rdma.device.name": call.device}
        if call.function in REGISTERS_MEMORY:
            self._record(call, "rdma.memory.registered", call.length, device)
        elif call.function == "ibv_dereg_mr":
            self._record(call, "rdma.memory.deregistered", call.length, device)
        kind = CREATES.get(call.function)
        if kind is not None:
            self._created(call, kind, call.ret)
        elif call.function in DESTROYS:
            self._destroyed(call, DESTROYS[call.function], call.object)
        elif call.function == "ibv_modify_qp":
            self._modified(call)

    def _created(self, call: VerbsCall, kind: str, pointer: int) -> None:
        key = (call.pid, pointer)
        self._objects[key] = (kind, call.device)
        self._record(call, "rdma.objects", 1, {"rdma.device.name": call.device, "rdma.object.kind": kind})
        if kind == "qp":
            qp = self._qps[key] = QueuePair(call.device, call.qp_num, call.qp_type, call.qp_state)
            self._log(call, "rdma.qp.created", qp, "created")
        while len(self._objects) > self._max_objects:
            evicted, _ = self._objects.popitem(last=False)
            self._qps.pop(evicted, None)
            self._selfmetrics.add("otel_ebpf.rdma.objects.untracked", 1, {"reason": "table_full"})

    def _destroyed(self, call: VerbsCall, kind: str, pointer: int) -> None:
        key = (call.pid, pointer)
        known = self._objects.pop(key, None)
        if known is not None:
            self._record(call, "rdma.objects", -1, {"rdma.device.name": known[1], "rdma.object.kind": kind})
        else:
            self._selfmetrics.add("otel_ebpf.rdma.objects.untracked", 1, {"reason": "made_before_attach"})
        if kind == "qp":
            qp = self._qps.pop(key, None) or QueuePair(call.device, call.qp_num, call.qp_type)
            qp.state = call.qp_state
            self._log(call, "rdma.qp.destroyed", qp, f"destroyed in state {state_name(call.qp_state)}")

    def _modified(self, call: VerbsCall) -> None:
        key = (call.pid, call.object)
        qp = self._qps.get(key)
        if qp is None:  # made before the agent attached: its struct says what it is
            qp = QueuePair(call.device, call.qp_num, call.qp_type, call.qp_state)
            if len(self._qps) < self._max_objects:
                self._qps[key] = qp
        qp.connect(call, self._sysfs_root)
        if not call.attr_mask & ATTR_STATE:
            return
        before, qp.state = call.qp_state, call.attr_qp_state
        self._record(
            call,
            "rdma.qp.transitions",
            1,
            {
                "rdma.device.name": qp.device,
                "rdma.qp.type": qp_type_name(qp.qp_type),
                "rdma.qp.state": state_name(qp.state),
                "rdma.qp.previous_state": state_name(before),
            },
        )
        self._log(
            call,
            "rdma.qp.state_changed",
            qp,
            f"{state_name(before)} -> {state_name(qp.state)}",
            {"rdma.qp.previous_state": state_name(before)},
            SeverityNumber.WARN if qp.state == QpState.ERR else SeverityNumber.INFO,
        )

    def pair_names(self, pid: int) -> dict[int, str]:
        """The queue pairs of ``pid`` whose calls were seen, by number: their pair's name."""
        return {qp.num: qp.pair_name for (owner, _), qp in self._qps.items() if owner == pid}

    def record_data(self, counts: Iterable[datapath.DataCounts], now_ns: int) -> None:
        """What the kernel counted on the data path since the last read, per queue pair: with the
        pair's attributes where its calls were seen, its number alone otherwise."""
        by_number = {(pid, qp.num): qp for (pid, _), qp in self._qps.items()}
        for item in counts:
            qp = by_number.get((item.pid, item.qp_num))
            where: dict[str, AttributeValue] = qp.attributes() if qp is not None else {"rdma.qp.num": item.qp_num}
            metrics = self._metrics_of(item.pid)
            if isinstance(item, datapath.Latencies):
                metrics.merge_histogram(
                    SCOPE,
                    "rdma.completion.latency",
                    where,
                    sum(item.buckets),
                    item.sum_ns / 1e9,
                    item.buckets,
                    item.min_ns / 1e9,
                    item.max_ns / 1e9,
                    now_ns,
                )
                continue
            name = "rdma.work_requests" if isinstance(item, datapath.WorkRequests) else "rdma.completions"
            attributes = {**where, **item.attributes()}
            metrics.record(SCOPE, MetricPoint(name, item.count, attributes), now_ns)
            if item.bytes:
                metrics.record(SCOPE, MetricPoint(f"{name}.bytes", item.bytes, attributes), now_ns)

    def _metrics_of(self, pid: int) -> ProcessMetrics:
        metrics = self._metrics.get(pid)
        if metrics is None:
            metrics = self._metrics[pid] = ProcessMetrics(Resource(dict(self._resource_of(pid))), INSTRUMENTS)
        return metrics

    def _record(self, call: VerbsCall, instrument: str, value: int, attributes: Mapping[str, AttributeValue]) -> None:
        self._metrics_of(call.pid).record(SCOPE, MetricPoint(instrument, value, attributes), call.ts_ns)

    def _log(
        self,
        call: VerbsCall,
        event: str,
        qp: QueuePair,
        what: str,
        extra: Mapping[str, AttributeValue] | None = None,
        severity: SeverityNumber = SeverityNumber.INFO,
    ) -> None:
        attributes = {**qp.attributes(), "rdma.qp.state": state_name(qp.state), **(extra or {})}
        peer = ""
        if qp.remote_num is not None:
            address = qp.remote_gid or (f"LID {qp.remote_lid}" if qp.remote_lid else "an unknown address")
            peer = f", remote QP {qp.remote_num} at {address}"
        where = f"{qp.device} port {qp.port}" if qp.port else qp.device
        record = LogRecord(
            timestamp=call.ts_ns,
            observed_timestamp=call.ts_ns,
            severity_text=severity.name,
            severity_number=severity,
            body=f"RDMA queue pair {qp.num} ({qp_type_name(qp.qp_type)}, {where}): {what}{peer}",
            attributes=attributes,
            event_name=event,
        )
        self._logs.append(ReadableLogRecord(record, Resource(dict(self._resource_of(call.pid))), SCOPE))

    def take_logs(self) -> list[ReadableLogRecord]:
        logs, self._logs = self._logs, []
        return logs

    def processes_exited(self, pids: Iterable[int]) -> None:
        """Their objects are gone with them; their series go after the next collection."""
        gone = set(pids)
        for key in [key for key in self._objects if key[0] in gone]:
            del self._objects[key]
        for key in [key for key in self._qps if key[0] in gone]:
            del self._qps[key]
        self._exited |= gone & self._metrics.keys()

    def collect_metrics(self, now_ns: int) -> list[ResourceMetrics]:
        collected = [metrics.collect(now_ns, self._delta) for metrics in self._metrics.values()]
        for pid in self._exited:
            self._metrics.pop(pid, None)
        self._exited.clear()
        return [c for c in collected if c is not None]
