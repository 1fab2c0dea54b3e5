"""Live model-file guard: it denies, allows and reports opens of model files made here.

A copy of ``cat`` is the one allow-listed executable; ``/bin/cat`` and this Python process are
outside the allow-list. The rule names only this test's temporary directory, so nothing else on a
shared machine is affected.

The LSM tests need a kernel that loads BPF LSM programs. Where the kernel refuses the load (tried
for real, as ``otel-ebpf doctor`` does), they skip with a reason starting ``BPF LSM programs cannot
load on this kernel:`` and the kernel's answer — the one skip the project allows; any other
reason they cannot run fails them. Audit through syscall tracepoints runs on any kernel.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.probes.lsm import lsm_load_refusal
from tests.conftest import AGENT, REPO
from tests.live.test_gpu_live import _logs
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import OTLPReceiver, latest_total

pytestmark = pytest.mark.bpf
CONTENT = "weights\n"
LSM_SKIP = "BPF LSM programs cannot load on this kernel: "


@pytest.fixture(scope="module")
def bpf_lsm() -> None:
    """Skips only when the kernel answers a real load with a refusal; BTF missing, an unknown
    architecture and the like raise, and fail the test."""
    refused = lsm_load_refusal("file_open")
    if refused is not None:
        pytest.skip(LSM_SKIP + refused)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    models = tmp_path / "models" / "llama"
    models.mkdir(parents=True)
    (models / "weights.gguf").write_text(CONTENT)
    (models / "notes.txt").write_text(CONTENT)
    allowed = tmp_path / "allowed-cat"
    shutil.copy2(shutil.which("cat") or "/bin/cat", allowed)
    return {"model": models / "weights.gguf", "other": models / "notes.txt", "allowed": allowed, "dir": tmp_path}


def _launch(files: dict[str, Path], receiver: OTLPReceiver, mode: str, mechanism: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *AGENT,
            "run",
            "--pid",
            str(os.getpid()),
            "--exporter",
            "otlp",
            "--otlp-endpoint",
            receiver.grpc_endpoint,
            "--ready-file",
            str(files["dir"] / "agent.ready"),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "OTEL_EBPF_MODEL_GUARD": mode,
            "OTEL_EBPF_MODEL_GUARD_MECHANISM": mechanism,
            "OTEL_EBPF_MODEL_GUARD_PATHS": f"{files['dir']}/**/*.gguf",
            "OTEL_EBPF_MODEL_GUARD_ALLOW_EXECUTABLES": str(files["allowed"]),
        },
    )


def _start(files: dict[str, Path], receiver: OTLPReceiver, mode: str, mechanism: str = "lsm") -> subprocess.Popen:
    agent = _launch(files, receiver, mode, mechanism)
    _wait_for_file(files["dir"] / "agent.ready", agent, timeout=90)
    return agent


def _cat(program: Path | str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(program), str(path)], capture_output=True, text=True, timeout=30, check=False)


def _python_open_errno(path: Path) -> int:
    try:
        path.read_text()
    except OSError as exc:
        return exc.errno or -1
    return 0


def _stop(agent: subprocess.Popen) -> None:
    agent.send_signal(signal.SIGINT)
    stderr = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, stderr


def _opens(receiver: OTLPReceiver) -> list[tuple[str, str, bool, str]]:
    records: list[dict[str, Any]] = [r for r in _logs(receiver) if r["event_name"] == "model_guard.file_open"]
    return sorted(
        (
            r["attributes"]["process.executable.name"],
            r["attributes"]["model_guard.decision"],
            r["attributes"]["model_guard.allow_listed"],
            r["attributes"]["file.path"],
        )
        for r in records
    )


def test_enforce_denies_outside_the_allow_list_and_reports_each_open(bpf_lsm: None, files: dict[str, Path]) -> None:
    with OTLPReceiver() as receiver:
        agent = _start(files, receiver, "enforce")
        try:
            allowed = _cat(files["allowed"], files["model"])
            denied = _cat("cat", files["model"])
            python_errno = _python_open_errno(files["model"])
            other = _cat("cat", files["other"])
        finally:
            _stop(agent)
        assert (allowed.returncode, allowed.stdout) == (0, CONTENT)
        assert denied.returncode == 1 and "Operation not permitted" in denied.stderr
        assert python_errno == errno.EPERM
        assert (other.returncode, other.stdout) == (0, CONTENT)  # not a model file: untouched
        after = _cat("cat", files["model"])
        assert (after.returncode, after.stdout) == (0, CONTENT)  # detached with the agent
        model = str(files["model"])
        python = Path("/proc/self/comm").read_text().strip()  # the thread that opened it
        assert receiver.wait_for(lambda r: len(_opens(r)) >= 3, timeout=30)
        assert _opens(receiver) == sorted(
            [("allowed-cat", "allowed", True, model), ("cat", "denied", False, model), (python, "denied", False, model)]
        )
        metrics = receiver.metrics()
        assert latest_total(metrics, "otel_ebpf.model_guard.opens", decision="denied") == 2
        assert latest_total(metrics, "otel_ebpf.model_guard.opens", decision="allowed") == 1


def test_audit_reports_without_denying(bpf_lsm: None, files: dict[str, Path]) -> None:
    with OTLPReceiver() as receiver:
        agent = _start(files, receiver, "audit")
        try:
            read = _cat("cat", files["model"])
        finally:
            _stop(agent)
        assert (read.returncode, read.stdout) == (0, CONTENT)
        assert receiver.wait_for(lambda r: len(_opens(r)) >= 1, timeout=30)
        assert _opens(receiver) == [("cat", "allowed", False, str(files["model"]))]


def test_a_killed_agent_leaves_nothing_enforcing(bpf_lsm: None, files: dict[str, Path]) -> None:
    with OTLPReceiver() as receiver:
        agent = _start(files, receiver, "enforce")
        try:
            assert _cat("cat", files["model"]).returncode == 1
        finally:
            agent.kill()
            agent.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while (result := _cat("cat", files["model"])).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # the kernel drops the link when the last fd of the dead process closes
    assert (result.returncode, result.stdout) == (0, CONTENT)


# An opener that stays alive until told to exit, so that its cwd can still be read in /proc when
# the agent resolves its relative paths.
OPENER = r"""
import sys
for path in sys.argv[1:]:
    try:
        open(path).close()
    except OSError:
        pass
