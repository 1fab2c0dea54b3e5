"""Live BPF: HTTP over unix domain sockets, as Python services are deployed behind a proxy.

nginx listens on TCP and proxies to an ASGI app that hypercorn serves on a unix socket
(``proxy_pass http://unix:...``, the usual gunicorn/uvicorn set-up); curl also talks HTTP/2 to the
app's socket directly (``--unix-socket``). All three programs are traced. And a grpcio client calls
a grpcio server on a unix socket (``unix:`` targets, gRPC's own I/O: ``sendmsg``/``recvmsg``). Every request makes its
spans, with ``network.transport=unix``, the socket's path where the conventions put a peer's
address and no socket port; the app's SERVER span is the child of nginx's CLIENT span, the two
connections' ends paired by the kernel's sockets (every connection to the socket shares its path);
the kernel counts the app's HTTP/1 requests into its duration histogram. Before, unix sockets
were left out in the kernel: no span, no count, nothing said.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.live.file_agent import SOCKET_MODES, kill_all, release, start_file_agent, stop_file_agent
from tests.live.test_prometheus_live import _free_port
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

PROXIED = 5  # GET /items/<i> through nginx, then one GET /missing (404)
# its worker as root, as the test's directory is the test user's alone (nginx would take nobody)
NGINX_CONF = """user root;
worker_processes 1;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/px; fastcgi_temp_path {tmp}/fc;
  uwsgi_temp_path {tmp}/uw; scgi_temp_path {tmp}/sc;
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://unix:{socket}; }} }}
}}
"""
# hypercorn serving tests/protocols/h2_peers.py's app (HTTP/1.1 and h2c) on the unix socket argv[1],
# in this one process
APP = """
import asyncio, sys
from hypercorn.asyncio import serve
from hypercorn.config import Config
sys.path.insert(0, sys.argv[2])
from h2_peers import asgi_app
config = Config()
config.bind = [f"unix:{sys.argv[1]}"]
config.accesslog = config.errorlog = None
asyncio.run(serve(asgi_app, config))
"""


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    for _ in range(400):
        if path.exists():
            return
        assert process.poll() is None, f"{process.args[0]} exited ({process.returncode})"
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


@pytest.mark.parametrize("mode", ["copy-in-sock", "syscall-exits"])  # fd-tracking leaves unix sockets out
def test_http_through_nginx_to_an_app_on_a_unix_socket(tmp_path: Path, mode: str) -> None:
    app_socket, port = tmp_path / "app.sock", _free_port()
    (tmp_path / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp_path, port=port, socket=app_socket))
    app = subprocess.Popen([sys.executable, "-c", APP, str(app_socket), str(REPO / "tests" / "protocols")])
    nginx = subprocess.Popen(
        ["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "error.log")]
        + ["-g", f"daemon off; pid {tmp_path}/nginx.pid;"],
    )
    agent = None
    try:
        _wait_for(app_socket, app)
        _wait_for(tmp_path / "nginx.pid", nginx)
        agent = start_file_agent(tmp_path, [app.pid, nginx.pid], SOCKET_MODES[mode], args=["--exe", "curl"])
        statuses = [
            _curl(f"http://127.0.0.1:{port}/{path}") for path in [*(f"items/{i}" for i in range(PROXIED)), "missing"]
        ]
        assert statuses == ["200"] * PROXIED + ["404"]
        assert _curl("http://localhost/items/h2", "--unix-socket", str(app_socket), "--http2-prior-knowledge") == "200"
        stderr = stop_file_agent(agent)
    finally:
        if nginx.poll() is None:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=30)
        kill_all(agent, app, nginx)
    assert "kernel drop counters: {'ringbuf_full': 0" in stderr

    spans = load_file_spans(tmp_path / "out")

    def process(span: dict) -> str:
        return "app" if span["resource"]["process.pid"] == app.pid else span["resource"]["process.executable.name"]

    by_process = Counter((process(s), s["kind"]) for s in spans)
    assert by_process == {
        ("nginx", "SERVER"): PROXIED + 1,
        ("nginx", "CLIENT"): PROXIED + 1,
        ("curl", "CLIENT"): PROXIED + 2,
        ("app", "SERVER"): PROXIED + 2,
    }, by_process
    app_spans = [s for s in spans if s["resource"]["process.pid"] == app.pid]
    proxied = [s for s in spans if process(s) == "nginx" and s["kind"] == "CLIENT"]
    for span in app_spans + proxied:
        attributes = span["attributes"]
        assert attributes["network.transport"] == "unix", attributes
        # server.address and server.port are the Host header's (localhost, 80 by default)
        assert not {"network.peer.port", "client.port", "client.address"} & set(attributes), attributes
    # nginx's side names the socket it connected to; the app's peer (nginx's socket) has no name
    assert {s["attributes"]["network.peer.address"] for s in proxied} == {str(app_socket)}
    assert not any("network.peer.address" in s["attributes"] for s in app_spans)
    versions = Counter(
        (s["attributes"]["url.path"], s["attributes"]["network.protocol.version"] == "2") for s in app_spans
    )
    assert versions == {
        **{(f"/items/{i}", False): 1 for i in range(PROXIED)},
        ("/missing", False): 1,
        ("/items/h2", True): 1,
    }

    # One trace per request: curl -> nginx (TCP) -> nginx's call -> the app (unix), each span the
    # child of the one before (the app's by its socket's pair with nginx's, not by the path).
    by_id = {s["span_id"]: s for s in spans}
    for span in app_spans:
        chain = [span]
        while chain[-1]["parent_span_id"] in by_id:
            chain.append(by_id[chain[-1]["parent_span_id"]])
        proxied_call = span["attributes"]["network.protocol.version"] != "2"
        assert [(process(s), s["kind"]) for s in reversed(chain)] == [
            ("curl", "CLIENT"),
            *([("nginx", "SERVER"), ("nginx", "CLIENT")] if proxied_call else []),
            ("app", "SERVER"),
        ], chain
        assert chain[-1]["parent_span_id"] is None and len({s["trace_id"] for s in chain}) == 1

    metrics = load_file_metrics(tmp_path / "out")
    served = [p for p in metrics["http.server.request.duration"] if p["resource"]["process.pid"] == app.pid]
    assert latest_total({"served": served}, "served") == PROXIED + 2, served
    assert not any("server.port" in p["attributes"] for p in served)
    assert latest_total(metrics, "otel_ebpf.connections.unknown_protocol") == 0


# A grpcio server (argv[1] "serve") of demo.Echo/Say on the unix socket argv[2], reversing what it
# is sent, NOT_FOUND for "missing"; or a client that, once it reads a line, makes CALLS calls and
# one for "missing", printing each status.
GRPC_PEER = """
import sys, grpc
from concurrent import futures
role, path = sys.argv[1:3]
if role == "serve":
    def say(request, context):
        if request == b"missing":
            context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        return request[::-1]
    handler = grpc.method_handlers_generic_handler("demo.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)})
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    server.start()
    server.wait_for_termination()
sys.stdin.readline()
with grpc.insecure_channel(f"unix:{path}") as channel:
    say = channel.unary_unary("/demo.Echo/Say")
    for i in range(int(sys.argv[3])):
        assert say(b"call %d" % i) == (b"call %d" % i)[::-1]
    try:
        say(b"missing")
    except grpc.RpcError as error:
        print(error.code().name, flush=True)
"""
CALLS = 4


def test_grpc_over_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "grpc.sock"
    server = subprocess.Popen([sys.executable, "-c", GRPC_PEER, "serve", str(path)])
    client = subprocess.Popen(
        [sys.executable, "-c", GRPC_PEER, "call", str(path), str(CALLS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    agent = None
    try:
        _wait_for(path, server)
        agent = start_file_agent(tmp_path, [server.pid, client.pid], "{}\n")
        assert release(client) == "NOT_FOUND"
        assert client.wait(timeout=30) == 0
        stop_file_agent(agent)
    finally:
        kill_all(agent, client, server)

    spans = load_file_spans(tmp_path / "out")
    calls = [s for s in spans if s["kind"] == "CLIENT"]
    served = {s["parent_span_id"]: s for s in spans if s["kind"] == "SERVER"}
    assert len(calls) == len(served) == CALLS + 1, spans
    for call in calls:
        answer = served[call["span_id"]]  # each served call is its caller's child
        assert answer["trace_id"] == call["trace_id"] and answer["name"] == call["name"] == "demo.Echo/Say"
        for span in (call, answer):
            attributes = span["attributes"]
            assert (attributes["server.address"], attributes["network.transport"]) == (str(path), "unix")
            assert not {"server.port", "network.peer.port", "client.address"} & set(attributes), attributes
        assert call["attributes"]["network.peer.address"] == str(path)
    assert Counter(s["attributes"]["rpc.grpc.status_code"] for s in calls) == {0: CALLS, 5: 1}


def _curl(url: str, *options: str) -> str:
    """The status of one request by curl (a new process: the agent follows it by ``--exe``)."""
    done = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *options, url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout
