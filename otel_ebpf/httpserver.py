"""The agent's small HTTP server: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz`` for
Kubernetes probes.

Health is not tied to an exporter: every deployment wants probes, whether the agent sends OTLP to a
Collector or is scraped. So one server serves whatever is enabled at its address — ``/metrics``
with the ``prometheus`` exporter, the probes always — and :func:`start_servers` makes one or two of
them from the configuration (see docs/configuration.md, "Prometheus and health").

Requests are answered on the server's own threads; ``/metrics`` renders under the exporter's lock
(a copy of the series, then formatting outside it), so a scrape never waits for the event loop
nor the loop for a scrape.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .config import AgentConfig
from .exporters.errors import ExporterSetupError
from .health import Health

log = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a scrape in progress must not hold up the agent's exit
    health: Health
    registry: CollectorRegistry | None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # the name http.server dispatches to
        path = self.path.split("?", 1)[0]
        if path == "/metrics" and self.server.registry is not None:
            encode, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encode(self.server.registry), content_type)
        elif path in ("/healthz", "/readyz"):
            ok, why = self.server.health.live() if path == "/healthz" else self.server.health.ready()
            self._reply(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
        else:
            self._reply(404, b"not found\n", "text/plain; charset=utf-8")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — the base class's signature
        """Scrapes and probes every few seconds would flood the log."""


class AgentHttpServer:
    """One listening address; ``metrics`` (a ``prometheus-client`` collector) adds ``/metrics``.

    Binds in the constructor, so a taken port fails before the slow probe attach; ``setting`` names
    the configuration key to change in that error.
    """

    def __init__(self, host: str, port: int, health: Health, metrics: Collector | None, setting: str) -> None:
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except socket.gaierror as exc:
            raise ExporterSetupError(f"{setting}: cannot resolve host {host!r}: {exc.strerror}") from None
        server_class = type("_BoundServer", (_Server,), {"address_family": family})
        try:
            self._server = server_class((host, port), _Handler)
        except OSError as exc:
            why = "the port is already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ExporterSetupError(
                f"cannot listen on {host}:{port} for {self._routes(metrics)}: {why}; choose another with {setting}"
            ) from None
        self._server.health = health
        self._server.registry = None
        if metrics is not None:
            self._server.registry = CollectorRegistry(auto_describe=False)
            self._server.registry.register(metrics)
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"http-{port}", daemon=True)
        self._thread.start()
        log.info("serving %s on http://%s:%d", self._routes(metrics), host, self.port)

    @staticmethod
    def _routes(metrics: Collector | None) -> str:
        return "/metrics, /healthz, /readyz" if metrics is not None else "/healthz, /readyz"

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def start_servers(config: AgentConfig, health: Health, metrics: Collector | None) -> list[AgentHttpServer]:
    """The servers the configuration asks for: ``/metrics`` (and the probes) at ``prometheus.host:port``
    when ``metrics`` is given; the probes at ``health.host:port`` when ``health.port`` is set and is
    another address. Raises :class:`ExporterSetupError` if one cannot listen."""
    servers: list[AgentHttpServer] = []
    prometheus = (config.prometheus.host, config.prometheus.port)
    try:
        if metrics is not None:
            servers.append(AgentHttpServer(*prometheus, health, metrics, "prometheus.port"))
        wanted = (config.health.host, config.health.port)
        if config.health.port is not None and (metrics is None or wanted != prometheus):
            servers.append(AgentHttpServer(config.health.host, config.health.port, health, None, "health.port"))
    except ExporterSetupError:
        for server in servers:
            server.close()
        raise
    return servers
