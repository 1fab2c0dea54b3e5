"""The model-file guard's pure parts: path rules the kernel can evaluate exactly, the allow-list
keys it looks up, and the OTLP log record for each open it reports (docs/model-guard.md).

A rule is ``*.EXT`` (that extension anywhere) or ``/DIR/**/*.EXT`` (that extension under DIR, at
any depth). Those two forms are all the BPF side evaluates — an extension lookup in a hash map and
a masked prefix compare of the resolved path — so what the kernel enforces is exactly what the
pattern says; anything richer is refused at start-up rather than enforced approximately.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from . import __version__

MAX_RULES = 16  # bpf/model_guard.c MAX_RULES: rule i is bit i of a u32
EXTENSION_BYTES = 15  # EXT_LEN - 1: the key keeps a NUL
PREFIX_BYTES = 128  # PREFIX_WORDS * 8
MAX_ALLOWED = 256  # entries in each allow-list map
PATH_LEN = 4096

DEFAULT_PATHS = ("*.safetensors", "*.pt", "*.pth", "*.gguf", "*.onnx", "/models/**/*.bin",
                 "/root/.cache/huggingface/**/*.bin")

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


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> Path:
    for line in Path(mounts).read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    raise ValueError("no cgroup v2 hierarchy is mounted (allow_cgroups needs one)")


def cgroup_id(path: str, root: Path | None = None) -> int:
    """The id ``bpf_get_current_cgroup_id`` reports for a cgroup v2 path (its directory's inode)."""
    base = root or cgroup2_mount()
    return os.stat(base / path.lstrip("/")).st_ino


# struct open_record in bpf/model_guard.c
RECORD = struct.Struct("<QQQIIIIIIIiBB2x16s")
D_DENIED = 1
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
    path: str  # as the opener's root sees it; '' when the kernel could not resolve it

    @property
    def access(self) -> str:
        return _ACCESS.get(self.flags & os.O_ACCMODE, "unknown")


def decode_open(raw: bytes) -> FileOpen:
    (ts, cgroup, exe_ino, _dev, pid, tid, uid, gid, flags, rules, path_len, decision, listed,
     comm) = RECORD.unpack_from(raw)
    path = raw[RECORD.size:RECORD.size + path_len - 1].decode(errors="replace") if path_len > 0 else ""
    return FileOpen(ts, cgroup, exe_ino, pid, tid, uid, gid, flags, rules, decision == D_DENIED, bool(listed),
                    comm.split(b"\0", 1)[0].decode(errors="replace"), path)


def container_id(cgroup_file: str) -> str | None:
    """The container id in a ``/proc/<pid>/cgroup`` text (the last 64-hex path component)."""
    for line in cgroup_file.splitlines():
        found = _CONTAINER_ID.findall(line)
        if found:
            return found[-1]
    return None


def log_record(event: FileOpen, rules: Sequence[PathRule], mode: str, now_ns: int,
               process: Mapping[str, object], resource: Resource) -> ReadableLogRecord:
    """The OTLP log record for one open. ``process``: what /proc still knew of the opener
    (executable path, container id) when the record was read."""
    attributes: dict[str, object] = {
        "process.pid": event.pid,
        "process.executable.name": event.comm,
        "process.user.id": event.uid,
        "file.path": event.path,
        "file.name": event.path.rpartition("/")[2],
        "model_guard.access": event.access,
        "model_guard.decision": "denied" if event.denied else "allowed",
        "model_guard.allow_listed": event.allow_listed,
        "model_guard.mode": mode,
        "model_guard.rules": tuple(rule.pattern for index, rule in enumerate(rules) if event.rules & 1 << index),
        "model_guard.cgroup.id": event.cgroup_id,
        **process,
    }
    who = f"{process.get('process.executable.path') or event.comm} (pid {event.pid}, uid {event.uid})"
    if event.denied:
        body, severity = f"denied {event.access} open of {event.path} by {who}", SeverityNumber.WARN
    elif not event.allow_listed:
        body, severity = f"{event.access} open of {event.path} by {who}, not in the allow-list", SeverityNumber.WARN
    else:
        body, severity = f"{event.access} open of {event.path} by {who}", SeverityNumber.INFO
    record = LogRecord(timestamp=now_ns, observed_timestamp=now_ns, severity_text=severity.name,
                       severity_number=severity, body=body, attributes=attributes,
                       event_name="model_guard.file_open")
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
