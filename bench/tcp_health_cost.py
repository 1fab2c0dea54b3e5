"""What TCP health (``capture.tcp_health``, bpf/tcp_health.c) costs, measured with the socket probe
loaded in this process, with and without it.

A loopback TCP stream (a Python sender and receiver in a child process) runs for ``--duration``
seconds per arm; ``--chunk`` bytes per ``send`` with TCP_NODELAY, so that small chunks make many
segments and reads. Arms, rotated each round:

- ``off``: the socket probe without TCP health, tracing an idle ``sleep`` (not the stream);
- ``untraced``: the same with TCP health: every tcp program exits at its first lookup;
- ``traced-off``: the socket probe without TCP health, tracing the stream (``--pid``): its bytes
  copied to the ring buffer, which this benchmark reads and drops;
- ``traced``: the same with TCP health: retransmissions and resets counted, the RTT sampled at
  the receiver's reads (``sock:sock_recv_length``, compare its ns per run with ``traced-off``).

With ``--flows``, the arms are ``untraced`` and ``traced`` as above, each also with
``capture.tcp_flows`` (``flows-untraced``, ``flows-traced``: bpf/tcp_flows.c's cgroup programs
on every packet of the node), and the result goes to ``tcp_flows_cost``.

Reported: the stream's MB/s per arm (median over rounds, and each round's), and from ``kernel.bpf_stats_enabled``
(switched on for the run, restored after) the tcp programs' and ``sock_recv_length``'s runs per
second and ns per run.

Usage: ``python bench/tcp_health_cost.py [--duration S] [--rounds R] [--chunk BYTES] [--flows] [--quick]``
(as root)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from harness import kill, parse_live_args, program_runs, program_stats  # noqa: E402
from otel_ebpf.config import CaptureConfig, load_config  # noqa: E402
from otel_ebpf.containers import ContainerResolver  # noqa: E402
from otel_ebpf.probes.socket import SocketProbe  # noqa: E402
from results import write_result  # noqa: E402

BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
STREAM = r"""
import socket, sys, threading, time
chunk = int(sys.argv[1])
listener = socket.create_server(("127.0.0.1", 0))
sender = socket.create_connection(listener.getsockname())
receiver, _ = listener.accept()
sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
received = [0]
def drain():
    while n := len(receiver.recv(1 << 20)):
        received[0] += n
threading.Thread(target=drain, daemon=True).start()
print("ready", flush=True)
data = b"x" * chunk
for line in sys.stdin:
    deadline = time.perf_counter() + float(line)
    before, start = received[0], time.perf_counter()
    while time.perf_counter() < deadline:
        sender.sendall(data)
    print((received[0] - before) / (time.perf_counter() - start), flush=True)
"""
ARMS = ("off", "untraced", "traced-off", "traced")
FLOW_ARMS = ("untraced", "flows-untraced", "traced", "flows-traced")


class Stream:
    def __init__(self, chunk: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STREAM, str(chunk)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, seconds: float) -> float:
        """Bytes per second received over ``seconds``."""
        self.proc.stdin.write(f"{seconds}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())


def _program_stats(probe: SocketProbe) -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) of each tcp and flow program the probe loaded, and of the read's
    ``sock_recv_length``, where TCP health samples the RTT."""
    stats = program_stats(probe.bpf)
    wanted = ("tcp__", "tcp_flow_", "sock_recv_length")
    return {name.removeprefix("tcp__"): value for name, value in stats.items() if name.startswith(wanted)}


def _arm(arm: str, stream: Stream, idle_pid: int, seconds: float) -> dict[str, Any]:
    base = load_config({}, {})
    switches = {"tcp_health": not arm.endswith("off"), "tcp_flows": arm.startswith("flows-")}
    capture = CaptureConfig(**{**base.capture.__dict__, **switches})
    target = stream.proc.pid if arm.removeprefix("flows-").startswith("traced") else idle_pid
    targets = load_config({"pid": [target]}, {}).targets
    probe = SocketProbe(capture, targets, ContainerResolver("/"))
    probe.start()
    try:
        before = _program_stats(probe)
        start = time.perf_counter()
        rate = stream.run(seconds)
        elapsed = time.perf_counter() - start
        after = _program_stats(probe)
        while probe.poll(0):  # the traced arm's events: read, so the ring does not shed
            pass
    finally:
        probe.close()
    programs = {
        name: {"runs_per_s": runs / elapsed, "ns_per_run": time_ns / runs}
        for name, (time_ns, runs) in program_runs(before, after).items()
    }
    return {"bytes_per_s": rate, "programs": programs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk", type=int, default=1024, help="bytes per send (TCP_NODELAY)")
    parser.add_argument("--flows", action="store_true", help="the cost of capture.tcp_flows instead")
    args = parse_live_args(parser, duration=5, rounds=5, quick=(2, 1), tools=())
    arms = FLOW_ARMS if args.flows else ARMS
    stats_before = BPF_STATS.read_text().strip()
    BPF_STATS.write_text("1")
    idle = subprocess.Popen(["sleep", "infinity"])
    stream = Stream(args.chunk)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    try:
        for round_ in range(args.rounds):
            for arm in arms[round_ % len(arms) :] + arms[: round_ % len(arms)]:
                runs[arm].append(_arm(arm, stream, idle.pid, args.duration))
    finally:
        BPF_STATS.write_text(stats_before)
        kill(stream.proc)
        kill(idle)
    rows = {}
    print(f"loopback stream, {args.chunk} B sends, {args.rounds} rounds of {args.duration:g} s")
    for arm in arms:
        rate = statistics.median(r["bytes_per_s"] for r in runs[arm])
        names = sorted({name for r in runs[arm] for name in r["programs"]})
        programs = {
            name: {
                key: statistics.median(r["programs"][name][key] for r in runs[arm] if name in r["programs"])
                for key in ("runs_per_s", "ns_per_run")
            }
            for name in names
        }
        each = [round(r["bytes_per_s"] / 1e6, 1) for r in runs[arm]]
        rows[arm] = {"mb_per_s": rate / 1e6, "mb_per_s_rounds": each, "programs": programs}
        shown = ", ".join(f"{n} {p['ns_per_run']:.0f} ns/run x {p['runs_per_s']:.0f}/s" for n, p in programs.items())
        print(f"{arm:10s} {rate / 1e6:8.1f} MB/s (rounds: {each})  {shown}")
    if args.flows:
        for traced in ("untraced", "traced"):
            ratio = rows[f"flows-{traced}"]["mb_per_s"] / rows[traced]["mb_per_s"]
            print(f"{traced}: MB/s with / without tcp_flows: {ratio:.2f}")
    write_result(
        "tcp_flows_cost" if args.flows else "tcp_health_cost",
        None,
        {"parameters": {"rounds": args.rounds, "duration_s": args.duration, "chunk": args.chunk}, "arms": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
