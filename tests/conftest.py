"""Shared fixtures. In CI (CI=true) no test skips: a skip fails, unless the test is on
tests/skip_allowlist.txt; so a BPF test that cannot run there fails too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, "-m", "otel_ebpf.cli"]
SKIP_ALLOWLIST = Path(__file__).with_name("skip_allowlist.txt")


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
    if reason is not None:
        pytest.skip(reason)  # a failure under CI=true (pytest_runtest_makereport)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("bpf") and "bpf_available" not in item.fixturenames:
            item.fixturenames.insert(0, "bpf_available")


def _skip_allowlist() -> list[re.Pattern[str]]:
    """The allow-list's test ids; `*` matches anything (`[` is literal: test ids carry parameters)."""
    patterns = []
    for number, line in enumerate(SKIP_ALLOWLIST.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        pattern, _, why = line.partition(" | ")
        if not why.strip():
            raise pytest.UsageError(f"{SKIP_ALLOWLIST}:{number}: expected '<test id pattern> | <why it may skip>'")
        patterns.append(re.compile(".*".join(map(re.escape, pattern.strip().split("*")))))
    return patterns


def _fail_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """A skip hides a check CI was meant to make: under CI=true it fails, unless allow-listed."""
    if not report.skipped or hasattr(report, "wasxfail") or os.environ.get("CI") != "true":
        return
    if any(pattern.fullmatch(report.nodeid) for pattern in _skip_allowlist()):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where a test may skip only if {SKIP_ALLOWLIST.name} lists it: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


@pytest.fixture
def agent_cmd() -> list[str]:
    return list(AGENT)


def run_agent_command(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AGENT, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=REPO
    )
