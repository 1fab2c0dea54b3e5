"""Hostile bytes on loopback, for the live robustness test: run as
``python -m tests.live.hostile_peer HTTP1_PORT GRPC_PORT RTPS_PORT SEED`` once told to go.

It sends, from one process the agent traces: random bytes and broken HTTP/1 messages to an HTTP/1
server (an endless line, a body promised and never sent, a response where a request belongs, bad
chunk sizes, NULs, a cut connection); random frames after the HTTP/2 preface and a HEADERS block
of garbage HPACK to a gRPC server; "RTPS"-headed junk and random datagrams to a UDP port; and, as a
server on a port of its own, an SSE reply of broken JSON and invalid UTF-8 to a chat-completions
request it makes to itself. Every exchange that has a peer ends; the process prints ``done``.
"""

from __future__ import annotations

import random
import socket
import sys
import threading

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CHAT = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm\r\nContent-Type: application/json\r\n"
    b'Content-Length: 62\r\n\r\n{"model": "m", "stream": true, "messages": [{"role": "user"}]}'
)
BROKEN_SSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'30\r\ndata: {"choices": [{"delta": {"content": "a\xff\xfe"\n\n\r\n'
    b"zz\r\nnot a chunk size\r\n"
    b'14\r\ndata: {"model": [\n\n\r\n0\r\n\r\n'
)


def _send(port: int, *parts: bytes, read: bool = True) -> None:
    """One connection: ``parts`` written in turn, the reply read until the peer closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        try:
            for part in parts:
                sock.sendall(part)
            if read:
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
        except OSError:
            pass  # the server gave up on us first: that is its right


def _http1(port: int, rng: random.Random) -> None:
    _send(port, rng.randbytes(65536))
    _send(port, b"GET /" + b"A" * 200_000 + b" HTTP/1.1\r\n\r\n")
    _send(port, b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nshort", read=False)
    _send(port, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    _send(port, b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n-5\r\n" + bytes(100))
    _send(port, b"GET / HTTP/1.1\r\nHost: a\r\n\tfolded\r\n\x00\x00: \x00\r\n\r\n")
    for _ in range(20):
        _send(port, b"GET /" + rng.randbytes(rng.randrange(1, 300)) + b"\r\n\r\n")


def _grpc(port: int, rng: random.Random) -> None:
    _send(port, H2_PREFACE + rng.randbytes(4096))
    # a SETTINGS frame, then HEADERS (stream 1, END_HEADERS) whose block is random bytes
    headers = rng.randbytes(200)
    frame = len(headers).to_bytes(3, "big") + b"\x01\x04" + (1).to_bytes(4, "big") + headers
    _send(port, H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + frame)
    _send(port, H2_PREFACE + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + rng.randbytes(1000))


def _rtps(port: int, rng: random.Random) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(50):
            sock.sendto(b"RTPS\x02\x03\x01\x0f" + rng.randbytes(rng.randrange(0, 600)), ("127.0.0.1", port))
            sock.sendto(rng.randbytes(rng.randrange(1, 600)), ("127.0.0.1", port))


def _sse() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(BROKEN_SSE)

    thread = threading.Thread(target=answer)
    thread.start()
    _send(server.getsockname()[1], CHAT)
    thread.join()
    server.close()


def main() -> None:
    http1_port, grpc_port, rtps_port, seed = (int(a) for a in sys.argv[1:5])
    rng = random.Random(seed)
    print("ready", flush=True)
    sys.stdin.readline()
    _http1(http1_port, rng)
    _grpc(grpc_port, rng)
    _rtps(rtps_port, rng)
    _sse()
    print("done", flush=True)


if __name__ == "__main__":
    main()
