"""Live BPF: TLS plaintext from the SSL probes, with real OpenSSL peers, at a real OTLP receiver.

The HTTPS server is Python's ``http.server`` wrapped by ``ssl`` (OpenSSL 3: ``SSL_read_ex`` /
``SSL_write_ex``); the clients are ``http.client`` (the same) and ``curl`` (``SSL_read`` /
``SSL_write``). gRPC over TLS goes through the BoringSSL that grpcio links into its stripped module:
that is reported as not capturable, and its ciphertext must not turn into spans; so is GnuTLS's
``gnutls-serv``, whose library has no OpenSSL API at all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import trustme

from tests.conftest import AGENT, REPO
from tests.live.test_http_live import _wait_for_file
from tests.live.test_prometheus_live import _free_port
from tests.otlp_receiver import OTLPReceiver, latest_total

pytestmark = pytest.mark.bpf
WORKLOAD = [sys.executable, str(REPO / "examples" / "tls_peers.py")]
CALLS = 20


def _certificates(tmp: Path) -> tuple[str, str, str]:
    """(CA, server certificate chain, key) files for 127.0.0.1 and localhost."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    server.private_key_pem.write_to_path(str(tmp / "key.pem"))
    server.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    return str(tmp / "ca.pem"), str(tmp / "cert.pem"), str(tmp / "key.pem")


