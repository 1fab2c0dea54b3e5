"""Live BPF: requests a server never answers are counted in the kernel's HTTP/1 duration histograms.

A raw-socket server answers some requests and closes the others' connections without a response
(a crash handler, a proxy giving up, a server out of workers); a raw-socket client sends one
request per connection and closes once it has its response or the connection's end. The kernel
counts a request when its response starts, so the unanswered ones are counted when their
connection is closed (``http_unanswered`` in bpf/http1_summary.h): on both sides, with
``error.type=response_missing`` and no status code, as their spans say. Error rates read off the
RED metrics would otherwise leave out exactly the requests that failed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter

import pytest

from tests.conftest import AGENT, REPO
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
ANSWERED = 5
UNANSWERED = 4

# Writes its port to argv[1]; per connection: reads a request head, answers it unless its path
# says "hangup", then closes once the client has.
SERVER = r"""
import socket, sys, threading
listener = socket.create_server(("127.0.0.1", 0))
open(sys.argv[1], "w").write(str(listener.getsockname()[1]))
def serve(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        data = conn.recv(4096)
        if not data:
            break
        head += data
    if b"hangup" not in head.split(b"\r\n", 1)[0]:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        conn.recv(1)  # the client closes
    conn.close()
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],)).start()
"""

# Per request a connection: sends it, reads until the response's end or the connection's, closes.
CLIENT = r"""
import socket, sys
port, answered, unanswered = (int(a) for a in sys.argv[1:])
paths = [f"/ok/{i}" for i in range(answered)] + [f"/hangup/{i}" for i in range(unanswered)]
for path in paths:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        got = b""
        while not got.endswith(b"ok"):
            data = sock.recv(4096)
            if not data:
                break
            got += data
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], dict[str, list[dict]]]:
    tmp = tmp_path_factory.mktemp("unanswered")
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp / "port")])
    try:
        port = _wait_for_file(tmp / "port", server)
        with OTLPReceiver() as receiver:
            agent = subprocess.Popen(
                [
                    *AGENT,
                    "run",
                    "--port",
                    port,
                    "--exporter",
                    "otlp",
                    "--otlp-endpoint",
                    receiver.grpc_endpoint,
                    "--ready-file",
                    str(tmp / "ready"),
                ],
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
            )
            _wait_for_file(tmp / "ready", agent)
            subprocess.run([sys.executable, "-c", CLIENT, port, str(ANSWERED), str(UNANSWERED)], check=True, timeout=60)
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=60)[1]
            assert agent.returncode == 0, stderr
            return receiver.spans(), receiver.metrics()
    finally:
        server.kill()
        server.wait()


def _counts(metrics: dict[str, list[dict]], name: str) -> Counter:
    """Requests per (status code, error.type) in the last point of each series."""
    latest: dict[tuple, dict] = {}
    for point in metrics[name]:
        series = tuple(sorted(point["attributes"].items()))
        if series not in latest or point["time_ns"] >= latest[series]["time_ns"]:
            latest[series] = point
    counts: Counter = Counter()
    for point in latest.values():
        attributes = point["attributes"]
        counts[attributes.get("http.response.status_code"), attributes.get("error.type")] += point["count"]
    return counts


@pytest.mark.parametrize("side", ["server", "client"])
def test_unanswered_requests_are_counted_as_response_missing(run: tuple, side: str) -> None:
    _, metrics = run
    assert _counts(metrics, f"http.{side}.request.duration") == Counter(
        {(200, None): ANSWERED, (None, "response_missing"): UNANSWERED}
    )


def test_their_spans_say_the_same(run: tuple) -> None:
    spans, _ = run
    outcomes = Counter(
        (s["kind"], s["attributes"].get("http.response.status_code"), s["attributes"].get("error.type")) for s in spans
    )
    assert outcomes == Counter(
        {
            ("SERVER", 200, None): ANSWERED,
            ("CLIENT", 200, None): ANSWERED,
            ("SERVER", None, "response_missing"): UNANSWERED,
            ("CLIENT", None, "response_missing"): UNANSWERED,
        }
    )
