"""The model-file guard's pure parts: path rules the kernel can evaluate exactly, the allow-list
keys it looks up, and the OTLP log record for each open it reports (docs/model-guard.md).

A rule is ``*.EXT`` (that extension anywhere) or ``/DIR/**/*.EXT`` (that extension under DIR, at
any depth). Those two forms are all the BPF side evaluates — an extension lookup in a hash map and
a masked prefix compare of the resolved path — so what the kernel enforces is exactly what the
pattern says; anything richer is refused at start-up rather than enforced approximately.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import AnyValue

from . import __version__
from .cgroups import cgroup2_mount

MAX_RULES = 16  # bpf/model_guard.c MAX_RULES: rule i is bit i of a u32
EXTENSION_BYTES = 15  # EXT_LEN - 1: the key keeps a NUL
PREFIX_BYTES = 128  # PREFIX_WORDS * 8
MAX_ALLOWED = 256  # entries in each allow-list map
PATH_LEN = 4096

DEFAULT_PATHS = (
    "*.safetensors",
    "*.pt",
    "*.pth",
    "*.gguf",
    "*.onnx",
    "/models/**/*.bin",
    "/root/.cache/huggingface/**/*.bin",
)

SCOPE = InstrumentationScope("otel_ebpf.model_guard", __version__)
_GLOB_CHARS = re.compile(r"[*?\[\]]")
_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")


@dataclass(frozen=True)
class PathRule:
    """One ``model_guard.paths`` pattern in the form the kernel evaluates."""

    pattern: str
    extension: str  # after the last '.', no dot
    directory: str  # '' (anywhere) or an absolute directory ending in '/'


def parse_rule(pattern: str) -> PathRule:
    """``*.EXT`` or ``/DIR/**/*.EXT``; ValueError saying which forms exist otherwise."""
    directory, sep, tail = pattern.rpartition("/**/")
    if sep and (not directory.startswith("/") or _GLOB_CHARS.search(directory)):
        raise ValueError(f"{pattern!r}: the directory before /**/ must be absolute and plain (no * ? [ ])")
    if not tail.startswith("*.") or _GLOB_CHARS.search(tail[2:]) or "/" in tail or "." in tail[2:] or not tail[2:]:
        raise ValueError(f"{pattern!r}: use '*.ext' or '/dir/**/*.ext' (one extension, no other wildcards)")
    extension = tail[2:]
    if len(extension.encode()) > EXTENSION_BYTES:
        raise ValueError(f"{pattern!r}: extension longer than {EXTENSION_BYTES} bytes")
    prefix = directory.rstrip("/") + "/" if sep else ""
    if len(prefix.encode()) > PREFIX_BYTES:
        raise ValueError(f"{pattern!r}: directory longer than {PREFIX_BYTES - 1} bytes")
    return PathRule(pattern, extension, prefix)


def compile_rules(patterns: Sequence[str]) -> tuple[PathRule, ...]:
    if not patterns:
        raise ValueError("name at least one pattern")
    if len(patterns) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} patterns (the kernel side keeps one bit per pattern)")
    return tuple(parse_rule(pattern) for pattern in patterns)


def extension_masks(rules: Sequence[PathRule]) -> dict[bytes, int]:
    """The ``extensions`` map: extension → bit mask of the rules ending in it."""
    masks: dict[bytes, int] = {}
    for index, rule in enumerate(rules):
        key = rule.extension.encode()
        masks[key] = masks.get(key, 0) | 1 << index
    return masks


def prefix_words(directory: str) -> tuple[list[int], list[int]]:
    """``struct prefix`` for a directory: its bytes as little-endian u64 words, and the mask that
    selects them (all zero for a rule without a directory)."""
    raw = directory.encode().ljust(PREFIX_BYTES, b"\0")
    mask = (b"\xff" * len(directory.encode())).ljust(PREFIX_BYTES, b"\0")
    words = list(struct.unpack(f"<{PREFIX_BYTES // 8}Q", raw))
    masks = list(struct.unpack(f"<{PREFIX_BYTES // 8}Q", mask))
    return words, masks


def kernel_dev(st_dev: int) -> int:
    """The kernel's internal dev_t (what ``super_block.s_dev`` holds) for a ``stat`` st_dev."""
    return os.major(st_dev) << 20 | os.minor(st_dev)


