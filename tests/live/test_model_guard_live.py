"""Live BPF LSM: the model-file guard denies, allows and reports opens of a model file made here.

A copy of ``cat`` is the one allow-listed executable; ``/bin/cat`` and this Python process are
outside the allow-list. The rule names only this test's temporary directory, so nothing else on a
shared machine is affected. Needs a kernel that loads BPF LSM programs: where it does not, the test
fails under CI=true (never a silent skip) and says why.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.probes.lsm import lsm_load_error
from tests.conftest import AGENT, REPO
from tests.live.test_gpu_live import _logs
from tests.live.test_http_live import _wait_for_file
from tests.otlp_receiver import OTLPReceiver, latest_total

pytestmark = pytest.mark.bpf
CONTENT = "weights\n"


@pytest.fixture(scope="module")
def bpf_lsm() -> None:
    reason = lsm_load_error("file_open")
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"BPF LSM test cannot run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    models = tmp_path / "models" / "llama"
    models.mkdir(parents=True)
    (models / "weights.gguf").write_text(CONTENT)
    (models / "notes.txt").write_text(CONTENT)
    allowed = tmp_path / "allowed-cat"
    shutil.copy2(shutil.which("cat") or "/bin/cat", allowed)
    return {"model": models / "weights.gguf", "other": models / "notes.txt", "allowed": allowed, "dir": tmp_path}


def _start(files: dict[str, Path], receiver: OTLPReceiver, mode: str) -> subprocess.Popen:
    ready = files["dir"] / "agent.ready"
    agent = subprocess.Popen(
        [*AGENT, "run", "--pid", str(os.getpid()), "--exporter", "otlp", "--otlp-endpoint", receiver.grpc_endpoint,
         "--ready-file", str(ready)],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OTEL_EBPF_MODEL_GUARD": mode,
             "OTEL_EBPF_MODEL_GUARD_PATHS": f"{files['dir']}/**/*.gguf",
             "OTEL_EBPF_MODEL_GUARD_ALLOW_EXECUTABLES": str(files["allowed"])},
    )
    _wait_for_file(ready, agent, timeout=90)
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
    return sorted((r["attributes"]["process.executable.name"], r["attributes"]["model_guard.decision"],
                   r["attributes"]["model_guard.allow_listed"], r["attributes"]["file.path"]) for r in records)


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
        assert _opens(receiver) == sorted([("allowed-cat", "allowed", True, model), ("cat", "denied", False, model),
                                           (python, "denied", False, model)])
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
