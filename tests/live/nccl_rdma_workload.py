"""An inference server whose all-reduce crosses the (pretend) wire: the stand-in NCCL's collectives
drive a network transport on the stand-in libibverbs (tests/rdma/standin/collective_net.c), which
writes on one queue pair from the calling thread and on another from a proxy thread, as NCCL does.

    python tests/live/nccl_rdma_workload.py PORT_FILE

Each ``POST /generate`` all-reduces 1024 float16 (2048 bytes) on the thread serving it, then
"generates" for 1.5 s before it answers (examples/gpu_inference_standin.py's server, without its
kernel launches). Commands on stdin, one per line, each answered by one JSON
line: ``connect`` (the queue pairs: {"ring": [local, peer], "tree": [...], "spare": [...]}) and
``idle`` (a write on the spare queue pair, outside any collective).
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.gpu_inference_standin import inference_server
from examples.gpu_training_standin import Gpu
from tests.gpu.standin.build import build as build_gpu
from tests.rdma.standin import build as verbs

GENERATE_S = 1.5
PAIRS = ("ring", "tree", "spare")


def main() -> int:
    gpu = Gpu(build_gpu())
    net = ctypes.CDLL(str(verbs.build() / verbs.NET))
    net.net_transport.argtypes = net.net_idle.argtypes = (ctypes.c_size_t,)
    gpu.nccl.standinNcclSetNet(ctypes.cast(net.net_transport, ctypes.c_void_p))
    server = inference_server(gpu, GENERATE_S, launches=0)
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
