"""Cgroup v2 ids named by their paths: a walk of the hierarchy, remembered."""

from __future__ import annotations

from pathlib import Path

from otel_ebpf.cgroups import CgroupPaths


def test_ids_are_named_by_their_directories_path(tmp_path: Path) -> None:
    (tmp_path / "kubepods.slice" / "pod-a").mkdir(parents=True)
    (tmp_path / "system.slice").mkdir()
    (tmp_path / "cgroup.procs").write_text("")  # files are not cgroups
    paths = CgroupPaths(tmp_path)
    assert paths.path((tmp_path / "kubepods.slice" / "pod-a").stat().st_ino) == "/kubepods.slice/pod-a"
    assert paths.path(tmp_path.stat().st_ino) == "/"
    assert paths.path((tmp_path / "cgroup.procs").stat().st_ino) == ""
    # remembered: found without walking again, even once the directory is gone
    system = (tmp_path / "system.slice").stat().st_ino
    assert paths.path(system) == "/system.slice"
    (tmp_path / "system.slice").rmdir()
    assert paths.path(system) == "/system.slice"


def test_what_is_remembered_and_walked_is_bounded(tmp_path: Path) -> None:
    for name in "abcdef":
        (tmp_path / name).mkdir()
    paths = CgroupPaths(tmp_path, max_known=3, max_walk=2)  # the root and one child
    assert paths.path((tmp_path / "f").stat().st_ino) in ("/f", "")
    assert len(paths._known) <= 3  # noqa: SLF001 — the bound itself
    paths = CgroupPaths(tmp_path, max_known=3)
    for name in "abcdef":
        assert paths.path((tmp_path / name).stat().st_ino) == f"/{name}"
    assert len(paths._known) <= 3  # noqa: SLF001
