"""The agent's configuration, resolved once at start-up into a frozen :class:`AgentConfig`.

Five layers, lowest to highest precedence:

1. built-in defaults (the field defaults of the dataclasses below),
2. the YAML file named by ``--config`` or ``OTEL_EBPF_CONFIG``,
3. ``OTEL_EBPF_*`` environment variables,
4. standard ``OTEL_*`` environment variables (``OTEL_EXPORTER_OTLP_*``, ``OTEL_RESOURCE_ATTRIBUTES``,
   ``OTEL_BSP_*``, ...), so an agent dropped into an OpenTelemetry-configured environment does
   what that environment says,
5. command-line flags (``cli`` holds only the flags the user actually gave).

Every setting is declared once, in :data:`SETTINGS`: its dotted YAML key (which is also its
attribute path on :class:`AgentConfig`, e.g. ``config.capture.payload_cap``), its parser and the
environment variables and flag that can carry it. Errors are :class:`ConfigError` and name what the
user typed: the YAML key, the environment variable or the flag. Nothing else in the agent reads the
environment for configuration; the rest of the code receives an :class:`AgentConfig`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml

from otel_ebpf.model_guard import DEFAULT_PATHS as DEFAULT_MODEL_PATHS
from otel_ebpf.model_guard import MAX_ALLOWED, MAX_RULES, MECHANISMS, parse_rule
from otel_ebpf.pii import KIND_NAMES as PII_KIND_NAMES
from otel_ebpf.pii import custom_kind
from otel_ebpf.protocol import ENTRY_POINT_GROUP

EXPORTER_NAMES = ("otlp", "file", "console", "prometheus")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_DEFAULT_OTLP_ENDPOINTS = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}


class ConfigError(ValueError):
    """A setting is invalid. ``key`` is what the user wrote: YAML key, env var or ``--flag``."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


def _frozen(mapping: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class TargetsConfig:
    """What to trace. ``pids`` and ``executables`` select processes (either list; neither: every
    process but the agent); ``ports`` then keeps only connections with one of them as local or
    peer port."""

    pids: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()
    executables: tuple[str, ...] = ()  # globs on the executable's path or basename (or argv[0]'s)

    @property
    def selects_processes(self) -> bool:
        """Whether only some processes are traced (else every process but the agent)."""
        return bool(self.pids or self.executables)


@dataclass(frozen=True)
class FileConfig:
    output_dir: Path = Path("./otel-ebpf-data")


@dataclass(frozen=True)
class OTLPConfig:
    endpoint: str = _DEFAULT_OTLP_ENDPOINTS["grpc"]
    protocol: str = "grpc"
    traces_endpoint: str | None = None  # used as-is (no path appended) when set
    metrics_endpoint: str | None = None
    profiles_endpoint: str | None = None
    logs_endpoint: str | None = None
    headers: Mapping[str, str] = field(default_factory=_frozen)
    timeout_s: float = 10.0
    insecure: bool = True  # resolved from the endpoint's scheme unless set
    compression: str = "none"
    # Per-signal queue of encoded batches waiting for the backend (docs/configuration.md#otlp).
    queue_max_batches: int = 512
    queue_max_bytes: int = 64 << 20
    spool_dir: Path | None = None  # the queue on disk instead, kept across restarts
    spool_max_bytes: int = 256 << 20
    retry_initial_s: float = 1.0
    retry_max_s: float = 30.0
    retry_max_elapsed_s: float = 300.0

    def signal_endpoint(self, signal: str) -> str:
        """The URL the ``signal`` (``traces`` or ``metrics``) exporter sends to.

        A signal-specific endpoint is used as-is. Otherwise gRPC uses the base endpoint and
        http/protobuf appends ``/v1/<signal>`` to it, as the OTLP exporter specification says.
        """
        explicit = {
            "traces": self.traces_endpoint,
            "metrics": self.metrics_endpoint,
            "profiles": self.profiles_endpoint,
            "logs": self.logs_endpoint,
        }[signal]
        if explicit:
            return explicit
        if signal == "profiles" and self.protocol != "grpc":  # profiles are still in development
            return f"{self.endpoint.rstrip('/')}/v1development/profiles"
        if self.protocol == "grpc":
            return self.endpoint
        return f"{self.endpoint.rstrip('/')}/v1/{signal}"


@dataclass(frozen=True)
class PrometheusConfig:
    """``/metrics`` for the ``prometheus`` exporter (docs/configuration.md, "Prometheus and health")."""

    host: str = "localhost"  # the OTel specification's default; 0.0.0.0 or the pod IP in Kubernetes
    port: int = 9464
    max_series: int = 20000  # series kept (a histogram is one); points of new series past it: dropped, counted
    series_ttl_s: float = 300.0  # a series not updated this long (its process exited) is forgotten


@dataclass(frozen=True)
class HealthConfig:
    """``/healthz`` and ``/readyz``: served with ``/metrics``, or on their own when ``port`` is set."""

    host: str = "localhost"
    port: int | None = None


@dataclass(frozen=True)
class ResourceConfig:
    """Attributes added to every resource the agent emits (one resource per observed process)."""

    attributes: Mapping[str, Any] = field(default_factory=_frozen)
    # the node's root filesystem as the agent sees it: container runtimes' state files are read
    # below it for pod and container names (a DaemonSet mounts the host's / at e.g. /host)
    host_root: Path = Path("/")


@dataclass(frozen=True)
class AgentIdentity:
    """The agent's own identity, used on its self-metrics; observed processes get their own."""

    service_name: str = "otel-ebpf"


@dataclass(frozen=True)
class CaptureConfig:
    payload_cap: int = 4096  # bytes copied per syscall; the BPF side rounds up to a power of two
    ring_buffer_kb: int = 4096
    max_connections: int = 16384
    max_processes: int = 1024
    # how BPF recognises sockets: "auto" (sock tracepoints when the kernel has them, Linux 6.3+),
    # "tracepoints", or "fd-tracking" (fds from accept/connect and /proc, for older kernels)
    socket_mode: str = "auto"
    # HTTP/1 request counts and durations aggregated in the kernel: exact at any load (docs/performance.md)
    kernel_http_metrics: bool = True
    # retransmissions, resets and RTT of traced processes' TCP connections, counted in the kernel (docs/network.md)
    tcp_health: bool = True
    # bytes and packets of those connections, per series and cgroup: cgroup programs on every packet
    # of the node (docs/network.md); needs tcp_health
    tcp_flows: bool = False
    # share of one core the agent may spend on captured traffic; past it, new HTTP/1 exchanges are
    # shed (counted) instead
    cpu_budget: float = 0.5
    # share of one core the agent's reader takes each second at its niceness however busy the CPUs;
    # past it, it reads on CPU the applications leave idle only, up to cpu_budget (otel_ebpf/idle_cpu.py).
    # None: the reader always runs at its niceness
    cpu_floor: float | None = None
    # scheduling niceness of the agent's threads (0-19): above the applications', they run first
    # when CPUs are short (otel_ebpf/niceness.py); 0 leaves it as started
    nice: int = 10


@dataclass(frozen=True)
class TraceConfig:
    """Trace assembly (see docs/configuration.md, "Traces")."""

    # "skip": no span for an outgoing request that already carries a trace context (the
    # instrumented program's own span stands for it); "child": one, under the program's span
    instrumented_clients: str = "skip"
    inflight_timeout_s: float = 300.0  # a request still in flight after this is forgotten
    max_inflight: int = 65536  # requests in flight remembered, node-wide
    reorder_window_ms: int = 50  # event time held back to put the CPUs' events in order
    sample_ratio: float = 1.0  # share of plain spans kept (errors and slow requests always are)
    keep_slower_than_ms: float = 1000.0  # a request at least this slow always keeps its span
    # insert W3C traceparent into traced processes' HTTP/1 requests, in the kernel (docs/kubernetes.md)
    inject_traceparent: bool = False


@dataclass(frozen=True)
class ProtocolsConfig:
    enabled: tuple[str, ...] | None = None  # None: every installed plugin
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=_frozen)  # plugin name -> its options


