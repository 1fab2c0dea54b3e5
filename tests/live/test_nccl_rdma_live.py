"""Live BPF: an NCCL collective's span names the RDMA queue pairs it used, as a real OTLP receiver
gets it.

The workload (tests/live/nccl_rdma_workload.py) serves requests whose handler all-reduces through
the stand-in NCCL, whose transport (tests/rdma/standin/collective_net.c) writes 2048 bytes on the
"ring" queue pair from the calling thread, and from a proxy thread (as NCCL's, which posts the
work requests) 2048 bytes on "tree" and a receive on tree's peer. A "spare" queue pair is written
on only outside the collectives: before the requests, while each handler "generates" after its
all-reduce returned, and after. Each span must name exactly ring, tree and tree's peer, with the
bytes each sent — never spare, whose writes the data path did count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.live.test_gpu_live import _start_agent, _stop
from tests.live.test_http_live import _wait_for_file
from tests.live.test_rdma_live import _last
from tests.otlp_receiver import OTLPReceiver
from tests.rdma import sysfs_tree

pytestmark = pytest.mark.bpf
GID = "0000:0000:0000:0000:0000:ffff:0a00:000{}"  # 10.0.0.1 (mlx5_0), 10.0.0.2 (mlx5_1)
REQUESTS = 2
BYTES = 1024 * 2  # 1024 float16


def _command(workload: subprocess.Popen, line: str) -> dict:
    workload.stdin.write(f"{line}\n")
    workload.stdin.flush()
    return json.loads(workload.stdout.readline())


def _request(port: int) -> None:
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=b"{}", method="POST"), timeout=10
    ) as r:
        assert r.status == 200


def test_collective_span_names_the_queue_pairs_it_posted_on(tmp_path: Path) -> None:
    root = sysfs_tree.build(tmp_path / "infiniband")
    workload = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "live" / "nccl_rdma_workload.py"), str(tmp_path / "port")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(_wait_for_file(tmp_path / "port", workload))
        with OTLPReceiver() as receiver:
            env = {
                "OTEL_EBPF_RDMA_VERBS": "true",
                "OTEL_EBPF_RDMA_SYSFS_ROOT": str(root),
                "OTEL_METRIC_EXPORT_INTERVAL": "500",
            }
            agent = _start_agent(tmp_path, receiver, workload.pid, env)
            try:
                qpns = _command(workload, "connect")
                hooked = lambda r: any(  # noqa: E731
                    p["value"] == 3 for p in r.metrics().get("otel_ebpf.rdma.provider_functions", [])
                )
                assert receiver.wait_for(hooked, timeout=30)
                _command(workload, "idle")
                for _ in range(REQUESTS):
                    request = threading.Thread(target=_request, args=(port,))
                    request.start()
                    time.sleep(0.5)  # the all-reduce has returned; the handler "generates"
                    _command(workload, "idle")
                    request.join()
                _command(workload, "idle")
                spare = lambda r: sum(  # noqa: E731
                    v
                    for k, v in _last(r.metrics(), "rdma.work_requests", workload.pid).items()
                    if ("rdma.qp.num", qpns["spare"][0]) in k
                )
                assert receiver.wait_for(lambda r: spare(r) == REQUESTS + 2, timeout=30)
            finally:
                stderr = _stop(agent, tmp_path / "agent.stderr")
            receiver.wait_for(lambda r: len([s for s in r.spans() if s["name"] == "nccl AllReduce"]) >= REQUESTS, 15)
            spans = receiver.spans()
            metrics = receiver.metrics()
    finally:
        workload.kill()
        workload.wait()
    ring, tree = qpns["ring"], qpns["tree"]
    expected = {
        f"mlx5_0/{ring[0]}->{GID.format(2)}/{ring[1]}": BYTES,
        f"mlx5_0/{tree[0]}->{GID.format(2)}/{tree[1]}": BYTES,
        f"mlx5_1/{tree[1]}->{GID.format(1)}/{tree[0]}": 0,  # the proxy's receive: nothing sent
    }
    collectives = [s for s in spans if s["name"] == "nccl AllReduce"]
    assert len(collectives) == REQUESTS, stderr
    for span in collectives:
        attributes = span["attributes"]
        assert attributes["rdma.qp_pairs"] == sorted(expected), attributes
        assert attributes["rdma.qp_pairs.bytes"] == [expected[name] for name in attributes["rdma.qp_pairs"]]
    drops = {p["attributes"]["reason"]: p["value"] for p in metrics["otel_ebpf.kernel.drops"]}
    assert drops["verbs_posts_ringbuf_full"] == 0
    assert not metrics.get("otel_ebpf.rdma.collective_posts.dropped")