print("opened", flush=True)
sys.stdin.read()
"""


def _tracepoint_opens(receiver: OTLPReceiver) -> list[tuple[str, str, bool, str, str, str]]:
    records = [r for r in _logs(receiver) if r["event_name"] == "model_guard.file_open"]
    return sorted(
        (
            r["attributes"]["process.executable.name"],
            r["attributes"]["model_guard.decision"],
            r["attributes"]["model_guard.allow_listed"],
            r["attributes"]["file.path"],
            r["attributes"]["model_guard.mechanism"],
            "fd" if r["attributes"]["model_guard.result"] >= 0 else r["attributes"]["model_guard.errno"],
        )
        for r in records
    )


def test_audit_through_tracepoints_reports_absolute_and_relative_opens(
    files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside") / "elsewhere.gguf"  # the rule's extension, not its directory
    outside.write_text(CONTENT)
    model, models = files["model"], files["model"].parent
    with OTLPReceiver() as receiver:
        agent = _start(files, receiver, "audit", mechanism="tracepoints")
        try:
            absolute = _cat("cat", model)
            other = _cat("cat", files["other"])
            elsewhere = _cat("cat", outside)
            opener = subprocess.Popen(
                [sys.executable, "-c", OPENER, model.name, "missing.gguf", "../llama/notes.txt"],
                cwd=models,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert opener.stdout is not None and opener.stdout.readline() == "opened\n"
                # while the opener lives: its cwd is what the agent joins "weights.gguf" with
                assert receiver.wait_for(lambda r: len(_tracepoint_opens(r)) >= 3, timeout=60)
            finally:
                opener.communicate(timeout=30)
        finally:
            _stop(agent)
    assert [(r.returncode, r.stdout) for r in (absolute, other, elsewhere)] == [(0, CONTENT)] * 3  # nothing denied
    python = Path(sys.executable).name[:15]
    assert _tracepoint_opens(receiver) == sorted(
        [
            ("cat", "allowed", False, str(model), "tracepoints", "fd"),
            (python, "allowed", False, str(model), "tracepoints", "fd"),  # relative, resolved against the cwd
            (python, "allowed", False, str(models / "missing.gguf"), "tracepoints", "ENOENT"),
        ]
    )
    metrics = receiver.metrics()
    assert latest_total(metrics, "otel_ebpf.model_guard.opens", decision="allowed") == 3
    assert latest_total(metrics, "otel_ebpf.model_guard.opens", decision="denied") == 0
    assert latest_total(metrics, "otel_ebpf.model_guard.records.lost") == 0


def test_enforce_without_bpf_lsm_stops_the_agent_with_the_reason(files: dict[str, Path]) -> None:
    """Where LSM programs load, enforce starts; where the kernel refuses them, the agent stops at
    start and says why and what the kernel needs — it never pretends to enforce."""
    refused = lsm_load_refusal("file_open")
    with OTLPReceiver() as receiver:
        agent = _launch(files, receiver, "enforce", "auto")
        if refused is None:
            _wait_for_file(files["dir"] / "agent.ready", agent, timeout=90)
            _stop(agent)
            return
        stderr = agent.communicate(timeout=90)[1]
    assert agent.returncode == 1
    assert (
        f"otel-ebpf: model_guard enforce needs BPF LSM: {refused}. Enforcing needs a kernel that loads BPF LSM "
        "programs: `bpf` in its lsm= list" in stderr
    )
    assert not (files["dir"] / "agent.ready").exists()