@dataclass(frozen=True)
class ExportConfig:
    max_queue_spans: int = 20000
    max_batch: int = 512
    interval_s: float = 1.0
    metric_interval_s: float = 10.0
    metric_temporality: str = "cumulative"
    disabled: bool = False  # OTEL_SDK_DISABLED: export nothing, keep counting


@dataclass(frozen=True)
class RunConfig:
    duration_s: float | None = None
    ready_file: Path | None = None
    log_level: str = "info"


@dataclass(frozen=True)
class ProfilingConfig:
    """CPU profiling (docs/profiling.md)."""

    enabled: bool = False
    frequency_hz: int = 49  # samples per second per CPU; prime, so as not to beat with periodic work
    interval_s: float = 10.0  # one profile per process per interval
    max_stacks: int = 16384  # distinct stacks per interval, all processes together
    python: bool = True  # walk CPython frames
    flamegraphs: bool = True  # folded stacks + SVG per service with the file exporter
    pyroscope_url: str | None = None


@dataclass(frozen=True)
class GpuConfig:
    """CUDA / NCCL / PyTorch-allocator views (docs/gpu.md)."""

    enabled: str = "auto"  # auto: once a target maps a GPU library by name; true: now; false: never
    stacks: str = "python"  # python (Python + native frames) | native | none
    leak_age_s: float = 60.0  # an allocation alive this long while in-use grows is a leak suspect
    leak_min_allocations: int = 2  # suspects from one stack before it is reported
    max_allocations: int = 1_000_000  # live allocations tracked (oldest evicted, counted)
    max_stacks: int = 10_000  # distinct stacks per GPU profile view per interval
    interval_s: float = 10.0  # GPU profiles exported every interval
    ring_buffer_kb: int = 4096
    nvml: bool = True  # device state through NVML where the NVIDIA driver is (otel_ebpf/gpu/nvml.py)
    nvml_library: str = ""  # libnvidia-ml.so.1 outside the loader's search path (a host mount)


