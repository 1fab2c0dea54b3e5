"""An "inference server" whose request handler runs NCCL collectives and CUDA launches on the
stand-in libraries (no GPU needed): each ``POST /generate`` does one tensor-parallel all-reduce
(1024 x float16) and two kernel launches, on the thread serving the request, then "generates" for
``GENERATE_S`` seconds before it answers (an LLM request lasts seconds).

    python examples/gpu_inference_standin.py PORT_FILE [GENERATE_S]
"""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.gpu_training_standin import Dim3, Gpu
from tests.gpu.standin.build import build

ELEMENTS = 1024
FLOAT16 = 6


def inference_server(gpu: Gpu, generate_s: float, launches: int = 2) -> HTTPServer:
    """A server on a free loopback port whose ``POST`` handler all-reduces ``ELEMENTS`` float16 on
    ``gpu``, launches ``launches`` kernels, then sleeps ``generate_s`` before it answers."""
    comm = gpu.comm(2, 0)
    buffer = gpu.malloc(ELEMENTS * 2)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 -- keep output clean
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            assert gpu.nccl.ncclAllReduce(buffer, buffer, ELEMENTS, FLOAT16, 0, comm, None) == 0
            for _ in range(launches):
                assert gpu.rt.cudaLaunchKernel(gpu.kernel, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, None) == 0
            time.sleep(generate_s)
            body = b'{"text": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return HTTPServer(("127.0.0.1", 0), Handler)


def main() -> int:
    server = inference_server(Gpu(build()), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
    Path(sys.argv[1]).write_text(str(server.server_address[1]))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
