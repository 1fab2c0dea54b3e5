"""The smallest HTTP/1.1 keep-alive peers, for live tests that care where they run (a network or PID
namespace), not what they say. Run as ``python -m tests.live.keepalive_peers`` from the repository:

``serve ADDRESS [--wait]``: prints ``PID PORT``; with ``--wait`` accepts only after a line on stdin
(so that an agent attached meanwhile sees the accept); answers every request ``200 ok``, one
connection at a time, and outlives peers that hang up.
``client HOST PORT PATH CALLS [--wait]``: prints ``PID`` (and ``ready`` with ``--wait``, then waits
for a line on stdin), makes CALLS requests for PATH on one connection, then prints ``done``.
"""

from __future__ import annotations

import os
import socket
import sys


def serve(address: str, wait: bool) -> None:
    server = socket.socket()
    server.bind((address, 0))
    server.listen()
    print(os.getpid(), server.getsockname()[1], flush=True)
    if wait:
        sys.stdin.readline()
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                reader = conn.makefile("rb")
                while reader.readline():
                    while reader.readline() not in (b"\r\n", b""):
                        pass
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            except OSError:
                pass  # a peer that hung up on us (the hostile test's): the next one


def client(host: str, port: int, path: str, calls: int, wait: bool) -> None:
    print(os.getpid(), flush=True)
    if wait:
        print("ready", flush=True)
        sys.stdin.readline()
    with socket.create_connection((host, port)) as sock:
        for _ in range(calls):
            sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: peer\r\n\r\n")
            got = b""
            while not got.endswith(b"ok"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise SystemExit(f"connection closed after {got!r}")
                got += chunk
    print("done", flush=True)


if __name__ == "__main__":
    wait = "--wait" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--wait"]
    if args[0] == "serve":
        serve(args[1], wait)
    else:
        client(args[1], int(args[2]), args[3], int(args[4]), wait)
