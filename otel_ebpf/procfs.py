"""What ``/proc`` tells about processes and sockets the kernel events do not.

Used by the probe layer only (the pipeline sees the results as events): process identity on first
sight of a pid, and the tuple of a socket that was connected before the agent started.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .containers import ContainerResolver
from .pipeline.events import ProcessInfo
from .protocol import Endpoint, Role

# Environment variables of an observed process that decide its resource (README.md, "What you get",
# "A resource per observed process").
RESOURCE_ENV_VARS = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")
_TCP_LISTEN = "0A"
MAX_CGROUP_BYTES = 64 << 10  # /proc/<pid>/cgroup: one line per hierarchy, a few hundred bytes in all


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    executable: str
    command_line: str
    environment: dict[str, str]
    cgroup: str = ""  # /proc/<pid>/cgroup: names the process's container and pod (containers.py)


def _read(path: str, limit: int = -1) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def process_identity(pid: int, proc: str = "/proc") -> ProcessIdentity | None:
    """Executable, command line and resource-related environment of ``pid``; None if it is gone
    or exiting."""
    cmdline = _read(f"{proc}/{pid}/cmdline")
    if cmdline is None:
        return None
    try:
        exe = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        exe = ""
    if not cmdline and not exe:
        return None  # exiting (a zombie keeps its /proc entry but neither of these)
    environ = _read(f"{proc}/{pid}/environ") or b""
    env: dict[str, str] = {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name.decode(errors="replace") in RESOURCE_ENV_VARS:
            env[name.decode()] = value.decode(errors="replace")
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    cgroup = (_read(f"{proc}/{pid}/cgroup", MAX_CGROUP_BYTES) or b"").decode(errors="replace")
    return ProcessIdentity(pid, exe.removesuffix(" (deleted)"), " ".join(args), env, cgroup)


def process_info(pid: int, timestamp_ns: int, containers: ContainerResolver, proc: str = "/proc") -> ProcessInfo | None:
    """The :class:`ProcessInfo` that announces ``pid`` to the pipeline, its container and pod
    included; None if it is gone or exiting."""
    ident = process_identity(pid, proc)
    if ident is None:
        return None
    return ProcessInfo(
        timestamp_ns, pid, ident.executable, ident.command_line, ident.environment, containers.attributes(ident.cgroup)
    )


def process_name(pid: int, proc: str = "/proc") -> str | None:
    """The name the kernel gives ``pid`` (``comm``: the executable's, at most 15 bytes); None if it is gone."""
    comm = _read(f"{proc}/{pid}/comm")
    return comm.rstrip(b"\n").decode(errors="replace") if comm else None


def iter_pids(proc: str = "/proc") -> Iterator[int]:
    for name in os.listdir(proc):
        if name.isdigit():
            yield int(name)


COMM_CHARS = 15  # a process's name (comm) as the kernel keeps it: TASK_COMM_LEN less its NUL


def executable_matches(pid: int, globs: Iterable[str], proc: str = "/proc") -> bool:
    """True when the executable path or its basename (or argv[0]'s), or the process's name (its
    comm: a script's name when run by its ``#!`` line, as ``uvicorn`` is) matches one of ``globs``."""
    names: list[str] = []
    try:
        exe = os.readlink(f"{proc}/{pid}/exe").removesuffix(" (deleted)")
        names += [exe, os.path.basename(exe)]
    except OSError:
        pass
    cmdline = _read(f"{proc}/{pid}/cmdline")
    if cmdline:
        argv0 = cmdline.split(b"\0", 1)[0].decode(errors="replace")
        names += [argv0, os.path.basename(argv0)]
    comm = process_name(pid, proc)
    if comm:
        names.append(comm)
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs for name in names if name)


def exact_names(globs: Iterable[str]) -> list[str]:
    """The globs that are a process name as such (no wildcard, no path, short enough to be a comm):
    those the kernel can match itself when a program is executed."""
    return [glob for glob in globs if 0 < len(glob.encode()) <= COMM_CHARS and not set(glob) & set("*?[/")]


def parent_pid(pid: int, proc: str = "/proc") -> int | None:
    stat = _read(f"{proc}/{pid}/stat")
    if stat is None:
        return None
    # comm may hold spaces and parentheses: the fields after the last ')' are fixed
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def child_pids(pid: int, proc: str = "/proc") -> list[int]:
    """The children of ``pid``, from its threads' ``children`` files (the kernel's own lists)."""
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return []  # gone
    children: list[int] = []
    for tid in tasks:
        children += map(int, (_read(f"{proc}/{pid}/task/{tid}/children") or b"").split())
    return children


