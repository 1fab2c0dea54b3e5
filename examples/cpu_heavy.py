"""A CPU-bound Python program whose profile is known: two thirds of its CPU in a pure-Python loop
(``hot_python``), one third in ``zlib.compress`` called from ``hot_native``.

    python examples/cpu_heavy.py run [--duration S] [--python-share 0.667]
    python examples/cpu_heavy.py serve PORT_FILE [--work-ms MS]    # HTTP: each GET burns CPU

The split is enforced by time (each 300 ms slice: ``python_share`` of it in hot_python, the rest in
hot_native), so it holds whatever the machine's speed. ``serve`` answers every ``GET /work`` after
running the same mix for ``--work-ms`` on the serving thread — the profile samples taken then
belong to that request's span. Used by ``make demo``, the CPU profiler's live tests and
``bench/profile_overhead.py``.
"""

from __future__ import annotations

import argparse
import http.server
import os
import sys
import time
import zlib

DATA = os.urandom(1 << 15)
SLICE_S = 0.3


def hot_python(seconds: float) -> int:
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        for i in range(2000):
            total += i * i % 7  # HOT-PYTHON-LINE
    return total


def hot_native(seconds: float) -> int:
    end = time.perf_counter() + seconds
    size = 0
    while time.perf_counter() < end:
        size += len(zlib.compress(DATA, 6))  # HOT-NATIVE-LINE
    return size


def mix(seconds: float, python_share: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hot_python(SLICE_S * python_share)
        hot_native(SLICE_S * (1 - python_share))


def serve(port_file: str, work_ms: int, python_share: float) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            return

        def do_GET(self) -> None:
            mix(work_ms / 1000, python_share)
            body = b"done\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as stream:
        stream.write(str(server.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run")
    run.add_argument("--duration", type=float, default=1e9)
    run.add_argument("--python-share", type=float, default=2 / 3)
    srv = sub.add_parser("serve")
    srv.add_argument("port_file")
    srv.add_argument("--work-ms", type=int, default=2000)
    srv.add_argument("--python-share", type=float, default=2 / 3)
    args = parser.parse_args(argv)
    if args.mode == "run":
        mix(args.duration, args.python_share)
    else:
        serve(args.port_file, args.work_ms, args.python_share)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
