"""Live BPF: ``otel-ebpf record`` then ``otel-ebpf replay``, the way a bug report is made.

The recording is taken from a real server and curl, with no exporter; replaying it must give the
spans of those requests, and the recorder's log must say what the kernel lost meanwhile (a recording
has no self-metrics of its own).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO, run_agent_command
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import load_file_spans

pytestmark = pytest.mark.bpf
WORKLOAD = [sys.executable, str(Path(__file__).with_name("http_workload.py"))]
PATHS = {"/items/1": 200, "/items/2": 200, "/missing": 404}


def test_a_recording_replays_into_the_spans_of_what_it_saw(tmp_path: Path) -> None:
    server = subprocess.Popen([*WORKLOAD, "serve", str(tmp_path / "port")])
    recorder = None
    try:
        port = _wait_for_file(tmp_path / "port", server)
        recorder = subprocess.Popen(
            [
                *AGENT,
                "record",
                "--pid",
                str(server.pid),
                "--output",
                str(tmp_path / "events.jsonl"),
                "--ready-file",
                str(tmp_path / "ready"),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for_file(tmp_path / "ready", recorder)
        for path in PATHS:
            subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}{path}"], check=True, timeout=30)
        recorder.send_signal(signal.SIGINT)
        stderr = recorder.communicate(timeout=60)[1]
        assert recorder.returncode == 0, stderr
    finally:
        for proc in (server, recorder):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "kernel drop counters: {'ringbuf_full': 0" in stderr

    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["format"] == "otel-ebpf-events"
    assert sum(json.loads(line).get("type") == "ConnData" for line in lines[1:]) >= 2 * len(PATHS)

    replay = run_agent_command(
        "replay", str(tmp_path / "events.jsonl"), "--exporter", "file", "--output", str(tmp_path / "out"), timeout=120
    )
    assert replay.returncode == 0, replay.stderr
    spans = load_file_spans(tmp_path / "out")
    assert Counter(
        (s["attributes"]["url.path"], s["attributes"]["http.response.status_code"]) for s in spans
    ) == Counter(PATHS.items())
    assert {s["kind"] for s in spans} == {"SERVER"} and {s["resource"]["process.pid"] for s in spans} == {server.pid}
