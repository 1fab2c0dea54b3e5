"""What the agent costs the syscalls of processes it does not trace, measured side by side in one run.

The syscall tracepoints and the sock tracepoints fire for every process on the node; the agent's
programs there return at once for a process it does not trace, but each run, and each tracepoint's
dispatch around it, is paid by that process. Four workloads, each an untraced child process doing
one kind of I/O in a loop, timed by its own clock:

- ``file``: ``dd bs=1 if=/dev/zero of=/dev/null``: a ``read`` and a ``write`` per byte, no socket;
- ``unix``: a Unix socket pair, one byte ``send`` then ``recv`` (a Python loop);
- ``tcp``: the same over a TCP loopback connection;
- ``getppid``: a syscall no program of the agent is for (a Python loop): what every other syscall
  of the node pays for the tracepoints the agent enabled on all of them.

Arms: no agent; the agent tracing an unrelated idle ``sleep`` (``--pid``); and with ``--before DIR``
the same agent from another source tree (e.g. a worktree of an earlier commit, with its ``bpf/``
and ``protocols/`` linked under its ``otel_ebpf/``). Each round runs every arm once, in rotated
order, so drift on a shared machine hits all of them. Reported per workload and arm: ns per
iteration (median of the rounds) and what the agent adds to the untraced run's.

Usage: ``python bench/untraced_syscalls.py [--iterations N] [--rounds R] [--before DIR]`` (as root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from results import write_result  # noqa: E402
from tls_untraced import AGENT, agent_on_sleep, nothing  # noqa: E402

# One iteration: a one-byte send and the matching receive on a socket pair of KIND (unix, tcp),
# or (getppid) one getppid.
SYSCALL_LOOP = """
import os, socket, sys, time
kind, n = sys.argv[1], int(sys.argv[2])
if kind == "getppid":
    getppid = os.getppid
    start = time.perf_counter_ns()
    for _ in range(n):
        getppid()
    print((time.perf_counter_ns() - start) / n)
    sys.exit()
if kind == "unix":
    a, b = socket.socketpair()
else:
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
send, recv = a.send, b.recv
start = time.perf_counter_ns()
for _ in range(n):
    send(b"x")
    recv(1)
print((time.perf_counter_ns() - start) / n)
"""


def dd_ns(iterations: int) -> float:
    """ns per byte (a read and a write) of ``dd`` copying ``/dev/zero`` to ``/dev/null`` byte by byte."""
    start = time.perf_counter_ns()
    subprocess.run(
        ["dd", "bs=1", f"count={iterations}", "if=/dev/zero", "of=/dev/null"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return (time.perf_counter_ns() - start) / iterations


def loop_ns(kind: str, iterations: int) -> float:
    """ns per iteration of SYSCALL_LOOP's ``kind`` loop, in a child process."""
    out = subprocess.run(
        [sys.executable, "-c", SYSCALL_LOOP, kind, str(iterations)], check=True, capture_output=True, text=True
    )
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=500_000, help="loop iterations per workload and run")
    parser.add_argument(
        "--before",
        type=Path,
        help="also run the agent in this source tree (with its .venv's Python, else this one), --pid sleep",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running every arm once")
    parser.add_argument("--quick", action="store_true", help="one round of a fifth of the iterations")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.rounds = args.iterations // 5, 1
    if os.geteuid() != 0:
        raise SystemExit("the agent attaches eBPF programs: run the benchmark as root")
    workloads: dict[str, Callable[[], float]] = {
        "file (dd: read + write)": lambda: dd_ns(args.iterations),
        "unix socket pair (send + recv)": lambda: loop_ns("unix", args.iterations),
        "tcp loopback (send + recv)": lambda: loop_ns("tcp", args.iterations),
        "other syscalls (getppid)": lambda: loop_ns("getppid", args.iterations),
    }
    arms: dict[str, Callable[[], Iterator[None]]] = {
        "no agent": nothing,
        "agent --pid sleep (this checkout)": lambda: agent_on_sleep(AGENT[:1], REPO),
    }
    if args.before:
        before = args.before.resolve()
        python = before / ".venv" / "bin" / "python"
        arms[f"agent --pid sleep ({before})"] = lambda: agent_on_sleep(
            [str(python) if python.exists() else sys.executable], before
        )
    ns: dict[str, dict[str, list[float]]] = {w: {a: [] for a in arms} for w in workloads}
    names = list(arms)
    for round_no in range(args.rounds):
        for arm in names[round_no % len(names) :] + names[: round_no % len(names)]:
            with arms[arm]():
                for workload, run in workloads.items():
                    ns[workload][arm].append(run())
                    print(
                        f"[bench] round {round_no + 1}/{args.rounds} {arm}, {workload}: "
                        f"{ns[workload][arm][-1]:,.0f} ns per iteration",
                        flush=True,
                    )
    print(f"\n{args.iterations:,} iterations x {args.rounds} round(s), median ns per iteration (added by the agent):")
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for workload, by_arm in ns.items():
        untraced = statistics.median(by_arm["no agent"])
        print(f"  {workload}")
        figures[workload] = {}
        for arm, values in by_arm.items():
            median = statistics.median(values)
            figures[workload][arm] = {"ns_per_iteration": median, "added_ns": median - untraced}
            print(f"    {arm:<60} {median:>8,.0f} ns   {median - untraced:>+7,.0f}")
    write_result(
        "untraced_syscalls", None, {"iterations": args.iterations, "rounds": args.rounds, "workloads": figures}
    )


if __name__ == "__main__":
    main()