@dataclass(frozen=True)
class ModelGuardConfig:
    """Model-file guard with BPF LSM (docs/model-guard.md)."""

    mode: str = "off"  # off | audit (report every open) | enforce (also deny opens outside the allow-list)
    mechanism: str = "auto"  # auto (BPF LSM, else for audit syscall tracepoints) | lsm | tracepoints
    paths: tuple[str, ...] = DEFAULT_MODEL_PATHS  # '*.ext' or '/dir/**/*.ext'
    allow_executables: tuple[str, ...] = ()  # by inode of the file at start-up
    allow_uids: tuple[int, ...] = ()
    allow_cgroups: tuple[str, ...] = ()  # cgroup v2 paths, e.g. /system.slice/vllm.service


@dataclass(frozen=True)
class PiiConfig:
    """Personal data and secrets scrubbed from captured content before export (docs/genai.md)."""

    enabled: bool = True
    kinds: tuple[str, ...] = PII_KIND_NAMES  # built-in kinds scrubbed
    patterns: Mapping[str, str] = field(default_factory=_frozen)  # extra kinds: name -> regular expression


@dataclass(frozen=True)
class RoceConfig:
    """RoCEv2 traffic counted on the wire by a TC classifier (docs/roce.md)."""

    interfaces: tuple[str, ...] = ()  # none: off
    max_qp_pairs: int = 4096  # (interface, direction, source, destination, QP) flows the kernel counts


@dataclass(frozen=True)
class RdmaConfig:
    """RDMA verbs control path and port counters (docs/rdma.md)."""

    verbs: bool = False  # hook libibverbs in target processes (devices, PDs, MRs, CQs, queue pairs)
    port_counters: bool = True  # the ports' counters from sysfs, where there are RDMA devices
    sysfs_root: str = "/sys/class/infiniband"
    max_objects: int = 65536  # verbs objects (and queue pairs) followed, all processes together
    collective_linger_s: float = 0.01  # an NCCL span names the queue pairs posted on until this after its return


@dataclass(frozen=True)
class AgentConfig:
    targets: TargetsConfig = TargetsConfig()
    exporters: tuple[str, ...] = ("file",)
    file: FileConfig = FileConfig()
    otlp: OTLPConfig = OTLPConfig()
    prometheus: PrometheusConfig = PrometheusConfig()
    health: HealthConfig = HealthConfig()
    resource: ResourceConfig = ResourceConfig()
    agent: AgentIdentity = AgentIdentity()
    capture: CaptureConfig = CaptureConfig()
    trace: TraceConfig = TraceConfig()
    profiling: ProfilingConfig = ProfilingConfig()
    gpu: GpuConfig = GpuConfig()
    model_guard: ModelGuardConfig = ModelGuardConfig()
    pii: PiiConfig = PiiConfig()
    roce: RoceConfig = RoceConfig()
    rdma: RdmaConfig = RdmaConfig()
    protocols: ProtocolsConfig = ProtocolsConfig()
    export: ExportConfig = ExportConfig()
    run: RunConfig = RunConfig()
    source: Path | None = None  # the YAML file that was read, if any


# --- parsers: raw value (YAML/CLI native value, or env/flag text) -> typed value, or ValueError ---

Parser = Callable[[Any], Any]


def _int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {value!r}")


def _integer(minimum: int, maximum: int | None = None, *, power_of_two: bool = False) -> Parser:
    def parse(value: Any) -> int:
        number = _int(value)
        if number < minimum or (maximum is not None and number > maximum):
            bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
            raise ValueError(f"{number} is out of range (allowed: {bound})")
        if power_of_two and number & (number - 1):
            raise ValueError(f"{number} is not a power of two")
        return number

    return parse


def _number(value: Any) -> float:
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise ValueError(f"expected a number, got {value!r}")
    return number


def _positive_number(value: Any) -> float:
    number = _number(value)
    if number <= 0:
        raise ValueError(f"must be greater than 0, got {value!r}")
    return number


def _non_negative_number(value: Any) -> float:
    number = _number(value)
    if number < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return number


def _ratio(value: Any) -> float:
    number = _positive_number(value)
    if number > 1:
        raise ValueError(f"must be at most 1, got {value!r}")
    return number


def _milliseconds(value: Any) -> float:
    """Standard OTEL_* durations are in milliseconds; ours are in seconds."""
    return _positive_number(value) / 1000.0


_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true or false, got {value!r}")


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value.strip()


def _choice(*options: str) -> Parser:
    def parse(value: Any) -> str:
        text = _text(value).lower()
        if text not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return text

    return parse


