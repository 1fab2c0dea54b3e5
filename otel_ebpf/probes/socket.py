"""Socket probe: loads ``bpf/socket_trace.c``, attaches it, and yields typed events.

The only module (with its siblings in ``probes/``) that imports ``bcc``. Besides decoding the ring
buffer it fills in from ``/proc`` what the kernel events cannot tell (process identity, tuples of
sockets that predate the agent), so the pipeline behind it needs nothing but the event stream.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .. import procfs
from ..cgroups import CgroupPaths, cgroup2_mount
from ..config import CaptureConfig, TargetsConfig
from ..containers import ContainerResolver
from ..pipeline.events import (
    ConnClose,
    ConnData,
    ConnKey,
    ConnOpen,
    Event,
    HttpRequestCounts,
    KernelLoss,
    KernelTrace,
    ProcessExit,
    ProcessInfo,
    TcpHealthCounts,
)
from ..protocol import Direction, Endpoint, Role, Transport
from ..ring_loss import RingLossLog
from . import tcp_health
from .addresses import AF_UNIX, endpoint, unix_ends
from .btf import VMLINUX, Btf, BtfError
from .http_red import HttpRedReader
from .inject import Injection
from .loading import (
    TargetTable,
    close_program,
    detach_programs,
    load_program,
    power_of_two_at_least,
    ring_buffer_pages,
    write_settings,
)
from .ringbuf import RingBufferReader
from .tls import SYMBOL_PATTERN, TLSAttacher, TLSLibraries, mapped_files, system_libssl

log = logging.getLogger(__name__)

EV_DATA, EV_OPEN, EV_CLOSE, EV_EXEC, EV_EXIT, EV_DGRAM, EV_TRACE = 1, 2, 3, 4, 5, 6, 7
SET_AGENT_TGID, SET_FILTER_PIDS, SET_FILTER_PORTS, SET_WATCH_EXEC, SET_READY = 0, 1, 2, 3, 4
SET_SHED_BACKLOG, SET_KEEP_1024, SET_GAVE_UP = 5, 6, 7
STAT_NAMES = (
    "ringbuf_full",
    "active_full",
    "iov_bytes_not_captured",
    "mmsg_not_copied",
    "tls_unattributed",
    "http_red_full",
    "http_pipeline_full",
    "socket_io_outside_syscalls",  # io_uring's or splice's socket I/O of traced processes: not copied
    "http_responses_unseen",  # HTTP/1 requests unanswered at a close of such a socket: not in the histograms
)
# stats[] slots 9.. : HTTP/1 requests shed, by reason (bpf/http1_summary.h, SHED_*)
SHED_REASONS = ("backlog", "cpu_budget", "ring_full")
# iovec segments a vectored syscall's exit copies (grpcio writes one per HPACK field); the rest,
# up to 320 in all, in a program it tail-calls (segments_more in bpf/socket_trace.c)
MAX_IOV = 64
MAX_RED_SERIES = 4096  # HTTP/1 metric series the kernel aggregates (http_red)
LOSS_CHECK_S = 1.0
MAX_TOLD = 64  # processes a warning names, each once (socket I/O outside syscalls, unread TLS); counters count all
# Records decoded per poll at most: what one loop iteration hands the pipeline stays bounded, and
# short enough (about 70 ms of CPU for HTTP/1) that the loop's once-a-second CPU-budget reading
# stays near a second when the agent gets only a fraction of a core (8192 stretched it to 2-3 s).
MAX_POLL_RECORDS = 2048
# Ring bytes decoded per poll at most: 2,048 records of HTTP/1 are a few hundred KiB, but a busy
# HTTP/2 connection's records are 4 KiB each with a score of calls in every one, and 2,048 of them
# (read at once after the reader waited on its CPU budget) made more spans than the export queue
# holds (export.max_queue_spans: 20,000), which dropped the rest.
MAX_POLL_BYTES = 512 * 1024
# New HTTP/1 exchanges are shed while more than this share of the ring is waiting to be read.
SHED_BACKLOG_SHARE = 0.5
# The kernel wakes the agent each time the bytes waiting for it cross another such share of the
# ring; a poll's timeout bounds the wait for fewer.
WAKEUP_SHARE = 1 / 16

_HEADER = struct.Struct("<QIIIiII")  # ts, type, tgid, tid, fd, generation, flags
HDR_AFTER_LOSS = 1
HDR_UNSEEN_IO = 2
HDR_TLS = 4
_DATA = struct.Struct("<IIII")  # direction, length, captured, flags
_DIRECTIONS = tuple(Direction)  # by value: indexing costs a tenth of calling the enum
# A (TCP) data event's: _DATA's fields, then the connection's retransmissions so far; one unpack
_STREAM_DATA = struct.Struct(_DATA.format + "I")
DATA_TLS = 1
DATA_LAST_CHUNK = 2  # the call's hidden bytes end with LAST_CHUNK (ends_chunked in socket_trace.c)
LAST_CHUNK = b"\r\n0\r\n\r\n"
# role, family, lport, rport, protocol, path_length, path_of_peer, laddr, raddr, comm, client_isn,
# server_isn, path
_OPEN = struct.Struct("<IHHHHHH16s16s16sII128s")
_OPEN_COMM = 9  # the place of comm in _OPEN's fields
_DGRAM_PEER = struct.Struct("<HH4x16s")  # family, port, pad, addr: after _DATA in a datagram event
IPPROTO_UDP = 17
_TRACE = struct.Struct("<QQQBB6x")  # after the header of an EV_TRACE: struct trace_ids
_ROLES = {1: Role.CLIENT, 2: Role.SERVER}


SOCK_LENGTH_TRACEPOINT = Path("/sys/kernel/tracing/events/sock/sock_send_length")


def resolve_socket_mode(requested: str) -> str:
    """``auto`` means the sock tracepoints when this kernel has them (Linux 6.3+) and BTF, which
    their programs read sockets and task storage by."""
    if requested != "auto":
        return requested
    return "tracepoints" if SOCK_LENGTH_TRACEPOINT.exists() and VMLINUX.exists() else "fd-tracking"


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> list[int]:
    """CPU ids the kernel may ever use, e.g. ``0-3,8`` -> [0, 1, 2, 3, 8]."""
    cpus: list[int] = []
    for part in Path(path).read_text().strip().split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


@dataclass(slots=True)
class _Opening:
    """A connection the kernel announced, until user space admits it (as a ConnOpen) or not.

    ``index`` is its place in the poll's events, where a placeholder waits while its tuple is
    looked up in /proc."""

    index: int
    ts: int
    key: ConnKey
    role: Role | None
    family: int
    local: Endpoint | None
    peer: Endpoint | None
    lport: int
    rport: int
    unwanted: bool = False
    transport: Transport = Transport.TCP
    isns: tuple[int, int] | None = None  # (client, server): the TCP handshake's sequence numbers


def _kernel_offsets(sock_length: bool, rtt_at_reads: bool) -> list[str]:
    """Where the kernel's structs keep what the programs read, as ``-D`` flags, from its BTF:
    with ``sock_length``, a socket's family, type and protocol, which the raw ``sock_{send,recv}_length``
    programs read (a RuntimeError without BTF, which that mode's task storage needs anyway); the
    ``tcp_sock`` sequence numbers the ISNs are read from and, with ``rtt_at_reads``, the smoothed
    RTT that TCP health samples when a traced process reads (bpf/tcp_health.c). Without BTF, no
    ISNs (said once), and the RTT is sampled at each segment received instead."""
    try:
        btf = Btf.from_file()  # a second each: read once for all
        flags = []
        if sock_length:
            family = btf.offset("sock", "__sk_common") + btf.offset("sock_common", "skc_family")
            flags += [
                f"-DSKC_FAMILY={family}",
                f"-DSK_TYPE={btf.offset('sock', 'sk_type')}",
                f"-DSK_PROTOCOL={btf.offset('sock', 'sk_protocol')}",
            ]
            flags += _unix_offsets(btf)
    except BtfError as exc:
        if sock_length:
            raise RuntimeError(
                f"socket_mode tracepoints reads sockets by the kernel's BTF: {exc}; "
                "capture.socket_mode: fd-tracking needs none"
            ) from None
        log.info("TCP initial sequence numbers not read (connections cannot be joined across nodes): %s", exc)
        return []
    try:
        flags += [
            f"-DTCP_SND_UNA={btf.offset('tcp_sock', 'snd_una')}",
            f"-DTCP_RCV_NXT={btf.offset('tcp_sock', 'rcv_nxt')}",
        ]
        if rtt_at_reads:
            flags.append(f"-DTCP_SRTT_US={btf.offset('tcp_sock', 'srtt_us')}")
    except BtfError as exc:
        log.info("TCP initial sequence numbers not read (connections cannot be joined across nodes): %s", exc)
    return flags


def _unix_offsets(btf: Btf) -> list[str]:
    """What unix stream connections' open events read (bpf/socket_trace.c, ``unix_ends``): without
    them (unix sockets built as a module keep their types out of the kernel's BTF) such
    connections are not traced, and that is said once."""
    try:
        return [
            "-DUNIX_ENDS",
            f"-DUNIX_PEER={btf.offset('unix_sock', 'peer')}",
            f"-DUNIX_ADDR={btf.offset('unix_sock', 'addr')}",
            f"-DUNIX_ADDRESS_LEN={btf.offset('unix_address', 'len')}",
            f"-DUNIX_ADDRESS_NAME={btf.offset('unix_address', 'name')}",
        ]
    except BtfError as exc:
        log.warning("connections over unix sockets are not traced: %s", exc)
        return []


def _tls_symbols(path: str) -> set[str]:
    """Which SSL entry points ``path`` defines (BCC reads its symbol tables)."""
    from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

    try:
        return {name.decode() for name, _ in BPF.get_user_functions_and_addresses(path, SYMBOL_PATTERN)}
    except Exception:  # noqa: BLE001 — not an ELF file, or unreadable: no symbols
        return set()


@dataclass(slots=True)
class _Started:
    """What :meth:`SocketProbe.start` builds: the program, and what reads it or attaches through it."""

    bpf: Any  # bcc.BPF, untyped (see loading.compile_program)
    targets: TargetTable
    tls: TLSAttacher
    ring: RingBufferReader
    http_red: HttpRedReader
    tcp_health: tcp_health.TcpHealthReader | None  # with capture.tcp_health
    injection: Injection | None  # with inject_traceparent
    flow_fds: list[int]  # with capture.tcp_flows: what holds the flow programs attached
    gave_up: bool = False  # ignore_connection ran: settings[SET_GAVE_UP] is set


class _UprobeCloser:
    """Closes detached uprobes off the poll loop. Each close waits for the kernel's RCU grace
    periods (~0.1 s measured here), so detaching an exited process's 14 SSL probes in line would
    stall the ring buffer for over a second."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[bytes, int] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def close(self, bpf: Any, names: Iterable[bytes]) -> None:
        """Take ``names`` (BCC uprobe event names) off ``bpf`` at once, close them soon."""
        for name in names:
            fd = bpf.uprobe_fds.get(name)
            if fd is None:
                continue
            bpf._del_uprobe_fd(name)  # noqa: SLF001 — BCC's count of open probes
            self._queue.put((name, fd))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="uprobe-closer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        from bcc.libbcc import lib  # noqa: PLC0415

        while (item := self._queue.get()) is not None:
            name, fd = item
            lib.bpf_close_perf_event_fd(fd)
            lib.bpf_detach_uprobe(name)  # removes the tracefs event where BCC had to make one (old kernels)

    def stop(self) -> None:
        """Wait for the closes queued so far."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class SocketProbe:
    """Kernel side of socket capture. ``poll`` returns decoded events in ring-buffer order."""

    def __init__(
        self,
        capture: CaptureConfig,
        targets: TargetsConfig,
        containers: ContainerResolver,
        inject_traceparent: bool = False,
    ) -> None:
        """``inject_traceparent``: insert W3C ``traceparent`` into traced processes' HTTP/1 requests
        (bpf/inject_traceparent.c, docs/kubernetes.md)."""
        self.capture = capture
        self.inject_traceparent = inject_traceparent
        self.targets = targets
        self._containers = containers
        self.payload_cap = power_of_two_at_least(capture.payload_cap)
        self.socket_mode = resolve_socket_mode(capture.socket_mode)
        self.tcp_health = capture.tcp_health and self._tcp_health_supported()
        self._started: _Started | None = None  # from start() to close()
        self.latest_event_ns = 0  # the newest timestamp decoded so far (Unix time)
        # with capture.tcp_flows: the cgroup v2 mount the flow programs attach to
        self._cgroup_mount = self._flows_mount() if self.tcp_health and capture.tcp_flows else None
        if capture.tcp_flows and not self.tcp_health:
            log.warning("TCP bytes and packets are not counted: they need TCP health (capture.tcp_health)")
        self._events: list[Event | _Opening] = []  # _Opening: placeholders, see poll
        self._known_pids: set[int] = set()
        self._lost_reported = 0
        self._loss_log = RingLossLog()
        self._next_loss_check = 0.0
        self._outside_counted = 0
        self._outside_told: set[int] = set()  # processes named in the log (at most MAX_TOLD)
        self._ciphertext_told: set[int] = set()  # processes whose unread TLS was explained (idem)
        self._exited_ciphertext_told = False  # an exited one was: the next go to the debug log
        # connections user space rejected (failing --port, not TCP, the agent's own exports) whose
        # events may still be in flight; insertion-ordered so the oldest go first past the cap
        self._filtered_out: dict[ConnKey, None] = {}
        self._own_endpoints: set[Endpoint] = set()  # fd-tracking: the agent's own connections
        self._own_endpoints_fresh = False  # read from /proc during this poll
        self._unresolved: list[_Opening] = []  # this poll's sockets announced without a local end
        self._uprobe_closer = _UprobeCloser()
        self._detaching: threading.Thread | None = None  # from detach(): TLS targets no longer followed
        self._preexisting: dict[tuple[int, int], procfs.SocketTuple] = {}  # (pid, fd) at start
        self._synthetic = 1  # fd-tracking ids for seeded sockets: odd, below the kernel's ktime ones
        # Kernel time (CLOCK_MONOTONIC) -> Unix time, fixed at start so replays see the same values.
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Compile, configure and attach. Raises RuntimeError with BCC's message on failure."""
        pages = ring_buffer_pages(self.capture.ring_buffer_kb)
        ring_bytes = pages * os.sysconf("SC_PAGE_SIZE")
        drop_reasons, drop_flags = self._drops() if self.tcp_health else (None, [])
        filtering = self.targets.selects_processes
        targets = procfs.selected_pids(self.targets.pids, self.targets.executables)
        sock_length = self.socket_mode != "fd-tracking"
        # reads and writes copied where the socket hands their bytes over or takes them, with no
        # exit program (a read's arguments from x86-64's saved registers; traceparent injection
        # keeps the enters and exits)
        copy_in_sock = sock_length and not self.inject_traceparent and os.uname().machine == "x86_64"
        bpf = load_program(
            [
                "socket_trace.c",
                "tls_trace.c",
                *(["tcp_health.c"] if self.tcp_health else []),
                *(["tcp_flows.c"] if self._cgroup_mount else []),
                *(["inject_traceparent.c"] if self.inject_traceparent else []),
            ],
            "socket probe",
            defines={
                "PAYLOAD_CAP": self.payload_cap,
                "MAX_IOV": MAX_IOV,
                "MAX_RED_SERIES": MAX_RED_SERIES,
                "MAX_CONNS": self.capture.max_connections,
                "MAX_TARGETS": self.capture.max_processes,
                "RINGBUF_PAGES": pages,
                "WAKEUP_BYTES": int(ring_bytes * WAKEUP_SHARE),
                "NR_CPUS": max(possible_cpus()) + 1,
                "FD_TRACKING": self.socket_mode == "fd-tracking",
                "TCP_HEALTH": self.tcp_health,
                "MAX_TCP_SERIES": tcp_health.MAX_TCP_SERIES if self.tcp_health else None,
                "TCP_RETRANSMIT_ERR": self.tcp_health and tcp_health.retransmit_reports_failures(),
                "TCP_FLOWS": self._cgroup_mount is not None,
                "INJECT": self.inject_traceparent,
                "COPY_IN_SOCK": copy_in_sock,
            },
            # reads name their socket (sock_recv_length) unless tracking fds: RTT sampled there
            cflags=[*_kernel_offsets(sock_length, self.tcp_health and sock_length), *drop_flags],
            settings={
                SET_AGENT_TGID: os.getpid(),
                SET_FILTER_PIDS: filtering,
                SET_WATCH_EXEC: bool(self.targets.executables),
                SET_SHED_BACKLOG: int(ring_bytes * SHED_BACKLOG_SHARE),
                SET_KEEP_1024: 1024,
            },
            targets=targets,
        )
        try:  # until _started holds it, close() cannot free the program
            # what the kernel measures the ring's backlog with, to shed before it overflows
            bpf["events_ref"][ctypes.c_int(0)] = ctypes.c_int(bpf["events"].map_fd)
            from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

            # what a vectored call's exit hands the segments past MAX_IOV to: a program of its own
            # type (the syscall exits, and the sock tracepoints for the reads and writes they copy)
            more = bpf.load_func("segments_more", BPF.TRACEPOINT)
            bpf["segments_tail"][ctypes.c_int(0)] = ctypes.c_int(more.fd)
            if copy_in_sock:  # bpf/socket_trace.c: SOCK_TAIL_SEGMENTS, SOCK_TAIL_IOV
                for index, name in enumerate(("segments_more_sock", "sock_iov")):
                    program = bpf.load_func(name, BPF.RAW_TRACEPOINT)
                    bpf["sock_tail"][ctypes.c_int(index)] = ctypes.c_int(program.fd)
            injection = Injection(bpf) if self.inject_traceparent else None
            self._kernel_exec_names(bpf)
            if self.targets.ports:
                ports = bpf["ports"]
                for port in self.targets.ports:
                    ports[ctypes.c_uint16(port)] = ctypes.c_uint8(1)
                write_settings(bpf, {SET_FILTER_PORTS: 1})
            flows, cgroup_path, flow_fds = self._attach_flows(bpf) if self.tcp_health else (None, None, [])
            self._started = started = _Started(
                bpf,
                TargetTable(bpf["targets"], targets),
                # Tracing chosen processes, the SSL probes are attached for each of them only (see tls.py).
                TLSAttacher(
                    _tls_symbols, self._attach_tls, self._detach_tls, targets=self._is_target if filtering else None
                ),
                RingBufferReader(bpf["events"].map_fd, ring_bytes),
                HttpRedReader(bpf["http_red"]),
                tcp_health.TcpHealthReader(
                    bpf["tcp_series"],
                    bpf["tcp_drops"] if drop_reasons is not None else None,
                    drop_reasons,
                    flows,
                    cgroup_path,
                )
                if self.tcp_health
                else None,
                injection,
                flow_fds,
            )
        except BaseException:
            close_program(bpf)
            raise
        for pid in targets:
            self._follow(pid)
        if not filtering:
            self._note_existing_sockets(procfs.iter_pids())
        start_pids = started.targets.pids if filtering else set(procfs.iter_pids()) - {os.getpid()}
        started.tls.scan(start_pids, system_libssl())
        write_settings(bpf, {SET_READY: 1})

    @property
    def bpf(self) -> Any:
        """The loaded program (``bcc.BPF``), once started: what benchmarks read per-program runs from."""
        return self._run.bpf

    @property
    def _run(self) -> _Started:
        """What start() built (a call before it, or after close(), is a bug)."""
        if self._started is None:
            raise RuntimeError("the socket probe is not started")
        return self._started

    @staticmethod
    def _drops() -> tuple[dict[int, str] | None, list[str]]:
        """The kernel's drop reasons and the flags that count dropped packets of traced sockets,
        where the kernel can tell whose they are (``skb:kfree_skb`` with ``rx_sk``, and BTF for
        ``sk_buff.sk``); (None, no flags) otherwise."""
        reasons = tcp_health.drop_reasons()
        if reasons is None:
            log.info("TCP drops not counted: skb:kfree_skb names no receiving socket on this kernel (Linux 6.8+)")
            return None, []
        try:
            return reasons, ["-DTCP_DROPS", f"-DSKB_SK={Btf.from_file().offset('sk_buff', 'sk')}"]
        except BtfError as exc:
            log.info("TCP drops not counted: %s", exc)
            return None, []

    @staticmethod
    def _flows_mount() -> Path | None:
        """Where the cgroup programs of capture.tcp_flows attach: the cgroup v2 root."""
        try:
            return cgroup2_mount()
        except (OSError, ValueError) as exc:
            log.warning("TCP bytes and packets are not counted: %s", exc)
            return None

    def _attach_flows(self, bpf: Any) -> tuple[Any, Callable[[int], str] | None, list[int]]:
        """``tcp_flows``, what names its cgroups and what holds the flow programs attached; (None,
        None, []) without capture.tcp_flows or where the kernel refuses them (said in the log)."""
        if self._cgroup_mount is None:
            return None, None, []
        try:
            fds = tcp_health.attach_flows(bpf, str(self._cgroup_mount))
        except Exception as exc:  # noqa: BLE001 — BCC raises bare Exception when the verifier refuses a program
            log.warning("TCP bytes and packets are not counted: %s", exc)
            return None, None, []
        return bpf["tcp_flows"], CgroupPaths(self._cgroup_mount).path, fds

    def _tcp_health_supported(self) -> bool:
        missing = tcp_health.missing_tracepoints(rtt_per_segment=self.socket_mode == "fd-tracking")
        if missing:
            log.warning("TCP health is off: this kernel lacks the tracepoints %s", ", ".join(missing))
        return not missing

    def _attach_tls(self, path: str, symbol: str, program: str, is_return: bool, pid: int | None) -> list[bytes]:
        """One SSL probe, for process ``pid`` only or (None) every process mapping ``path``; the
        names BCC gave what it attached, which are what ``_detach_tls`` needs (BCC's own detach
        looks the symbol up again, in a process that may be gone)."""
        if self._detaching is not None:
            return []  # stopping: nothing new
        bpf = self._run.bpf
        before = set(bpf.uprobe_fds)
        attach = bpf.attach_uretprobe if is_return else bpf.attach_uprobe
        attach(name=path, sym=symbol, fn_name=program, pid=-1 if pid is None else pid)
        return [name for name in bpf.uprobe_fds if name not in before]

    def _detach_tls(self, handle: object) -> None:
        """``handle``: what one ``_attach_tls`` returned (TLSAttacher keeps handles untyped)."""
        if self._detaching is None:  # else detach() takes every probe off at once
            self._uprobe_closer.close(self._run.bpf, cast("list[bytes]", handle))

    def _is_target(self, pid: int) -> bool:
        """Whether the kernel traces ``pid`` (children join at fork, exiting processes leave)."""
        return pid in self._run.targets

    @property
    def tls_libraries(self) -> TLSLibraries:
        """TLS implementations found so far: hooked, and those without symbols."""
        return self._run.tls.libraries

    def detach(self) -> None:
        """Begin to stop: the kernel's programs come off in a thread of their own (seconds of the
        kernel's grace periods), while the ring and the maps stay readable, so that the agent reads
        what the ring holds meanwhile (``drain``); ``close`` waits for it."""
        started = self._started
        if started is None or self._detaching is not None:
            return

        def detach() -> None:
            self._uprobe_closer.stop()
            detach_programs(started.bpf)

        self._detaching = threading.Thread(target=detach, name="detach-socket-probe")
        self._detaching.start()

    def close(self) -> None:
        if self._detaching is not None:
            self._detaching.join()
        started, self._started = self._started, None
        if started is None:
            return
        started.ring.close()
        if started.tls.libraries.refused:
            log.warning(
                "TLS: %d (library, process) pairs were not hooked: more than %d at once",
                started.tls.libraries.refused,
                started.tls.max_attachments,
            )
        self._uprobe_closer.stop()
        for fd in started.flow_fds:
            os.close(fd)
        if started.injection is not None:
            started.injection.close()
        close_program(started.bpf)

    def _kernel_exec_names(self, bpf: Any) -> None:
        """The --exe names the kernel matches at exec (bpf/socket_trace.c): a process run by one is
        traced from its first syscall, however short its life."""
        names = procfs.exact_names(self.targets.executables)
        table = bpf["exec_names"]
        for name in names[: table.max_entries]:
            table[table.Key(name.encode())] = ctypes.c_uint8(1)
        if len(names) > table.max_entries:
            log.warning(
                "--exe: %d names, the kernel matches the first %d at exec; processes run by the others are "
                "traced once user space has seen their exec (a short-lived one may be missed)",
                len(names),
                table.max_entries,
            )

    def keep_exchanges(self, share: float) -> None:
        """Copy only this share of new HTTP/1 exchanges (the rest are shed, counted, still in the
        kernel's exact counts): how the agent stays within its CPU budget."""
        write_settings(self._run.bpf, {SET_KEEP_1024: max(1, min(1024, round(share * 1024)))})

    def add_target(self, pid: int) -> None:
        self._run.targets.add(pid)
        self._follow(pid)

    def _follow(self, pid: int) -> None:
        """``pid`` is a target now: its existing connections noted, its SSL libraries watched."""
        self._note_existing_sockets([pid])
        self._run.tls.watch(pid)

    def _note_existing_sockets(self, pids: Iterable[int]) -> None:
        """Connections made before the agent (or before a process became a target) showed the
        kernel no state change: take their tuples from /proc now, before their fds can be closed
        and reused. Tracking fds, they are also the connections the kernel should know."""
        bpf = self._run.bpf
        conns, listen_ports = bpf["conns"], bpf["listen_ports"]
        for pid in pids:
            if pid == os.getpid():
                continue
            sockets = procfs.tcp_sockets(pid)
            for fd, found in sockets.connected.items():
                self._preexisting[(pid, fd)] = found
                if self.socket_mode == "fd-tracking":
                    self._synthetic += 2
                    leaf = conns.Leaf()
                    leaf.synthetic = self._synthetic
                    conns[ctypes.c_uint64((pid << 32) | fd)] = leaf
            if self.socket_mode == "fd-tracking":
                for fd, port in sockets.listening.items():
                    listen_ports[ctypes.c_uint64((pid << 32) | fd)] = ctypes.c_uint16(port)

    def ignore_connection(self, conn: ConnKey) -> None:
        """Tell the kernel to stop copying this connection's bytes (user space gave up on it)."""
        if self._started is None:
            return
        pid, fd, generation = conn
        key = ctypes.c_uint64((pid << 32) | (fd & 0xFFFFFFFF))
        self._started.bpf["ignored"][key] = ctypes.c_uint32(generation)
        if not self._started.gave_up:  # until the first, the kernel's exits skip the table's lookup
            write_settings(self._started.bpf, {SET_GAVE_UP: 1})
            self._started.gave_up = True

    def tell_ciphertext(self, conn: ConnKey) -> None:
        """User space judged a connection to be TLS that no SSL probe decrypted: say why, once per
        process. A process that maps a TLS library the agent hooked began that connection before
        its probes were attached, or closed it after the handshake (a TLS health check): the debug
        log only."""
        pid = conn[0]
        told = self._ciphertext_told
        if pid in told or len(told) >= MAX_TOLD or self._started is None:
            return
        told.add(pid)
        name = procfs.process_name(pid)
        if name is None:  # no name to tell them apart by: one warning for all
            level = logging.DEBUG if self._exited_ciphertext_told else logging.WARNING
            self._exited_ciphertext_told = True
            log.log(
                level,
                "process %d, which has exited, made TLS connections whose plaintext the agent did not see "
                "(it began TLS before its TLS library was hooked, as a curl run by a traced script does, "
                "or its library is not one the agent hooks): they make no spans (counted in "
                "otel_ebpf.connections.tls_ciphertext; later such processes only in the debug log)",
                pid,
            )
        elif mapped_files(pid) & self._started.tls.libraries.hooked.keys():
            log.debug(
                "process %d (%s): a TLS connection began before its SSL probes were attached, or carried no "
                "application data",
                pid,
                name,
            )
        else:
            log.warning(
                "process %d (%s) speaks TLS through a library the agent does not hook (only OpenSSL's API "
                "is: Java's JSSE, Go's crypto/tls, rustls, GnuTLS and a statically linked BoringSSL are "
                "not): its TLS connections make no spans (counted in otel_ebpf.connections.tls_ciphertext)",
                pid,
                name,
            )

    # ---- events ----------------------------------------------------------------------------------

    def poll(self, timeout_ms: int, max_records: int = MAX_POLL_RECORDS) -> list[Event]:
        """Wait up to ``timeout_ms`` for events; return what arrived (possibly nothing), at most
        ``max_records`` of the ring's records and about ``MAX_POLL_BYTES`` of it: the rest wait in
        the ring for the next poll."""
        # The kernel wakes us only when another WAKEUP_SHARE of the ring is waiting; the timeout
        # bounds the wait for less.
        self._own_endpoints_fresh = False
        started = self._run
        ring = started.ring
        ring.wait(timeout_ms)
        data = ring.data
        for offset, size in ring.records(max_records, MAX_POLL_BYTES):
            self._on_record(data, offset, size)
        pending, self._events = self._events, []
        # placeholders are there only while openings wait to be resolved
        events = self._resolve_openings(pending) if self._unresolved else cast("list[Event]", pending)
        if started.tls.scan_due():  # libraries loaded since (Python imports ssl on first use)
            started.tls.scan(self._known_pids)
        now = time.monotonic()
        if now >= self._next_loss_check:  # per-CPU map reads are syscalls: not every poll
            self._next_loss_check = now + LOSS_CHECK_S
            stats = self.kernel_stats()
            lost = stats["ringbuf_full"]
            if stats["socket_io_outside_syscalls"] > self._outside_counted:
                self._outside_counted = stats["socket_io_outside_syscalls"]
                self._tell_outside_syscalls()
            if lost > self._lost_reported:
                events.append(KernelLoss(time.time_ns(), lost - self._lost_reported))
                self._lost_reported = lost
                self._loss_log.update(lost, now)
        return events

    def _tell_outside_syscalls(self) -> None:
        """The kernel counted socket I/O it could not copy: name the process it counted last, once (by
        its own name while it runs, else by the name of the thread the kernel counted)."""
        last = self._run.bpf["outside_syscalls_process"][ctypes.c_int(0)]
        if last.tgid in self._outside_told or len(self._outside_told) >= MAX_TOLD:
            return
        self._outside_told.add(last.tgid)
        log.warning(
            "process %d (%s) reads or sends on sockets through io_uring or splice, not read/write-family "
            "syscalls: those bytes are not captured and make no spans (counted in otel_ebpf.kernel.drops, "
            "reason=socket_io_outside_syscalls)",
            last.tgid,
            procfs.process_name(last.tgid) or bytes(last.comm).split(b"\0", 1)[0].decode(errors="replace"),
        )

    def http_counts(self) -> list[Event]:
        """The kernel's HTTP/1 counts since the last call. The kernel counts a request when its
        response starts, which can be before the process's first event reaches user space: such a
        process is announced here, ahead of its counts."""
        return self._announced(self._run.http_red.read(self.latest_event_ns))

    def tcp_health_counts(self) -> list[Event]:
        """The kernel's TCP health counts since the last call (capture.tcp_health), each process
        announced ahead of its first counts as in :meth:`http_counts`. A process may have counts
        before any event of it was read (a refused connect moves no bytes): until then, the clock
        stamps them. None when the kernel lacks what TCP health needs."""
        reader = self._run.tcp_health
        if reader is None:
            return []
        return self._announced(reader.read(self.latest_event_ns or time.time_ns()))

    def _announced(self, counts: Sequence[HttpRequestCounts | TcpHealthCounts]) -> list[Event]:
        for counted in counts:
            if counted.pid not in self._known_pids:
                self._announce_process(counted.pid, counted.timestamp_ns, "")
        # _announce_process queues ProcessInfo only: no placeholders here
        announced, self._events = cast("list[Event]", self._events), []
        return [*announced, *counts]

    def drain(self) -> Iterator[list[Event]]:
        """The events the ring holds now, in bounded batches (the agent is stopping): at most one
        ring's worth, whatever traffic goes on meanwhile."""
        ring = self._run.ring
        target = ring.produced
        while ring.consumed < target:
            before = ring.consumed
            yield self.poll(0)
            if ring.consumed == before:  # a record still being written: leave it
                return

    def kernel_stats(self) -> dict[str, int]:
        """Totals of the kernel's per-CPU drop counters since start."""
        started = self._run
        table = started.bpf["stats"]
        stats = {name: sum(table[ctypes.c_int(i)]) for i, name in enumerate(STAT_NAMES)}
        if started.tcp_health is not None:
            tcp_table = started.bpf["tcp_stats"]
            stats.update({name: sum(tcp_table[ctypes.c_int(i)]) for i, name in enumerate(tcp_health.STAT_NAMES)})
        return stats

    def injections(self) -> dict[str, int]:
        """traceparent injection: requests by outcome since start (none when it is off)."""
        injection = self._run.injection
        return injection.counts() if injection is not None else {}

    def shed_requests(self) -> dict[str, int]:
        """HTTP/1 requests the kernel shed since start, by reason."""
        table = self._run.bpf["stats"]
        return {reason: sum(table[ctypes.c_int(len(STAT_NAMES) + i)]) for i, reason in enumerate(SHED_REASONS)}

    def _on_record(self, data: mmap.mmap | bytes, offset: int, size: int) -> None:
        # Decoded where it lies in the ring: only a payload is copied out, once, as the bytes its
        # event keeps. ``size`` is the record's whole length, which the decoding does not need.
        ts, kind, tgid, tid, fd, generation, flags = _HEADER.unpack_from(data, offset)
        if (tgid, fd, generation) in self._filtered_out:
            if kind == EV_CLOSE:
                self._filtered_out.pop((tgid, fd, generation), None)
            return
        ts += self.clock_offset_ns
        if ts > self.latest_event_ns:
            self.latest_event_ns = ts
        body = offset + _HEADER.size
        if tgid not in self._known_pids and kind in (EV_DATA, EV_DGRAM, EV_OPEN, EV_CLOSE, EV_TRACE):
            comm = _OPEN.unpack_from(data, body)[_OPEN_COMM] if kind == EV_OPEN else b""
            self._announce_process(tgid, ts, comm.split(b"\0", 1)[0].decode(errors="replace"))
        if kind == EV_DATA:
            direction, length, captured, data_flags, retransmissions = _STREAM_DATA.unpack_from(data, body)
            start = body + _STREAM_DATA.size
            # positional, in the dataclass's order (tls, peer, after_loss, retransmissions, tail): the
            # hottest line of the decoding, where keywords cost ~0.1 us per event
            self._events.append(
                ConnData(
                    ts,
                    tgid,
                    tid,
                    fd,
                    generation,
                    _DIRECTIONS[direction],
                    length,
                    data[start : start + captured],
                    data_flags & DATA_TLS != 0,
                    None,
                    flags & HDR_AFTER_LOSS != 0,
                    retransmissions,
                    LAST_CHUNK if data_flags & DATA_LAST_CHUNK else b"",
                )
            )
        elif kind == EV_TRACE:
            trace_hi, trace_lo, span, _, sampled = _TRACE.unpack_from(data, body)
            self._events.append(
                KernelTrace(ts - 1, tgid, fd, generation, ts, trace_hi << 64 | trace_lo, span, bool(sampled))
            )
        elif kind == EV_DGRAM:
            direction, length, captured, _ = _DATA.unpack_from(data, body)
            family, port, addr = _DGRAM_PEER.unpack_from(data, body + _DATA.size)
            start = body + _DATA.size + _DGRAM_PEER.size
            self._events.append(
                ConnData(
                    ts,
                    tgid,
                    tid,
                    fd,
                    generation,
                    _DIRECTIONS[direction],
                    length,
                    data[start : start + captured],
                    False,
                    endpoint(family, addr, port) if family in (2, 10) else None,
                )
            )
        elif kind == EV_OPEN:
            self._conn_open(data, body, ts, tgid, fd, generation)  # queues the open itself, or its placeholder
        elif kind == EV_CLOSE:
            self._events.append(
                ConnClose(
                    ts,
                    tgid,
                    fd,
                    generation,
                    bool(flags & HDR_AFTER_LOSS),
                    bool(flags & HDR_UNSEEN_IO),
                    bool(flags & HDR_TLS),
                )
            )
        elif kind == EV_EXEC:
            self._on_exec(tgid)
        elif kind == EV_EXIT:
            self._on_exit(ts, tgid)

    def _conn_open(self, data: mmap.mmap | bytes, body: int, ts: int, tgid: int, fd: int, generation: int) -> None:
        """The open record whose fields start at ``body`` in ``data``."""
        fields = _OPEN.unpack_from(data, body)
        role_code, family, lport, rport, protocol, path_length, path_of_peer, laddr, raddr, _, *isns, path = fields
        if family == AF_UNIX:
            local, peer = unix_ends(laddr, raddr, path[:path_length], bool(path_of_peer))
            key = (tgid, fd, generation)
            opening = _Opening(len(self._events), ts, key, None, family, local, peer, 0, 0, transport=Transport.UNIX)
            if (opened := self._admit(opening)) is not None:
                self._events.append(opened)
            return
        client_isn, server_isn = isns
        udp = protocol == IPPROTO_UDP
        # UDP: the kernel names the bound end (bind/getsockname), which may be the wildcard
        # address, and never a peer (each datagram has its own).
        local_known = family and (any(laddr) or udp and lport)
        opening = _Opening(
            len(self._events),
            ts,
            (tgid, fd, generation),
            _ROLES.get(role_code),
            family,
            endpoint(family, laddr, lport) if local_known else None,
            endpoint(family, raddr, rport) if family and not udp else None,
            lport,
            rport,
            transport=Transport.UDP if udp else Transport.TCP,
            isns=(client_isn, server_isn) if client_isn or server_isn else None,
        )
        if opening.local is None:
            # The kernel saw no state change (the socket predates the agent) or, tracking fds,
            # only the peer address: /proc knows the rest while the socket is open. Its tables
            # cost milliseconds to read, so the poll's unknown sockets are looked up together.
            self._events.append(opening)  # replaced once resolved
            self._unresolved.append(opening)
        elif (opened := self._admit(opening)) is not None:
            self._events.append(opened)

    def _resolve_openings(self, events: list[Event | _Opening]) -> list[Event]:
        """``events`` with the tuples of the sockets announced in this poll without their local
        end filled in (or those connections' events gone, where user space rejects them)."""
        openings, self._unresolved = self._unresolved, []
        rejected: set[ConnKey] = set()
        lookup: dict[int, list[int]] = {}
        udp_lookup: dict[int, list[int]] = {}
        for opening in openings:
            if opening.transport is Transport.UDP:
                udp_lookup.setdefault(opening.key[0], []).append(opening.key[1])
            elif opening.key[:2] not in self._preexisting:
                lookup.setdefault(opening.key[0], []).append(opening.key[1])
        found = procfs.socket_tuples(lookup)
        # A UDP socket has no peer of its own (each datagram names one): only its bound end.
        udp_found = procfs.udp_local_endpoints(udp_lookup) if udp_lookup else {}
        for opening in openings:
            if opening.transport is Transport.UDP:
                opening.local = udp_found.get(opening.key[:2])
                opening.lport = opening.local.port if opening.local else 0
            else:
                known = self._preexisting.pop(opening.key[:2], None) or found.get(opening.key[:2])
                if known is not None:
                    opening.local, opening.peer = known.local, known.peer
                    opening.role = opening.role or known.role
                    opening.lport, opening.rport = known.local.port, known.peer.port
                # Tracking fds, an accept/connect without an inet address is no TCP connection.
                opening.unwanted = known is None and not opening.family and self.socket_mode == "fd-tracking"
            admitted = self._admit(opening)
            events[opening.index] = admitted or opening
            if admitted is None:
                rejected.add(opening.key)
        # Placeholders go, and so do the rejected connections' events that came in the same poll.
        return [e for e in events if not isinstance(e, _Opening) and getattr(e, "key", None) not in rejected]

    def _admit(self, opening: _Opening) -> ConnOpen | None:
        """The ConnOpen for ``opening``, or None when user space rejects the connection (then the
        kernel is told to ignore it)."""
        if (
            opening.unwanted
            or self.targets.ports
            and not (opening.lport in self.targets.ports or opening.rport in self.targets.ports)
            or self._talks_to_agent(opening.local, opening.peer)
        ):
            self.ignore_connection(opening.key)
            self._filtered_out[opening.key] = None
            if len(self._filtered_out) > self.capture.max_connections:
                del self._filtered_out[next(iter(self._filtered_out))]
            return None
        client_isn, server_isn = opening.isns or (None, None)
        return ConnOpen(
            opening.ts,
            *opening.key,
            opening.role,
            opening.local,
            opening.peer,
            opening.transport,
            client_isn,
            server_isn,
        )

    def _talks_to_agent(self, local: Endpoint | None, peer: Endpoint | None) -> bool:
        """A collector on this node receiving the agent's own exports: tracing it would feed the
        agent's output back into itself. With the sock tracepoints the kernel decides this; with
        fd-tracking, /proc tells which local ends the agent's own connections have."""
        if peer is None or self.socket_mode != "fd-tracking":
            return False
        same_host = ipaddress.ip_address(peer.address).is_loopback or (local and local.address == peer.address)
        if same_host and peer not in self._own_endpoints and not self._own_endpoints_fresh:
            self._own_endpoints = procfs.local_endpoints(os.getpid())
            self._own_endpoints_fresh = True  # read at most once per poll: it costs milliseconds
        return peer in self._own_endpoints

    def _announce_process(self, pid: int, ts: int, comm: str) -> None:
        """Identity from /proc; a process already gone (a quick curl) is named by its ``comm``."""
        info = procfs.process_info(pid, ts, self._containers)
        if info is None:
            if not comm:
                return  # try again at its next event
            info = ProcessInfo(ts, pid, "", comm, {})
        self._known_pids.add(pid)
        self._events.append(info)
        self._run.tls.watch(pid)  # tracing chosen processes, a child forked by a target is one too

    def _on_exec(self, pid: int) -> None:
        if procfs.executable_matches(pid, self.targets.executables):
            self.add_target(pid)  # a target already has probes that follow it; its new files are looked at
            self._known_pids.discard(pid)  # a new image: announce its identity again

    def _on_exit(self, ts: int, pid: int) -> None:
        started = self._run
        started.tls.forget(pid)  # its per-process SSL probes, if it had some
        if pid in started.targets.pids:  # the kernel removed it: quick --exe matches leave no trace
            started.targets.discard(pid)
        if pid in self._known_pids:  # others never had a connection event
            self._known_pids.discard(pid)
            started.http_red.process_exited(pid)
            if started.tcp_health is not None:
                started.tcp_health.process_exited(pid)
            self._events.append(ProcessExit(ts, pid))
