"""Where profiles leave the agent: OTLP (gRPC / HTTP), ``profiles.jsonl``, per-service folded
stacks and SVG flame graphs, and Pyroscope.

:class:`ProfileSink` takes each interval's :class:`Profile` batch and hands it to a background
thread through a bounded queue, so a slow or dead backend never stalls sampling: a batch that finds
the queue full is dropped and counted (``otel_ebpf.profiles.export.failed{exporter=queue}``), as is
every failed export, per destination.
"""

from __future__ import annotations

import gzip
import logging
import queue
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from otel_ebpf.exporters.file import to_json_line
from otel_ebpf.profiles import flamegraph, otlp, pprof
from otel_ebpf.profiles.model import Profile
from otel_ebpf.selfmetrics import SelfMetrics

log = logging.getLogger(__name__)

PROFILES_FILE = "profiles.jsonl"
FLAMEGRAPH_DIR = "profiles"
HTTP_PATH = "/v1development/profiles"
QUEUE_BATCHES = 8
MAX_FOLDED_LINES = 50_000  # per service, for the cumulative folded file
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_]")


class ProfileDestination(ABC):
    """One place profiles go; the sink counts an export that raises as failed."""

    name = "destination"

    @abstractmethod
    def export(self, profiles: Sequence[Profile]) -> None:
        """Send one interval's profiles; raise on failure."""

    def close(self) -> None:
        """Release what the destination holds (files, connections); nothing by default."""


class FileProfiles(ProfileDestination):
    """``profiles.jsonl`` (OTLP/JSON) plus, per service, ``profiles/<service>.folded`` and ``.svg``
    holding everything sampled since start (rewritten every interval)."""

    name = "file"

    def __init__(self, output_dir: Path, flamegraphs: bool = True) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.flamegraphs = flamegraphs
        self._stream = (self.output_dir / PROFILES_FILE).open("a", encoding="utf-8")
        self._folded: dict[tuple[str, str], dict[str, int]] = {}  # (service, type) -> cumulative stacks

    def export(self, profiles: Sequence[Profile]) -> None:
        self._stream.write(to_json_line(otlp.encode(profiles)) + "\n")
        self._stream.flush()
        if not self.flamegraphs:
            return
        touched = set()
        for profile in profiles:
            key = (profile.service_name, profile.sample_types[0].type)
            total = self._folded.setdefault(key, {})
            for line, count in flamegraph.folded(profile).items():
                if line in total or len(total) < MAX_FOLDED_LINES:
                    total[line] = total.get(line, 0) + count
            touched.add(key)
        directory = self.output_dir / FLAMEGRAPH_DIR
        directory.mkdir(exist_ok=True)
        for service, kind in touched:
            stem = _SAFE_NAME.sub("_", service) + ("" if kind == "samples" else f".{kind}")
            stacks = self._folded[(service, kind)]
            (directory / f"{stem}.folded").write_text(flamegraph.format_folded(stacks))
            (directory / f"{stem}.svg").write_text(flamegraph.render_svg(stacks, f"{service} — {kind}", kind))

    def close(self) -> None:
        self._stream.close()


