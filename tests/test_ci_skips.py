"""The CI rule of tests/conftest.py: under CI=true a skip fails unless tests/skip_allowlist.txt lists
the test. Checked on a tiny suite run by a real pytest with a copy of that conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import REPO

SUITE = """
import pytest

def test_passes():
    pass

def test_skips():
    pytest.skip("a tool is missing")

@pytest.mark.skipif(True, reason="by marker")
def test_skipif():
    pass

def test_allowed():
    pytest.skip("cannot be installed")

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    pytest.skip("per parameter")

def test_wildcard_one():
    pytest.skip("any of a family")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_xfail():
    raise AssertionError

@pytest.fixture
def missing():
    pytest.skip("from a fixture")

def test_fixture_skips(missing):
    pass
"""

ALLOWLIST = """# comment
tests/test_suite.py::test_allowed | it cannot be installed here
tests/test_suite.py::test_param[1] | the first parameter only: `[` is literal
tests/test_suite.py::test_wildcard_* | a family
"""


def _run(tmp_path: Path, allowlist: str, ci: bool, module_skip: bool = False) -> tuple[int, dict[str, str], str]:
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "skip_allowlist.txt").write_text(allowlist)
    (tests / "test_suite.py").write_text(SUITE)
    if module_skip:
        (tests / "test_module_skip.py").write_text(
            'import pytest\npytest.skip("whole module", allow_module_level=True)\n'
        )
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            f"--junitxml={junit}",
            "tests",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcomes: dict[str, str] = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[case.get("name", "")] = (
                "failed" if {"failure", "error"} & set(kinds) else "skipped" if kinds else "passed"
            )
    return proc.returncode, outcomes, proc.stdout + proc.stderr


def test_outside_ci_a_skip_is_a_skip(tmp_path: Path) -> None:
    rc, outcomes, output = _run(tmp_path, ALLOWLIST, ci=False)
    assert rc == 0, output
    assert outcomes == {
        "test_passes": "passed",
        "test_skips": "skipped",
        "test_skipif": "skipped",
        "test_allowed": "skipped",
        "test_param[1]": "skipped",
        "test_param[2]": "skipped",
        "test_wildcard_one": "skipped",
        "test_xfail": "skipped",
        "test_fixture_skips": "skipped",
    }, output


def test_under_ci_only_the_allow_list_skips(tmp_path: Path) -> None:
    rc, outcomes, output = _run(tmp_path, ALLOWLIST, ci=True)
    assert rc == 1, output
    # an expected failure is no skip: it stays as it is
    assert outcomes == {
        "test_passes": "passed",
        "test_skips": "failed",
        "test_skipif": "failed",
        "test_allowed": "skipped",
        "test_param[1]": "skipped",
        "test_param[2]": "failed",
        "test_wildcard_one": "skipped",
        "test_xfail": "skipped",
        "test_fixture_skips": "failed",
    }, output
    assert (
        "skipped under CI=true, where a test may skip only if skip_allowlist.txt lists it: a tool is missing" in output
    )


def test_under_ci_a_module_skip_fails_collection(tmp_path: Path) -> None:
    rc, _, output = _run(tmp_path, ALLOWLIST, ci=True, module_skip=True)
    assert rc == pytest.ExitCode.INTERRUPTED, output
    assert "ERROR tests/test_module_skip.py - skipped under CI=true" in output
    assert "lists it: whole module" in output, output


def test_an_entry_without_its_reason_is_refused(tmp_path: Path) -> None:
    rc, _, output = _run(tmp_path, "tests/test_suite.py::test_skips\n", ci=True)
    assert rc == pytest.ExitCode.USAGE_ERROR, output
    assert "skip_allowlist.txt:1: expected '<test id pattern> | <why it may skip>'" in output, output


def test_the_allow_list_names_existing_tests() -> None:
    """An entry whose test was renamed or removed would silently allow nothing."""
    for line in (REPO / "tests" / "skip_allowlist.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            path, _, name = line.partition(" | ")[0].partition("::")
            function = name.split("[")[0]
            assert f"def {function}(" in (REPO / path).read_text(), line