def _start_agent(
    tmp: Path,
    receiver: OTLPReceiver,
    socket_mode: str,
    *targets: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.Popen:
    """The agent with ``targets`` (and any other flags) exporting to ``receiver``, once it is ready;
    ``env`` adds to the environment."""
    ready = tmp / "agent.ready"
    agent = subprocess.Popen(
        [
            *AGENT,
            "run",
            *targets,
            "--exporter",
            "otlp",
            "--otlp-endpoint",
            receiver.grpc_endpoint,
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OTEL_EBPF_SOCKET_MODE": socket_mode, **(env or {})},
    )
    try:
        _wait_for_file(ready, agent, timeout)
    except BaseException:
        agent.kill()  # an agent left attached would tax every later test's syscalls
        agent.wait()
        raise
    return agent


def _client_and_agent(
    tmp: Path,
    receiver: OTLPReceiver,
    server: subprocess.Popen,
    client_argv: list[str],
    port: int,
    ca: str,
    *options: str,
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """A client (``client_argv`` PORT CA CALLS ``options``) waiting for its go line, and the agent
    tracing it and the server (by pid: other programs on a busy machine stay out of the counts)."""
    client = subprocess.Popen(
        [*client_argv, str(port), ca, str(CALLS), *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert client.stdout.readline() == "ready\n"
    agent = _start_agent(tmp, receiver, "tracepoints", "--pid", str(server.pid), "--pid", str(client.pid))
    return client, agent


def _serve_and_call(
    tmp: Path, serve: str | list[str], client_argv: list[str], spans_expected: int, *options: str
) -> tuple[list[str], str, list, dict, int]:
    """A TLS server (a ``tls_peers.py`` command, or the command line it takes PORT_FILE CERT KEY
    after) and a client of it (given ``options`` after its other arguments), both traced from the
    start: the client's output lines, the agent's stderr, what the receiver got, and the client's
    pid."""
    ca, cert, key = _certificates(tmp)
    server_argv = [*WORKLOAD, serve] if isinstance(serve, str) else serve
    server = subprocess.Popen([*server_argv, str(tmp / "port"), cert, key])
    try:
        port = int(_wait_for_file(tmp / "port", server))
        with OTLPReceiver() as receiver:
            client, agent = _client_and_agent(tmp, receiver, server, client_argv, port, ca, *options)
            try:
                out, _ = client.communicate("go\n", timeout=60)
                assert client.returncode == 0
                stderr = _stop(agent)
            finally:
                if agent.poll() is None:  # an agent left attached would tax every later test's syscalls
                    agent.kill()
                    agent.wait()
            receiver.wait_for(lambda r: len(r.spans()) >= spans_expected and bool(r.metrics()), timeout=10)
            return out.splitlines(), stderr, receiver.spans(), receiver.metrics(), client.pid
    finally:
        server.kill()
        server.wait()


def _stop(agent: subprocess.Popen) -> str:
    agent.send_signal(signal.SIGINT)
    stderr = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, stderr
    return stderr


def _assert_each_call_on_both_sides(lines: list[str], spans: list[dict]) -> None:
    """One SERVER and one CLIENT span per call the client reported (a JSON line each)."""
    calls = [json.loads(line) for line in lines]
    assert len(calls) == CALLS
    expected = Counter((c["path"], c["status"]) for c in calls)
    for kind in ("SERVER", "CLIENT"):
        got = Counter((_path(s), s["attributes"]["http.response.status_code"]) for s in spans if s["kind"] == kind)
        assert got == expected, kind


def _path(span: dict) -> str:
    a = span["attributes"]
    return a["url.path"] if span["kind"] == "SERVER" else "/" + a["url.full"].split("/", 3)[3]


@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_https_plaintext_becomes_spans(tmp_path: Path, socket_mode: str) -> None:
    ca, cert, key = _certificates(tmp_path)
    server = subprocess.Popen([*WORKLOAD, "https-serve", str(tmp_path / "port"), cert, key])
    try:
        port = int(_wait_for_file(tmp_path / "port", server))
        client = subprocess.Popen(
            [*WORKLOAD, "https-client", str(port), ca, str(CALLS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(client.stdout.readline())["status"] == 200  # before the agent
        assert client.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            # Everything is traced by pid, so other programs on a busy machine stay out of the
            # counts: each curl is a shell that waits for a line, then becomes curl (same pid).
            curls = {
                path: subprocess.Popen(
                    [
                        "sh",
                        "-c",
                        f'read go && exec curl -s -o /dev/null --cacert {ca} "https://127.0.0.1:{port}{path}"',
                    ],
                    stdin=subprocess.PIPE,
                    text=True,
                )
                for path in ("/items/curl", "/missing/curl")
            }
            pids = [server.pid, client.pid, *(curl.pid for curl in curls.values())]
            agent = _start_agent(tmp_path, receiver, socket_mode, *(f"--pid={pid}" for pid in pids))
            out, _ = client.communicate("go\n", timeout=60)
            assert client.returncode == 0
            calls = [json.loads(line) for line in out.splitlines()]
            for path, curl in curls.items():
                curl.communicate("go\n", timeout=30)
                assert curl.returncode == 0
                calls.append({"path": path, "status": 404 if path.startswith("/missing") else 200})
            stderr = _stop(agent)
            receiver.wait_for(lambda r: len(r.spans()) >= 2 * len(calls) - 1, timeout=10)
            spans, metrics = receiver.spans(), receiver.metrics()
    finally:
        server.kill()
        server.wait()

    assert "TLS: hooked" in stderr and "libssl" in stderr
    expected = Counter((c["path"], c["status"]) for c in calls)
    clients = Counter((_path(s), s["attributes"]["http.response.status_code"]) for s in spans if s["kind"] == "CLIENT")
    servers = Counter((_path(s), s["attributes"]["http.response.status_code"]) for s in spans if s["kind"] == "SERVER")
    assert clients == expected
    # The server thread of the connection that predates the agent was already inside SSL_read when
    # the probes attached: that call's plaintext is not seen (its response is, unmatched).
    assert servers == expected - Counter([("/missing/0", 404)])
    assert all(s["attributes"]["url.full"].startswith("https://") for s in spans if s["kind"] == "CLIENT")
    assert all(s["attributes"]["url.scheme"] == "https" for s in spans if s["kind"] == "SERVER")
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0  # no ciphertext reached a parser
    assert latest_total(metrics, "otel_ebpf.kernel.drops", reason="tls_unattributed") == 0
    assert "ringbuf_full" in {p["attributes"]["reason"] for p in metrics["otel_ebpf.kernel.drops"]}
    # both ends of the keep-alive connection and of two curls
    assert latest_total(metrics, "otel_ebpf.connections.tls") == 6
    # same-node hops: every server span's parent is the client span of the same request
    by_id = {s["span_id"]: s for s in spans}
    for server_span in (s for s in spans if s["kind"] == "SERVER"):
        parent = by_id[server_span["parent_span_id"]]
        assert (parent["kind"], _path(parent)) == ("CLIENT", _path(server_span))


def test_asyncio_tls_over_memory_bios(tmp_path: Path) -> None:
    """aiohttp on both ends: asyncio's SSLProtocol decrypts through memory BIOs, so no syscall
    happens inside SSL_read; the socket is the one the thread read just before."""
    lines, _, spans, metrics, _ = _serve_and_call(tmp_path, "async-serve", [*WORKLOAD, "async-client"], 2 * CALLS)
    _assert_each_call_on_both_sides(lines, spans)
    assert latest_total(metrics, "otel_ebpf.kernel.drops", reason="tls_unattributed") == 0
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0


def test_node_https_client_over_memory_bios(tmp_path: Path) -> None:
    """A Node.js client: its TLS runs over memory BIOs and its handshake is driven from SSL_read
    and SSL_write, so neither a syscall inside an SSL call nor a read just before its first write
    names the socket; the TLS records it writes next do. OpenSSL reading its own files inside the
    first SSL call must not name one either."""
    client = ["node", str(Path(__file__).with_name("https_client.js"))]
    lines, _, spans, metrics, pid = _serve_and_call(tmp_path, "https-serve", client, 2 * CALLS)
    _assert_each_call_on_both_sides(lines, spans)
    assert {s["resource"]["process.pid"] for s in spans if s["kind"] == "CLIENT"} == {pid}
    assert latest_total(metrics, "otel_ebpf.kernel.drops", reason="tls_unattributed") == 0
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0  # no ciphertext reached a parser


def test_node_https_client_opening_a_connection_per_request_names_each_socket(tmp_path: Path) -> None:
    """The same client, each request on a new connection opened right after the last response
    was read, the earlier connections kept open. A new connection's first SSL call (an SSL_read
    that starts its handshake) decrypts nothing: the socket the thread read just before is the
    previous connection's, not its own; its first TLS records name it. Taken from that read, every
    later connection's plaintext went to the first one's, and its own ciphertext reached the
    parsers as bytes of no protocol."""
    client = ["node", str(Path(__file__).with_name("https_client.js"))]
    lines, _, spans, metrics, _ = _serve_and_call(tmp_path, "https-serve", client, 2 * CALLS, "per-request")
    _assert_each_call_on_both_sides(lines, spans)
    by_id = {s["span_id"]: s for s in spans}
    for server_span in (s for s in spans if s["kind"] == "SERVER"):  # joined by their connection's ends
        parent = by_id[server_span["parent_span_id"]]
        assert (parent["kind"], _path(parent)) == ("CLIENT", _path(server_span))
    assert latest_total(metrics, "otel_ebpf.connections.tls") == 2 * CALLS
    assert latest_total(metrics, "otel_ebpf.connections.tls_ciphertext") == 0
    assert latest_total(metrics, "otel_ebpf.connections.unknown_protocol") == 0
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0


@pytest.mark.parametrize(
    "server",
    [[*WORKLOAD, "async-serve"], ["node", str(Path(__file__).with_name("https_server.js"))]],
    ids=["aiohttp", "node"],
)
def test_memory_bio_server_under_concurrent_handshakes_names_each_connection(tmp_path: Path, server: list[str]) -> None:
    """Servers whose TLS runs over memory BIOs (asyncio's, Node.js's), one thread for every
    connection, under 8 clients that each open a connection per request and close it: the SSL
    objects the server frees come back at the same addresses for new connections, on other
    sockets. Learnt once for good, a reused SSL* took the plaintext to a closed socket (lost, counted
    ``tls_unattributed``) or to another live connection (spans with another request's peer port
    and parent), and left its own connection's ciphertext to the parsers."""
    threads = 8
    lines, _, spans, metrics, _ = _serve_and_call(
        tmp_path, server, [*WORKLOAD, "https-connections"], 2 * CALLS * threads, str(threads)
    )
    calls = {c["path"]: c for c in map(json.loads, lines)}
    assert len(calls) == CALLS * threads
    by_id = {s["span_id"]: s for s in spans}
    server_spans = {_path(s): s for s in spans if s["kind"] == "SERVER"}
    assert server_spans.keys() == calls.keys()
    for path, span in server_spans.items():
        assert span["attributes"]["client.port"] == calls[path]["port"], path
        parent = by_id[span["parent_span_id"]]
        assert (parent["kind"], _path(parent)) == ("CLIENT", path)
    assert latest_total(metrics, "otel_ebpf.kernel.drops", reason="tls_unattributed") == 0
    assert latest_total(metrics, "otel_ebpf.connections.tls") == 2 * CALLS * threads
    assert latest_total(metrics, "otel_ebpf.connections.tls_ciphertext") == 0
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0


def test_tls_connections_closed_after_their_handshake_are_not_taken_for_an_unhooked_library(tmp_path: Path) -> None:
    """Health checks against a memory-BIO server (aiohttp): a handshake, then the close. The
    server reads each ClientHello outside any SSL call, so that ciphertext reaches user space
    before the SSL probes name the socket, and no plaintext follows; the close says the probes
    knew the connection. Counted ``tls_ciphertext`` (an unhooked TLS library) before: 20 of 20."""
    lines, _, spans, metrics, _ = _serve_and_call(tmp_path, "async-serve", [*WORKLOAD, "handshakes"], 0)
    assert len(lines) == CALLS
    assert spans == []
    assert latest_total(metrics, "otel_ebpf.connections.tls_ciphertext") == 0
    assert latest_total(metrics, "otel_ebpf.kernel.drops", reason="tls_unattributed") == 0


def test_grpc_over_tls_is_reported_not_parsed(tmp_path: Path) -> None:
    """grpcio's BoringSSL has no symbols to hook: the agent says so, and its ciphertext yields nothing."""
    lines, stderr, spans, metrics, _ = _serve_and_call(tmp_path, "grpc-serve", [*WORKLOAD, "grpc-client"], 0)
    assert len(lines) == CALLS
    assert "cygrpc" in stderr and "no SSL_read/SSL_write symbols" in stderr
    assert spans == []
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0
    assert latest_total(metrics, "otel_ebpf.connections.unknown_protocol") >= 1  # judged unknown, then ignored
    assert latest_total(metrics, "otel_ebpf.connections.tls_ciphertext") >= 1  # and as TLS no probe read


def test_tls_through_a_library_the_agent_does_not_hook_is_told(tmp_path: Path) -> None:
    """GnuTLS's test server (libgnutls, no OpenSSL API to hook, as Java's JSSE or Go's crypto/tls):
    its connections reach the agent as ciphertext only. Each is counted when it closes, the log
    names the process once and says why it makes no spans, and nothing reaches a parser."""
    _, cert, key = _certificates(tmp_path)
    port = _free_port()
    server = subprocess.Popen(
        ["gnutls-serv", "--http", "--x509certfile", cert, "--x509keyfile", key, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"https://127.0.0.1:{port}/items/"
    curl = ["curl", "-sSk", "--retry-connrefused", "--retry", "50", "--retry-delay", "0", "--retry-max-time", "10"]
    try:
        assert "GnuTLS" in subprocess.run([*curl, f"{url}warmup"], capture_output=True, text=True, check=True).stdout
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp_path, receiver, "tracepoints", "--pid", str(server.pid))
            for n in range(CALLS):
                subprocess.run([*curl, "-o", "/dev/null", f"{url}{n}"], check=True)
            stderr = _stop(agent)
            receiver.wait_for(lambda r: bool(r.metrics()), timeout=10)
            spans, metrics = receiver.spans(), receiver.metrics()
    finally:
        server.kill()
        server.wait()
    assert spans == []
    assert latest_total(metrics, "otel_ebpf.connections.tls_ciphertext") == CALLS
    told = f"process {server.pid} (gnutls-serv) speaks TLS through a library the agent does not hook"
    assert stderr.count(told) == 1, stderr
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0
