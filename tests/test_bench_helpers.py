"""The benchmarks' own arithmetic (bench/harness.py, bench/results.py, bench/kernel_profile.py,
bench/large_transfer.py): what ``make bench`` reports must be right before anyone trusts it. No
root, no BPF: metric totals over cumulative and delta points, span counting in OTLP JSON lines, the
results file, and where a perf profile's samples go."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))  # bench/ is no package
import harness
import kernel_profile
import results


def _point(
    value: float,
    time_ns: int,
    temporality: str,
    *,
    pid: int = 1,
    attributes: dict | None = None,
    start_ns: int = 0,
    histogram: bool = False,
) -> dict:
    point = {
        "type": "histogram" if histogram else "sum",
        "resource": {"process.pid": pid},
        "attributes": attributes or {},
        "start_ns": start_ns,
        "time_ns": time_ns,
        "temporality": temporality,
    }
    point["count" if histogram else "value"] = value
    return point


def test_cumulative_points_count_their_latest_value_per_series() -> None:
    points = [
        _point(5, 1, "CUMULATIVE"),
        _point(9, 3, "CUMULATIVE"),
        _point(7, 2, "CUMULATIVE"),
        _point(4, 3, "CUMULATIVE", attributes={"reason": "x"}),
        _point(2, 3, "CUMULATIVE", pid=2),
        _point(3, 9, "CUMULATIVE", start_ns=5),
    ]  # the series restarted: a new start time
    assert harness.metric_total(points) == 9 + 4 + 2 + 3
    assert harness.metric_total(points, lambda p: p["resource"]["process.pid"] == 2) == 2


def test_delta_points_add_up_and_histograms_count() -> None:
    points = [
        _point(5, 1, "DELTA", histogram=True),
        _point(7, 2, "DELTA", histogram=True),
        _point(11, 2, "CUMULATIVE", histogram=True, pid=3),
    ]
    assert harness.metric_total(points) == 5 + 7 + 11


def test_a_missing_self_metric_counts_zero() -> None:
    assert harness.self_counter({}, "otel_ebpf.spans.shed") == 0


def _resource_spans(pid: int, spans: list[dict]) -> dict:
    return {
        "resource": {"attributes": [{"key": "process.pid", "value": {"intValue": str(pid)}}]},
        "scopeSpans": [{"spans": spans}],
    }


def test_span_counts_by_process_kind_status_and_exit(tmp_path: Path) -> None:
    exited = [
        {"key": "error.type", "value": {"stringValue": "response_missing"}},
        {"key": "otel_ebpf.process.exited", "value": {"boolValue": True}},
    ]
    lines = [
        {
            "resourceSpans": [
                _resource_spans(10, [{"kind": 2}, {"kind": 2, "status": {"code": 2}}]),
                _resource_spans(
                    20, [{"kind": 3, "status": {}}, {"kind": 3, "status": {"code": 2}, "attributes": exited}]
                ),
            ]
        },
        {"resourceSpans": [_resource_spans(10, [{"kind": 2}])]},
    ]
    traces = tmp_path / "traces.jsonl"
    traces.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert harness.span_counts(traces) == {
        (10, 2, 0, False): 2,
        (10, 2, 2, False): 1,
        (20, 3, 0, False): 1,
        (20, 3, 2, True): 1,
    }
    assert harness.span_counts(tmp_path / "absent.jsonl") == {}


def test_large_transfer_counts_spans_by_side_and_body_size(tmp_path: Path) -> None:
    import large_transfer

    def sized(kind: int, size: int | None) -> dict:
        attributes = [] if size is None else [{"key": "http.response.body.size", "value": {"intValue": str(size)}}]
        return {"kind": kind, "attributes": attributes}

    line = {
        "resourceSpans": [
            _resource_spans(10, [sized(2, 100), sized(2, 100), sized(2, None), sized(1, 5)]),  # nginx; one INTERNAL
            _resource_spans(20, [sized(3, 100), sized(2, 7)]),  # curl, and a server that is not nginx
        ]
    }
    traces = tmp_path / "traces.jsonl"
    traces.write_text(json.dumps(line) + "\n")
    assert large_transfer.spans_by_size(traces, {10}) == {
        ("server", 100): 2,
        ("server", None): 1,
        ("client", 100): 1,
        ("client", 7): 1,
    }


def test_wrk_output_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    out = """Running 2s test @ http://127.0.0.1:1/
  1 threads and 16 connections
  Latency Distribution
     50%  152.00us
     99%    7.99ms
  93659 requests in 2.01s, 13.40MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  46583.05
