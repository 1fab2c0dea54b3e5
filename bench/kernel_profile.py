"""What the socket probe's programs spend their time on: the clock, map lookups, user-memory
reads, the ring buffer, or their own code; and what the tracepoints cost around them.

The load of ``bench/kernel_cost.py`` (nginx with one worker, ``wrk -t1 -c16``, the probe on
nginx's port, a thread reading and dropping the ring), profiled system-wide by ``perf record -g``
(``perf`` is Debian's ``linux-perf``). Every sample taken in nginx or ``wrk`` is attributed:

- inside a BPF program (a ``bpf_prog_*`` frame on its stack): to that program, and by the kernel
  function at the top of the stack to one of the groups below;
- in a tracepoint's dispatch but no program (``perf_syscall_{enter,exit}``, ``perf_trace_*``,
  ``trace_call_bpf``; a raw tracepoint's ``bpf_trace_run3``): to the dispatch, the record the
  kernel fills before it runs a program;
- elsewhere: to nginx and ``wrk`` themselves.

Shares are of nginx's and ``wrk``'s samples, so they read as "of the work that serves the
requests". ``bench/kernel_cost.py`` gives ns per run; this says where inside a run they go.

Usage: ``python bench/kernel_profile.py [--quick] [--duration S] [--rate N]`` (as root; ``--rate``
0, the default, is as fast as possible)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from harness import parse_live_args, print_columns, wrk  # noqa: E402
from kernel_cost import probed_nginx  # noqa: E402
from nginx_load import CONNECTIONS  # noqa: E402
from results import write_result  # noqa: E402

LOAD_COMMANDS = ("nginx", "wrk")
# The kernel function a sample inside a program was in, by group; the rest is the program's own code.
GROUPS = {
    "clock": ("read_tsc", "ktime_get_mono_fast_ns", "bpf_ktime_get_ns"),
    "map lookups": (
        "htab_map_hash",
        "lookup_nulls_elem_raw",
        "__htab_map_lookup_elem",
        "htab_lru_map_lookup_elem",
        "htab_percpu_map_lookup_elem",
        "bpf_task_storage_get",
        "bpf_task_storage_get_recur",
        "bpf_local_storage_lookup",
        "array_map_lookup_elem",
        "percpu_array_map_lookup_elem",
        "bpf_map_lookup_elem",
        "memcmp",  # a hash bucket's key comparison
    ),
    "map updates": ("htab_map_update_elem", "htab_lru_map_update_elem", "alloc_htab_elem", "bpf_lru_pop_free"),
    "user-memory reads": (
        "copy_from_user_nofault",
        "__check_object_size",
        "check_stack_object",
        "__virt_addr_valid",
        "is_vmalloc_addr",
        "nmi_uaccess_okay",
        "bpf_probe_read_user",
        "bpf_probe_read_compat",
    ),
    "ring buffer": (
        "bpf_ringbuf_output",
        "__pi_memcpy",  # bpf_ringbuf_output's copy of the record
        "__bpf_ringbuf_reserve",
        "bpf_ringbuf_commit",
        "bpf_ringbuf_query",
        "irq_work_queue",
        "arch_irq_work_raise",
        "native_apic_msr_write",
        "native_write_msr",
    ),
}
GROUP_OF = {function: group for group, functions in GROUPS.items() for function in functions}
DISPATCH = ("perf_syscall_enter", "perf_syscall_exit", "trace_call_bpf", "bpf_trace_run3")


def samples(script: Iterable[str]) -> Iterator[tuple[str, list[str]]]:
    """(command, stack leaf first) of each sample in ``perf script -F comm,ip,sym`` output."""
    command, stack = "", list[str]()
    for line in script:
        if not line.strip():
            if command:
                yield command, stack
            command, stack = "", []
        elif line[0] in " \t":
            stack.append(line.split()[-1])
        else:
            command, stack = line.split()[0], []
    if command:
        yield command, stack


def program_name(frame: str) -> str:
    """``bpf_prog_<tag>_tracepoint__syscalls__sys_exit_read`` -> ``syscalls:sys_exit_read``,
    ``bpf_prog_<tag>_raw_tracepoint__sock_recv_length`` -> ``sock_recv_length``."""
    name = frame.split("_", 3)[-1].removeprefix("raw_tracepoint__").removeprefix("tracepoint__")
    return name.replace("__", ":", 1)


def attribute(stacks: Iterable[tuple[str, list[str]]]) -> tuple[int, Counter[str], Counter[tuple[str, str]]]:
    """Samples of the load's commands; per place (a program, the dispatch, or the load itself);
    per (program, group)."""
    total = 0
    places: Counter[str] = Counter()
    groups: Counter[tuple[str, str]] = Counter()
    for command, stack in stacks:
        if command not in LOAD_COMMANDS:
            continue
        total += 1
        program = next((f for f in stack if f.startswith("bpf_prog_")), None)
        if program is not None:
            name = program_name(program)
            places[name] += 1
            leaf = stack[0]
            groups[(name, "program code" if leaf == program else GROUP_OF.get(leaf, "other kernel"))] += 1
        elif any(f in DISPATCH or f.startswith("perf_trace_") for f in stack):
            places["tracepoint dispatch"] += 1
        else:
            places["nginx and wrk"] += 1
    return total, places, groups


def profile(rate: float | None, seconds: float) -> tuple[int, Counter[str], Counter[tuple[str, str]], float]:
    """Record ``seconds`` of the load (from a second into it); its attribution and requests/s."""
    with tempfile.TemporaryDirectory(prefix="kernel-profile-") as tmp, probed_nginx(rate) as (nginx, _):
        data = Path(tmp) / "perf.data"
        command = ["perf", "record", "-a", "-g", "-o", str(data), "--", "sleep", f"{seconds:g}"]
        recorders: list[subprocess.Popen] = []
        timer = threading.Timer(1.0, lambda: recorders.append(subprocess.Popen(command, stderr=subprocess.PIPE)))
        timer.start()
        run = wrk(nginx.url, seconds + 2, CONNECTIONS, rate=rate)
        timer.join()
        (recorder,) = recorders
        _, stderr = recorder.communicate()
        if recorder.returncode != 0:
            raise SystemExit(f"perf record failed: {stderr.decode(errors='replace').strip()}")
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "comm,ip,sym"], check=True, capture_output=True, text=True
        ).stdout
    total, places, groups = attribute(samples(script.splitlines()))
    return total, places, groups, run.rps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=0, help="requests/s (0: as fast as possible)")
    args = parse_live_args(parser, duration=8.0, rounds=1, quick=(3.0, 1), tools=("nginx", "wrk", "perf"))
    rate = args.rate or None
    total, places, groups, rps = profile(rate, args.duration)
    if not total:
        raise SystemExit("perf recorded no sample of nginx or wrk")

    def share(n: int) -> float:
        return round(100 * n / total, 2)

    in_programs = sum(n for place, n in places.items() if place not in ("tracepoint dispatch", "nginx and wrk"))
    print(
        f"nginx 1 worker, wrk -t1 -c{CONNECTIONS} at {rate or 'max'} ({rps:,.0f} requests/s), {args.duration:g} s"
        f" of perf record -a -g: {total:,} samples of nginx and wrk; in BPF programs {share(in_programs):.1f} %,"
        f" tracepoint dispatch {share(places['tracepoint dispatch']):.1f} %"
    )
    group_names = [*GROUPS, "other kernel", "program code"]
    lines = [["program", "% of samples", *group_names]]
    programs = [place for place, _ in places.most_common() if place not in ("tracepoint dispatch", "nginx and wrk")]
    for program in programs:
        lines.append(
            [program, f"{share(places[program]):.2f}", *(f"{share(groups[(program, g)]):.2f}" for g in group_names)]
        )
    lines.append(
        ["all programs", f"{share(in_programs):.2f}"]
        + [f"{share(sum(groups[(p, g)] for p in programs)):.2f}" for g in group_names]
    )
    print_columns(lines)
    write_result(
        "kernel_profile",
        None,
        {
            "rate": rate,
            "requests_per_s": round(rps),
            "duration_s": args.duration,
            "samples": total,
            "percent_in_programs": share(in_programs),
            "percent_in_dispatch": share(places["tracepoint dispatch"]),
            "programs": {
                program: {"percent": share(places[program]), **{g: share(groups[(program, g)]) for g in group_names}}
                for program in programs
            },
            "all_programs": {g: share(sum(groups[(p, g)] for p in programs)) for g in group_names},
        },
    )


if __name__ == "__main__":
    main()
