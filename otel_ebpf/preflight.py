"""Start-up checks of what the agent will trace and write, made before any probe attaches.

Compiling and attaching the probes takes seconds; a mistyped ``--pid`` or an unwritable path found
after that ends in a traceback, or worse in a run that traces nothing and says it is ready. Each
check here raises :class:`StartupError`, which the CLI reports in one line with exit code 2, the
code of every other mistake in how the agent was asked to run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .config import AgentConfig


class StartupError(Exception):
    """The agent cannot run as asked; the message names the setting and the problem."""


def check_start(config: AgentConfig, record_path: str | None, export: bool = True) -> None:
    """Every ``targets.pids`` process and ``roce.interfaces`` interface exists and every path the
    run writes is writable; a ready file left by an earlier run (killed before it could remove it)
    is removed, so that a script waiting for it does not see "ready" before this run is."""
    gone = exited(config.targets.pids)
    if gone:
        raise StartupError(f"targets.pids (--pid): no such process: {', '.join(map(str, gone))}")
    missing = [name for name in config.roce.interfaces if not Path("/sys/class/net", name).is_dir()]
    if missing:
        raise StartupError(f"roce.interfaces: no network interface named {', '.join(missing)}")
    check_outputs(config, record_path, export)


def check_outputs(config: AgentConfig, record_path: str | None, export: bool = True) -> None:
    """The file exporter's directory (when exporting), the recording and the ready file can be
    written."""
    if export and "file" in config.exporters and not config.export.disabled:
        output = config.file.output_dir
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"file.output_dir (--output): cannot create {output}: {exc.strerror or exc}") from None
        _check_writable(output, output, "file.output_dir (--output)")
    if record_path is not None:
        try:
            with open(record_path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise StartupError(f"--record/--output: cannot write {record_path}: {exc.strerror or exc}") from None
    ready = config.run.ready_file
    if ready is not None:
        if ready.is_dir():
            raise StartupError(f"run.ready_file (--ready-file): {ready} is a directory")
        try:
            ready.unlink(missing_ok=True)
        except OSError as exc:
            raise StartupError(
                f"run.ready_file (--ready-file): cannot remove the stale {ready}: {exc.strerror or exc}"
            ) from None
        _check_writable(ready.parent, ready, "run.ready_file (--ready-file)")


def exited(pids: Iterable[int]) -> list[int]:
    """The processes of ``pids`` that do not exist or have exited (a zombie never runs again)."""
    gone = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            gone.append(pid)
            continue
        # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")"
        if stat[stat.rfind(")") + 2 :][:1] in ("Z", "X"):
            gone.append(pid)
    return gone


def write_ready_file(path: Path) -> None:
    """The agent's pid into ``path``, atomically: a script never reads it half written."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as stream:
            stream.write(f"{os.getpid()}\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _check_writable(directory: Path, target: Path, setting: str) -> None:
    """Create and remove a file in ``directory`` (where ``target`` goes): the one check that covers
    every reason (mode bits, a read-only file system, a missing directory); ``os.access`` answers
    for the real uid."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise StartupError(f"{setting}: cannot write {target}: {exc.strerror or exc}") from None
