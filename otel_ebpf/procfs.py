"""What ``/proc`` tells about processes and sockets the kernel events do not.

Used by the probe layer only (the pipeline sees the results as events): process identity on first
sight of a pid, and the tuple of a socket that was connected before the agent started.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from .protocol import Endpoint, Role

# Environment variables of an observed process that decide its resource (REFERENCE.md).
RESOURCE_ENV_VARS = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")
_TCP_LISTEN = "0A"


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    executable: str
    command_line: str
    environment: dict[str, str]


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
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
    return ProcessIdentity(pid, exe.removesuffix(" (deleted)"), " ".join(args), env)


def iter_pids(proc: str = "/proc") -> Iterator[int]:
    for name in os.listdir(proc):
        if name.isdigit():
            yield int(name)


def executable_matches(pid: int, globs: Iterable[str], proc: str = "/proc") -> bool:
    """True when the executable path or its basename (or argv[0]'s) matches one of ``globs``."""
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
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs for name in names if name)


def _parse_endpoint(field: str, v6: bool) -> Endpoint:
    # /proc/net/tcp prints addresses as host-order 32-bit words in hex.
    addr_hex, port_hex = field.split(":")
    raw = bytes.fromhex(addr_hex)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.IPv6Address(words) if v6 else ipaddress.IPv4Address(words)
    if v6 and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return Endpoint(str(addr), int(port_hex, 16))


@dataclass(frozen=True)
class SocketTuple:
    local: Endpoint
    peer: Endpoint
    role: Role | None  # SERVER when the local port is one the process's namespace listens on


_Tables = tuple[dict[str, tuple[Endpoint, Endpoint]], dict[str, int]]  # connected, listening by inode


def _tcp_tables(pid: int, proc: str) -> _Tables:
    """TCP sockets of ``pid``'s network namespace: connected (inode -> local, peer) and listening
    (inode -> port)."""
    connected: dict[str, tuple[Endpoint, Endpoint]] = {}
    listening: dict[str, int] = {}
    for table, v6 in (("tcp", False), ("tcp6", True)):
        text = _read(f"{proc}/{pid}/net/{table}")
        if not text:
            continue
        for line in text.decode(errors="replace").splitlines()[1:]:
            cols = line.split()
            if len(cols) < 10:
                continue
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
    tables: dict[str, _Tables] = {}
    for pid, fds in fds_by_pid.items():
        inodes = _socket_inodes(pid, fds, proc)
        if not inodes:
            continue
        try:
            namespace = os.readlink(f"{proc}/{pid}/ns/net")
        except OSError:
            continue
        if namespace not in tables:
            tables[namespace] = _tcp_tables(pid, proc)
        for fd, socket_tuple in _classify(pid, inodes, proc, tables[namespace]).connected.items():
            found[(pid, fd)] = socket_tuple
    return found


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
