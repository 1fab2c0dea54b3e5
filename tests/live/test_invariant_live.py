"""Live BPF: one invariant over the whole path, kernel to backend, through an outage; and a steady
load that does not grow the agent.

A Python service is loaded for ``LOAD_S`` seconds by clients the agent does not trace, while the
agent exports spans to a real OTLP receiver (gRPC) and to files. Its CPU budget is small, so it
sheds; in the middle of the load the receiver refuses everything (UNAVAILABLE) for ``OUTAGE_S``
seconds, and the agent's OTLP queue holds two batches, retried for one second, so it drops. Then
for each exporter, every request the clients made is exactly one of: a span that exporter
delivered, a span it counted as dropped (``otel_ebpf.spans.dropped``), or an exchange the agent
counted as shed (``otel_ebpf.spans.shed``) — and each of the three happened, so the sum proves
something. The agent's resident memory, sampled through the run, must not grow.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from tests.conftest import REPO
from tests.live.file_agent import start_file_agent, stop_file_agent
from tests.otlp_receiver import OTLPReceiver, latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

CLIENTS = 3
LOAD_S = 24.0
OUTAGE = (8.0, 13.0)  # seconds into the load
RSS_GROWTH_MB = 24  # allowed between the second and the last quarter of the load


def _client(port: int, stop: threading.Event, statuses: Counter) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    i = 0
    while not stop.is_set():
        conn.request("GET", f"/users/{i}")
        response = conn.getresponse()
        response.read()
        statuses[response.status] += 1
        i += 1
    conn.close()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("invariant")
    server = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "http_service.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    with OTLPReceiver() as receiver:
        try:
            port = int(server.stdout.readline().rsplit(":", 1)[1])
            config = (
                "capture:\n  cpu_budget: 0.05\n"
                "export:\n  metric_interval_s: 1\n"
                "otlp:\n  protocol: grpc\n  queue_max_batches: 2\n  retry_max_elapsed_s: 1\n"
                "  retry_initial_s: 0.05\n  retry_max_s: 0.2\n"
            )
            agent = start_file_agent(
                tmp, server.pid, config, args=("--exporter", "otlp", "--otlp-endpoint", receiver.grpc_endpoint)
            )
            statuses: Counter = Counter()
            stop = threading.Event()
            clients = [threading.Thread(target=_client, args=(port, stop, statuses)) for _ in range(CLIENTS)]
            started = time.monotonic()
            for client in clients:
                client.start()
            rss: list[tuple[float, float]] = []
            outage = "before"
            while (elapsed := time.monotonic() - started) < LOAD_S:
                if outage == "before" and elapsed >= OUTAGE[0]:
                    receiver.answer(grpc_code=grpc.StatusCode.UNAVAILABLE, http_status=503)
                    outage = "on"
                elif outage == "on" and elapsed >= OUTAGE[1]:
                    receiver.answer()
                    outage = "over"
                rss.append((elapsed, _rss_mb(agent.pid)))
                time.sleep(0.25)
            stop.set()
            for client in clients:
                client.join()
            time.sleep(1.5)  # a metric interval and the kernel's once-a-second report
            stop_file_agent(agent)
            return {
                "requests": sum(statuses.values()),
                "statuses": statuses,
                "received": receiver.spans(),
                "rejected": receiver.rejected.get("traces", 0),
                "file_spans": load_file_spans(tmp / "out"),
                "metrics": load_file_metrics(tmp / "out"),
                "rss": rss,
            }
        finally:
            server.kill()
            server.wait()


@pytest.mark.parametrize("exporter", ["otlp", "file"])
def test_every_request_is_delivered_dropped_or_shed(run: dict, exporter: str) -> None:
    assert set(run["statuses"]) == {200}
    metrics = run["metrics"]
    delivered = run["received"] if exporter == "otlp" else run["file_spans"]
    assert all(s["kind"] == "SERVER" for s in delivered)
    assert len({(s["trace_id"], s["span_id"]) for s in delivered}) == len(delivered), "a span delivered twice"
    exported = latest_total(metrics, "otel_ebpf.spans.exported", exporter=exporter)
    dropped = latest_total(metrics, "otel_ebpf.spans.dropped", exporter=exporter)
    shed = latest_total(metrics, "otel_ebpf.spans.shed")
    assert exported == len(delivered)
    assert shed > 0, "the agent was not overloaded: the test proves nothing"
    if exporter == "otlp":
        assert run["rejected"] > 0 and dropped > 0, "the outage lost nothing: the test proves nothing"
    else:
        assert dropped == 0
    assert len(delivered) + dropped + shed == run["requests"]


def test_the_duration_histogram_counts_every_request(run: dict) -> None:
    assert latest_total(run["metrics"], "http.server.request.duration") == run["requests"]


def test_the_agent_does_not_grow_under_steady_load(run: dict) -> None:
    def mean_mb(first: float, last: float) -> float:
        samples = [mb for elapsed, mb in run["rss"] if first * LOAD_S <= elapsed < last * LOAD_S]
        assert len(samples) >= 8
        return sum(samples) / len(samples)

    second, last = mean_mb(0.25, 0.5), mean_mb(0.75, 1.0)
    assert last - second <= RSS_GROWTH_MB, (second, last)
    assert max(mb for _, mb in run["rss"]) < 400
