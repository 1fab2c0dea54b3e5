"""RDMA verbs probe: finds ``libibverbs`` in target processes, hooks its control-path functions
with ``bpf/verbs_trace.c`` and hands the decoded calls to :class:`~otel_ebpf.rdma.views.VerbsViews`.

A uprobe belongs to a file, so each distinct file (device, inode) named ``libibverbs.so*`` that a
target maps is hooked once, for every process that maps it. libibverbs exports most functions
twice: the current ABI (``ibv_create_qp@@IBVERBS_1.1``) and the 1.0 compatibility entry points
(``ibv_create_qp@IBVERBS_1.0``, for programs linked in 2006) whose structs differ. Only the
default versions are hooked, by address: the structs read are those of the current ABI.
Processes load the library late (an MPI or NCCL plugin dlopens it), so maps are rescanned every
:data:`RESCAN_S`.

The data path: a record of a call with a context names the provider's ``poll_cq``, ``post_send``
and ``post_recv`` (the context's ops table, read in the kernel); each address is placed in its
file through the process's maps and hooked there once (:mod:`otel_ebpf.rdma.providers`). What
those programs count is read from the kernel's tables once per metrics interval. In processes that
map NCCL each post call also sends a record (:mod:`otel_ebpf.rdma.collectives`: the queue pairs
of NCCL's collectives).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .. import procfs
from ..config import AgentConfig
from ..containers import ContainerResolver
from ..rdma.calls import FUNCTIONS, PROVIDER_FUNCTIONS, VerbsCall, decode
from ..rdma.collectives import CollectiveQueuePairs, Post, decode_post
from ..rdma.datapath import Completions, DataCounts, Latencies, WorkRequests
from ..rdma.providers import place_of, virtual_address
from ..rdma.views import VerbsViews
from ..resources import ProcessResources
from ..selfmetrics import SelfMetrics
from .loading import SET_AGENT_TGID, SET_FILTER_PIDS, TargetTable, close_program, load_program
from .tables import CumulativeTable
from .tls import mapped_files, seen_by

log = logging.getLogger(__name__)

RESCAN_S = 1.0
RING_BUFFER_PAGES = 64  # 256 KiB: control-path calls are few, but a job's start makes thousands at once
POST_RING_BUFFER_PAGES = 256  # 1 MiB of 32-byte post records: 32768, read every poll (milliseconds)
STAT_NAMES = (  # bpf/verbs_trace.c, STAT_*
    "verbs_ringbuf_full",
    "verbs_returns_without_entry",
    "verbs_data_table_full",
    "verbs_pending_table_full",
    "verbs_completions_unmatched",
    "verbs_wr_list_cut",
    "verbs_sge_list_cut",
    "verbs_wc_array_cut",
    "verbs_posts_ringbuf_full",
)
IDLE_EVICT_S = 300.0  # a data-path series that has not grown this long leaves the kernel's table
# the program each provider function gets: (entry, return or None)
PROVIDER_PROGRAMS = {
    "poll_cq": ("enter_poll_cq", "return_poll_cq"),
    "post_send": ("enter_post_send", None),
    "post_recv": ("enter_post_recv", None),
}
_HIDDEN_VERSION = 0x8000  # .gnu.version: a symbol version that is not the default (name@VER, not name@@VER)


def is_verbs_library(path: str) -> bool:
    return os.path.basename(path).startswith("libibverbs.so")


def is_nccl_library(path: str) -> bool:
    return os.path.basename(path).startswith("libnccl.so")


def default_symbols(path: str, names: Iterable[str] = FUNCTIONS) -> dict[str, int]:
    """The virtual address of each of ``names`` that ``path`` defines, at its default version."""
    from elftools.common.exceptions import ELFError  # noqa: PLC0415 — only when a file is looked at
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415
    from elftools.elf.gnuversions import GNUVerSymSection  # noqa: PLC0415
    from elftools.elf.sections import SymbolTableSection  # noqa: PLC0415

    wanted = set(names)
    found: dict[str, int] = {}
    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            symbols = elf.get_section_by_name(".dynsym")
            versions = elf.get_section_by_name(".gnu.version")
            if not isinstance(symbols, SymbolTableSection):
                return {}
            if not isinstance(versions, GNUVerSymSection):
                versions = None
            for index, symbol in enumerate(symbols.iter_symbols()):
                if (
                    symbol.name not in wanted
                    or symbol["st_info"]["type"] != "STT_FUNC"
                    or symbol["st_shndx"] == "SHN_UNDEF"
                ):
                    continue
                version = versions.get_symbol(index).entry["ndx"] if versions is not None else 1
                if isinstance(version, int) and version & _HIDDEN_VERSION:
                    continue
                found[symbol.name] = symbol["st_value"]
    except (OSError, ELFError, ValueError):
        return {}
    return found


class VerbsProbe:
    """Kernel side: ``poll`` returns decoded calls; ``scan`` hooks new libibverbs files."""

    def __init__(self, config: AgentConfig) -> None:
        self._targets = config.targets
        self._max_targets = config.capture.max_processes
        self._bpf: Any = None
        self._seen: set[tuple[int, int]] = set()
        self.hooked: dict[str, tuple[str, ...]] = {}  # path -> functions hooked
        self.pids: set[int] = set()  # processes that map a hooked file
        self._in_targets: TargetTable  # the kernel's targets table: start() makes it
        self._calls: list[VerbsCall] = []
        self._posts: list[Post] = []
        self._post_pids: TargetTable  # the kernel's post_pids table (they map NCCL): start() makes it
        self.follow_posts = False  # whether NCCL processes' post calls are wanted (NCCL spans are made)
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()
        self.providers: dict[str, str] = {}  # "path+0xaddress" -> the provider function hooked there
        self._provider_places: set[tuple[int, int, int]] = set()  # (device, inode, address) hooked
        self._addresses_seen: set[tuple[int, int]] = set()  # (pid, address) placed already
        self._tables: tuple[CumulativeTable, ...] = ()

    def start(self) -> None:
        """Compile, configure, hook what target processes map now. Raises RuntimeError."""
        self._bpf = load_program(
            ["verbs_trace.c"],
            "RDMA verbs probe (bpf/verbs_trace.c)",
            defines={
                "RINGBUF_PAGES": RING_BUFFER_PAGES,
                "POST_RINGBUF_PAGES": POST_RING_BUFFER_PAGES,
                "MAX_TARGETS": self._max_targets,
            },
            settings={SET_AGENT_TGID: os.getpid(), SET_FILTER_PIDS: self._targets.selects_processes},
        )
        self._in_targets = TargetTable(self._bpf["targets"])
        self._post_pids = TargetTable(self._bpf["post_pids"])
        self._bpf["verbs_events"].open_ring_buffer(self._on_event)
        self._bpf["verbs_posts"].open_ring_buffer(self._on_post)
        tables = (("posted", _count_totals), ("completed", _count_totals), ("latencies", _latency_totals))
        self._tables = tuple(
            CumulativeTable(self._bpf[name], totals, time.monotonic, IDLE_EVICT_S) for name, totals in tables
        )
        self.scan()

    def scan(self) -> set[int]:
        """Hook the libibverbs files target processes map that are not hooked yet; returns the
        target processes that map a hooked file (those that exited since are gone from it)."""
        pids = self._target_pids()
        if self._targets.selects_processes:  # the kernel's table follows: new targets in, exited ones out
            self._in_targets.replace(pids)
        mapping, nccl = set(), set()
        for pid in pids:
            files = mapped_files(pid)
            libraries = [path for path in files if is_verbs_library(path)]
            for path in libraries:
                self._consider(path)
            if libraries:
                mapping.add(pid)
                if self.follow_posts and any(is_nccl_library(path) for path in files):
                    nccl.add(pid)
        self.pids = mapping
        self._post_pids.replace(nccl)  # the kernel sends their post calls, and no others'
        self._addresses_seen = {seen for seen in self._addresses_seen if seen[0] in mapping}
        return mapping

    def take_posts(self) -> list[Post]:
        """The post calls read from the ring since the last take."""
        posts, self._posts = self._posts, []
        return posts

    def _target_pids(self) -> set[int]:
        if self._targets.selects_processes:
            return procfs.selected_pids(self._targets.pids, self._targets.executables)
        return set(procfs.iter_pids()) - {os.getpid()}

    def _consider(self, path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) in self._seen:
            return
        self._seen.add((st.st_dev, st.st_ino))
        addresses = default_symbols(path)
        if not addresses:
            log.warning("RDMA: %s defines none of the verbs functions hooked; not hooked", path)
            return
        try:
            for name, address in sorted(addresses.items()):
                # the return first: an entry seen is then always followed by its return
                self._bpf.attach_uretprobe(name=path, addr=address, fn_name=f"return_{name}")
                self._bpf.attach_uprobe(name=path, addr=address, fn_name=f"enter_{name}")
        except Exception as exc:  # noqa: BLE001 — BCC raises bare Exception naming the failure
            log.warning("RDMA: cannot hook %s: %s", path, exc)
            return
        self.hooked[path] = tuple(sorted(addresses))
        log.info("RDMA: hooked %s (%d verbs functions)", path, len(addresses))

    @property
    def started(self) -> bool:
        return self._bpf is not None

    def poll(self, timeout_ms: int) -> list[VerbsCall]:
        self._bpf.ring_buffer_poll(timeout_ms)
        self._bpf.ring_buffer_consume()
        calls, self._calls = self._calls, []
        for call in calls:
            for function, address in zip(PROVIDER_FUNCTIONS, call.providers, strict=True):
                if address and (call.pid, address) not in self._addresses_seen:
                    self._addresses_seen.add((call.pid, address))
                    self._hook_provider(call.pid, function, address)
        return calls

    def _hook_provider(self, pid: int, function: str, address: int) -> None:
        """Hook the provider function at ``address`` in ``pid`` where its file holds it, unless hooked."""
        try:
            with open(f"/proc/{pid}/maps") as f:
                place = place_of(f.read(), address)
        except OSError:
            return  # exited
        if place is None:
            log.warning("RDMA: provider %s of process %d at %#x is in no file; not hooked", function, pid, address)
            return
        path = seen_by(pid, place.path)  # the process's own file, in a container too
        try:
            st = os.stat(path)
        except OSError:
            return
        elf_address = virtual_address(path, place.offset)
        if elf_address is None or (st.st_dev, st.st_ino, elf_address) in self._provider_places:
            return
        self._provider_places.add((st.st_dev, st.st_ino, elf_address))
        enter, leave = PROVIDER_PROGRAMS[function]
        try:
            if leave is not None:  # the return first: an entry seen is then always followed by its return
                self._bpf.attach_uretprobe(name=path, addr=elf_address, fn_name=leave)
            self._bpf.attach_uprobe(name=path, addr=elf_address, fn_name=enter)
        except Exception as exc:  # noqa: BLE001 — BCC raises bare Exception naming the failure
            log.warning("RDMA: cannot hook provider %s in %s: %s", function, place.path, exc)
            return
        self.providers[f"{place.path}+{elf_address:#x}"] = function
        log.info("RDMA: hooked provider %s at %s+%#x (process %d)", function, place.path, elf_address, pid)

    def read_data(self) -> list[DataCounts]:
        """What the data-path programs counted since the last read."""
        posted, completed, latencies = self._tables
        counts: list[DataCounts] = []
        for key, _, (count, size) in posted.read():
            counts.append(WorkRequests(key.pid, key.qp_num, key.opcode, count, size))
        for key, _, (count, size) in completed.read():
            counts.append(Completions(key.pid, key.qp_num, key.opcode, key.status, count, size))
        for key, per_cpu, (total, *buckets) in latencies.read():
            low = min((v.min_ns for v in per_cpu if v.min_ns), default=0)
            counts.append(Latencies(key.pid, key.qp_num, tuple(buckets), total, low, max(v.max_ns for v in per_cpu)))
        return counts

    def forget_processes(self, pids: set[int]) -> None:
        """The work requests of exited processes will not complete: out of the pending table."""
        pending = self._bpf["pending"]
        for key in [key for key in pending.keys() if key.pid in pids]:
            pending.pop(key, None)

    def _on_event(self, _ctx: int, data: int, size: int) -> None:
        call = decode(ctypes.string_at(data, size), self.clock_offset_ns)
        if call is not None:
            self._calls.append(call)

    def _on_post(self, _ctx: int, data: int, size: int) -> None:
        post = decode_post(ctypes.string_at(data, size), self.clock_offset_ns)
        if post is not None:
            self._posts.append(post)

    def kernel_stats(self) -> dict[str, int]:
        table = self._bpf["stats"]
        return {name: sum(table[ctypes.c_int(i)]) for i, name in enumerate(STAT_NAMES)}

    def close(self) -> None:
        if self._bpf is not None:
            close_program(self._bpf)
            self._bpf = None


def _count_totals(per_cpu: Any) -> tuple[int, ...]:
    return sum(v.count for v in per_cpu), sum(v.bytes for v in per_cpu)


def _latency_totals(per_cpu: Any) -> tuple[int, ...]:
    """The sum, then the count of each bucket."""
    return sum(v.sum_ns for v in per_cpu), *(sum(v.slots[i] for v in per_cpu) for i in range(len(per_cpu[0].slots)))


class VerbsMonitor:
    """The verbs probe and its views, as the agent drives them: ``poll`` often, ``collect_metrics``
    each metrics interval, ``close`` at the end."""

    def __init__(self, config: AgentConfig, selfmetrics: SelfMetrics, host_name: str, delta: frozenset) -> None:
        from ..exporters.logs import build_log_sink  # noqa: PLC0415 — with the probe only

        self._selfmetrics = selfmetrics
        self.probe = VerbsProbe(config)
        self._resources = ProcessResources(
            config.resource.attributes, host_name, ContainerResolver(str(config.resource.host_root))
        )
        self.views = VerbsViews(
            self._resources.of, selfmetrics, Path(config.rdma.sysfs_root), delta, config.rdma.max_objects
        )
        self._log_sink = build_log_sink(config, selfmetrics)
        self._next_scan = 0.0
        self._linger_ns = int(config.rdma.collective_linger_s * 1e9)
        self._collectives: CollectiveQueuePairs | None = None

    def join_collectives(self, export: Callable[[list], None]) -> Callable[[list], None]:
        """Where the GPU monitor hands its NCCL spans: they reach ``export`` once their window has
        passed, with the queue pairs they used (:mod:`otel_ebpf.rdma.collectives`)."""
        self._collectives = CollectiveQueuePairs(export, self.views.pair_names, self._selfmetrics, self._linger_ns)
        self.probe.follow_posts = True  # from the next map rescan
        return self._collectives.take

    def start(self) -> None:
        self.probe.start()
        self._next_scan = time.monotonic() + RESCAN_S

    def poll(self, timeout_ms: int = 0) -> None:
        read_until_ns = time.time_ns()  # every post made before now is in the ring: read below
        calls = self.probe.poll(timeout_ms)
        for call in calls:
            self.views.handle(call)
        posts = self.probe.take_posts()
        if self._collectives is not None:
            for post in posts:
                self._collectives.posts.add(post)
            self._collectives.flush(read_until_ns)
        self._selfmetrics.add("otel_ebpf.rdma.calls", len(calls))
        self._log_sink.export(self.views.take_logs())
        if time.monotonic() >= self._next_scan:
            self._next_scan = time.monotonic() + RESCAN_S
            before = self.probe.pids
            gone = before - self.probe.scan()
            gone = {pid for pid in gone if not os.path.exists(f"/proc/{pid}")}
            if gone:
                self.views.processes_exited(gone)
                self.probe.forget_processes(gone)
                for pid in gone:
                    self._resources.pop(pid)
            self._selfmetrics.set("otel_ebpf.rdma.libraries", len(self.probe.hooked))
            self._selfmetrics.set("otel_ebpf.rdma.provider_functions", len(self.probe.providers))
            for reason, total in self.probe.kernel_stats().items():
                self._selfmetrics.set("otel_ebpf.kernel.drops", total, {"reason": reason})

    def collect_metrics(self, now_ns: int) -> list:
        self.views.record_data(self.probe.read_data(), now_ns)
        return self.views.collect_metrics(now_ns)

    def close(self, timeout_s: float = 5.0) -> None:
        """Take what the kernel still holds (the data path's counts: for the agent's last metrics,
        collected after this), export the last records, detach."""
        try:
            if self.probe.started:
                self.poll(0)
                if self._collectives is not None:
                    self._collectives.flush(None)
                self.views.record_data(self.probe.read_data(), time.time_ns())
        finally:
            self.probe.close()
            self._log_sink.shutdown(timeout_s)