def _auto_or_boolean(value: Any) -> str:
    """``auto``, or a boolean (YAML ``true``, or ``on``/``off``/``1``/``0`` text) as ``true``/``false``."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return "true" if _boolean(value) else "false"
    except ValueError:
        raise ValueError(f"must be auto, true or false; got {value!r}") from None


def _path(value: Any) -> Path:
    return Path(_text(value)).expanduser()


def _url(value: Any) -> str:
    text = _text(value)
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 -- raises ValueError on a malformed port
    except ValueError:
        raise ValueError(f"invalid port in {text!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def _list(item: Parser, *, non_empty: str | None = None) -> Parser:
    """A list from YAML/CLI, or a comma-separated string from the environment. Duplicates are
    dropped (first wins). ``non_empty`` is the message for an empty list, when one is an error."""

    def parse(value: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            raw = [part.strip() for part in value.split(",") if part.strip()]
        elif isinstance(value, (list, tuple)):
            raw = list(value)
        else:
            raw = [value]
        items = []
        for position, element in enumerate(raw, 1):
            try:
                items.append(item(element))
            except ValueError as exc:
                raise ValueError(f"item {position}: {exc}") from None
        if non_empty and not items:
            raise ValueError(non_empty)
        return tuple(dict.fromkeys(items))

    return parse


def _scalar(value: Any) -> str | bool | int | float:
    if isinstance(value, (str, bool, int, float)):
        return value
    raise ValueError(f"expected a string, number or boolean, got {value!r}")


def _header_value(value: Any) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected a string, got {value!r}")


def _key_value_pairs(text: str) -> Iterator[tuple[str, str]]:
    """``k=v,k2=v2`` as in OTEL_RESOURCE_ATTRIBUTES and OTEL_EXPORTER_OTLP_HEADERS (percent-decoded)."""
    for entry in text.split(","):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        if not sep:
            raise ValueError(f"entry {entry.strip()!r} is not key=value")
        yield unquote(key.strip()), unquote(value.strip())


def _mapping(value: Parser, *, lower_keys: bool = False, reserved: Mapping[str, str] | None = None) -> Parser:
    """A mapping from YAML, or ``k=v,...`` text from the environment. ``reserved`` maps keys that
    are not allowed here to the reason why."""

    def parse(raw: Any) -> Mapping[str, Any]:
        if isinstance(raw, str):
            pairs: Iterable[tuple[Any, Any]] = list(_key_value_pairs(raw))
        elif isinstance(raw, Mapping):
            pairs = raw.items()
        else:
            raise ValueError(f"expected a mapping, got {raw!r}")
        result: dict[str, Any] = {}
        for key, element in pairs:
            if not isinstance(key, str) or not key.strip():
                raise ValueError(f"invalid key {key!r}")
            name = key.strip().lower() if lower_keys else key.strip()
            if reserved and name in reserved:
                raise ValueError(f"{name}: {reserved[name]}")
            try:
                result[name] = value(element)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return MappingProxyType(result)

    return parse


def _at_most(count: int, parse: Parser) -> Parser:
    def parse_bounded(value: Any) -> tuple[Any, ...]:
        items = parse(value)
        if len(items) > count:
            raise ValueError(f"at most {count} entries, got {len(items)}")
        return items

    return parse_bounded


def _model_path(value: Any) -> str:
    return parse_rule(_text(value)).pattern


def _absolute_path(value: Any) -> str:
    text = _text(value)
    if not text.startswith("/"):
        raise ValueError(f"expected an absolute path, got {text!r}")
    return text


def _pii_patterns(raw: Any) -> Mapping[str, str]:
    """``pii.patterns``: name -> regular expression, each compiled and checked now (custom_kind)."""
    patterns = _mapping(_text)(raw)
    for name, pattern in patterns.items():
        custom_kind(name, pattern)
    return patterns


@dataclass(frozen=True)
class Setting:
    """One configuration key and every way to set it.

    ``std_parse`` parses the standard variable when its format differs (milliseconds, say);
    ``merge`` makes a mapping combine key by key across layers instead of being replaced.
    """

    key: str
    parse: Parser
    env: str | None = None  # OTEL_EBPF_* variable
    std_env: str | None = None  # standard OTEL_* variable
    flag: str | None = None  # argparse dest
    std_parse: Parser | None = None
    merge: bool = False

    @property
    def flag_name(self) -> str | None:
        return f"--{self.flag.replace('_', '-')}" if self.flag else None


_RESOURCE_RESERVED = {
    "service.name": "observed processes keep their own service.name; name the agent with "
    "agent.service_name (or OTEL_SERVICE_NAME)"
}

SETTINGS: tuple[Setting, ...] = (
    Setting("targets.pids", _list(_integer(1)), env="OTEL_EBPF_PIDS", flag="pid"),
    Setting("targets.ports", _list(_integer(1, 65535)), env="OTEL_EBPF_PORTS", flag="port"),
    Setting("targets.executables", _list(_text), env="OTEL_EBPF_EXECUTABLES", flag="exe"),
    Setting(
        "exporters",
        _list(
            _choice(*EXPORTER_NAMES),
            non_empty="name at least one exporter (to export nothing set export.disabled or OTEL_SDK_DISABLED)",
        ),
        env="OTEL_EBPF_EXPORTERS",
        flag="exporter",
    ),
    Setting("file.output_dir", _path, env="OTEL_EBPF_OUTPUT_DIR", flag="output"),
    Setting(
        "otlp.endpoint",
        _url,
        env="OTEL_EBPF_OTLP_ENDPOINT",
        std_env="OTEL_EXPORTER_OTLP_ENDPOINT",
        flag="otlp_endpoint",
    ),
    Setting("otlp.traces_endpoint", _url, std_env="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    Setting("otlp.metrics_endpoint", _url, std_env="OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
    Setting("otlp.profiles_endpoint", _url, std_env="OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"),
    Setting("otlp.logs_endpoint", _url, std_env="OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"),
    Setting("otlp.protocol", _choice(*OTLP_PROTOCOLS), std_env="OTEL_EXPORTER_OTLP_PROTOCOL", flag="otlp_protocol"),
    Setting("otlp.headers", _mapping(_header_value, lower_keys=True), std_env="OTEL_EXPORTER_OTLP_HEADERS", merge=True),
    Setting("otlp.timeout_s", _positive_number, std_env="OTEL_EXPORTER_OTLP_TIMEOUT", std_parse=_milliseconds),
    Setting("otlp.insecure", _boolean, std_env="OTEL_EXPORTER_OTLP_INSECURE"),
    Setting("otlp.compression", _choice("none", "gzip"), std_env="OTEL_EXPORTER_OTLP_COMPRESSION"),
    Setting("otlp.queue_max_batches", _integer(1), env="OTEL_EBPF_OTLP_QUEUE_MAX_BATCHES"),
    Setting("otlp.queue_max_bytes", _integer(1024), env="OTEL_EBPF_OTLP_QUEUE_MAX_BYTES"),
    Setting("otlp.spool_dir", _path, env="OTEL_EBPF_OTLP_SPOOL_DIR"),
    Setting("otlp.spool_max_bytes", _integer(1 << 20), env="OTEL_EBPF_OTLP_SPOOL_MAX_BYTES"),
    Setting("otlp.retry_initial_s", _positive_number, env="OTEL_EBPF_OTLP_RETRY_INITIAL"),
    Setting("otlp.retry_max_s", _positive_number, env="OTEL_EBPF_OTLP_RETRY_MAX"),
    Setting("otlp.retry_max_elapsed_s", _positive_number, env="OTEL_EBPF_OTLP_RETRY_MAX_ELAPSED"),
    Setting("prometheus.host", _text, std_env="OTEL_EXPORTER_PROMETHEUS_HOST", flag="prometheus_host"),
    Setting("prometheus.port", _integer(1, 65535), std_env="OTEL_EXPORTER_PROMETHEUS_PORT", flag="prometheus_port"),
    Setting("prometheus.max_series", _integer(1), env="OTEL_EBPF_PROMETHEUS_MAX_SERIES"),
    Setting("prometheus.series_ttl_s", _positive_number, env="OTEL_EBPF_PROMETHEUS_SERIES_TTL"),
    Setting("health.host", _text, env="OTEL_EBPF_HEALTH_HOST"),
    Setting("health.port", _integer(1, 65535), env="OTEL_EBPF_HEALTH_PORT", flag="health_port"),
    Setting(
        "resource.attributes",
        _mapping(_scalar, reserved=_RESOURCE_RESERVED),
        std_env="OTEL_RESOURCE_ATTRIBUTES",
        std_parse=_mapping(_scalar),
        merge=True,
    ),
    Setting("resource.host_root", _path, env="OTEL_EBPF_HOST_ROOT"),
    Setting("agent.service_name", _text, std_env="OTEL_SERVICE_NAME"),
    Setting("capture.payload_cap", _integer(64, 32768), env="OTEL_EBPF_PAYLOAD_CAP"),
    Setting("capture.ring_buffer_kb", _integer(64, 1 << 20, power_of_two=True), env="OTEL_EBPF_RING_BUFFER_KB"),
    Setting("capture.max_connections", _integer(1), env="OTEL_EBPF_MAX_CONNECTIONS"),
    Setting("capture.max_processes", _integer(1), env="OTEL_EBPF_MAX_PROCESSES"),
    Setting("capture.socket_mode", _choice("auto", "tracepoints", "fd-tracking"), env="OTEL_EBPF_SOCKET_MODE"),
    Setting("capture.kernel_http_metrics", _boolean, env="OTEL_EBPF_KERNEL_HTTP_METRICS"),
    Setting("capture.tcp_health", _boolean, env="OTEL_EBPF_TCP_HEALTH"),
    Setting("capture.tcp_flows", _boolean, env="OTEL_EBPF_TCP_FLOWS"),
    Setting("capture.cpu_budget", _positive_number, env="OTEL_EBPF_CPU_BUDGET"),
    Setting("capture.cpu_floor", _non_negative_number, env="OTEL_EBPF_CPU_FLOOR"),
    Setting("capture.nice", _integer(0, 19), env="OTEL_EBPF_NICE"),
    Setting("trace.instrumented_clients", _choice("skip", "child"), env="OTEL_EBPF_TRACE_INSTRUMENTED_CLIENTS"),
    Setting("trace.inflight_timeout_s", _positive_number, env="OTEL_EBPF_TRACE_INFLIGHT_TIMEOUT"),
    Setting("trace.max_inflight", _integer(1), env="OTEL_EBPF_TRACE_MAX_INFLIGHT"),
    Setting("trace.reorder_window_ms", _integer(0, 10_000), env="OTEL_EBPF_TRACE_REORDER_WINDOW_MS"),
    Setting("trace.sample_ratio", _ratio, env="OTEL_EBPF_TRACE_SAMPLE_RATIO"),
    Setting("trace.keep_slower_than_ms", _positive_number, env="OTEL_EBPF_TRACE_KEEP_SLOWER_THAN_MS"),
    Setting("trace.inject_traceparent", _boolean, env="OTEL_EBPF_TRACE_INJECT_TRACEPARENT", flag="inject_traceparent"),
    Setting("profiling.enabled", _boolean, env="OTEL_EBPF_PROFILING", flag="profile"),
    Setting(
        "profiling.frequency_hz", _integer(1, 1000), env="OTEL_EBPF_PROFILING_FREQUENCY_HZ", flag="profile_frequency"
    ),
    Setting("profiling.interval_s", _positive_number, env="OTEL_EBPF_PROFILING_INTERVAL"),
    Setting("profiling.max_stacks", _integer(1), env="OTEL_EBPF_PROFILING_MAX_STACKS"),
    Setting("profiling.python", _boolean, env="OTEL_EBPF_PROFILING_PYTHON"),
    Setting("profiling.flamegraphs", _boolean, env="OTEL_EBPF_PROFILING_FLAMEGRAPHS"),
    Setting("profiling.pyroscope_url", _url, env="OTEL_EBPF_PYROSCOPE_URL", flag="pyroscope_url"),
    Setting("gpu.enabled", _auto_or_boolean, env="OTEL_EBPF_GPU", flag="gpu"),
    Setting("gpu.stacks", _choice("python", "native", "none"), env="OTEL_EBPF_GPU_STACKS"),
    Setting("gpu.leak_age_s", _positive_number, env="OTEL_EBPF_GPU_LEAK_AGE"),
    Setting("gpu.leak_min_allocations", _integer(1), env="OTEL_EBPF_GPU_LEAK_MIN_ALLOCATIONS"),
    Setting("gpu.max_allocations", _integer(1), env="OTEL_EBPF_GPU_MAX_ALLOCATIONS"),
    Setting("gpu.max_stacks", _integer(1), env="OTEL_EBPF_GPU_MAX_STACKS"),
    Setting("gpu.interval_s", _positive_number, env="OTEL_EBPF_GPU_INTERVAL"),
    Setting("gpu.ring_buffer_kb", _integer(64, 1 << 20, power_of_two=True), env="OTEL_EBPF_GPU_RING_BUFFER_KB"),
    Setting("gpu.nvml", _boolean, env="OTEL_EBPF_GPU_NVML"),
    Setting("gpu.nvml_library", _absolute_path, env="OTEL_EBPF_GPU_NVML_LIBRARY"),
    Setting("model_guard.mode", _choice("off", "audit", "enforce"), env="OTEL_EBPF_MODEL_GUARD"),
    Setting("model_guard.mechanism", _choice(*MECHANISMS), env="OTEL_EBPF_MODEL_GUARD_MECHANISM"),
    Setting(
        "model_guard.paths",
        _at_most(MAX_RULES, _list(_model_path, non_empty="name at least one pattern")),
        env="OTEL_EBPF_MODEL_GUARD_PATHS",
    ),
    Setting(
        "model_guard.allow_executables",
        _at_most(MAX_ALLOWED, _list(_absolute_path)),
        env="OTEL_EBPF_MODEL_GUARD_ALLOW_EXECUTABLES",
    ),
    Setting(
        "model_guard.allow_uids", _at_most(MAX_ALLOWED, _list(_integer(0))), env="OTEL_EBPF_MODEL_GUARD_ALLOW_UIDS"
    ),
    Setting(
        "model_guard.allow_cgroups",
        _at_most(MAX_ALLOWED, _list(_absolute_path)),
        env="OTEL_EBPF_MODEL_GUARD_ALLOW_CGROUPS",
    ),
    Setting("pii.enabled", _boolean, env="OTEL_EBPF_PII"),
    Setting("pii.kinds", _list(_choice(*PII_KIND_NAMES)), env="OTEL_EBPF_PII_KINDS"),
    Setting("pii.patterns", _pii_patterns),
    Setting("roce.interfaces", _list(_text), env="OTEL_EBPF_ROCE_INTERFACES"),
    Setting("roce.max_qp_pairs", _integer(1, 1 << 20), env="OTEL_EBPF_ROCE_MAX_QP_PAIRS"),
    Setting("rdma.verbs", _boolean, env="OTEL_EBPF_RDMA_VERBS"),
    Setting("rdma.port_counters", _boolean, env="OTEL_EBPF_RDMA_PORT_COUNTERS"),
    Setting("rdma.sysfs_root", _absolute_path, env="OTEL_EBPF_RDMA_SYSFS_ROOT"),
    Setting("rdma.max_objects", _integer(1), env="OTEL_EBPF_RDMA_MAX_OBJECTS"),
    Setting("rdma.collective_linger_s", _positive_number, env="OTEL_EBPF_RDMA_COLLECTIVE_LINGER"),
    Setting("protocols.enabled", _list(_text), env="OTEL_EBPF_PROTOCOLS"),
    Setting("export.max_queue_spans", _integer(1), std_env="OTEL_BSP_MAX_QUEUE_SIZE"),
    Setting("export.max_batch", _integer(1), std_env="OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
    Setting("export.interval_s", _positive_number, std_env="OTEL_BSP_SCHEDULE_DELAY", std_parse=_milliseconds),
    Setting(
        "export.metric_interval_s", _positive_number, std_env="OTEL_METRIC_EXPORT_INTERVAL", std_parse=_milliseconds
    ),
    Setting(
        "export.metric_temporality",
        _choice("cumulative", "delta", "lowmemory"),
        std_env="OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
    ),
    Setting("export.disabled", _boolean, std_env="OTEL_SDK_DISABLED"),
    Setting("run.duration_s", _positive_number, flag="duration"),
    Setting("run.ready_file", _path, flag="ready_file"),
    Setting("run.log_level", _choice(*LOG_LEVELS), env="OTEL_EBPF_LOG_LEVEL"),
)

_BY_KEY = {setting.key: setting for setting in SETTINGS}
_SECTIONS = tuple(dict.fromkeys(key.partition(".")[0] for key in _BY_KEY if "." in key))
_TOP_LEVEL = tuple(dict.fromkeys(key.partition(".")[0] for key in _BY_KEY))
CONFIG_FLAG = "config"
CONFIG_ENV = "OTEL_EBPF_CONFIG"


def _did_you_mean(key: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"


def installed_protocols() -> frozenset[str]:
    """Names of the protocol plugins registered as entry points (without importing them)."""
    return frozenset(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


class _Layers:
    """Accumulates given values, layer by layer, remembering which source set each key last."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.origin: dict[str, str] = {}

    def set(self, setting: Setting, raw: Any, source: str, parse: Parser | None = None) -> None:
        try:
            value = (parse or setting.parse)(raw)
        except ValueError as exc:
            raise ConfigError(source, str(exc)) from None
        if setting.merge and setting.key in self.values:
            value = MappingProxyType({**self.values[setting.key], **value})
        self.values[setting.key] = value
        self.origin[setting.key] = source

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.origin.get(key, key), problem)


