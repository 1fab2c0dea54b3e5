"""Replay: a recorded event stream gives exactly the expected spans and metrics (golden files).

``data/golden_events.jsonl`` was recorded live with ``otel-ebpf record --port P`` while curl and
``http.client`` talked to ``tests/live/http_workload.py serve`` (keep-alive, chunked, large body,
POST with a secret in the query, 404, 500). ``data/golden_spans.json`` and
``data/golden_metrics.json`` are what replaying it must produce, to the nanosecond and the id;
after an intended output change, regenerate them with ``UPDATE_GOLDEN=1 make test``
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import run_agent_command
from tests.otlp_receiver import load_file_metrics, load_file_spans

DATA = Path(__file__).with_name("data")


def _check(name: str, got: object) -> None:
    path = DATA / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


def test_replay_matches_golden_output(tmp_path: Path) -> None:
    result = run_agent_command(
        "replay", str(DATA / "golden_events.jsonl"), "--exporter", "file", "--output", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    spans = sorted(load_file_spans(tmp_path / "traces.jsonl"), key=lambda s: (s["start_ns"], s["span_id"]))
    assert len(spans) == 16  # 8 requests, each seen by its client and by the server
    _check("golden_spans.json", spans)
    metrics = load_file_metrics(tmp_path / "metrics.jsonl")
    http_metrics = {name: points for name, points in metrics.items() if name.startswith("http.")}
    _check("golden_metrics.json", http_metrics)
    assert not any("abc" in json.dumps(s) for s in spans)  # ?token=abc is redacted everywhere