def selected_pids(pids: Iterable[int], globs: Iterable[str], proc: str = "/proc") -> set[int]:
    """The processes ``--pid``/``--exe`` select now: ``pids`` (those alive), the processes
    (other than this one) whose executable matches one of ``globs`` (see above), and every living
    descendant of those: the workers a server's master started before the agent (nginx,
    gunicorn, ``uvicorn --workers``) are what serve its requests. Without globs only the chosen
    processes' trees are read, not every process's."""
    pids, globs, own = set(pids), list(globs), os.getpid()
    if globs:
        roots = {pid for pid in iter_pids(proc) if pid != own and (pid in pids or executable_matches(pid, globs, proc))}
    else:
        roots = {pid for pid in pids if pid != own and os.path.exists(f"{proc}/{pid}")}
    if not roots:
        return roots
    children_of = _children_lister(proc, next(iter(roots)))
    selected, pending = set(roots), list(roots)
    while pending:
        for child in children_of(pending.pop()):
            if child not in selected and child != own:
                selected.add(child)
                pending.append(child)
    return selected


def _children_lister(proc: str, pid: int) -> Callable[[int], list[int]]:
    """How to list a process's children: its threads' ``children`` files (CONFIG_PROC_CHILDREN,
    which the major distributions enable; ``pid``'s tells whether the kernel has them), else a
    table of every process's parent."""
    if os.path.exists(f"{proc}/{pid}/task/{pid}/children"):
        return lambda parent: child_pids(parent, proc)
    table: dict[int, list[int]] = {}
    for child in iter_pids(proc):
        parent = parent_pid(child, proc)
        if parent:
            table.setdefault(parent, []).append(child)
    return lambda parent: table.get(parent, [])


def _parse_endpoint(field: str, v6: bool) -> Endpoint:
    # /proc/net/tcp prints addresses as host-order 32-bit words in hex.
    addr_hex, port_hex = field.split(":")
    raw = bytes.fromhex(addr_hex)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if not v6:
        return Endpoint(str(ipaddress.IPv4Address(words)), int(port_hex, 16))
    addr = ipaddress.IPv6Address(words)
    return Endpoint(str(addr.ipv4_mapped or addr), int(port_hex, 16))


@dataclass(frozen=True)
class SocketTuple:
    local: Endpoint
    peer: Endpoint
    role: Role | None  # SERVER when the local port is one the process's namespace listens on


_Tables = tuple[dict[str, tuple[Endpoint, Endpoint]], dict[str, int]]  # connected, listening by inode


def _socket_rows(pid: int, proc: str, table: str) -> Iterator[tuple[list[str], bool]]:
    """(columns, is IPv6) of each socket in ``pid``'s namespace's /proc/net/{table}{,6}."""
    for name, v6 in ((table, False), (table + "6", True)):
        text = _read(f"{proc}/{pid}/net/{name}")
        if not text:
            continue
        for line in text.decode(errors="replace").splitlines()[1:]:
            cols = line.split()
            if len(cols) >= 10:
                yield cols, v6


