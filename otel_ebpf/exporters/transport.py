"""One attempt to hand an encoded OTLP request to a backend, over gRPC or HTTP/protobuf.

A :class:`Transport` sends bytes that are already a serialized ``Export*ServiceRequest`` — the same
bytes a spool record holds — and says what came of it as a :class:`~.retry.SendResult`. It never
retries: retrying, ordering and accounting belong to :class:`~.delivery.Delivery`, one design for
every signal.

TLS files are read from the standard variables, as the OpenTelemetry SDK exporters read them:
``OTEL_EXPORTER_OTLP_CERTIFICATE`` (roots to trust), ``OTEL_EXPORTER_OTLP_CLIENT_KEY`` and
``OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`` (mutual TLS).
"""

from __future__ import annotations

import gzip
import os
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import cast

import grpc
import requests

from otel_ebpf.config import OTLPConfig
from otel_ebpf.exporters.retry import SendResult, classify_grpc, classify_http, retryable

GRPC_METHODS = {
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    "profiles": "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
}


class Transport(ABC):
    """Sends one encoded export request; thread-compatible (one delivery thread uses it)."""

    @abstractmethod
    def send(self, body: bytes, timeout_s: float) -> SendResult:
        """One attempt, bounded by ``timeout_s``; never raises for a network or server failure."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; an attempt in progress fails (gRPC) or finishes on its own timeout."""


def _read(variable: str) -> bytes | None:
    path = os.environ.get(variable)
    if not path:
        return None
    with open(path, "rb") as file:
        return file.read()


class GrpcTransport(Transport):
    def __init__(
        self,
        endpoint: str,
        method: str,
        *,
        insecure: bool,
        headers: Mapping[str, str],
        gzip_body: bool,
        max_reconnect_s: float,
    ) -> None:
        target = urllib.parse.urlsplit(endpoint).netloc or endpoint
        # gRPC's own reconnect backoff grows to 2 minutes by default; a channel still waiting to
        # reconnect fails every call at once, which would outlast our backoff after a long outage.
        options = [
            ("grpc.max_reconnect_backoff_ms", max(100, int(max_reconnect_s * 1000))),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
        ]
        if insecure:
            self._channel = grpc.insecure_channel(target, options)
        else:
            credentials = grpc.ssl_channel_credentials(
                _read("OTEL_EXPORTER_OTLP_CERTIFICATE"),
                _read("OTEL_EXPORTER_OTLP_CLIENT_KEY"),
                _read("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
            )
            self._channel = grpc.secure_channel(target, credentials, options)
        # No serializers: the request is already protobuf bytes, and the response is not needed.
        self._call: grpc.UnaryUnaryMultiCallable = self._channel.unary_unary(method)
        self._metadata = tuple(headers.items())
        self._compression = grpc.Compression.Gzip if gzip_body else grpc.Compression.NoCompression

    def send(self, body: bytes, timeout_s: float) -> SendResult:
        try:
            self._call(body, timeout=timeout_s, metadata=self._metadata, compression=self._compression)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
            # grpc hands (key, value) tuples; its stubs call them _Metadatum objects
            return classify_grpc(code.name, cast("Sequence[tuple[str, str | bytes]]", tuple(trailing or ())))
        except ValueError:  # a closed channel
            return retryable("closed")
        return classify_grpc("OK")

    def close(self) -> None:
        self._channel.close()


class HttpTransport(Transport):
    def __init__(self, url: str, *, headers: Mapping[str, str], gzip_body: bool) -> None:
        self._url = url
        self._gzip = gzip_body
        self._session = requests.Session()
        self._session.headers.update({"Content-Type": "application/x-protobuf", **headers})
        if gzip_body:
            self._session.headers["Content-Encoding"] = "gzip"
        roots = os.environ.get("OTEL_EXPORTER_OTLP_CERTIFICATE")
        if roots:
            self._session.verify = roots
        client_cert = os.environ.get("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")
        if client_cert:
            self._session.cert = (client_cert, os.environ.get("OTEL_EXPORTER_OTLP_CLIENT_KEY") or client_cert)
        # What requests would read from the environment at every post (the proxy variables, a CA
        # bundle, ~/.netrc's credentials for the endpoint), read once: per post it was a stat of
        # ~/.netrc and a walk of the proxy variables, ~1 % of the agent's CPU under load. The
        # OTLP certificate, when set, wins over REQUESTS_CA_BUNDLE, as in OpenTelemetry's exporter.
        found = self._session.merge_environment_settings(url, {}, None, roots or None, None)
        self._session.proxies.update(found["proxies"])
        if found["verify"] is not None:
            self._session.verify = found["verify"]
        self._session.auth = requests.utils.get_netrc_auth(url)
        self._session.trust_env = False

    def send(self, body: bytes, timeout_s: float) -> SendResult:
        try:
            response = self._session.post(
                self._url, data=gzip.compress(body) if self._gzip else body, timeout=timeout_s
            )
        except requests.Timeout:
            return retryable("timeout")
        except requests.RequestException:  # refused, reset, DNS: the backend may be back later
            return retryable("connection_error")
        headers = {key.lower(): value for key, value in response.headers.items()}
        response.close()
        return classify_http(response.status_code, headers)

    def close(self) -> None:
        self._session.close()


def build_transport(config: OTLPConfig, signal: str) -> Transport:
    """The transport for ``signal`` (``traces``, ``metrics``, ``logs``, ``profiles``)."""
    endpoint = config.signal_endpoint(signal)
    gzip_body = config.compression == "gzip"
    if config.protocol == "grpc":
        return GrpcTransport(
            endpoint,
            GRPC_METHODS[signal],
            insecure=config.insecure,
            headers=config.headers,
            gzip_body=gzip_body,
            max_reconnect_s=config.retry_max_s,
        )
    return HttpTransport(endpoint, headers=config.headers, gzip_body=gzip_body)
