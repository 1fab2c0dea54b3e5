"""Loads bpf/model_guard.c on the file_open LSM hook — or, to audit on a kernel that refuses LSM
programs, on the open syscalls' tracepoints — fills its rule and allow-list maps, and turns what it
reports into OTLP log records (docs/model-guard.md).

The LSM program is attached through a link owned by this process: when the agent exits — cleanly,
by a crash or kill -9 — the kernel drops the link and the hook stops denying. Maps are filled
before anything can match: the allow-lists and settings first, the extension map (which is what
makes an open a model-file open) last.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import replace

from opentelemetry.sdk.resources import Resource

from .. import model_guard as rules_
from ..config import ModelGuardConfig
from ..exporters.logs import LogSink
from ..selfmetrics import SelfMetrics
from .btf import Btf
from .loading import Define, close_program, load_program, ring_buffer_pages
from .lsm import lsm_load_error

log = logging.getLogger(__name__)

RING_BUFFER_KB = 1024  # about 250 reports in flight; model files are opened seldom
MAX_POLL_RECORDS = 1024
# -D name -> (struct, member): every kernel struct field the program reads
OFFSETS = {
    "F_PATH": ("file", "f_path"),
    "F_INODE": ("file", "f_inode"),
    "F_FLAGS": ("file", "f_flags"),
    "PATH_DENTRY": ("path", "dentry"),
    "DENTRY_NAME": ("dentry", "d_name"),
    "QSTR_NAME": ("qstr", "name"),
    "QSTR_LEN": ("qstr", "len"),
    "TASK_MM": ("task_struct", "mm"),
    "MM_EXE_FILE": ("mm_struct", "exe_file"),
    "INODE_INO": ("inode", "i_ino"),
    "INODE_SB": ("inode", "i_sb"),
    "SB_DEV": ("super_block", "s_dev"),
}
OPTIONAL_SYSCALLS = ("openat2", "open")  # openat is everywhere; open is not on arm64, openat2 before 5.6
MECHANISM_NAMES = {"lsm": "BPF LSM", "tracepoints": "syscall tracepoints"}
SET_ENFORCE = 0  # settings[] in bpf/model_guard.c
# counters[] in bpf/model_guard.c
C_ALLOWED, C_DENIED, C_RING_FULL, C_READ_FAILED, C_PATH_FAILED = range(5)


class _ExtKey(ctypes.Structure):
    _fields_ = [("ext", ctypes.c_char * 16)]


class _Prefix(ctypes.Structure):
    _fields_ = [("word", ctypes.c_uint64 * 16), ("mask", ctypes.c_uint64 * 16)]


class _ExeKey(ctypes.Structure):
    _fields_ = [("ino", ctypes.c_uint64), ("dev", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class ModelGuard:
    """The file_open hook, its maps, and the log records of what it saw."""

    def __init__(
        self, config: ModelGuardConfig, selfmetrics: SelfMetrics, log_sink: LogSink, resource: Resource
    ) -> None:
        self.config = config
        self.rules = rules_.compile_rules(config.paths)
        self._selfmetrics = selfmetrics
        self._log_sink = log_sink
        self._resource = resource
        self._bpf = None
        self._raw: list[bytes] = []
        self.mechanism = ""  # lsm or tracepoints, once started
        # tracepoints: opens user space matched, or could not resolve for a directory rule
        self._matched_here = self._unresolved = 0

    def start(self) -> None:
        """Choose the mechanism, compile, fill the maps; RuntimeError saying why it cannot."""
        btf = Btf.from_file()
        refused = None if self.config.mechanism == "tracepoints" else lsm_load_error("file_open", btf)
        try:
            self.mechanism = rules_.choose_mechanism(self.config.mode, self.config.mechanism, refused)
        except ValueError as exc:
            raise RuntimeError(str(exc)) from None
        try:
            exes = {path: rules_.executable_key(path) for path in self.config.allow_executables}
            cgroups = {path: rules_.cgroup_id(path) for path in self.config.allow_cgroups}
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"model_guard allow-list: {exc}") from exc
        defines: dict[str, Define] = {name: btf.offset(*member) for name, member in OFFSETS.items()}
        defines["RINGBUF_PAGES"] = ring_buffer_pages(RING_BUFFER_KB)
        if self.mechanism == "tracepoints":
            from bcc import BPF  # noqa: PLC0415 — only the probe layer needs bcc

            defines["TRACEPOINTS"] = True
            for call in OPTIONAL_SYSCALLS:
                defines[f"HAVE_{call.upper()}"] = BPF.tracepoint_exists("syscalls", f"sys_enter_{call}")
        # BCC attaches LSM_PROBE and TRACEPOINT_PROBE programs as it loads them: with the
        # extension map still empty nothing matches until the maps below are complete.
        self._bpf = bpf = load_program(
            ["model_guard.c"],
            f"model guard ({MECHANISM_NAMES[self.mechanism]})",
            defines=defines,
            settings={SET_ENFORCE: self.config.mode == "enforce"},
        )
        one = ctypes.c_uint8(1)
        bpf["allowed_tgids"][ctypes.c_uint32(os.getpid())] = one  # never lock the agent out
        for ino, dev in exes.values():
            bpf["allowed_exes"][_ExeKey(ino, dev, 0)] = one
        for uid in self.config.allow_uids:
            bpf["allowed_uids"][ctypes.c_uint32(uid)] = one
        for cgroup in cgroups.values():
            bpf["allowed_cgroups"][ctypes.c_uint64(cgroup)] = one
        for index, rule in enumerate(self.rules):
            words, masks = rules_.prefix_words(rule.directory)
            bpf["prefixes"][ctypes.c_int(index)] = _Prefix(
                (ctypes.c_uint64 * 16)(*words), (ctypes.c_uint64 * 16)(*masks)
            )
        bpf["opens"].open_ring_buffer(self._on_record)
        for extension, mask in rules_.extension_masks(self.rules).items():
            bpf["extensions"][_ExtKey(extension)] = ctypes.c_uint32(mask)
        if self.mechanism == "lsm":
            log.info(
                "model guard: %s through BPF LSM (file_open)",
                "enforcing" if self.config.mode == "enforce" else "auditing",
            )
        else:
            log.warning(
                "model guard: auditing through syscall tracepoints (%s)",
                f"BPF LSM unavailable: {refused}" if refused else "model_guard.mechanism: tracepoints",
            )
        log.info(
            "model guard attached (%s): %s; allowed: %d executables, %d uids, %d cgroups",
            self.config.mode,
            ", ".join(self.config.paths),
            len(exes),
            len(self.config.allow_uids),
            len(cgroups),
        )

    def _on_record(self, _ctx: int, data: int, size: int) -> None:
        self._raw.append(ctypes.string_at(data, size))

    def poll(self, timeout_ms: int = 0) -> int:
        """Export what the kernel reported; returns how many opens."""
        if self._bpf is None:
            return 0
        self._bpf.ring_buffer_poll(timeout_ms)
        raw, self._raw = self._raw, []
        now = time.time_ns()
        records = []
        for item in raw:
            event = rules_.decode_open(item)
            if self.mechanism == "tracepoints":
                event = self._matched(event)
                if event is None:
                    continue
            records.append(
                rules_.log_record(
                    event,
                    self.rules,
                    self.config.mode,
                    self.mechanism,
                    now,
                    rules_.process_attributes(event.pid),
                    self._resource,
                )
            )
        self._log_sink.export(records)
        self._count()
        return len(records)

    def _matched(self, event: rules_.FileOpen) -> rules_.FileOpen | None:
        """A syscall's open with its path made absolute and the rules it matches (the kernel
        checked extensions only); None when it matches none."""
        path = rules_.resolve_path(event)
        matched = rules_.match_rules(path, event.rules, self.rules)
        if not matched:
            self._unresolved += path is None
            return None
        self._matched_here += 1
        return replace(event, path=path or event.path, rules=matched)

    def _count(self) -> None:
        if self._bpf is None:
            return
        table = self._bpf["counters"]
        totals = [sum(table[ctypes.c_int(i)]) for i in range(5)]
        totals[C_ALLOWED] += self._matched_here
        totals[C_PATH_FAILED] += self._unresolved
        self._selfmetrics.set("otel_ebpf.model_guard.opens", totals[C_ALLOWED], {"decision": "allowed"})
        self._selfmetrics.set("otel_ebpf.model_guard.opens", totals[C_DENIED], {"decision": "denied"})
        self._selfmetrics.set("otel_ebpf.model_guard.records.lost", totals[C_RING_FULL])
        self._selfmetrics.set("otel_ebpf.model_guard.fail_open", totals[C_READ_FAILED], {"reason": "read_failed"})
        self._selfmetrics.set("otel_ebpf.model_guard.fail_open", totals[C_PATH_FAILED], {"reason": "path_failed"})

    def close(self, timeout_s: float = 5.0) -> None:
        """Detach (the hook stops denying at once), report what was left, flush the logs."""
        if self._bpf is not None:
            self.poll(0)
            close_program(self._bpf)
            self._bpf = None
        self._log_sink.shutdown(timeout_s)
