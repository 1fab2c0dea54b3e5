"""An inference server whose all-reduce crosses the (pretend) wire: the stand-in NCCL's collectives
drive a network transport on the stand-in libibverbs (tests/rdma/standin/collective_net.c), which
writes on one queue pair from the calling thread and on another from a proxy thread, as NCCL does.

    python tests/live/nccl_rdma_workload.py PORT_FILE

Each ``POST /generate`` all-reduces 1024 float16 (2048 bytes) on the thread serving it, then
"generates" for 1.5 s before it answers. Commands on stdin, one per line, each answered by one JSON
line: ``connect`` (the queue pairs: {"ring": [local, peer], "tree": [...], "spare": [...]}) and
``idle`` (a write on the spare queue pair, outside any collective).
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.gpu_training_standin import Gpu
from tests.gpu.standin.build import build as build_gpu
from tests.rdma.standin import build as verbs

ELEMENTS = 1024
FLOAT16 = 6
GENERATE_S = 1.5
PAIRS = ("ring", "tree", "spare")


def main() -> int:
    gpu = Gpu(build_gpu())
    net = ctypes.CDLL(str(verbs.build() / verbs.NET))
    net.net_transport.argtypes = net.net_idle.argtypes = (ctypes.c_size_t,)
    gpu.nccl.standinNcclSetNet(ctypes.cast(net.net_transport, ctypes.c_void_p))
    comm = gpu.comm(2, 0)
    buffer = gpu.malloc(ELEMENTS * 2)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 -- keep output clean
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            assert gpu.nccl.ncclAllReduce(buffer, buffer, ELEMENTS, FLOAT16, 0, comm, None) == 0
            time.sleep(GENERATE_S)
            body = b'{"text": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Path(sys.argv[1]).write_text(str(server.server_address[1]))
    for line in sys.stdin:
        if line.strip() == "connect":
            qpns = (ctypes.c_uint32 * 6)()
            assert net.net_connect(qpns) == 0
            answer = {name: [qpns[2 * i], qpns[2 * i + 1]] for i, name in enumerate(PAIRS)}
        elif line.strip() == "idle":
            net.net_idle(4096)
            answer = {}
        else:
            break
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
