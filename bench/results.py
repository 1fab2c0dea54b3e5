"""Benchmark results as files: ``bench/results/<name>.json``, one per benchmark, rewritten by each run.

Every figure the README quotes comes from one of these files, so a reader can see where it came
from and reproduce it: each file holds the exact command line, the date, the source revision, the
machine (CPUs, kernel, Python) and the figures. Benchmarks call :func:`write_result`;
``python bench/results.py [NAME ...]`` prints the files (``make bench`` ends with it).

``BENCH_RESULTS=DIR`` writes (and reads) the files elsewhere: ``make bench-quick`` uses
``bench/results/quick`` so that short runs never overwrite the figures of a full one.

Usage: ``python bench/results.py [NAME ...]``
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def results_dir() -> Path:
    return Path(os.environ.get("BENCH_RESULTS") or REPO / "bench" / "results")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


REFERENCE_LOOP_STEPS = 2_000_000


def reference_loop_cpu_s() -> float:
    """CPU seconds this machine takes, now, for a fixed pure-Python loop (best of 3): its speed, which
    on a shared host varies from day to day by more than any change to the agent. Absolute figures
    (µs per request) from two results files compare only when these do; ratios measured side by
    side in one run do regardless."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        total = 0
        for step in range(REFERENCE_LOOP_STEPS):
            total += step
        best = min(best, time.process_time() - start)
    return round(best, 3)


def machine() -> dict[str, Any]:
    """What the figures depend on besides the code: CPUs (and how many this process may use),
    kernel, and the CPU's speed at the end of the run."""
    memory_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "memory_gib": round(memory_kb / 2**20, 1),
        "kernel": os.uname().release,
        "arch": os.uname().machine,
        "python": platform.python_version(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "reference_loop_cpu_s": reference_loop_cpu_s(),
    }


def revision() -> dict[str, Any]:
    """The source tree measured: commit, and whether it had uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--", "otel_ebpf", "bpf", "protocols", "bench", "examples")),
    }


def command_line() -> str:
    """This process's command line, as a shell would take it back."""
    return shlex.join([sys.executable, *sys.argv])


def write_result(name: str, command: str | Sequence[str] | None, figures: dict[str, Any]) -> Path:
    """Write ``<results dir>/<name>.json``; ``command`` None means this process's own command line."""
    if command is None:
        command = command_line()
    elif not isinstance(command, str):
        command = shlex.join(command)
    document = {
        "name": name,
        "command": command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "revision": revision(),
        "machine": machine(),
        "figures": figures,
    }
    directory = results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=1, default=str) + "\n")
    tmp.replace(path)
    print(f"[results] wrote {os.path.relpath(path)}", flush=True)
    return path


# --- printing ---


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def _table(rows: list[dict[str, Any]], indent: str) -> list[str]:
    """Records as a table: one line each, or, when they have many fields, one column each."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    if len(keys) <= 8:
        cells = [keys] + [[_cell(row.get(k)) for k in keys] for row in rows]
    else:
        cells = [[key, *(_cell(row.get(key)) for row in rows)] for key in keys]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    return [
        indent
        + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in cells
    ]


def format_figures(figures: Any, indent: str = "  ") -> list[str]:
    """Figures as text: lists of flat records as tables, mappings as ``key: value`` lines."""
    lines: list[str] = []
    for key, value in figures.items():
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) for v in value)
            and not any(isinstance(x, (dict, list)) for v in value for x in v.values())
        ):
            lines += [f"{indent}{key}:", *_table(value, indent + "  ")]
        elif isinstance(value, dict):
            lines += [f"{indent}{key}:", *format_figures(value, indent + "  ")]
        elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            lines.append(f"{indent}{key}: ({len(value)} records, see the file)")
        else:
            lines.append(f"{indent}{key}: {_cell(value) if not isinstance(value, list) else value}")
    return lines


def print_result(path: Path) -> None:
    doc = json.loads(path.read_text())
    m = doc["machine"]
    rev = doc.get("revision") or {}
    print(f"== {doc['name']}  ({os.path.relpath(path)})")
    print(f"  command: {doc['command']}")
    dirty = " + uncommitted changes" if rev.get("dirty") else ""
    print(
        f"  date: {doc['date']}; revision {str(rev.get('commit'))[:12]}{dirty}; "
        f"{m['nproc']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, Python {m['python']}"
    )
    print("\n".join(format_figures(doc["figures"])))


def main(argv: list[str]) -> int:
    paths = sorted(results_dir().glob("*.json")) if not argv else [results_dir() / f"{n}.json" for n in argv]
    if not paths:
        print(f"no results in {results_dir()}: run make bench")
        return 1
    missing = [path for path in paths if not path.exists()]
    for path in paths:
        if path not in missing:
            print_result(path)
            print()
    if missing:
        print(f"no results yet: {', '.join(os.path.relpath(p) for p in missing)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
