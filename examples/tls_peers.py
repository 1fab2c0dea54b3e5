"""TLS peers for tests, benchmarks and demos: an HTTPS server, a keep-alive HTTPS client, gRPC over TLS.

    tls_peers.py https-serve PORT_FILE CERT KEY
    tls_peers.py https-client PORT CA N        (prints "ready", waits for a line, then N GETs)
    tls_peers.py https-connections PORT CA N K  (prints "ready", waits for a line, then K threads
                                                 make N GETs each, a new connection per GET)
    tls_peers.py handshakes PORT CA N             (prints "ready", waits for a line, then N connections
                                                 that close after their handshake, as health checks)
    tls_peers.py async-serve PORT_FILE CERT KEY   (aiohttp: asyncio TLS over memory BIOs)
    tls_peers.py async-client PORT CA N           (prints "ready", waits for a line, then N GETs)
    tls_peers.py grpc-serve PORT_FILE CERT KEY
    tls_peers.py grpc-client PORT CA N            (prints "ready", waits for a line, then N calls)

Python's ``ssl`` goes through the system OpenSSL (``SSL_read_ex``/``SSL_write_ex``) — on the socket
itself for blocking code, over memory BIOs for asyncio; grpcio through the BoringSSL linked into
its own module. Each client prints one JSON line per call.
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import ssl
import sys
import threading
from pathlib import Path

SERVICE, METHOD = "demo.Echo", "Say"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # one write per response, sent at once: header and body written apart would wait ~40 ms for
    # the client's delayed ACK (Nagle)
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        status = 404 if self.path.startswith("/missing") else 200
        body = json.dumps({"path": self.path}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def https_serve(port_file: str, cert: str, key: str) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


def wait_for_go() -> None:
    """Let whoever started this client attach to it first."""
    print("ready", flush=True)
    sys.stdin.readline()


def https_client(port: int, ca: str, count: int) -> None:
    """One keep-alive connection, opened (with one request) before the go line: when the agent
    starts in between, it attaches to a TLS connection in the middle of its life."""
    context = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context)

    def get(path: str) -> None:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        print(json.dumps({"path": path, "status": response.status}), flush=True)

    get("/items/before-agent")
    wait_for_go()
    for i in range(count):
        get(f"/items/{i}" if i % 5 else f"/missing/{i}")
    conn.close()


def https_connections(port: int, ca: str, count: int, threads: int) -> None:
    """Concurrent handshakes, and connections closed as fast as they open: a server's freed SSL
    objects come back for new connections, often on other sockets. Each line also has the
    connection's local port, which the server's span must name."""
    context = ssl.create_default_context(cafile=ca)
    printing = threading.Lock()

    def client(thread: int) -> None:
        for i in range(count):
            path = f"/items/{thread}-{i}"
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context)
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            port_used = conn.sock.getsockname()[1]
            conn.close()
            with printing:
                print(json.dumps({"path": path, "status": response.status, "port": port_used}), flush=True)

    wait_for_go()
    workers = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def handshakes(port: int, ca: str, count: int) -> None:
    context = ssl.create_default_context(cafile=ca)
    wait_for_go()
    for i in range(count):
        with socket.create_connection(("127.0.0.1", port)) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                print(json.dumps({"handshake": i, "version": tls.version()}), flush=True)


def async_serve(port_file: str, cert: str, key: str) -> None:
    import asyncio

    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        status = 404 if request.path.startswith("/missing") else 200
        return web.json_response({"path": request.path}, status=status)

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        Path(port_file).write_text(str(site._server.sockets[0].getsockname()[1]))  # noqa: SLF001 — port 0's pick
        await asyncio.Event().wait()

    asyncio.run(run())


def async_client(port: int, ca: str, count: int) -> None:
    import asyncio

    import aiohttp

    wait_for_go()

    async def run() -> None:
        context = ssl.create_default_context(cafile=ca)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=1)) as session:
            for i in range(count):
                path = f"/items/{i}" if i % 5 else f"/missing/{i}"
                async with session.get(f"https://127.0.0.1:{port}{path}") as response:
                    await response.read()
                    print(json.dumps({"path": path, "status": response.status}), flush=True)

    asyncio.run(run())


def grpc_serve(port_file: str, cert: str, key: str) -> None:
    import grpc

    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(4))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, _context: request)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler})])
    credentials = grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    Path(port_file).write_text(str(port))
    threading.Event().wait()


def grpc_client(port: int, ca: str, count: int) -> None:
    import grpc

    wait_for_go()
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
        for i in range(count):
            reply = call(b"hello %d" % i, timeout=10)
            print(json.dumps({"call": i, "reply": reply.decode()}), flush=True)


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "https-serve":
        https_serve(*args)
    elif command == "https-client":
        https_client(int(args[0]), args[1], int(args[2]))
    elif command == "https-connections":
        https_connections(int(args[0]), args[1], int(args[2]), int(args[3]))
    elif command == "handshakes":
        handshakes(int(args[0]), args[1], int(args[2]))
    elif command == "async-serve":
        async_serve(*args)
    elif command == "async-client":
        async_client(int(args[0]), args[1], int(args[2]))
    elif command == "grpc-serve":
        grpc_serve(*args)
    elif command == "grpc-client":
        grpc_client(int(args[0]), args[1], int(args[2]))
    else:
        sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
