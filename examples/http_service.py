"""A small "inference service" for the otel-ebpf demo: plain ``http.server``, no OpenTelemetry in it.

    python examples/http_service.py --port 8080

HTTP/1.1 with keep-alive on a thread per connection, so the agent sees several requests per
connection and requests from several threads. Routes:

    GET  /health          200 {"status": "ok"}
    GET  /users/<int>     200 a user (404 when the id is not a number)
    GET  /items/<uuid>    200 an item (404 when it is not a UUID)
    POST /predict         200 {"outputs": [...]}, after a few ms of "inference"; 400 on bad JSON
    GET  /error           500 (a SERVER span with error status)
    anything else         404

The agent names the service from the process's own environment, so start it with
``OTEL_SERVICE_NAME=demo-inference`` (as ``examples/demo.py`` does) to see that name on its spans.
Prints ``listening on http://HOST:PORT`` once it accepts connections (``--port 0`` picks a free port).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

USER_PATH = re.compile(r"^/users/([^/]+)$")
ITEM_PATH = re.compile(r"^/items/([^/]+)$")
MAX_BODY = 1 << 20


class Handler(BaseHTTPRequestHandler):
    """The routes in the module docstring, answered with JSON."""

    protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
    server_version = "demo-inference/1.0"
    # Buffer each response and send it in one write when the handler returns. With the default
    # unbuffered writer, headers and body go out as two segments and Nagle + delayed ACK add
    # ~40 ms to every request on loopback.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 — the name BaseHTTPRequestHandler gives it
        """Silent: the agent is what reports requests here."""

    def _json(self, status: int, document: object) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """/health, /users/<int>, /items/<uuid>, /error; 404 otherwise."""
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif m := USER_PATH.match(path):
            if m.group(1).isdigit():
                user_id = int(m.group(1))
                self._json(200, {"id": user_id, "name": f"user-{user_id}", "plan": "free"})
            else:
                self._json(404, {"error": "no such user"})
        elif m := ITEM_PATH.match(path):
            try:
                item = uuid.UUID(m.group(1))
            except ValueError:
                self._json(404, {"error": "no such item"})
            else:
                self._json(200, {"id": str(item), "price": item.int % 1000 / 10})
        elif path == "/error":
            self._json(500, {"error": "model backend unavailable"})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        """/predict: {"inputs": [numbers]} in, {"outputs": [...]} out after a short "inference"."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._json(413, {"error": "body too large"})
            self.close_connection = True  # the unread body would corrupt the next request
            return
        body = self.rfile.read(length)
        if self.path.split("?", 1)[0] != "/predict":
            self._json(404, {"error": "not found"})
            return
        try:
            inputs = json.loads(body or b"{}")["inputs"]
            features = [float(x) for x in inputs]
        except (ValueError, KeyError, TypeError):
            self._json(400, {"error": 'expected {"inputs": [numbers]}'})
            return
        # "Inference": a few milliseconds that grow with the input, so latencies differ visibly.
        time.sleep(0.005 + 0.001 * min(len(features), 20))
        outputs = [round(0.5 * x + 1.0, 6) for x in features]
        self._json(200, {"model": "demo-linear-v1", "outputs": outputs})


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    args = parser.parse_args(argv)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, _stop)
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
