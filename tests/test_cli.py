"""The CLI contract that needs no root: configuration errors, help, replay of bad recordings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_agent_command


@pytest.mark.parametrize(
    ("yaml_text", "env", "named"),
    [
        ("capture:\n  payload_cap: 40000\n", {}, "capture.payload_cap"),
        ("capture:\n  payload_cpa: 4096\n", {}, "capture.payload_cpa"),
        ("", {"OTEL_EBPF_PORTS": "80,99999"}, "OTEL_EBPF_PORTS"),
        ("", {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ],
)
def test_invalid_configuration_exits_2_naming_the_key(tmp_path: Path, yaml_text: str, env: dict, named: str) -> None:
    config = tmp_path / "otel-ebpf.yaml"
    config.write_text(yaml_text)
    result = run_agent_command("run", "--config", str(config), "--duration", "1", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith(f"otel-ebpf: invalid configuration: {named}:")


def test_replay_of_a_file_that_is_not_a_recording(tmp_path: Path) -> None:
    bogus = tmp_path / "events.jsonl"
    bogus.write_text("GET / HTTP/1.1\n")
    result = run_agent_command("replay", str(bogus), "--exporter", "file", "--output", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "line 1: not a recording header" in result.stderr


def test_replay_of_a_truncated_recording_exports_what_came_before(tmp_path: Path) -> None:
    golden = (Path(__file__).with_name("data") / "golden_events.jsonl").read_text().splitlines()
    truncated = tmp_path / "cut.jsonl"
    truncated.write_text("\n".join(golden[:-5]) + "\n" + golden[-5][: len(golden[-5]) // 2])
    result = run_agent_command("replay", str(truncated), "--exporter", "file", "--output", str(tmp_path / "out"))
    assert result.returncode == 1
    assert f"line {len(golden) - 4}:" in result.stderr
    assert (tmp_path / "out" / "traces.jsonl").read_text().count('"spans"') >= 1
