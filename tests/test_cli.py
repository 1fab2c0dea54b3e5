"""The CLI contract that needs no root: configuration errors, help, replay of bad recordings."""

from __future__ import annotations

import os
import subprocess
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


# -- start-up checks: exit 2 before any probe attaches (otel_ebpf/preflight.py) --------------------


def _no_such_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def _run_briefly(*args: str) -> subprocess.CompletedProcess[str]:
    """The agent as a user would start it, bounded in case the check under test let it run."""
    return run_agent_command(*args, "--duration", "3") if args[0] != "replay" else run_agent_command(*args)


def _assert_refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "probes attached" not in result.stderr
    for text in expected:
        assert text in result.stderr


def test_a_pid_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    pid = _no_such_pid()
    result = _run_briefly("run", "--pid", str(os.getpid()), "--pid", str(pid), "--output", str(tmp_path))
    _assert_refused(result, f"otel-ebpf: targets.pids (--pid): no such process: {pid}\n")


def test_a_roce_interface_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "otel-ebpf.yaml"
    config.write_text("roce:\n  interfaces: [lo, nosuch0]\n")
    result = _run_briefly("run", "--config", str(config), "--pid", str(os.getpid()), "--output", str(tmp_path))
    _assert_refused(result, "otel-ebpf: roce.interfaces: no network interface named nosuch0\n")


@pytest.mark.parametrize("where", ["under-a-file", "a-directory", "missing-directory"])
def test_an_unwritable_ready_file_is_refused(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    ready = {
        "under-a-file": tmp_path / "file" / "ready",
        "a-directory": tmp_path / "dir",
        "missing-directory": tmp_path / "missing" / "ready",
    }[where]
    result = _run_briefly(
        "run", "--pid", str(os.getpid()), "--output", str(tmp_path / "out"), "--ready-file", str(ready)
    )
    _assert_refused(result, "otel-ebpf: run.ready_file (--ready-file): ", str(ready))


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--exporter", "file", "--output", "{blocked}/out"],
        ["record", "--output", "{blocked}/events.jsonl"],
        ["run", "--record", "{blocked}/events.jsonl", "--output", "{tmp}/out"],
        ["replay", "{recording}", "--exporter", "file", "--output", "{blocked}/out"],
    ],
)
def test_an_unwritable_output_is_refused(tmp_path: Path, command: list[str]) -> None:
    blocked = tmp_path / "a-file"  # nothing can be created under a regular file, not even by root
    blocked.write_text("")
    recording = Path(__file__).with_name("data") / "golden_events.jsonl"
    args = [a.format(blocked=blocked, tmp=tmp_path, recording=recording) for a in command]
    if command[0] != "replay":
        args += ["--pid", str(os.getpid())]
    _assert_refused(_run_briefly(*args), str(blocked))
