"""UDP through every datagram syscall the socket probe hooks, with RTPS-shaped datagrams.

Two sockets on 127.0.0.1 in one process, made after "go" on stdin; then ``sendto`` → ``recvfrom``;
``sendmsg`` with three iovecs → ``recvmsg``; ``sendmmsg`` of three messages (three iovecs each)
→ ``recvmmsg`` (libc, through ctypes: Python has no binding). Prints the two bound ports and the
datagrams (hex) as JSON, so the test can compare them with what the agent recorded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import socket
import struct
import sys

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(IOVec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]


def datagram(n: int) -> list[bytes]:
    """An RTPS message as three iovecs: header, INFO_TS, HEARTBEAT (writer 0x103, count n)."""
    header = b"RTPS\x02\x05\x01\x10" + bytes(11) + bytes([n])
    info_ts = struct.pack("<BBHiI", 0x09, 1, 8, 1_700_000_000 + n, 0)
    heartbeat = (
        struct.pack("<BBH", 0x07, 1, 28) + bytes(4) + bytes.fromhex("00000103") + struct.pack("<iIiII", 0, 1, 0, n, n)
    )
    return [header, info_ts, heartbeat]


def _sockaddr(port: int) -> ctypes.Array:
    raw = struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton("127.0.0.1") + bytes(8)
    return ctypes.create_string_buffer(raw, len(raw))


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    # Bound under observation: the kernel side learns each local end from bind/getsockname (the
    # process exits at once, before /proc could be read).
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(("127.0.0.1", 0))
    rport, sport = receiver.getsockname()[1], sender.getsockname()[1]
    sent: list[str] = []
    one = b"".join(datagram(1))
    sender.sendto(one, ("127.0.0.1", rport))
    receiver.recvfrom(65536)
    sent.append(one.hex())
    two = datagram(2)
    sender.sendmsg(two, [], 0, ("127.0.0.1", rport))
    receiver.recvmsg(65536)
    sent.append(b"".join(two).hex())

    # sendmmsg / recvmmsg: three datagrams of three iovecs each, in one call each way
    keep = []
    msgs = (MMsgHdr * 3)()
    dest = _sockaddr(rport)
    for i in range(3):
        parts = datagram(3 + i)
        iovs = (IOVec * len(parts))()
        for j, part in enumerate(parts):
            buf = ctypes.create_string_buffer(part, len(part))
            keep.append(buf)
            iovs[j] = IOVec(ctypes.cast(buf, ctypes.c_void_p), len(part))
        keep.append(iovs)
        msgs[i].hdr = MsgHdr(ctypes.cast(dest, ctypes.c_void_p), 16, iovs, len(parts), None, 0, 0)
        sent.append(b"".join(parts).hex())
    if libc.sendmmsg(sender.fileno(), msgs, 3, 0) != 3:
        raise SystemExit(f"sendmmsg: errno {ctypes.get_errno()}")
    rmsgs = (MMsgHdr * 3)()
    for i in range(3):
        buf = ctypes.create_string_buffer(2048)
        name = ctypes.create_string_buffer(16)
        iov = (IOVec * 1)(IOVec(ctypes.cast(buf, ctypes.c_void_p), 2048))
        keep += [buf, name, iov]
        rmsgs[i].hdr = MsgHdr(ctypes.cast(name, ctypes.c_void_p), 16, iov, 1, None, 0, 0)
    got = 0
    while got < 3:  # MSG_WAITFORONE semantics by hand: loopback delivers them at once anyway
        n = libc.recvmmsg(receiver.fileno(), ctypes.byref(rmsgs, got * ctypes.sizeof(MMsgHdr)), 3 - got, 0, None)
        if n < 0:
            raise SystemExit(f"recvmmsg: errno {ctypes.get_errno()}")
        got += n
    print(json.dumps({"receiver": rport, "sender": sport, "datagrams": sent}), flush=True)


if __name__ == "__main__":
    main()