class OTLPProfiles(ProfileDestination):
    """``ProfilesService/Export`` over gRPC, or ``POST .../v1development/profiles`` over HTTP."""

    name = "otlp"

    def __init__(
        self,
        endpoint: str,
        protocol: str,
        headers: dict[str, str],
        timeout_s: float,
        insecure: bool = True,
        compression: str = "none",
    ) -> None:
        self.endpoint, self.protocol, self.headers = endpoint, protocol, dict(headers)
        self.timeout_s, self.compression = timeout_s, compression
        self._channel = None
        if protocol == "grpc":
            import grpc  # noqa: PLC0415
            from opentelemetry.proto.collector.profiles.v1development import (  # noqa: PLC0415
                profiles_service_pb2_grpc,
            )

            target = urllib.parse.urlsplit(endpoint).netloc or endpoint
            self._channel = (
                grpc.insecure_channel(target)
                if insecure
                else grpc.secure_channel(target, grpc.ssl_channel_credentials())
            )
            self._stub = profiles_service_pb2_grpc.ProfilesServiceStub(self._channel)
            self._grpc_compression = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression

    def export(self, profiles: Sequence[Profile]) -> None:
        request = otlp.encode(profiles)
        if self._channel is not None:
            self._stub.Export(
                request,
                timeout=self.timeout_s,
                metadata=tuple(self.headers.items()),
                compression=self._grpc_compression,
            )
            return
        body = request.SerializeToString()
        headers = {"Content-Type": "application/x-protobuf", **self.headers}
        if self.compression == "gzip":
            body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
        _post(self.endpoint, body, headers, self.timeout_s)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class PyroscopeProfiles(ProfileDestination):
    """Pyroscope's ``/ingest`` with a pprof body, one request per service and interval."""

    name = "pyroscope"

    def __init__(self, url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})

    def export(self, profiles: Sequence[Profile]) -> None:
        for profile in profiles:
            self.export_one(profile)

    def export_one(self, profile: Profile) -> None:
        service = profile.service_name
        labels = {"service_name": service}
        for key in ("host.name", "service.namespace", "k8s.namespace.name", "k8s.pod.name"):
            if key in profile.resource:
                labels[_LABEL_CHARS.sub("_", key)] = str(profile.resource[key])
        rendered = ",".join(f"{k}={_label_value(v)}" for k, v in labels.items())
        kind = "cpu" if profile.period_type.type == "cpu" else profile.period_type.type
        hz = round(1e9 / profile.period) if profile.period_type.unit == "nanoseconds" and profile.period else 0
        query = {
            "name": f"{service}.{kind}{{{rendered}}}",
            "from": str(profile.start_ns // 1_000_000_000),
            "until": str(max(profile.end_ns // 1_000_000_000, profile.start_ns // 1_000_000_000 + 1)),
            "format": "pprof",
            "spyName": "otel-ebpf",
        }
        if hz:
            query["sampleRate"] = str(hz)
        boundary = uuid.uuid4().hex
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="profile"; filename="profile.pprof"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + gzip.compress(pprof.encode(profile))
            + f"\r\n--{boundary}--\r\n".encode()
        )
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", **self.headers}
        _post(f"{self.url}/ingest?{urllib.parse.urlencode(query)}", body, headers, self.timeout_s)


def _label_value(value: str) -> str:
    return value.replace(",", "_").replace("}", "_").replace("=", "_")


def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 -- configured URL
        response.read()


class ProfileSink:
    """Fans profile batches out to destinations on a background thread (bounded, drops counted)."""

    def __init__(self, destinations: Sequence[ProfileDestination], selfmetrics: SelfMetrics) -> None:
        self.destinations = list(destinations)
        self._metrics = selfmetrics
        self._queue: queue.Queue[list[Profile] | None] = queue.Queue(QUEUE_BATCHES)
        self._thread = threading.Thread(target=self._run, name="otel-ebpf-profiles", daemon=True)
        self._thread.start()

    def export(self, profiles: Sequence[Profile]) -> None:
        if not profiles or not self.destinations:
            return
        try:
            self._queue.put_nowait(list(profiles))
        except queue.Full:
            self._metrics.add("otel_ebpf.profiles.export.failed", 1, {"exporter": "queue"})

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            for destination in self.destinations:
                try:
                    destination.export(batch)
                except Exception as exc:  # noqa: BLE001 -- any failure of one destination is counted, not fatal
                    self._metrics.add("otel_ebpf.profiles.export.failed", 1, {"exporter": destination.name})
                    log.warning("profile export to %s failed: %s", destination.name, exc)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Export what is queued (within ``timeout_s``), then close the destinations."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        for destination in self.destinations:
            destination.close()


def build_profile_sink(config, selfmetrics: SelfMetrics) -> ProfileSink:  # config: AgentConfig
    """The destinations the configuration names: ``otlp`` and ``file`` exporters, and Pyroscope."""
    destinations: list[ProfileDestination] = []
    if not config.export.disabled:
        if "file" in config.exporters:
            destinations.append(FileProfiles(config.file.output_dir, config.profiling.flamegraphs))
        if "otlp" in config.exporters:
            o = config.otlp
            destinations.append(
                OTLPProfiles(
                    o.signal_endpoint("profiles"), o.protocol, dict(o.headers), o.timeout_s, o.insecure, o.compression
                )
            )
        if config.profiling.pyroscope_url:
            destinations.append(PyroscopeProfiles(config.profiling.pyroscope_url, config.otlp.timeout_s))
    return ProfileSink(destinations, selfmetrics)
