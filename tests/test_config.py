"""Configuration: precedence of the five layers, validation that names the key, defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ebpf import config as config_module
from otel_ebpf.config import SETTINGS, AgentConfig, ConfigError, OTLPConfig, TargetsConfig, load_config
from otel_ebpf.pii import KIND_NAMES as PII_KIND_NAMES

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "otel-ebpf.example.yaml"
DOCS = REPO / "docs" / "configuration.md"


def nested(key: str, value: Any) -> dict[str, Any]:
    """``capture.payload_cap`` -> ``{"capture": {"payload_cap": value}}``."""
    head, _, rest = key.partition(".")
    return {head: nested(rest, value) if rest else value}


def merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def resolve(
    tmp_path: Path, yaml_doc: Any = None, env: dict[str, str] | None = None, cli: dict[str, Any] | None = None
) -> AgentConfig:
    cli = dict(cli or {})
    if yaml_doc is not None:
        path = tmp_path / "otel-ebpf.yaml"
        path.write_text(yaml.safe_dump(yaml_doc) if not isinstance(yaml_doc, str) else yaml_doc)
        cli["config"] = str(path)
    return load_config(cli, env or {})


def value_at(config: AgentConfig, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


@pytest.fixture
def more_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "installed_protocols", lambda: frozenset({"http1", "http2", "kafka"}))


# --- precedence: defaults -> YAML -> OTEL_EBPF_* -> standard OTEL_* -> flags ---

# key: (default, [(layer, name, raw value, resolved value after this layer), ...] lowest first)
CHAINS: dict[str, tuple[Any, list[tuple[str, str, Any, Any]]]] = {
    "targets.pids": (
        (),
        [("yaml", "", [1], (1,)), ("env", "OTEL_EBPF_PIDS", "2, 3", (2, 3)), ("cli", "pid", [4], (4,))],
    ),
    "targets.ports": (
        (),
        [
            ("yaml", "", [80], (80,)),
            ("env", "OTEL_EBPF_PORTS", "443,8443", (443, 8443)),
            ("cli", "port", [8080], (8080,)),
        ],
    ),
    "targets.executables": (
        (),
        [
            ("yaml", "", ["python*"], ("python*",)),
            ("env", "OTEL_EBPF_EXECUTABLES", "/usr/bin/node", ("/usr/bin/node",)),
            ("cli", "exe", ["vllm"], ("vllm",)),
        ],
    ),
    "exporters": (
        ("file",),
        [
            ("yaml", "", ["console"], ("console",)),
            ("env", "OTEL_EBPF_EXPORTERS", "otlp, file", ("otlp", "file")),
            ("cli", "exporter", ["console", "console"], ("console",)),
        ],
    ),
    "resource.host_root": (
        Path("/"),
        [("yaml", "", "/host", Path("/host")), ("env", "OTEL_EBPF_HOST_ROOT", "/node", Path("/node"))],
    ),
    "file.output_dir": (
        Path("otel-ebpf-data"),
        [
            ("yaml", "", "/var/a", Path("/var/a")),
            ("env", "OTEL_EBPF_OUTPUT_DIR", "/var/b", Path("/var/b")),
            ("cli", "output", "/var/c", Path("/var/c")),
        ],
    ),
    "otlp.endpoint": (
        "http://localhost:4317",
        [
            ("yaml", "", "http://yaml:4317", "http://yaml:4317"),
            ("env", "OTEL_EBPF_OTLP_ENDPOINT", "http://ebpf:4317", "http://ebpf:4317"),
            ("std", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://std:4317", "http://std:4317"),
            ("cli", "otlp_endpoint", "https://cli:4317", "https://cli:4317"),
        ],
    ),
    "otlp.traces_endpoint": (
        None,
        [
            ("yaml", "", "http://yaml:4317", "http://yaml:4317"),
            ("std", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://std:4317", "http://std:4317"),
        ],
    ),
    "otlp.metrics_endpoint": (
        None,
        [
            ("yaml", "", "http://yaml:4317", "http://yaml:4317"),
            ("std", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://std:4317", "http://std:4317"),
        ],
    ),
    "otlp.protocol": (
        "grpc",
        [
            ("yaml", "", "http/protobuf", "http/protobuf"),
            ("std", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "grpc"),
            ("cli", "otlp_protocol", "http/protobuf", "http/protobuf"),
        ],
    ),
    "otlp.headers": (
        {},
        [
            (
                "yaml",
                "",
                {"Authorization": "Bearer y", "x-tenant": "a"},
                {"authorization": "Bearer y", "x-tenant": "a"},
            ),
            (
                "std",
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-tenant=b%20c, api-key=k",
                {"authorization": "Bearer y", "x-tenant": "b c", "api-key": "k"},
            ),
        ],
    ),
    "otlp.timeout_s": (10.0, [("yaml", "", 5, 5.0), ("std", "OTEL_EXPORTER_OTLP_TIMEOUT", "2500", 2.5)]),
    "otlp.insecure": (True, [("yaml", "", False, False), ("std", "OTEL_EXPORTER_OTLP_INSECURE", "TRUE", True)]),
    "otlp.compression": (
        "none",
        [("yaml", "", "gzip", "gzip"), ("std", "OTEL_EXPORTER_OTLP_COMPRESSION", "none", "none")],
    ),
    "otlp.queue_max_batches": (
        512,
        [("yaml", "", 64, 64), ("env", "OTEL_EBPF_OTLP_QUEUE_MAX_BATCHES", "128", 128)],
    ),
    "otlp.queue_max_bytes": (
        64 << 20,
        [("yaml", "", 1 << 20, 1 << 20), ("env", "OTEL_EBPF_OTLP_QUEUE_MAX_BYTES", "2048", 2048)],
    ),
    "otlp.spool_dir": (
        None,
        [("yaml", "", "/var/a", Path("/var/a")), ("env", "OTEL_EBPF_OTLP_SPOOL_DIR", "/var/b", Path("/var/b"))],
    ),
    "otlp.spool_max_bytes": (
        256 << 20,
        [("yaml", "", 1 << 30, 1 << 30), ("env", "OTEL_EBPF_OTLP_SPOOL_MAX_BYTES", "1048576", 1 << 20)],
    ),
    "otlp.retry_initial_s": (1.0, [("yaml", "", 0.5, 0.5), ("env", "OTEL_EBPF_OTLP_RETRY_INITIAL", "2", 2.0)]),
    "otlp.retry_max_s": (30.0, [("yaml", "", 10, 10.0), ("env", "OTEL_EBPF_OTLP_RETRY_MAX", "60", 60.0)]),
    "otlp.retry_max_elapsed_s": (
        300.0,
        [("yaml", "", 60, 60.0), ("env", "OTEL_EBPF_OTLP_RETRY_MAX_ELAPSED", "3600", 3600.0)],
    ),
    "prometheus.host": (
        "localhost",
        [
            ("yaml", "", "0.0.0.0", "0.0.0.0"),
            ("std", "OTEL_EXPORTER_PROMETHEUS_HOST", "10.0.0.7", "10.0.0.7"),
            ("cli", "prometheus_host", "::", "::"),
        ],
    ),
    "prometheus.port": (
        9464,
        [
            ("yaml", "", 9000, 9000),
            ("std", "OTEL_EXPORTER_PROMETHEUS_PORT", "9001", 9001),
            ("cli", "prometheus_port", 9002, 9002),
        ],
    ),
    "prometheus.max_series": (20000, [("yaml", "", 10, 10), ("env", "OTEL_EBPF_PROMETHEUS_MAX_SERIES", "20", 20)]),
    "prometheus.series_ttl_s": (
        300.0,
        [("yaml", "", 60, 60.0), ("env", "OTEL_EBPF_PROMETHEUS_SERIES_TTL", "90", 90.0)],
    ),
    "health.host": ("localhost", [("yaml", "", "0.0.0.0", "0.0.0.0"), ("env", "OTEL_EBPF_HEALTH_HOST", "::1", "::1")]),
    "health.port": (
        None,
        [("yaml", "", 9465, 9465), ("env", "OTEL_EBPF_HEALTH_PORT", "9466", 9466), ("cli", "health_port", 9467, 9467)],
    ),
    "resource.attributes": (
        {},
        [
            ("yaml", "", {"deployment.environment.name": "prod", "k8s.node.count": 3}, None),
            (
                "std",
                "OTEL_RESOURCE_ATTRIBUTES",
                "team=ml%2Finfra,k8s.node.count=4",
                {"deployment.environment.name": "prod", "k8s.node.count": "4", "team": "ml/infra"},
            ),
        ],
    ),
    "agent.service_name": (
        "otel-ebpf",
        [("yaml", "", "agent-a", "agent-a"), ("std", "OTEL_SERVICE_NAME", "agent-b", "agent-b")],
    ),
    "capture.payload_cap": (4096, [("yaml", "", 1024, 1024), ("env", "OTEL_EBPF_PAYLOAD_CAP", "256", 256)]),
    "capture.ring_buffer_kb": (4096, [("yaml", "", 1024, 1024), ("env", "OTEL_EBPF_RING_BUFFER_KB", "128", 128)]),
    "capture.max_connections": (16384, [("yaml", "", 100, 100), ("env", "OTEL_EBPF_MAX_CONNECTIONS", "200", 200)]),
    "capture.max_processes": (1024, [("yaml", "", 10, 10), ("env", "OTEL_EBPF_MAX_PROCESSES", "20", 20)]),
    "capture.socket_mode": (
        "auto",
        [("yaml", "", "tracepoints", "tracepoints"), ("env", "OTEL_EBPF_SOCKET_MODE", "fd-tracking", "fd-tracking")],
    ),
    "capture.kernel_http_metrics": (
        True,
        [("yaml", "", False, False), ("env", "OTEL_EBPF_KERNEL_HTTP_METRICS", "true", True)],
    ),
    "capture.tcp_health": (True, [("yaml", "", False, False), ("env", "OTEL_EBPF_TCP_HEALTH", "false", False)]),
    "capture.tcp_flows": (False, [("yaml", "", True, True), ("env", "OTEL_EBPF_TCP_FLOWS", "true", True)]),
    "capture.cpu_budget": (0.5, [("yaml", "", 0.25, 0.25), ("env", "OTEL_EBPF_CPU_BUDGET", "1.5", 1.5)]),
    "capture.cpu_floor": (None, [("yaml", "", 0, 0.0), ("env", "OTEL_EBPF_CPU_FLOOR", "0.05", 0.05)]),
    "capture.nice": (10, [("yaml", "", 0, 0), ("env", "OTEL_EBPF_NICE", "19", 19)]),
    "trace.instrumented_clients": (
        "skip",
        [("yaml", "", "child", "child"), ("env", "OTEL_EBPF_TRACE_INSTRUMENTED_CLIENTS", "SKIP", "skip")],
    ),
    "trace.inflight_timeout_s": (
        300.0,
        [("yaml", "", 60, 60.0), ("env", "OTEL_EBPF_TRACE_INFLIGHT_TIMEOUT", "90", 90.0)],
    ),
    "trace.max_inflight": (65536, [("yaml", "", 10, 10), ("env", "OTEL_EBPF_TRACE_MAX_INFLIGHT", "20", 20)]),
    "trace.reorder_window_ms": (
        50,
        [("yaml", "", 0, 0), ("env", "OTEL_EBPF_TRACE_REORDER_WINDOW_MS", "200", 200)],
    ),
    "trace.sample_ratio": (1.0, [("yaml", "", 0.5, 0.5), ("env", "OTEL_EBPF_TRACE_SAMPLE_RATIO", "0.1", 0.1)]),
    "trace.keep_slower_than_ms": (
        1000.0,
        [("yaml", "", 250, 250.0), ("env", "OTEL_EBPF_TRACE_KEEP_SLOWER_THAN_MS", "2000", 2000.0)],
    ),
    "trace.inject_traceparent": (
        False,
        [
            ("yaml", "", True, True),
            ("env", "OTEL_EBPF_TRACE_INJECT_TRACEPARENT", "true", True),
            ("cli", "inject_traceparent", True, True),
        ],
    ),
    "gpu.enabled": (
        "auto",
        [("yaml", "", True, "true"), ("env", "OTEL_EBPF_GPU", "off", "false"), ("cli", "gpu", "auto", "auto")],
    ),
    "gpu.stacks": ("python", [("yaml", "", "native", "native"), ("env", "OTEL_EBPF_GPU_STACKS", "none", "none")]),
    "gpu.leak_age_s": (60.0, [("yaml", "", 5, 5.0), ("env", "OTEL_EBPF_GPU_LEAK_AGE", "0.5", 0.5)]),
    "gpu.leak_min_allocations": (2, [("yaml", "", 1, 1), ("env", "OTEL_EBPF_GPU_LEAK_MIN_ALLOCATIONS", "3", 3)]),
    "gpu.max_allocations": (1_000_000, [("yaml", "", 10, 10), ("env", "OTEL_EBPF_GPU_MAX_ALLOCATIONS", "20", 20)]),
    "gpu.max_stacks": (10_000, [("yaml", "", 10, 10), ("env", "OTEL_EBPF_GPU_MAX_STACKS", "20", 20)]),
    "gpu.interval_s": (10.0, [("yaml", "", 2, 2.0), ("env", "OTEL_EBPF_GPU_INTERVAL", "1.5", 1.5)]),
    "gpu.ring_buffer_kb": (4096, [("yaml", "", 1024, 1024), ("env", "OTEL_EBPF_GPU_RING_BUFFER_KB", "512", 512)]),
    "gpu.nvml": (True, [("yaml", "", False, False), ("env", "OTEL_EBPF_GPU_NVML", "off", False)]),
    "gpu.nvml_library": (
        "",
        [("yaml", "", "/host/usr/lib/libnvidia-ml.so.1", "/host/usr/lib/libnvidia-ml.so.1")]
        + [("env", "OTEL_EBPF_GPU_NVML_LIBRARY", "/opt/nvidia/libnvidia-ml.so.1", "/opt/nvidia/libnvidia-ml.so.1")],
    ),
    "roce.interfaces": (
        (),
        [("yaml", "", ["eth1"], ("eth1",)), ("env", "OTEL_EBPF_ROCE_INTERFACES", "eth2,eth3", ("eth2", "eth3"))],
    ),
    "roce.max_qp_pairs": (4096, [("yaml", "", 16, 16), ("env", "OTEL_EBPF_ROCE_MAX_QP_PAIRS", "32", 32)]),
    "rdma.verbs": (False, [("yaml", "", True, True), ("env", "OTEL_EBPF_RDMA_VERBS", "off", False)]),
    "rdma.port_counters": (True, [("yaml", "", False, False), ("env", "OTEL_EBPF_RDMA_PORT_COUNTERS", "on", True)]),
    "rdma.sysfs_root": (
        "/sys/class/infiniband",
        [("yaml", "", "/host/sys/class/infiniband", "/host/sys/class/infiniband")]
        + [("env", "OTEL_EBPF_RDMA_SYSFS_ROOT", "/tmp/infiniband", "/tmp/infiniband")],
    ),
    "rdma.max_objects": (65536, [("yaml", "", 10, 10), ("env", "OTEL_EBPF_RDMA_MAX_OBJECTS", "20", 20)]),
    "rdma.collective_linger_s": (
        0.01,
        [("yaml", "", 0.5, 0.5), ("env", "OTEL_EBPF_RDMA_COLLECTIVE_LINGER", "0.2", 0.2)],
    ),
    "model_guard.mode": (
        "off",
        [("yaml", "", "audit", "audit"), ("env", "OTEL_EBPF_MODEL_GUARD", "enforce", "enforce")],
    ),
    "model_guard.mechanism": (
        "auto",
        [("yaml", "", "lsm", "lsm"), ("env", "OTEL_EBPF_MODEL_GUARD_MECHANISM", "tracepoints", "tracepoints")],
    ),
    "model_guard.paths": (
        ("*.safetensors", "*.pt", "*.pth", "*.gguf", "*.onnx", "/models/**/*.bin", "/root/.cache/huggingface/**/*.bin"),
        [
            ("yaml", "", ["*.pt", "/srv/m/**/*.bin"], ("*.pt", "/srv/m/**/*.bin")),
            ("env", "OTEL_EBPF_MODEL_GUARD_PATHS", "*.gguf", ("*.gguf",)),
        ],
    ),
    "model_guard.allow_executables": (
        (),
        [
            ("yaml", "", ["/usr/bin/python3"], ("/usr/bin/python3",)),
            (
                "env",
                "OTEL_EBPF_MODEL_GUARD_ALLOW_EXECUTABLES",
                "/opt/vllm/bin/python,/bin/a",
                ("/opt/vllm/bin/python", "/bin/a"),
            ),
        ],
    ),
    "model_guard.allow_uids": (
        (),
        [("yaml", "", [1000], (1000,)), ("env", "OTEL_EBPF_MODEL_GUARD_ALLOW_UIDS", "0, 1001", (0, 1001))],
    ),
    "model_guard.allow_cgroups": (
        (),
        [
            ("yaml", "", ["/system.slice/vllm.service"], ("/system.slice/vllm.service",)),
            ("env", "OTEL_EBPF_MODEL_GUARD_ALLOW_CGROUPS", "/kubepods.slice", ("/kubepods.slice",)),
        ],
    ),
    "pii.enabled": (True, [("yaml", "", False, False), ("env", "OTEL_EBPF_PII", "on", True)]),
    "pii.kinds": (
        PII_KIND_NAMES,
        [("yaml", "", ["email", "card"], ("email", "card")), ("env", "OTEL_EBPF_PII_KINDS", "jwt", ("jwt",))],
    ),
    "pii.patterns": ({}, [("yaml", "", {"employee_id": r"EMP-\d{6}"}, {"employee_id": r"EMP-\d{6}"})]),
    "protocols.enabled": (
        None,
        [("yaml", "", ["http1", "kafka"], ("http1", "kafka")), ("env", "OTEL_EBPF_PROTOCOLS", "http2", ("http2",))],
    ),
    "export.max_queue_spans": (20000, [("yaml", "", 5000, 5000), ("std", "OTEL_BSP_MAX_QUEUE_SIZE", "6000", 6000)]),
    "export.max_batch": (512, [("yaml", "", 100, 100), ("std", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "200", 200)]),
    "export.interval_s": (1.0, [("yaml", "", 0.5, 0.5), ("std", "OTEL_BSP_SCHEDULE_DELAY", "250", 0.25)]),
    "export.metric_interval_s": (
        10.0,
        [("yaml", "", 30, 30.0), ("std", "OTEL_METRIC_EXPORT_INTERVAL", "5000", 5.0)],
    ),
    "export.metric_temporality": (
        "cumulative",
        [
            ("yaml", "", "delta", "delta"),
            ("std", "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "LowMemory", "lowmemory"),
        ],
    ),
    "export.disabled": (False, [("yaml", "", True, True), ("std", "OTEL_SDK_DISABLED", "false", False)]),
    "otlp.logs_endpoint": (
        None,
        [
            ("yaml", "", "http://yaml:4317", "http://yaml:4317"),
            ("std", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://std:4317", "http://std:4317"),
        ],
    ),
    "otlp.profiles_endpoint": (
        None,
        [
            ("yaml", "", "http://yaml:4317", "http://yaml:4317"),
            ("std", "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://std:4317", "http://std:4317"),
        ],
    ),
    "profiling.enabled": (
        False,
        [("yaml", "", True, True), ("env", "OTEL_EBPF_PROFILING", "false", False), ("cli", "profile", True, True)],
    ),
    "profiling.frequency_hz": (
        49,
        [
            ("yaml", "", 19, 19),
            ("env", "OTEL_EBPF_PROFILING_FREQUENCY_HZ", "97", 97),
            ("cli", "profile_frequency", 99, 99),
        ],
    ),
    "profiling.interval_s": (10.0, [("yaml", "", 5, 5.0), ("env", "OTEL_EBPF_PROFILING_INTERVAL", "2.5", 2.5)]),
    "profiling.max_stacks": (16384, [("yaml", "", 10, 10), ("env", "OTEL_EBPF_PROFILING_MAX_STACKS", "20", 20)]),
    "profiling.python": (True, [("yaml", "", False, False), ("env", "OTEL_EBPF_PROFILING_PYTHON", "true", True)]),
    "profiling.flamegraphs": (
        True,
        [("yaml", "", False, False), ("env", "OTEL_EBPF_PROFILING_FLAMEGRAPHS", "yes", True)],
    ),
    "profiling.pyroscope_url": (
        None,
        [
            ("yaml", "", "http://yaml:4040", "http://yaml:4040"),
            ("env", "OTEL_EBPF_PYROSCOPE_URL", "http://env:4040", "http://env:4040"),
            ("cli", "pyroscope_url", "http://cli:4040", "http://cli:4040"),
        ],
    ),
    "run.duration_s": (None, [("yaml", "", 3, 3.0), ("cli", "duration", 1.5, 1.5)]),
    "run.ready_file": (None, [("yaml", "", "/run/a", Path("/run/a")), ("cli", "ready_file", "/run/b", Path("/run/b"))]),
    "run.log_level": (
        "info",
        [("yaml", "", "debug", "debug"), ("env", "OTEL_EBPF_LOG_LEVEL", "WARNING", "warning")],
    ),
}


def test_every_setting_has_a_precedence_case() -> None:
    assert set(CHAINS) == {setting.key for setting in SETTINGS}


def test_every_source_of_a_setting_is_in_its_chain() -> None:
    for setting in SETTINGS:
        names = {name for _, name, _, _ in CHAINS[setting.key][1]}
        assert {setting.env, setting.std_env, setting.flag} - {None} <= names, setting.key


@pytest.mark.parametrize("key", sorted(CHAINS))
def test_each_layer_overrides_the_previous(key: str, tmp_path: Path, more_plugins: None) -> None:
    default, chain = CHAINS[key]
    assert value_at(resolve(tmp_path), key) == default
    yaml_doc: dict[str, Any] = {}
    env: dict[str, str] = {}
    cli: dict[str, Any] = {}
    for layer, name, raw, expected in chain:
        if layer == "yaml":
            merge(yaml_doc, nested(key, raw))
        elif layer in ("env", "std"):
            env[name] = raw
        else:
            cli[name] = raw
        if expected is None:
            expected = raw
        assert value_at(resolve(tmp_path, yaml_doc, env, cli), key) == expected, (layer, name)


def test_standard_variables_beat_otel_ebpf_ones(tmp_path: Path) -> None:
    env = {"OTEL_EBPF_OTLP_ENDPOINT": "http://ebpf:4317", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://std:4317"}
    assert resolve(tmp_path, env=env).otlp.endpoint == "http://std:4317"


def test_config_path_from_environment_and_flag_wins(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("capture: {payload_cap: 128}\n")
    b.write_text("capture: {payload_cap: 256}\n")
    from_env = load_config({}, {"OTEL_EBPF_CONFIG": str(a)})
    assert (from_env.capture.payload_cap, from_env.source) == (128, a)
    assert load_config({"config": str(b)}, {"OTEL_EBPF_CONFIG": str(a)}).capture.payload_cap == 256


def test_empty_variables_none_flags_and_foreign_cli_keys_count_as_unset(tmp_path: Path) -> None:
    config = resolve(
        tmp_path,
        env={"OTEL_EBPF_PIDS": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "  ", "OTEL_SDK_DISABLED": ""},
        cli={"pid": None, "duration": None, "command": "run", "verbose": True},
    )
    assert config == AgentConfig()


def test_yaml_null_leaves_and_sections_keep_defaults(tmp_path: Path) -> None:
    assert resolve(tmp_path, "capture:\nrun:\n  duration_s:\n") == dataclasses.replace(
        AgentConfig(), source=tmp_path / "otel-ebpf.yaml"
    )


def test_defaults_are_the_documented_ones() -> None:
    config = load_config({}, {})
    assert config.exporters == ("file",)
    assert config.file.output_dir == Path("otel-ebpf-data")
    assert (config.otlp.endpoint, config.otlp.protocol, config.otlp.insecure, config.otlp.timeout_s) == (
        "http://localhost:4317",
        "grpc",
        True,
        10.0,
    )
    assert (config.capture.payload_cap, config.capture.ring_buffer_kb) == (4096, 4096)
    assert (config.capture.max_connections, config.capture.max_processes) == (16384, 1024)
    assert (config.export.max_queue_spans, config.export.max_batch) == (20000, 512)
    assert (config.export.interval_s, config.export.metric_interval_s) == (1.0, 10.0)
    assert config.agent.service_name == "otel-ebpf"
    assert (config.prometheus.host, config.prometheus.port, config.health.port) == ("localhost", 9464, None)
    assert config.protocols.enabled is None and config.targets == TargetsConfig()


def test_config_is_frozen() -> None:
    config = load_config({}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.capture.payload_cap = 1  # type: ignore[misc]


# --- derived defaults ---


@pytest.mark.parametrize(
    ("env", "cli", "yaml_doc", "exporters"),
    [
        ({}, {}, None, ("file",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, {}, None, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, {}, None, ("otlp",)),
        ({"OTEL_EBPF_OTLP_ENDPOINT": "http://c:4317"}, {}, None, ("otlp",)),
        ({}, {"otlp_endpoint": "http://c:4317"}, None, ("otlp",)),
        ({}, {}, {"otlp": {"endpoint": "http://c:4317"}}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317"}, {}, None, ("file",)),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, {}, None, ("file",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, {"exporter": ["console"]}, None, ("console",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, {}, {"exporters": ["file"]}, ("file",)),
    ],
)
def test_default_exporter_selection(
    tmp_path: Path, env: dict[str, str], cli: dict[str, Any], yaml_doc: Any, exporters: tuple[str, ...]
) -> None:
    assert resolve(tmp_path, yaml_doc, env, cli).exporters == exporters


@pytest.mark.parametrize(
    ("protocol", "endpoint"), [("grpc", "http://localhost:4317"), ("http/protobuf", "http://localhost:4318")]
)
def test_default_endpoint_follows_the_protocol(protocol: str, endpoint: str) -> None:
    assert load_config({"otlp_protocol": protocol}, {}).otlp.endpoint == endpoint


@pytest.mark.parametrize(
    ("endpoint", "insecure"), [("http://c:4317", True), ("https://c:4317", False), ("HTTP://c:4317", True)]
)
def test_insecure_defaults_from_the_scheme(endpoint: str, insecure: bool) -> None:
    assert load_config({"otlp_endpoint": endpoint}, {}).otlp.insecure is insecure


@pytest.mark.parametrize(
    ("otlp", "signal", "url"),
    [
        (OTLPConfig(endpoint="http://c:4318", protocol="http/protobuf"), "traces", "http://c:4318/v1/traces"),
        (OTLPConfig(endpoint="http://c:4318/", protocol="http/protobuf"), "metrics", "http://c:4318/v1/metrics"),
        (OTLPConfig(endpoint="https://c/otlp/", protocol="http/protobuf"), "traces", "https://c/otlp/v1/traces"),
        (
            OTLPConfig(endpoint="http://c:4318", protocol="http/protobuf", traces_endpoint="http://t:1/custom"),
            "traces",
            "http://t:1/custom",
        ),
        (OTLPConfig(endpoint="http://c:4317", protocol="grpc"), "traces", "http://c:4317"),
        (OTLPConfig(endpoint="http://c:4317", metrics_endpoint="http://m:4317"), "metrics", "http://m:4317"),
    ],
)
def test_signal_endpoint(otlp: OTLPConfig, signal: str, url: str) -> None:
    assert otlp.signal_endpoint(signal) == url


def test_service_name_in_otel_resource_attributes_names_the_agent_not_every_process() -> None:
    config = load_config({}, {"OTEL_RESOURCE_ATTRIBUTES": "service.name=collector,team=ml"})
    assert config.agent.service_name == "collector"
    assert dict(config.resource.attributes) == {"team": "ml"}
    config = load_config({}, {"OTEL_RESOURCE_ATTRIBUTES": "service.name=collector", "OTEL_SERVICE_NAME": "explicit"})
    assert config.agent.service_name == "explicit"
    assert dict(config.resource.attributes) == {}


def test_protocol_options_pass_through_untouched(tmp_path: Path) -> None:
    options = {"capture_headers": ["x-request-id", "user-agent"], "max_body": 1024, "nested": {"a": [1, 2]}}
    config = resolve(tmp_path, {"protocols": {"enabled": ["http1"], "http1": options}})
    assert config.protocols.enabled == ("http1",)
    assert dict(config.protocols.options) == {"http1": options}


def test_empty_protocol_section_gives_empty_options(tmp_path: Path) -> None:
    assert dict(resolve(tmp_path, "protocols:\n  http1:\n").protocols.options) == {"http1": {}}


# --- every validation error names its key ---

ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    # (layer, {name: raw}, key the error names, text the problem contains)
    ("yaml", {"capture.payload_cap": 63}, "capture.payload_cap", "64..32768"),
    ("yaml", {"capture.payload_cap": 40000}, "capture.payload_cap", "out of range"),
    ("yaml", {"capture.payload_cap": "big"}, "capture.payload_cap", "integer"),
    ("yaml", {"capture.payload_cap": True}, "capture.payload_cap", "integer"),
    ("yaml", {"capture.payload_cap": 100.5}, "capture.payload_cap", "integer"),
    ("yaml", {"capture.ring_buffer_kb": 100}, "capture.ring_buffer_kb", "power of two"),
    ("yaml", {"capture.ring_buffer_kb": 32}, "capture.ring_buffer_kb", "out of range"),
    ("yaml", {"capture.max_connections": 0}, "capture.max_connections", "out of range"),
    ("yaml", {"capture.max_processes": -1}, "capture.max_processes", "out of range"),
    ("yaml", {"capture.nice": 20}, "capture.nice", "out of range"),
    ("env", {"OTEL_EBPF_NICE": "-5"}, "OTEL_EBPF_NICE", "out of range"),
    ("yaml", {"capture.cpu_floor": -0.1}, "capture.cpu_floor", "must not be negative"),
    ("env", {"OTEL_EBPF_CPU_FLOOR": "half"}, "OTEL_EBPF_CPU_FLOOR", "expected a number"),
    ("env", {"OTEL_EBPF_SOCKET_MODE": "kprobes"}, "OTEL_EBPF_SOCKET_MODE", "one of"),
    ("yaml", {"targets.pids": [-1]}, "targets.pids", "item 1"),
    ("env", {"OTEL_EBPF_MODEL_GUARD": "deny"}, "OTEL_EBPF_MODEL_GUARD", "one of"),
    ("env", {"OTEL_EBPF_MODEL_GUARD_MECHANISM": "kprobes"}, "OTEL_EBPF_MODEL_GUARD_MECHANISM", "one of"),
    ("yaml", {"model_guard.paths": ["/models/*.bin"]}, "model_guard.paths", "use '*.ext' or '/dir/**/*.ext'"),
    ("yaml", {"model_guard.paths": []}, "model_guard.paths", "at least one"),
    ("yaml", {"model_guard.paths": [f"*.e{i}" for i in range(17)]}, "model_guard.paths", "at most 16"),
    ("yaml", {"model_guard.allow_executables": ["python3"]}, "model_guard.allow_executables", "absolute path"),
    ("yaml", {"model_guard.allow_uids": [-1]}, "model_guard.allow_uids", "item 1"),
    ("yaml", {"model_guard.allow_uids": list(range(257))}, "model_guard.allow_uids", "at most 256"),
    ("yaml", {"targets.ports": [80, 0]}, "targets.ports", "item 2"),
    ("yaml", {"targets.ports": [70000]}, "targets.ports", "1..65535"),
    ("yaml", {"targets.ports": ["http"]}, "targets.ports", "integer"),
    ("yaml", {"targets.executables": [""]}, "targets.executables", "non-empty"),
    ("yaml", {"exporters": ["zipkin"]}, "exporters", "otlp, file, console, prometheus"),
    ("yaml", {"prometheus.port": 0}, "prometheus.port", "1..65535"),
    ("env", {"OTEL_EXPORTER_PROMETHEUS_PORT": "metrics"}, "OTEL_EXPORTER_PROMETHEUS_PORT", "integer"),
    ("yaml", {"prometheus.host": ""}, "prometheus.host", "non-empty"),
    ("yaml", {"prometheus.max_series": 0}, "prometheus.max_series", "out of range"),
    ("yaml", {"prometheus.series_ttl_s": 0}, "prometheus.series_ttl_s", "greater than 0"),
    ("cli", {"health_port": 70000}, "--health-port", "1..65535"),
    ("yaml", {"exporters": []}, "exporters", "at least one"),
    ("yaml", {"file.output_dir": 5}, "file.output_dir", "string"),
    ("yaml", {"otlp.endpoint": "localhost:4317"}, "otlp.endpoint", "http://"),
    ("yaml", {"otlp.endpoint": "ftp://c"}, "otlp.endpoint", "http://"),
    ("yaml", {"otlp.endpoint": "http://c:99999"}, "otlp.endpoint", "port"),
    ("yaml", {"otlp.protocol": "http/json"}, "otlp.protocol", "grpc, http/protobuf"),
    ("yaml", {"otlp.timeout_s": 0}, "otlp.timeout_s", "greater than 0"),
    ("yaml", {"otlp.timeout_s": "soon"}, "otlp.timeout_s", "number"),
    ("yaml", {"otlp.insecure": "maybe"}, "otlp.insecure", "true or false"),
    ("yaml", {"otlp.compression": "zstd"}, "otlp.compression", "none, gzip"),
    ("yaml", {"otlp.headers": {"a": {"b": 1}}}, "otlp.headers", "a: expected a string"),
    ("yaml", {"otlp.headers": ["a"]}, "otlp.headers", "mapping"),
    ("yaml", {"resource.attributes": {"service.name": "x"}}, "resource.attributes", "agent.service_name"),
    ("yaml", {"resource.attributes": {"k": [1]}}, "resource.attributes", "k:"),
    ("yaml", {"agent.service_name": ""}, "agent.service_name", "non-empty"),
    ("yaml", {"protocols.enabled": ["nope"]}, "protocols.enabled", "not installed: nope"),
    ("yaml", {"pii.kinds": ["email", "ssn"]}, "pii.kinds", "item 2"),
    ("env", {"OTEL_EBPF_PII": "maybe"}, "OTEL_EBPF_PII", "true or false"),
    ("yaml", {"pii.patterns": {"badge": "EMP-[0-9"}}, "pii.patterns", "invalid regular expression"),
    ("yaml", {"pii.patterns": {"badge": "(EMP)-\\d+"}}, "pii.patterns", "non-capturing"),
    ("yaml", {"pii.patterns": {"badge": "x*"}}, "pii.patterns", "empty text"),
    ("yaml", {"pii.patterns": {"Badge": "x"}}, "pii.patterns", "lower-case"),
    ("yaml", {"pii.patterns": {"email": "x"}}, "pii.patterns", "built-in"),
    ("yaml", {"export.max_queue_spans": 0}, "export.max_queue_spans", "out of range"),
    ("yaml", {"export.max_batch": 0}, "export.max_batch", "out of range"),
    ("yaml", {"export.interval_s": 0}, "export.interval_s", "greater than 0"),
    ("yaml", {"export.metric_interval_s": -1}, "export.metric_interval_s", "greater than 0"),
    ("yaml", {"export.metric_temporality": "sometimes"}, "export.metric_temporality", "cumulative"),
    ("yaml", {"export.disabled": "perhaps"}, "export.disabled", "true or false"),
    ("yaml", {"run.duration_s": -5}, "run.duration_s", "greater than 0"),
    ("yaml", {"run.duration_s": float("inf")}, "run.duration_s", "number"),
    ("yaml", {"run.log_level": "verbose"}, "run.log_level", "debug, info"),
    ("env", {"OTEL_EBPF_PIDS": "1,abc"}, "OTEL_EBPF_PIDS", "item 2"),
    ("env", {"OTEL_EBPF_PORTS": "99999"}, "OTEL_EBPF_PORTS", "1..65535"),
    ("env", {"OTEL_EBPF_EXPORTERS": "otlp,jaeger"}, "OTEL_EBPF_EXPORTERS", "item 2"),
    ("env", {"OTEL_EBPF_PAYLOAD_CAP": "lots"}, "OTEL_EBPF_PAYLOAD_CAP", "integer"),
    ("env", {"OTEL_EBPF_RING_BUFFER_KB": "1000"}, "OTEL_EBPF_RING_BUFFER_KB", "power of two"),
    ("env", {"OTEL_EBPF_OTLP_ENDPOINT": "c:4317"}, "OTEL_EBPF_OTLP_ENDPOINT", "http://"),
    ("env", {"OTEL_EBPF_LOG_LEVEL": "loud"}, "OTEL_EBPF_LOG_LEVEL", "debug"),
    ("env", {"OTEL_EBPF_PROTOCOLS": "http1,smtp"}, "OTEL_EBPF_PROTOCOLS", "smtp"),
    ("env", {"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, "OTEL_EXPORTER_OTLP_TIMEOUT", "greater than 0"),
    ("env", {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "OTEL_EXPORTER_OTLP_HEADERS", "key=value"),
    ("env", {"OTEL_RESOURCE_ATTRIBUTES": "=x"}, "OTEL_RESOURCE_ATTRIBUTES", "invalid key"),
    ("env", {"OTEL_RESOURCE_ATTRIBUTES": "service.name="}, "OTEL_RESOURCE_ATTRIBUTES", "non-empty"),
    ("env", {"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ("env", {"OTEL_EXPORTER_OTLP_INSECURE": "sure"}, "OTEL_EXPORTER_OTLP_INSECURE", "true or false"),
    ("env", {"OTEL_SDK_DISABLED": "perhaps"}, "OTEL_SDK_DISABLED", "true or false"),
    ("env", {"OTEL_BSP_MAX_QUEUE_SIZE": "-3"}, "OTEL_BSP_MAX_QUEUE_SIZE", "out of range"),
    ("env", {"OTEL_BSP_SCHEDULE_DELAY": "soon"}, "OTEL_BSP_SCHEDULE_DELAY", "number"),
    ("env", {"OTEL_METRIC_EXPORT_INTERVAL": "0"}, "OTEL_METRIC_EXPORT_INTERVAL", "greater than 0"),
    ("cli", {"pid": ["x"]}, "--pid", "integer"),
    ("cli", {"port": [0]}, "--port", "out of range"),
    ("cli", {"exporter": ["kafka"]}, "--exporter", "otlp"),
    ("cli", {"otlp_endpoint": "nope"}, "--otlp-endpoint", "http://"),
    ("cli", {"otlp_protocol": "udp"}, "--otlp-protocol", "grpc"),
    ("cli", {"duration": 0}, "--duration", "greater than 0"),
    ("cli", {"ready_file": ""}, "--ready-file", "non-empty"),
    # rules across keys name the source of the offending value
    ("yaml", {"export.max_queue_spans": 100, "export.max_batch": 200}, "export.max_batch", "max_queue_spans"),
    ("env", {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "30000"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_queue_spans"),
    ("yaml", {"otlp.endpoint": "https://c:4317", "otlp.insecure": True}, "otlp.insecure", "https"),
    ("env", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317/v1/traces"}, "OTEL_EXPORTER_OTLP_ENDPOINT", "no path"),
    ("cli", {"otlp_endpoint": "http://c:4318/v1"}, "--otlp-endpoint", "otlp.protocol"),
    (
        "yaml",
        {"model_guard.mode": "enforce", "model_guard.mechanism": "tracepoints"},
        "model_guard.mechanism",
        "can only audit",
    ),
]


@pytest.mark.parametrize(
    ("layer", "given", "key", "text"), ERRORS, ids=[f"{key}-{i}" for i, (_, _, key, _) in enumerate(ERRORS)]
)
def test_validation_errors_name_their_key(
    tmp_path: Path, layer: str, given: dict[str, Any], key: str, text: str
) -> None:
    yaml_doc: dict[str, Any] | None = None
    if layer == "yaml":
        yaml_doc = {}
        for dotted, raw in given.items():
            merge(yaml_doc, nested(dotted, raw))
    with pytest.raises(ConfigError) as caught:
        resolve(tmp_path, yaml_doc, given if layer == "env" else None, given if layer == "cli" else None)
    assert caught.value.key == key
    assert text in caught.value.problem
    assert str(caught.value) == f"{key}: {caught.value.problem}"


@pytest.mark.parametrize(
    ("document", "key", "text"),
    [
        ({"captrue": {"payload_cap": 1}}, "captrue", "did you mean 'capture'"),
        ({"capture": {"payload_cpa": 1}}, "capture.payload_cpa", "did you mean 'capture.payload_cap'"),
        ({"targets": {"pid": [1]}}, "targets.pid", "did you mean 'targets.pids'"),
        ({"exporter": ["otlp"]}, "exporter", "did you mean 'exporters'"),
        ({"protocols": {"htp1": {}}}, "protocols.htp1", "did you mean 'http1'"),
        ({"protocols": {"http1": ["capture_headers"]}}, "protocols.http1", "mapping of plugin options"),
        ({"zzz": 1}, "zzz", "unknown key"),
        ({"capture": 5}, "capture", "mapping of settings"),
    ],
)
def test_unknown_and_misshapen_yaml_keys(tmp_path: Path, document: Any, key: str, text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(tmp_path, document)
    assert caught.value.key == key
    assert text in caught.value.problem


def test_unreadable_or_invalid_files_name_what_pointed_at_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--config: cannot read .*missing\.yaml"):
        load_config({"config": str(tmp_path / "missing.yaml")}, {})
    with pytest.raises(ConfigError, match=r"^OTEL_EBPF_CONFIG: cannot read"):
        load_config({}, {"OTEL_EBPF_CONFIG": str(tmp_path / "missing.yaml")})
    bad = tmp_path / "bad.yaml"
    bad.write_text("capture: [1, 2\n")
    with pytest.raises(ConfigError, match=r"^--config: .*bad\.yaml is not valid YAML"):
        load_config({"config": str(bad)}, {})
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping of settings"):
        load_config({"config": str(listed)}, {})


# --- the shipped example and the documentation ---


def test_example_yaml_loads_and_shows_the_defaults() -> None:
    config = load_config({"config": str(EXAMPLE)}, {})
    assert config.source == EXAMPLE
    assert dataclasses.replace(config, source=None) == AgentConfig()


def test_example_yaml_mentions_every_key() -> None:
    text = EXAMPLE.read_text()
    for setting in SETTINGS:
        assert f"{setting.key.rpartition('.')[2]}:" in text, setting.key


def test_docs_mention_every_key_variable_and_flag() -> None:
    text = DOCS.read_text()
    for setting in SETTINGS:
        for name in (setting.key, setting.env, setting.std_env, setting.flag_name):
            if name:
                assert f"`{name}" in text, name