def executable_key(path: str) -> tuple[int, int]:
    """(inode, kernel dev) of an executable, as the kernel sees ``mm->exe_file``."""
    st = os.stat(path)
    return st.st_ino, kernel_dev(st.st_dev)


def cgroup_id(path: str, root: Path | None = None) -> int:
    """The id ``bpf_get_current_cgroup_id`` reports for a cgroup v2 path (its directory's inode)."""
    base = root or cgroup2_mount()
    return os.stat(base / path.lstrip("/")).st_ino


# struct open_record in bpf/model_guard.c
RECORD = struct.Struct("<QQQIIIIIIIiiiBB2x16s")
D_DENIED = 1
AT_FDCWD = -100
MECHANISMS = ("auto", "lsm", "tracepoints")  # model_guard.mechanism
LSM_REQUIREMENT = (
    "a kernel that loads BPF LSM programs: `bpf` in its lsm= list, BTF, and CAP_BPF + CAP_PERFMON + "
    'CAP_MAC_ADMIN (`otel-ebpf doctor`, "BPF LSM program load")'
)


def choose_mechanism(mode: str, mechanism: str, lsm_refused: str | None) -> str:
    """``lsm`` or ``tracepoints`` for a guard in ``mode``; ValueError when none can do it.
    ``lsm_refused``: why a BPF LSM program cannot load here (None: it can)."""
    if mechanism == "tracepoints" and mode != "enforce":
        return "tracepoints"
    if lsm_refused is None and mechanism != "tracepoints":
        return "lsm"
    if mode == "enforce":
        why = lsm_refused or "model_guard.mechanism is tracepoints, which cannot deny"
        raise ValueError(
            f"model_guard enforce needs BPF LSM: {why}. Enforcing needs {LSM_REQUIREMENT}; "
            "mode audit works without it, through syscall tracepoints"
        )
    if mechanism == "lsm":
        raise ValueError(
            f"model_guard.mechanism lsm: {lsm_refused}. It needs {LSM_REQUIREMENT}; "
            "mechanism auto would audit through syscall tracepoints instead"
        )
    return "tracepoints"


_ACCESS = {os.O_RDONLY: "read", os.O_WRONLY: "write", os.O_RDWR: "read_write"}


@dataclass(frozen=True)
class FileOpen:
    """One open of a model file as the kernel reported it."""

    ts_ns: int  # CLOCK_MONOTONIC
    cgroup_id: int
    exe_inode: int
    pid: int
    tid: int
    uid: int
    gid: int
    flags: int
    rules: int
    denied: bool
    allow_listed: bool
    comm: str
    path: str  # LSM: as the opener's root sees it, '' when unresolved; tracepoints: as passed to open
    result: int = 0  # tracepoints: the syscall's return, fd or -errno
    dirfd: int = AT_FDCWD  # tracepoints: what a relative path is relative to

    @property
    def access(self) -> str:
        return _ACCESS.get(self.flags & os.O_ACCMODE, "unknown")


def decode_open(raw: bytes) -> FileOpen:
    (ts, cgroup, exe_ino, _dev, pid, tid, uid, gid, flags, rules, path_len, result, dirfd, decision, listed, comm) = (
        RECORD.unpack_from(raw)
    )
    path = raw[RECORD.size : RECORD.size + path_len - 1].decode(errors="replace") if path_len > 0 else ""
    return FileOpen(
        ts,
        cgroup,
        exe_ino,
        pid,
        tid,
        uid,
        gid,
        flags,
        rules,
        decision == D_DENIED,
        bool(listed),
        comm.split(b"\0", 1)[0].decode(errors="replace"),
        path,
        result,
        dirfd,
    )


