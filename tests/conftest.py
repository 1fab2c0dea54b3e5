"""Shared fixtures. BPF tests: in CI (CI=true) a BPF test that cannot run fails, never skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, "-m", "otel_ebpf.cli"]


def _bpf_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "BPF tests need root"
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        return f"bcc is not importable ({exc}); run scripts/bootstrap.sh"
    if not Path("/sys/kernel/tracing/events/syscalls").is_dir():
        return "tracefs is not mounted at /sys/kernel/tracing; run scripts/bootstrap.sh"
    if shutil.which("curl") is None:
        return "curl is not installed; run scripts/bootstrap.sh"
    return None


@pytest.fixture(scope="session")
def bpf_available() -> None:
    reason = _bpf_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"BPF test cannot run in CI: {reason}")
    pytest.skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("bpf") and "bpf_available" not in item.fixturenames:
            item.fixturenames.insert(0, "bpf_available")


@pytest.fixture
def agent_cmd() -> list[str]:
    return list(AGENT)


def run_agent_command(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AGENT, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=REPO
    )
