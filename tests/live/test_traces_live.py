"""Live BPF: trace assembly across processes that know nothing about tracing.

The workload is ``examples/trace_chain.py``: loader -> gateway -> service -> backend, each hop a
separate process on loopback, ``x-request-id: req-<i>`` forwarded hop by hop. The agent is attached
by ``--pid`` to exactly the processes whose spans a test expects, and every test compares, request
by request, the traces the OTLP receiver got with the chain the workload really made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import AGENT, REPO
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import OTLPReceiver, latest_total

pytestmark = pytest.mark.bpf
CHAIN = [sys.executable, str(REPO / "examples" / "trace_chain.py")]
SOCKET_MODES = pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
REQUEST_ID = "http.request.header.x-request-id"
AMBIGUOUS = "otel_ebpf.trace.ambiguous_parents"

Span = dict[str, Any]


class Scenario:
    """The processes of one test. Servers and loaders are killed on exit whatever happened; the
    agent gets SIGINT (and is killed only if it does not stop)."""

    def __init__(self, tmp: Path, receiver: OTLPReceiver, socket_mode: str) -> None:
        self.tmp, self.receiver, self.socket_mode = tmp, receiver, socket_mode
        self.procs: list[subprocess.Popen] = []
        self.agent: subprocess.Popen | None = None
        self.agent_log = tmp / "agent.stderr"

    def __enter__(self) -> Scenario:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGINT)
            try:
                self.agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def spawn(self, args: list[str], **kwargs: Any) -> subprocess.Popen:
        proc = subprocess.Popen(args, **kwargs)
        self.procs.append(proc)
        return proc

    def serve(self, command: str, name: str, *args: str) -> tuple[int, int]:
        """Start ``trace_chain.py COMMAND NAME PORT_FILE ARGS``; its (pid, port)."""
        port_file = self.tmp / f"{name}.port"
        proc = self.spawn([*CHAIN, command, name, str(port_file), *args])
        return proc.pid, int(_wait_for_file(port_file, proc))

    def chain(self, backend_kind: str = "http") -> tuple[list[tuple[int, str]], int]:
        """gateway -> service -> backend (``grpc``: a gRPC backend): the five hops of a request
        from the root down, as (pid, span kind), and the gateway's port."""
        serve, scheme = ("serve-grpc", "grpc") if backend_kind == "grpc" else ("serve", "http")
        backend, backend_port = self.serve(serve, f"{backend_kind}-backend")
        service, service_port = self.serve("serve", "service", "--next", f"{scheme}://127.0.0.1:{backend_port}")
        gateway, gateway_port = self.serve("serve", "gateway", "--next", f"http://127.0.0.1:{service_port}")
        hops = [(gateway, "SERVER"), (gateway, "CLIENT"), (service, "SERVER"), (service, "CLIENT"), (backend, "SERVER")]
        return hops, gateway_port

    def loader(self, port: int, requests: int, concurrency: int, *flags: str) -> subprocess.Popen:
        """A loader that has started (so its pid can be traced) and waits for :meth:`load`."""
        proc = self.spawn(
            [
                *CHAIN,
                "load",
                f"http://127.0.0.1:{port}",
                "--requests",
                str(requests),
                "--concurrency",
                str(concurrency),
                "--wait",
                *flags,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline() == "ready\n"
        return proc

    def start_agent(self, *pids: int) -> None:
        ready = self.tmp / "agent.ready"
        with self.agent_log.open("w") as log:
            self.agent = subprocess.Popen(
                [
                    *AGENT,
                    "run",
                    *(f"--pid={pid}" for pid in pids),
                    "--exporter",
                    "otlp",
                    "--otlp-endpoint",
                    self.receiver.grpc_endpoint,
                    "--ready-file",
                    str(ready),
                ],
                cwd=REPO,
                stderr=log,
                env={**os.environ, "OTEL_EBPF_SOCKET_MODE": self.socket_mode},
            )
        try:
            _wait_for_file(ready, self.agent)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nagent stderr:\n{self.agent_log.read_text()}") from None

    def load(self, loader: subprocess.Popen, requests: int) -> list[dict]:
        """Let the loader go; its per-request lines, by id. Every request must have succeeded."""
        out, _ = loader.communicate("go\n", timeout=120)
        lines = sorted((json.loads(line) for line in out.splitlines()), key=lambda r: r["id"])
        assert loader.returncode == 0, out
        assert [r["id"] for r in lines] == list(range(requests))
        assert all(r["status"] == 200 for r in lines), [r for r in lines if r["status"] != 200]
        return lines

    def stop_agent(self, expected_spans: int) -> tuple[list[Span], dict[str, list[dict]]]:
        """SIGINT flushes everything; then what the receiver got."""
        assert self.agent is not None
        self.agent.send_signal(signal.SIGINT)
        returncode = self.agent.wait(timeout=60)
        assert returncode == 0, self.agent_log.read_text()
        self.receiver.wait_for(lambda r: len(r.spans()) >= expected_spans, timeout=3)
        return self.receiver.spans(), self.receiver.metrics()


def _pid(span: Span) -> int:
    return span["resource"]["process.pid"]


def _work_id(span: Span) -> int | None:
    """The ``<i>`` of ``/work/<i>`` (server: url.path, client: url.full); None for non-HTTP spans."""
    a = span["attributes"]
    path = a.get("url.path") or ("/" + a["url.full"].split("/", 3)[3] if "url.full" in a else None)
    if path is None or not path.startswith("/work/"):
        return None
    return int(path.removeprefix("/work/").split("?")[0])


def _describe(spans: list[Span]) -> list[tuple]:
    return [(_pid(s), s["kind"], _work_id(s), s["trace_id"][:8], s["span_id"], s["parent_span_id"]) for s in spans]


def _traces(spans: list[Span]) -> dict[str, list[Span]]:
    traces: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        traces[span["trace_id"]].append(span)
    return dict(traces)


def _chain_problem(trace: list[Span], hops: list[tuple[int, str]], root_parent: str | None) -> str | None:
    """Why ``trace`` is not exactly ``hops`` ((pid, kind) from the root down, each span the parent
    of the next, the root's parent ``root_parent``), all for one request; None when it is."""
    if sorted((_pid(s), s["kind"]) for s in trace) != sorted(hops):
        return f"hops {sorted((_pid(s), s['kind']) for s in trace)}"
    by_hop = {(_pid(s), s["kind"]): s for s in trace}
    parent = root_parent
    for hop in hops:
        if by_hop[hop]["parent_span_id"] != parent:
            return f"{hop} has parent {by_hop[hop]['parent_span_id']}, expected {parent}"
        parent = by_hop[hop]["span_id"]
    work_ids = {_work_id(s) for s in trace} - {None}
    if len(work_ids) != 1:
        return f"spans of requests {sorted(work_ids)}"
    (work_id,) = work_ids
    for s in trace:
        if _work_id(s) is not None and s["attributes"].get(REQUEST_ID) != [f"req-{work_id}"]:
            return f"{s['kind']} of pid {_pid(s)} has {REQUEST_ID}={s['attributes'].get(REQUEST_ID)}"
    return None


def _assert_chains(
    spans: list[Span], hops: list[tuple[int, str]], requests: int, root_parents: dict[str, str] | None = None
) -> dict[str, list[Span]]:
    """Exactly ``requests`` traces, each the chain ``hops`` of one distinct request."""
    traces = _traces(spans)
    sizes = sorted(len(t) for t in traces.values())
    assert len(spans) == len(hops) * requests and len(traces) == requests, (
        f"{len(spans)} spans in {len(traces)} traces (sizes {sizes}); example: {_describe(spans[:10])}"
    )
    problems = {}
    for trace_id, trace in traces.items():
        root_parent = None if root_parents is None else root_parents.get(trace_id, "<not the caller's trace>")
        if (problem := _chain_problem(trace, hops, root_parent)) is not None:
            problems[trace_id] = (problem, _describe(trace))
    assert not problems, f"{len(problems)} of {requests} traces wrong, e.g. {list(problems.values())[:3]}"
    work_ids = sorted(next(w for s in t if (w := _work_id(s)) is not None) for t in traces.values())
    assert work_ids == list(range(requests))
    return traces


REQUESTS = 50
CONCURRENCY = 8


@SOCKET_MODES
def test_threaded_chain_is_one_trace_per_request(tmp_path: Path, socket_mode: str) -> None:
    with OTLPReceiver() as receiver, Scenario(tmp_path, receiver, socket_mode) as run:
        hops, gateway_port = run.chain()
        loader = run.loader(gateway_port, REQUESTS, CONCURRENCY)  # not traced: the gateway is the root
        run.start_agent(*{pid for pid, _ in hops})
        run.load(loader, REQUESTS)
        spans, _ = run.stop_agent(5 * REQUESTS)
    traces = _assert_chains(spans, hops, REQUESTS)
    for trace in traces.values():
        assert {s["name"] for s in trace} == {"GET /work/{id}"}  # assembly leaves names alone


@SOCKET_MODES
def test_sdk_instrumented_caller_owns_the_trace(tmp_path: Path, socket_mode: str) -> None:
    with OTLPReceiver() as receiver, Scenario(tmp_path, receiver, socket_mode) as run:
        hops, gateway_port = run.chain()
        loader = run.loader(gateway_port, REQUESTS, CONCURRENCY, "--traceparent")
        run.start_agent(loader.pid, *{pid for pid, _ in hops})  # the loader too: its CLIENT spans are its own
        requests = run.load(loader, REQUESTS)
        spans, _ = run.stop_agent(5 * REQUESTS)
    assert [s for s in spans if _pid(s) == loader.pid] == []
    traces = _assert_chains(spans, hops, REQUESTS, root_parents={r["trace_id"]: r["span_id"] for r in requests})
    for r in requests:
        assert {_work_id(s) for s in traces[r["trace_id"]]} == {r["id"]}


@SOCKET_MODES
@pytest.mark.parametrize("forward", [False, True], ids=["id-dropped", "id-forwarded"])
def test_event_loop_never_guesses_a_parent(tmp_path: Path, socket_mode: str, forward: bool) -> None:
    """One event-loop thread serves 8 requests at once. Without a forwarded x-request-id the agent
    cannot tell which one an outgoing call belongs to: no parent (counted), never a wrong one.
    With it, every call is its request's child."""
    requests = 40
    with OTLPReceiver() as receiver, Scenario(tmp_path, receiver, socket_mode) as run:
        backend, backend_port = run.serve("serve", "backend")
        service, service_port = run.serve(
            "serve-async",
            "async-service",
            "--next",
            f"http://127.0.0.1:{backend_port}",
            *(() if forward else ("--no-forward",)),
        )
        loader = run.loader(service_port, requests, CONCURRENCY)
        run.start_agent(service, backend)
        run.load(loader, requests)
        spans, metrics = run.stop_agent(3 * requests)

    by_request: dict[tuple[int, int, str], Span] = {}
    for s in spans:
        key = (_work_id(s), _pid(s), s["kind"])
        assert key not in by_request, f"two spans for {key}"
        by_request[key] = s
    assert len(spans) == 3 * requests
    assert set(by_request) == {
        (i, pid, kind)
        for i in range(requests)
        for pid, kind in ((service, "SERVER"), (service, "CLIENT"), (backend, "SERVER"))
    }
    server_span_ids = {by_request[i, service, "SERVER"]["span_id"] for i in range(requests)}
    parentless_clients = 0
    for i in range(requests):
        server, client = by_request[i, service, "SERVER"], by_request[i, service, "CLIENT"]
        downstream = by_request[i, backend, "SERVER"]
        assert server["parent_span_id"] is None  # the loader is not traced and sends no traceparent
        for s in (server, client, downstream) if forward else (server,):
            assert s["attributes"].get(REQUEST_ID) == [f"req-{i}"], _describe([s])
        if client["parent_span_id"] is None:
            parentless_clients += 1
            for link in client["links"]:  # links may name the candidates; never a span of another kind
                assert link["span_id"] in server_span_ids, link
                assert link["attributes"].get("otel_ebpf.link.reason") == "ambiguous_parent", link
        else:
            assert (client["parent_span_id"], client["trace_id"]) == (server["span_id"], server["trace_id"]), (
                f"request {i}: wrong parent {_describe([client, server])}"
            )
        if downstream["parent_span_id"] is not None:
            assert (downstream["parent_span_id"], downstream["trace_id"]) == (client["span_id"], client["trace_id"]), (
                f"request {i}: wrong parent {_describe([downstream, client])}"
            )
    ambiguous = latest_total(metrics, AMBIGUOUS)
    if forward:
        assert (parentless_clients, ambiguous) == (0, 0)
        assert latest_total(metrics, "otel_ebpf.trace.correlated_parents") == requests
        return
    assert ambiguous > 0, f"{AMBIGUOUS} = {ambiguous}; parentless CLIENT spans: {parentless_clients}"
    assert ambiguous == parentless_clients  # each case counted once, and only those cases


@SOCKET_MODES
def test_grpc_hop_joins_the_trace(tmp_path: Path, socket_mode: str) -> None:
    """The service -> backend hop in gRPC. grpcio's core writes a call on whichever thread holds
    its connection at the time, not always the caller's: the x-request-id the service forwards as
    metadata is what ties each call to its request."""
    with OTLPReceiver() as receiver, Scenario(tmp_path, receiver, socket_mode) as run:
        hops, gateway_port = run.chain("grpc")
        loader = run.loader(gateway_port, REQUESTS, CONCURRENCY)
        run.start_agent(*{pid for pid, _ in hops})
        run.load(loader, REQUESTS)  # all 200: the gRPC hop itself works
        spans, _ = run.stop_agent(5 * REQUESTS)
    _assert_chains(spans, hops, REQUESTS)
