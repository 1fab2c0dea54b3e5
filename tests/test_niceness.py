"""The agent's niceness reaches every thread, and a refused change says so (otel_ebpf/niceness.py).

Each case runs in a child process of its own, whose priority the test suite can lose."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

# threads started before the change (then, with a uid argument, every thread drops root), each
# niceness set in turn, then every thread's niceness (stat field 19)
PROGRAM = """
import os, sys, threading
from pathlib import Path
from otel_ebpf.niceness import set_niceness
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(3)]
for thread in threads:
    thread.start()
uid, *values = sys.argv[1:]
if uid:
    os.setuid(int(uid))
done = [set_niceness(int(value)) for value in values]
nices = [int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]) for task in Path("/proc/self/task").iterdir()]
stop.set()
print(*done, *nices)
"""


def _run(*values: int, uid: int | None = None) -> list[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, "" if uid is None else str(uid), *map(str, values)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_every_thread_gets_the_niceness() -> None:
    assert _run(7) == ["True"] + ["7"] * 4


def test_going_back_without_cap_sys_nice_is_refused() -> None:
    """Raising it is always allowed; lowering it again needs CAP_SYS_NICE, which root has: the
    child then drops to nobody first."""
    assert _run(7, 0, uid=65534 if os.geteuid() == 0 else None) == ["True", "False"] + ["7"] * 4
