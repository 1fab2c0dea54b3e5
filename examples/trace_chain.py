"""A chain of small services for trace assembly: none of them knows anything about tracing.

    python examples/trace_chain.py serve backend /tmp/backend.port
    python examples/trace_chain.py serve service /tmp/service.port --next http://127.0.0.1:<backend>
    python examples/trace_chain.py serve gateway /tmp/gateway.port --next http://127.0.0.1:<service>
    python examples/trace_chain.py load http://127.0.0.1:<gateway> --requests 50 --concurrency 8

Every ``GET /work/<id>`` entering the gateway makes one call to the service on the handling
thread, which makes one call to the backend: five HTTP exchanges per request, which the agent
should assemble into one trace (gateway SERVER -> gateway CLIENT -> service SERVER -> service
CLIENT -> backend SERVER) without any instrumentation in these programs. ``x-request-id`` is
forwarded hop by hop so a test can tell which exchange belongs to which request.

Subcommands:

``serve NAME PORT_FILE [--next URL]``
    A threaded ``http.server`` (a thread per connection, HTTP/1.1 keep-alive) on 127.0.0.1 with a
    free port, written to PORT_FILE. With ``--next``, each request makes one ``GET <next>/work/<id>``
    on the handling thread (thread causality) over that thread's keep-alive connection; without,
    it answers after ~2 ms of "work". ``--next grpc://HOST:PORT`` makes the call with gRPC instead
    (needs grpcio).
``serve-async NAME PORT_FILE --next URL [--no-forward]``
    The same on one asyncio event loop (aiohttp server and ``aiohttp.ClientSession``), sleeping
    20 ms before the outgoing call so that concurrent requests overlap on the loop thread: the
    thread cannot tell which incoming request an outgoing one belongs to, the forwarded
    ``x-request-id`` can. ``--no-forward`` leaves it out: then the agent cannot tell.
``serve-grpc NAME PORT_FILE``
    A gRPC backend (grpcio, generic handler, raw bytes: no protoc) answering ``/tracechain.Chain/Work``.
``load URL --requests N --concurrency C [--traceparent] [--wait]``
    N ``GET URL/work/<i>`` (``x-request-id: req-<i>``) from C threads, each with its own keep-alive
    connection; one JSON line per request on stdout. ``--traceparent`` instruments the loader with
    the OpenTelemetry SDK (a CLIENT span per request, ``traceparent`` injected) and adds the span's
    ``trace_id``/``span_id`` to each line. ``--wait`` prints ``ready`` and waits for a line on
    stdin before sending, so an agent can be attached to the loader's PID first.
``load-grpc HOST:PORT --seconds S --concurrency C [--rate R]``
    Unary ``/tracechain.Chain/Work`` calls for S seconds on one channel (one HTTP/2 connection,
    ready before the clock starts) from C threads, as fast as they go or paced at R calls/s in all
    (each thread on a fixed schedule, catching up when late); calls in flight at the end are
    awaited and counted. Then one JSON line: calls answered, errors, seconds, p50/p99 latency in ms
    (from each call's send).
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

WORK_PATH = re.compile(r"^/work/([^/?]+)$")
REQUEST_ID = "x-request-id"
BACKEND_WORK_S = 0.002  # the backend's "work": long enough that calls overlap under concurrency
ASYNC_DELAY_S = 0.020  # the async service's pause before its outgoing call: requests overlap on the loop
GRPC_METHOD = "/tracechain.Chain/Work"


def _write_port(port_file: str, port: int) -> None:
    """Write atomically: a reader polling the file never sees a partial number."""
    tmp = Path(f"{port_file}.tmp")
    tmp.write_text(str(port))
    tmp.replace(port_file)


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _answer(name: str, work_id: str, downstream: Any = None) -> bytes:
    return json.dumps({"service": name, "id": work_id, "next": downstream}).encode()


# --- threaded HTTP server --------------------------------------------------------------------------


class Downstream:
    """The next hop over HTTP/1.1: one keep-alive connection per handling thread.

    Per thread, not shared: the call must be made on the thread handling the incoming request
    (that is what the agent's thread causality relies on), and ``http.client`` connections are not
    thread-safe anyway."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._local = threading.local()

    def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        """Close this thread's connection (when the incoming connection it served ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class GrpcDownstream:
    """The next hop over gRPC: one channel per process, as gRPC programs usually have (calls from
    every thread are multiplexed on its HTTP/2 connection)."""

    def __init__(self, url: str) -> None:
        import grpc  # optional: only this mode needs grpcio

        self._channel = grpc.insecure_channel(urlsplit(url).netloc)
        # No serializers: requests and responses are raw bytes, so no generated code is needed.
        self._work = self._channel.unary_unary(GRPC_METHOD)

    def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        work_id = WORK_PATH.match(path).group(1)  # type: ignore[union-attr]
        reply = self._work(work_id.encode(), metadata=list(headers.items()), timeout=30)
        return 200, reply

    def close(self) -> None:
        """Nothing per thread: the channel lives as long as the process."""


def make_handler(name: str, downstream: Downstream | GrpcDownstream | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
        # One write per response (headers + body): with two, Nagle and delayed ACK add ~40 ms.
        wbufsize = 64 * 1024
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            """Silent: the agent is what reports requests here."""

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            match = WORK_PATH.match(self.path)
            if match is None:
                self._send(404, b'{"error": "not found"}')
                return
            work_id = match.group(1)
            if downstream is None:
                time.sleep(BACKEND_WORK_S)
                self._send(200, _answer(name, work_id))
                return
            headers = {REQUEST_ID: value} if (value := self.headers.get(REQUEST_ID)) else {}
            try:
                status, body = downstream.get(f"/work/{work_id}", headers)
            except Exception as exc:  # the chain is the point: report a broken hop, do not hide it
                self._send(502, json.dumps({"service": name, "error": repr(exc)}).encode())
                return
            self._send(200 if status == 200 else 502, _answer(name, work_id, json.loads(body or b"null")))

        def finish(self) -> None:
            super().finish()
            if downstream is not None:
                downstream.close()

    return Handler


def serve(name: str, port_file: str, next_url: str | None) -> None:
    downstream: Downstream | GrpcDownstream | None = None
    if next_url is not None:
        downstream = GrpcDownstream(next_url) if next_url.startswith("grpc://") else Downstream(next_url)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(name, downstream))
    server.daemon_threads = True
    _write_port(port_file, server.server_address[1])
    try:
        server.serve_forever()
    finally:
        server.server_close()


# --- asyncio HTTP server ---------------------------------------------------------------------------


def serve_async(name: str, port_file: str, next_url: str, forward: bool = True) -> None:
    import asyncio

    from aiohttp import ClientSession, web  # optional: only this mode needs aiohttp

    async def work(request: web.Request) -> web.Response:
        work_id = request.match_info["id"]
        await asyncio.sleep(ASYNC_DELAY_S)  # let concurrent requests pile up on this one thread
        value = request.headers.get(REQUEST_ID) if forward else None
        headers = {REQUEST_ID: value} if value else {}
        try:
            async with request.app["session"].get(f"{next_url}/work/{work_id}", headers=headers) as response:
                status, body = response.status, await response.read()
        except Exception as exc:
            return web.json_response({"service": name, "error": repr(exc)}, status=502)
        return web.Response(
            status=200 if status == 200 else 502,
            body=_answer(name, work_id, json.loads(body)),
            content_type="application/json",
        )

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        async with ClientSession() as client:
            app["session"] = client
            yield

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/work/{id}", work)
        app.cleanup_ctx.append(session)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        _write_port(port_file, runner.addresses[0][1])
        await asyncio.Event().wait()  # until killed

    asyncio.run(main())


# --- gRPC server -----------------------------------------------------------------------------------


def serve_grpc(name: str, port_file: str) -> None:
    from concurrent import futures

    import grpc  # optional: only this mode needs grpcio

    def work(request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(BACKEND_WORK_S)
        return _answer(name, request.decode())

    # Generic handler with no (de)serializers: raw bytes in and out, so no protoc is needed.
    handler = grpc.method_handlers_generic_handler(
        "tracechain.Chain", {"Work": grpc.unary_unary_rpc_method_handler(work)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _write_port(port_file, port)
    server.wait_for_termination()


# --- load ------------------------------------------------------------------------------------------


def _sdk_client_spans() -> Callable[[dict[str, str]], AbstractContextManager[dict[str, str]]]:
    """A CLIENT span per request with ``traceparent`` injected into its headers, as any
    OpenTelemetry-instrumented client sends. Spans stay in memory: what matters is the header on
    the wire, and the ids printed for a test to compare with what the agent reports."""
    from opentelemetry.propagate import inject
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    provider = TracerProvider(resource=Resource.create({"service.name": "trace-chain-loader"}))
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracer = provider.get_tracer("trace_chain")

    @contextmanager
    def client_span(headers: dict[str, str]) -> Iterator[dict[str, str]]:
        with tracer.start_as_current_span("GET /work/{id}", kind=SpanKind.CLIENT) as span:
            inject(headers)
            ctx = span.get_span_context()
            yield {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}

    return client_span


def load(url: str, requests: int, concurrency: int, traceparent: bool, wait: bool) -> int:
    """Send the requests; 0 when every one got a 200."""
    client_span = _sdk_client_spans() if traceparent else None
    parts = urlsplit(url)
    if wait:
        print("ready", flush=True)
        sys.stdin.readline()
    ids: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(requests):
        ids.put(i)
    lock = threading.Lock()
    failures = 0

    def worker() -> None:
        nonlocal failures
        # Its own keep-alive connection, opened after --wait: it never predates an agent.
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            while True:
                try:
                    i = ids.get_nowait()
                except queue.Empty:
                    return
                headers = {REQUEST_ID: f"req-{i}"}
                line: dict[str, Any] = {"id": i}
                try:
                    with client_span(headers) if client_span else nullcontext({}) as span_ids:
                        line.update(span_ids)
                        conn.request("GET", f"/work/{i}", headers=headers)
                        response = conn.getresponse()
                        response.read()
                    line["status"] = response.status
                except Exception as exc:
                    conn.close()  # reconnects on the next request
                    line.update(status=None, error=repr(exc))
                with lock:
                    failures += line["status"] != 200
                    print(json.dumps(line), flush=True)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, name=f"load-{n}") for n in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 1 if failures else 0


def load_grpc(target: str, seconds: float, concurrency: int, rate: float | None) -> int:
    """Calls until the clock runs out (calls in flight then are awaited and counted); 0 when none failed."""
    import grpc  # optional: only this mode needs grpcio

    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        work = channel.unary_unary(GRPC_METHOD)
        start = time.perf_counter()
        stop_at = start + seconds

        def worker(n: int) -> None:
            due, i = start + (n / rate if rate else 0), n
            while (sent := time.perf_counter()) < stop_at:
                if rate:
                    if due >= stop_at:
                        return
                    if due > sent:
                        time.sleep(due - sent)
                        sent = time.perf_counter()
                    due += concurrency / rate
                try:
                    work(str(i).encode(), timeout=30)
                    latencies[n].append(time.perf_counter() - sent)
                except grpc.RpcError:
                    errors[n] += 1
                i += concurrency

        threads = [threading.Thread(target=worker, args=(n,), name=f"load-{n}") for n in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    done = sorted(latency for per_thread in latencies for latency in per_thread)
    p50, p99 = (done[int(q * (len(done) - 1))] * 1e3 if done else None for q in (0.5, 0.99))
    print(json.dumps({"calls": len(done), "errors": sum(errors), "seconds": elapsed, "p50_ms": p50, "p99_ms": p99}))
    return 1 if sum(errors) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="threaded HTTP/1.1 server, optionally calling --next")
    p.add_argument("name")
    p.add_argument("port_file")
    p.add_argument("--next", dest="next_url", help="http://HOST:PORT or grpc://HOST:PORT")
    p = sub.add_parser("serve-async", help="aiohttp server on one event loop, calling --next")
    p.add_argument("name")
    p.add_argument("port_file")
    p.add_argument("--next", dest="next_url", required=True, help="http://HOST:PORT")
    p.add_argument("--no-forward", dest="forward", action="store_false", help="do not forward x-request-id")
    p = sub.add_parser("serve-grpc", help="gRPC backend (grpcio, raw bytes)")
    p.add_argument("name")
    p.add_argument("port_file")
    p = sub.add_parser("load", help="send GET URL/work/<i> requests")
    p.add_argument("url")
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--traceparent", action="store_true", help="instrument with the OpenTelemetry SDK")
    p.add_argument("--wait", action="store_true", help="print 'ready', wait for a line on stdin")
    p = sub.add_parser("load-grpc", help="unary gRPC calls to a serve-grpc backend for a fixed time")
    p.add_argument("target", help="HOST:PORT")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=4, help="threads sharing the one channel")
    p.add_argument("--rate", type=float, help="calls/s in all (default: as fast as possible)")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _stop)
    try:
        if args.command == "serve":
            serve(args.name, args.port_file, args.next_url)
        elif args.command == "serve-async":
            serve_async(args.name, args.port_file, args.next_url.rstrip("/"), args.forward)
        elif args.command == "serve-grpc":
            serve_grpc(args.name, args.port_file)
        elif args.command == "load-grpc":
            return load_grpc(args.target, args.seconds, args.concurrency, args.rate)
        else:
            return load(args.url, args.requests, args.concurrency, args.traceparent, args.wait)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
