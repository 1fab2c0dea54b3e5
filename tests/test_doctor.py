"""``otel-ebpf doctor``: the real checks on this machine, and the report built from hand-made results."""

from __future__ import annotations

import io
import os

import pytest

from otel_ebpf import doctor
from otel_ebpf.doctor import CheckResult
from otel_ebpf.probes.lsm import lsm_load_error


@pytest.mark.bpf
def test_real_checks_required_pass_as_root() -> None:
    """As root (the ``bpf`` marker guarantees it, or fails in CI), every required check passes: the
    BPF tests rely on exactly this setup, so a failure here explains theirs."""
    assert os.geteuid() == 0
    results = doctor.run_checks()
    names = [r.name for r in results]
    assert len(names) == len(set(names)), "check names must be unique"
    required = ("privileges", "kernel version", "tracefs", "kernel headers", "bcc module")
    assert set(required) <= set(names) and "BCC compile + ring buffer" in names
    for r in results:
        assert r.detail, f"{r.name} has no detail"
        if not r.ok:
            assert r.fix, f"failing check {r.name} names no fix"
    failed = [f"{r.name}: {r.detail}" for r in results if r.required and not r.ok]
    assert not failed, "required checks failed:\n" + "\n".join(failed)
    assert doctor.print_report(results, io.StringIO()) == 0
    # TLS: the system OpenSSL can be hooked; grpcio's BoringSSL (a test dependency) cannot
    by_name = {r.name: r for r in results}
    assert by_name["TLS (OpenSSL)"].ok and "libssl" in by_name["TLS (OpenSSL)"].detail
    assert not by_name["TLS (grpcio)"].ok and not by_name["TLS (grpcio)"].required
    assert "cygrpc" in by_name["TLS (grpcio)"].detail


def test_report_all_ok_exits_zero() -> None:
    results = [
        CheckResult("a", True, "fine", "never shown"),
        CheckResult("bb", True, "fine too", required=False),
    ]
    out = io.StringIO()
    assert doctor.print_report(results, out) == 0
    text = out.getvalue()
    assert "[ OK ] a   fine" in text
    assert "never shown" not in text
    assert "2 ok, 0 warning(s), 0 required failed: the agent can run here" in text


def test_report_optional_failure_warns_but_exits_zero() -> None:
    results = [
        CheckResult("kernel", True, "6.18"),
        CheckResult("btf", False, "missing", "boot another kernel", required=False),
    ]
    out = io.StringIO()
    assert doctor.print_report(results, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[1] == "[WARN] btf     missing"
    assert lines[2] == " " * 15 + "fix: boot another kernel"
    assert lines[-1] == "1 ok, 1 warning(s), 0 required failed: the agent can run here"


def test_report_required_failure_exits_one_with_fix_and_multiline_detail() -> None:
    results = [
        CheckResult("compile", False, "failed (exit 1):\nerror: no such file\n1 error generated.", "make it"),
        CheckResult("btf", False, "missing", "boot another kernel", required=False),
        CheckResult("tracefs", True, "mounted"),
    ]
    out = io.StringIO()
    assert doctor.print_report(results, out) == 1
    lines = out.getvalue().splitlines()
    pad = " " * (len("compile") + 9)
    assert lines[:4] == [
        "[FAIL] compile  failed (exit 1):",
        pad + "error: no such file",
        pad + "1 error generated.",
        pad + "fix: make it",
    ]
    assert lines[-1] == "1 ok, 1 warning(s), 1 required failed: the agent cannot run here"


def test_probe_failure_reports_the_tail_of_stderr() -> None:
    """A compiler error is long: the report keeps its end, where the real error is."""
    script = "import sys\nfor i in range(40): print(f'line {i}', file=sys.stderr)\nsys.exit(3)"
    r = doctor._run_probe("probe", script, "the fix", required=True)  # noqa: SLF001 — the runner on its own
    assert not r.ok and r.required and r.fix == "the fix"
    assert r.detail.startswith("failed (exit 3):")
    assert "line 39" in r.detail and "line 0\n" not in r.detail
    assert len(r.detail.splitlines()) == doctor.TAIL_LINES + 1


def test_probe_success_reports_stdout() -> None:
    r = doctor._run_probe("probe", "print('3 events received')", "fix", required=False)  # noqa: SLF001
    assert r.ok and r.detail == "3 events received"


@pytest.mark.parametrize(
    ("release", "expected"),
    [("6.18.44-fc-v857", (6, 18)), ("5.8.0", (5, 8)), ("4.19.0-27-amd64", (4, 19)), ("garbage", (0, 0))],
)
def test_kernel_version(release: str, expected: tuple[int, int]) -> None:
    assert doctor.kernel_version(release) == expected


def test_effective_caps_parses_capeff() -> None:
    # This container's mask: everything up to CAP_CHECKPOINT_RESTORE except CAP_SYS_RESOURCE (24).
    caps = doctor.effective_caps("Name:\tx\nCapEff:\t000001fffeffffff\n")
    assert caps == {"CAP_SYS_PTRACE", "CAP_SYS_ADMIN", "CAP_PERFMON", "CAP_BPF"}
    assert doctor.effective_caps("CapEff:\t0000000000000000\n") == set()


def test_bpf_lsm_load_check_is_skipped_without_bpf_lsm_and_names_the_kernel_answer() -> None:
    skipped = doctor.check_bpf_lsm_load(False)
    assert (skipped.ok, skipped.required, skipped.detail) == (False, False, "skipped: BPF LSM not active")
    assert lsm_load_error("no_such_hook") == "function bpf_lsm_no_such_hook not in the kernel's BTF"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(doctor.BTF_VMLINUX), reason="loads BPF: root and BTF")
def test_bpf_lsm_load_check_reports_what_the_kernel_said() -> None:
    result = doctor.check_bpf_lsm_load(True)
    error = lsm_load_error("file_open")
    assert result.ok == (error is None) and not result.required
    assert result.detail == (doctor.LSM_LOADS if error is None else f"{error} ({doctor.LSM_REFUSED})")