def _tcp_tables(pid: int, proc: str) -> _Tables:
    """TCP sockets of ``pid``'s network namespace: connected (inode -> local, peer) and listening
    (inode -> port)."""
    connected: dict[str, tuple[Endpoint, Endpoint]] = {}
    listening: dict[str, int] = {}
    for cols, v6 in _socket_rows(pid, proc, "tcp"):
        if cols[3] == _TCP_LISTEN:
            listening[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
        else:
            connected[cols[9]] = (_parse_endpoint(cols[1], v6), _parse_endpoint(cols[2], v6))
    return connected, listening


def _socket_inode(pid: int, fd: int, proc: str) -> str | None:
    try:
        target = os.readlink(f"{proc}/{pid}/fd/{fd}")
    except OSError:
        return None
    return target[len("socket:[") : -1] if target.startswith("socket:[") else None


@dataclass(frozen=True)
class TCPSockets:
    connected: dict[int, SocketTuple]  # fd -> tuple of connected TCP sockets
    listening: dict[int, int]  # fd -> port of listening TCP sockets


def _socket_inodes(pid: int, fds: Iterable[int], proc: str) -> dict[int, str]:
    return {fd: inode for fd in fds if (inode := _socket_inode(pid, fd, proc)) is not None}


def _classify(pid: int, inodes: dict[int, str], proc: str, tables: _Tables | None = None) -> TCPSockets:
    """Which of the sockets ``inodes`` (fd -> inode) are connected or listening TCP sockets, from
    ``pid``'s network namespace's ``tables`` (read when not given)."""
    sockets = TCPSockets({}, {})
    if not inodes:
        return sockets
    connected, listening = tables or _tcp_tables(pid, proc)
    listening_ports = set(listening.values())
    for fd, inode in inodes.items():
        if inode in connected:
            local, peer = connected[inode]
            role = Role.SERVER if local.port in listening_ports else Role.CLIENT
            sockets.connected[fd] = SocketTuple(local, peer, role)
        elif inode in listening:
            sockets.listening[fd] = listening[inode]
    return sockets


def socket_tuples(fds_by_pid: Mapping[int, Iterable[int]], proc: str = "/proc") -> dict[tuple[int, int], SocketTuple]:
    """The TCP tuples of those of each process's fds that are connected TCP sockets, by (pid, fd).

    Reading a network namespace's tables costs milliseconds (the kernel walks every socket in
    it), so they are read once per namespace, for all the fds asked about.
    """
    found: dict[tuple[int, int], SocketTuple] = {}
    for pid, inodes, tables in _per_namespace(fds_by_pid, proc, _tcp_tables):
        for fd, socket_tuple in _classify(pid, inodes, proc, tables).connected.items():
            found[(pid, fd)] = socket_tuple
    return found


_T = TypeVar("_T")


def _per_namespace(
    fds_by_pid: Mapping[int, Iterable[int]], proc: str, read_tables: Callable[[int, str], _T]
) -> Iterator[tuple[int, dict[int, str], _T]]:
    """(pid, its socket fds -> inodes, its network namespace's tables) for each process with
    sockets among ``fds_by_pid``; ``read_tables(pid, proc)`` runs once per namespace."""
    tables: dict[str, _T] = {}
    for pid, fds in fds_by_pid.items():
        inodes = _socket_inodes(pid, fds, proc)
        if not inodes:
            continue
        try:
            namespace = os.readlink(f"{proc}/{pid}/ns/net")
        except OSError:
            continue
        if namespace not in tables:
            tables[namespace] = read_tables(pid, proc)
        yield pid, inodes, tables[namespace]


def tcp_sockets(pid: int, proc: str = "/proc") -> TCPSockets:
    """The TCP sockets ``pid`` holds now (empty if the process is gone)."""
    try:
        fds = [int(name) for name in os.listdir(f"{proc}/{pid}/fd")]
    except OSError:
        return TCPSockets({}, {})
    return _classify(pid, _socket_inodes(pid, fds, proc), proc)


def local_endpoints(pid: int, proc: str = "/proc") -> set[Endpoint]:
    """The local ends of ``pid``'s connected TCP sockets."""
    connected, _ = _tcp_tables(pid, proc)
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return set()
    inodes = {_socket_inode(pid, int(fd), proc) for fd in fds}
    return {local for inode, (local, _) in connected.items() if inode in inodes}


def _udp_bound(pid: int, proc: str) -> dict[str, Endpoint]:
    """UDP sockets of ``pid``'s network namespace: inode -> bound local end."""
    return {cols[9]: _parse_endpoint(cols[1], v6) for cols, v6 in _socket_rows(pid, proc, "udp")}


def udp_local_endpoints(
    fds_by_pid: Mapping[int, Iterable[int]], proc: str = "/proc"
) -> dict[tuple[int, int], Endpoint]:
    """The bound local end of those of each process's fds that are UDP sockets, by (pid, fd).

    UDP sockets are unconnected: the kernel's socket events give no tuple, every datagram names
    its own peer, and only the local end is a property of the socket. Tables are read once per
    network namespace, like :func:`socket_tuples`.
    """
    found: dict[tuple[int, int], Endpoint] = {}
    for pid, inodes, bound in _per_namespace(fds_by_pid, proc, _udp_bound):
        for fd, inode in inodes.items():
            if inode in bound:
                found[(pid, fd)] = bound[inode]
    return found