def resolve_path(event: FileOpen, proc: str = "/proc") -> str | None:
    """The absolute path of a path an open syscall was passed, ``.`` and ``..`` collapsed as text
    (symbolic links are not followed): a relative one joined with the thread's cwd (or the dirfd's
    directory) as /proc shows it *now* — a thread that changed directory since is not noticed.
    None when /proc no longer has it (the thread exited, the dirfd was closed)."""
    if event.path.startswith("/"):
        return posixpath.normpath(event.path)
    base = (
        f"{proc}/{event.pid}/task/{event.tid}/cwd"
        if event.dirfd == AT_FDCWD
        else f"{proc}/{event.pid}/fd/{event.dirfd}"
    )
    try:
        directory = os.readlink(base).removesuffix(" (deleted)")
    except OSError:
        return None
    return posixpath.normpath(posixpath.join(directory, event.path)) if directory.startswith("/") else None


def match_rules(path: str | None, candidates: int, rules: Sequence[PathRule]) -> int:
    """Of ``candidates`` (bit i: rule i), the rules ``path`` matches — what bpf/model_guard.c's
    directory_rules does, for paths only user space can resolve. None: rules naming a directory
    cannot match."""
    matched = 0
    for index, rule in enumerate(rules):
        if candidates & 1 << index and (not rule.directory or (path is not None and path.startswith(rule.directory))):
            matched |= 1 << index
    return matched


def container_id(cgroup_file: str) -> str | None:
    """The container id in a ``/proc/<pid>/cgroup`` text (the last 64-hex path component)."""
    for line in cgroup_file.splitlines():
        found = _CONTAINER_ID.findall(line)
        if found:
            return found[-1]
    return None


def log_record(
    event: FileOpen,
    rules: Sequence[PathRule],
    mode: str,
    mechanism: str,
    now_ns: int,
    process: Mapping[str, AnyValue],
    resource: Resource,
) -> ReadableLogRecord:
    """The OTLP log record for one open. ``process``: what /proc still knew of the opener
    (executable path, container id) when the record was read; ``mechanism``: lsm or tracepoints
    (which also report the syscall's result)."""
    attributes: dict[str, AnyValue] = {
        "process.pid": event.pid,
        "process.executable.name": event.comm,
        "process.user.id": event.uid,
        "file.path": event.path,
        "file.name": event.path.rpartition("/")[2],
        "model_guard.access": event.access,
        "model_guard.decision": "denied" if event.denied else "allowed",
        "model_guard.allow_listed": event.allow_listed,
        "model_guard.mode": mode,
        "model_guard.mechanism": mechanism,
        "model_guard.rules": tuple(rule.pattern for index, rule in enumerate(rules) if event.rules & 1 << index),
        "model_guard.cgroup.id": event.cgroup_id,
        **process,
    }
    failed = ""
    if mechanism == "tracepoints":
        attributes["model_guard.result"] = event.result
        if event.result < 0:
            attributes["model_guard.errno"] = failed = errno.errorcode.get(-event.result, str(-event.result))
            failed = f" (failed: {failed})"
    who = f"{process.get('process.executable.path') or event.comm} (pid {event.pid}, uid {event.uid})"
    if event.denied:
        body, severity = f"denied {event.access} open of {event.path} by {who}", SeverityNumber.WARN
    elif not event.allow_listed:
        body, severity = (
            f"{event.access} open of {event.path} by {who}, not in the allow-list{failed}",
            SeverityNumber.WARN,
        )
    else:
        body, severity = f"{event.access} open of {event.path} by {who}{failed}", SeverityNumber.INFO
    record = LogRecord(
        timestamp=now_ns,
        observed_timestamp=now_ns,
        severity_text=severity.name,
        severity_number=severity,
        body=body,
        attributes=attributes,
        event_name="model_guard.file_open",
    )
    return ReadableLogRecord(record, resource, SCOPE)


def process_attributes(pid: int, proc: str = "/proc") -> dict[str, object]:
    """Executable path and container id of ``pid``, as far as /proc still has them."""
    found: dict[str, object] = {}
    try:
        found["process.executable.path"] = os.readlink(f"{proc}/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        pass
    try:
        container = container_id(Path(f"{proc}/{pid}/cgroup").read_text())
    except OSError:
        container = None
    if container:
        found["container.id"] = container
    return found