"""

    class FakeWrk:
        pid, returncode = 4321, 0

        def __init__(self, command: list[str], **kwargs: object) -> None:
            FakeWrk.command, FakeWrk.env = command, kwargs["env"]

        def communicate(self) -> tuple[str, str]:
            return out, ""

    monkeypatch.setattr(harness.subprocess, "Popen", FakeWrk)
    run = harness.wrk("http://127.0.0.1:1/", 2, 16, rate=5000)
    assert (run.requests, run.rps, run.non_2xx, run.socket_errors, run.wrk_pid) == (93659, 46583.05, 5, 3, 4321)
    assert (run.p50_ms, run.p99_ms) == (pytest.approx(0.152), pytest.approx(7.99))
    assert FakeWrk.command[1:3] == ["-s", str(harness.PACING_SCRIPT)] and FakeWrk.env["WRK_RATE"] == "5000"


def test_results_file_has_command_date_machine_and_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path))
    path = results.write_result(
        "demo", ["python", "bench/demo.py", "--quick"], {"loads": [{"offered": "max", "ratio": 0.9}], "note": "x"}
    )
    doc = json.loads(path.read_text())
    assert path == tmp_path / "demo.json"
    assert doc["command"] == "python bench/demo.py --quick"
    assert doc["date"] and doc["machine"]["nproc"] >= 1 and doc["machine"]["kernel"]
    assert doc["figures"] == {"loads": [{"offered": "max", "ratio": 0.9}], "note": "x"}
    assert results.main(["demo"]) == 0
    printed = capsys.readouterr().out
    assert "python bench/demo.py --quick" in printed and "0.9" in printed
    assert results.main(["absent"]) == 1


# `perf script -F comm,ip,sym`: a sample's command, then its stack from the leaf, one frame a line
PERF_SCRIPT = """nginx
\tffffffff81000001 read_tsc
\tffffffff81000002 ktime_get_mono_fast_ns
\tffffffffa0000003 bpf_prog_0123456789abcdef_tracepoint__syscalls__sys_enter_read
\tffffffff81000004 trace_call_bpf
\tffffffff81000005 perf_syscall_enter

wrk
\tffffffffa0000006 bpf_prog_fedcba9876543210_tracepoint__syscalls__sys_exit_read
\tffffffff81000004 trace_call_bpf

wrk
\tffffffff81000007 copy_from_user_nofault
\tffffffffa0000006 bpf_prog_fedcba9876543210_tracepoint__syscalls__sys_exit_read

nginx
\tffffffff81000008 perf_syscall_exit

wrk
\tffffffff81000009 tcp_sendmsg

wrk
\tffffffff81000007 copy_from_user_nofault
\tffffffffa000000a bpf_prog_00112233445566aa_raw_tracepoint__sock_recv_length
\tffffffff8100000b bpf_trace_run3

nginx
\tffffffff8100000b bpf_trace_run3

python3
\tffffffffa0000006 bpf_prog_fedcba9876543210_tracepoint__syscalls__sys_exit_read
"""


def test_profile_samples_go_to_their_program_and_what_it_called() -> None:
    total, places, groups = kernel_profile.attribute(kernel_profile.samples(PERF_SCRIPT.splitlines()))
    assert total == 7  # nginx's and wrk's, not the reader's (python3)
    assert places == {
        "syscalls:sys_enter_read": 1,
        "syscalls:sys_exit_read": 2,
        "sock_recv_length": 1,  # a raw tracepoint's program
        "tracepoint dispatch": 2,
        "nginx and wrk": 1,
    }
    assert groups == {
        ("syscalls:sys_enter_read", "clock"): 1,
        ("syscalls:sys_exit_read", "program code"): 1,
        ("syscalls:sys_exit_read", "user-memory reads"): 1,
        ("sock_recv_length", "user-memory reads"): 1,
    }
