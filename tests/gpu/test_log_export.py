"""Leak reports leave as OTLP log records: logs.jsonl (file exporter) and OTLP gRPC/HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource

from otel_ebpf.config import load_config
from otel_ebpf.exporters.file import LOGS_FILE, from_json_line
from otel_ebpf.exporters.logs import build_log_sink
from otel_ebpf.gpu.views import SCOPE
from otel_ebpf.selfmetrics import SelfMetrics
from tests.otlp_receiver import OTLPReceiver, _attributes


def _record(i: int) -> ReadableLogRecord:
    record = LogRecord(
        timestamp=1_000 + i,
        observed_timestamp=1_000 + i,
        severity_text="WARN",
        severity_number=SeverityNumber.WARN,
        body=f"leak {i}",
        attributes={"code.function.name": "leaky", "cuda.memory.leak.size": 1024 * i},
        event_name="cuda.memory.leak",
    )
    return ReadableLogRecord(record, Resource({"service.name": "trainer", "process.pid": 42}), SCOPE)


def _lines(path: Path) -> list[ExportLogsServiceRequest]:
    return [from_json_line(line, ExportLogsServiceRequest()) for line in path.read_text().splitlines()]


def test_file_exporter_writes_logs_jsonl(tmp_path: Path) -> None:
    metrics = SelfMetrics()
    sink = build_log_sink(load_config({"exporter": ["file"], "output": str(tmp_path)}, {}), metrics)
    sink.export([_record(1), _record(2)])
    sink.shutdown(5)
    requests = _lines(tmp_path / LOGS_FILE)
    records = [r for req in requests for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    assert [r.body.string_value for r in records] == ["leak 1", "leak 2"]
    assert _attributes(records[1].attributes) == {"code.function.name": "leaky", "cuda.memory.leak.size": 2048}
    assert records[0].event_name == "cuda.memory.leak" and records[0].severity_number == SeverityNumber.WARN.value
    resource = _attributes(requests[0].resource_logs[0].resource.attributes)
    assert resource == {"service.name": "trainer", "process.pid": 42}
    assert requests[0].resource_logs[0].scope_logs[0].scope.name == "otel_ebpf.gpu"
    assert metrics.total("otel_ebpf.logs.exported") == 2 and metrics.total("otel_ebpf.logs.dropped") == 0


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_exporter_sends_logs(protocol: str) -> None:
    with OTLPReceiver() as receiver:
        endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
        config = load_config({"exporter": ["otlp"], "otlp_endpoint": endpoint, "otlp_protocol": protocol}, {})
        sink = build_log_sink(config, SelfMetrics())
        sink.export([_record(3)])
        sink.shutdown(10)
        assert receiver.wait_for(lambda r: bool(r.requests("logs")), timeout=10)
        (request,) = receiver.requests("logs")
    assert request.resource_logs[0].scope_logs[0].log_records[0].body.string_value == "leak 3"


def test_a_dead_backend_drops_and_counts() -> None:
    metrics = SelfMetrics()
    config = load_config(
        {"exporter": ["otlp"], "otlp_endpoint": "http://127.0.0.1:9", "otlp_protocol": "http/protobuf"},
        {"OTEL_EXPORTER_OTLP_TIMEOUT": "200"},
    )
    sink = build_log_sink(config, metrics)
    sink.export([_record(1)])
    sink.shutdown(3)
    assert metrics.total("otel_ebpf.logs.dropped") == 1 and metrics.total("otel_ebpf.logs.exported") == 0


def test_disabled_export_builds_no_exporter(tmp_path: Path) -> None:
    config = load_config({"exporter": ["file"], "output": str(tmp_path)}, {"OTEL_SDK_DISABLED": "true"})
    sink = build_log_sink(config, SelfMetrics())
    sink.export([_record(1)])
    sink.shutdown(1)
    assert not (tmp_path / LOGS_FILE).exists()