def _read_yaml(path: Path, source: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"{path} is not valid YAML: {exc}") from None


def _yaml_leaves(document: Any, source: str, installed: frozenset[str]) -> tuple[list[tuple[str, Any]], dict]:
    """Flatten the YAML document into (dotted key, value) pairs plus the ``protocols.<name>`` option
    sections, rejecting unknown keys."""
    if document is None:
        return [], {}
    if not isinstance(document, Mapping):
        raise ConfigError(source, "the configuration file must hold a mapping of settings")
    leaves: list[tuple[str, Any]] = []
    plugin_options: dict[str, Mapping[str, Any]] = {}
    for top, value in document.items():
        top = str(top)
        if top in _BY_KEY:
            leaves.append((top, value))
            continue
        if top not in _SECTIONS:
            raise ConfigError(top, _did_you_mean(top, _TOP_LEVEL))
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(top, f"expected a mapping of settings, got {value!r}")
        for name, leaf in value.items():
            key = f"{top}.{name}"
            if key in _BY_KEY:
                leaves.append((key, leaf))
            elif top == "protocols" and str(name) in installed:
                if leaf is not None and not isinstance(leaf, Mapping):
                    raise ConfigError(key, f"expected a mapping of plugin options, got {leaf!r}")
                plugin_options[str(name)] = MappingProxyType(dict(leaf or {}))
            elif top == "protocols":
                close = difflib.get_close_matches(str(name), sorted(installed) + ["enabled"], n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                names = ", ".join(sorted(installed)) or "none"
                raise ConfigError(key, f"no protocol plugin {name!r} is installed (installed: {names}){hint}")
            else:
                raise ConfigError(key, _did_you_mean(key, _BY_KEY))
    return leaves, plugin_options


def load_config(cli: Mapping[str, Any], environ: Mapping[str, str]) -> AgentConfig:
    """Resolve the configuration from defaults, YAML, environment and flags (see the module doc).

    ``cli`` maps argparse dests (:attr:`Setting.flag`, plus ``config``) to the values the user
    gave; ``None`` values and other keys are ignored. Empty environment variables count as unset.
    Raises :class:`ConfigError` naming the offending key, variable or flag.
    """
    layers = _Layers()
    installed = installed_protocols()

    # 2. YAML file
    source_path: Path | None = None
    plugin_options: dict[str, Mapping[str, Any]] = {}
    config_source, config_value = (
        ("--config", cli[CONFIG_FLAG]) if cli.get(CONFIG_FLAG) is not None else (CONFIG_ENV, environ.get(CONFIG_ENV))
    )
    if config_value:
        source_path = Path(str(config_value)).expanduser()
        leaves, plugin_options = _yaml_leaves(_read_yaml(source_path, config_source), config_source, installed)
        for key, value in leaves:
            if value is not None:
                layers.set(_BY_KEY[key], value, key)

    # 3. OTEL_EBPF_* and 4. standard OTEL_* variables
    for setting in SETTINGS:
        if setting.env and environ.get(setting.env, "").strip():
            layers.set(setting, environ[setting.env], setting.env)
    for setting in SETTINGS:
        if setting.std_env and environ.get(setting.std_env, "").strip():
            layers.set(setting, environ[setting.std_env], setting.std_env, setting.std_parse)
    _take_service_name(layers, environ)

    # 5. flags
    for setting in SETTINGS:
        if setting.flag and cli.get(setting.flag) is not None:
            layers.set(setting, cli[setting.flag], setting.flag_name or setting.flag)

    return _resolve(layers, plugin_options, installed, source_path)


def _take_service_name(layers: _Layers, environ: Mapping[str, str]) -> None:
    """``service.name`` in OTEL_RESOURCE_ATTRIBUTES names the agent (OTEL_SERVICE_NAME wins, per the
    SDK specification); it must not be stamped on every observed process's resource."""
    attributes = dict(layers.values.get("resource.attributes", {}))
    name = attributes.pop("service.name", None)
    if name is None:
        return
    layers.values["resource.attributes"] = MappingProxyType(attributes)
    if not environ.get("OTEL_SERVICE_NAME", "").strip():
        layers.set(_BY_KEY["agent.service_name"], str(name), "OTEL_RESOURCE_ATTRIBUTES")


def _resolve(
    layers: _Layers, plugin_options: Mapping[str, Mapping[str, Any]], installed: frozenset[str], source: Path | None
) -> AgentConfig:
    """Fill the defaults that depend on other settings, check cross-key rules, build the dataclasses."""
    values = layers.values

    if "exporters" not in values:
        # Pointing the agent at an OTLP endpoint (any layer) means "send it there".
        wants_otlp = "otlp.endpoint" in values or "otlp.traces_endpoint" in values
        values["exporters"] = ("otlp",) if wants_otlp else ("file",)

    protocol = values.get("otlp.protocol", OTLPConfig.protocol)
    values.setdefault("otlp.endpoint", _DEFAULT_OTLP_ENDPOINTS[protocol])
    if protocol == "grpc":
        for key in (
            "otlp.endpoint",
            "otlp.traces_endpoint",
            "otlp.metrics_endpoint",
            "otlp.profiles_endpoint",
            "otlp.logs_endpoint",
        ):
            if key in values and urlsplit(values[key]).path not in ("", "/"):
                raise layers.error(key, f"a gRPC endpoint takes no path, got {values[key]!r} (is otlp.protocol right?)")
    scheme = urlsplit(values["otlp.endpoint"]).scheme
    if values.get("otlp.insecure") and scheme == "https":
        raise layers.error("otlp.insecure", "cannot be true for an https:// endpoint")
    values.setdefault("otlp.insecure", scheme == "http")

    if values.get("otlp.retry_initial_s", OTLPConfig.retry_initial_s) > values.get(
        "otlp.retry_max_s", OTLPConfig.retry_max_s
    ):
        raise layers.error("otlp.retry_initial_s", "must not exceed otlp.retry_max_s")
    if values.get("export.max_batch", ExportConfig.max_batch) > values.get(
        "export.max_queue_spans", ExportConfig.max_queue_spans
    ):
        raise layers.error("export.max_batch", "must not exceed export.max_queue_spans")
    if values.get("model_guard.mode") == "enforce" and values.get("model_guard.mechanism") == "tracepoints":
        raise layers.error("model_guard.mechanism", "tracepoints can only audit; enforce needs lsm (or auto)")

    missing = [name for name in values.get("protocols.enabled", ()) if name not in installed]
    if missing:
        raise layers.error(
            "protocols.enabled",
            f"protocol plugin(s) not installed: {', '.join(missing)} "
            f"(installed: {', '.join(sorted(installed)) or 'none'})",
        )

    sections: dict[str, dict[str, Any]] = {"protocols": {"options": MappingProxyType(dict(plugin_options))}}
    for key, value in values.items():
        if "." in key:
            section, _, name = key.partition(".")
            sections.setdefault(section, {})[name] = value
    default = AgentConfig()
    return replace(
        default,
        exporters=values["exporters"],
        source=source,
        **{section: replace(getattr(default, section), **given) for section, given in sections.items()},
    )
