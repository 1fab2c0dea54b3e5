"""What the agent costs an HTTPS server it does not trace, measured side by side in one run.

The agent traces an unrelated idle ``sleep`` (``--pid``); an HTTPS server on the same system libssl
is loaded by ``wrk`` (keep-alive, which links the same libssl). Tracing chosen processes, the SSL
probes are attached for those processes only, so the server and wrk should run as fast as without
the agent. For reference, the same load with uprobes attached to the libssl *file* (every process
traps on every SSL call: what ``--pid`` cost before the probes became per process), either:

- ``file-wide uprobes``: empty BPF programs on the agent's SSL entry points and returns, attached
  once to the file by a helper (the traps alone, the floor of the old cost), or
- ``agent --pid sleep (DIR)``: ``--before DIR`` runs the agent in another source tree (e.g.
  ``git archive <commit> otel_ebpf | tar -x -C DIR``, from before this change) with the same
  ``--pid sleep``.

Each round runs every arm once, in rotated order, so drift on a shared machine hits all of them;
reported: requests/s per arm (median of the rounds) and the ratio to the untraced run. During
each run the server's memory is read at libssl's SSL entry points every 0.2 s: a breakpoint (0xCC)
there in an arm that should have none means something else on the node (another agent hooking
the libssl file) makes it trap; such runs are marked and left out of the medians.

Server: nginx (one worker, ``return 200``) when installed, else Python's ``http.server`` with
``ssl`` (``examples/tls_peers.py``), or as ``--server`` says.

Usage: ``python bench/tls_untraced.py [--duration S] [--connections N] [--rounds R]
[--server nginx|python] [--before DIR]`` (as root)
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from harness import parse_live_args  # noqa: E402
from results import write_result  # noqa: E402
from otel_ebpf.probes.tls import ENTRY_PROGRAMS, system_libssl  # noqa: E402
from tests.live.test_tls_untraced_live import _entry_points, _planted  # noqa: E402

AGENT = [sys.executable, "-m", "otel_ebpf.cli"]
NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log stderr error;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""
# Attached to the libssl file by a helper process, as the agent did before probes became per process.
FILE_WIDE_PROBES = r"""
import sys
from bcc import BPF
path, symbols = sys.argv[1], sys.argv[2:]
bpf = BPF(text="int empty(struct pt_regs *ctx) { return 0; }")
for symbol in symbols:
    bpf.attach_uprobe(name=path, sym=symbol, fn_name="empty")
    bpf.attach_uretprobe(name=path, sym=symbol, fn_name="empty")
print("ready", flush=True)
sys.stdin.read()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _certificates(tmp: Path) -> tuple[str, str]:
    import trustme

    server = trustme.CA().issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(tmp / "key.pem"))
    server.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    return str(tmp / "cert.pem"), str(tmp / "key.pem")


@contextmanager
def https_server(kind: str, tmp: Path) -> Iterator[tuple[int, int]]:
    """(port, pid) of a fresh HTTPS server."""
    cert, key = _certificates(tmp)
    if kind == "nginx":
        port = _free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, cert=cert, key=key))
        proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(tmp)])
        deadline = time.monotonic() + 10
        while subprocess.run(["curl", "-sk", "-o", "/dev/null", f"https://127.0.0.1:{port}/"]).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("nginx did not start")
            time.sleep(0.1)
    else:
        port_file = tmp / "port"
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "examples" / "tls_peers.py"), "https-serve", str(port_file), cert, key]
        )
        deadline = time.monotonic() + 10
        while not port_file.exists() or not port_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the Python HTTPS server did not start")
            time.sleep(0.05)
        port = int(port_file.read_text())
    try:
        yield port, proc.pid
    finally:
        proc.kill()
        proc.wait()


def wrk(port: int, duration: float, connections: int) -> float:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{round(duration)}s", f"https://127.0.0.1:{port}/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


@contextmanager
def breakpoints_seen(pid: int) -> Iterator[set[str]]:
    """The SSL entry points of the system libssl where ``pid`` had a breakpoint at some point
    while the block ran (sampled every 0.2 s)."""
    (libssl,) = system_libssl()
    entry_points = _entry_points(libssl)
    seen: set[str] = set()
    done = threading.Event()

    def sample() -> None:
        while True:
            seen.update(_planted(pid, libssl, entry_points))
            if done.wait(0.2):
                return

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield seen
    finally:
        done.set()
        sampler.join()
        seen.update(_planted(pid, libssl, entry_points))


@contextmanager
def nothing() -> Iterator[None]:
    yield


@contextmanager
def agent_on_sleep(python: list[str], cwd: Path) -> Iterator[None]:
    """An agent tracing only an idle ``sleep``, with the file exporter."""
    sleeper = subprocess.Popen(["sleep", "3600"])
    with tempfile.TemporaryDirectory() as out:
        ready = Path(out) / "ready"
        agent = subprocess.Popen(
            [
                *python,
                "-m",
                "otel_ebpf.cli",
                "run",
                "--pid",
                str(sleeper.pid),
                "--exporter",
                "file",
                "--output",
                out,
                "--ready-file",
                str(ready),
            ],
            cwd=cwd,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"agent did not start: {agent.stderr.read() if agent.poll() is not None else ''}")
                time.sleep(0.05)
            yield
        finally:
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=300)[1]
            sleeper.kill()
            sleeper.wait()
        if agent.returncode != 0:
            raise SystemExit(f"agent failed ({agent.returncode}): {stderr}")


@contextmanager
def file_wide_probes() -> Iterator[None]:
    (libssl,) = system_libssl()
    helper = subprocess.Popen(
        [sys.executable, "-c", FILE_WIDE_PROBES, libssl, *ENTRY_PROGRAMS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if helper.stdout.readline() != "ready\n":
            raise SystemExit("the file-wide uprobes did not attach")
        yield
    finally:
        helper.stdin.close()
        helper.wait(timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=16, help="wrk keep-alive connections")
    parser.add_argument("--server", choices=("nginx", "python"), default="nginx" if shutil.which("nginx") else "python")
    parser.add_argument(
        "--before",
        type=Path,
        help="also run the agent in this source tree (with its .venv's Python, else this one), --pid sleep",
    )
    args = parse_live_args(parser, duration=8.0, rounds=3, quick=(2.0, 1))
    arms: dict[str, Callable[[], object]] = {
        "untraced": nothing,
        "agent --pid sleep (this checkout)": lambda: agent_on_sleep(AGENT[:1], REPO),
        "file-wide uprobes (empty programs)": file_wide_probes,
    }
    untrapped = {"untraced", "agent --pid sleep (this checkout)"}  # the server must not trap in these
    if args.before:
        before = args.before.resolve()
        python = before / ".venv" / "bin" / "python"
        arms[f"agent --pid sleep ({before})"] = lambda: agent_on_sleep(
            [str(python) if python.exists() else sys.executable], before
        )
    results: dict[str, list[float]] = {name: [] for name in arms}
    contaminated: dict[str, int] = dict.fromkeys(arms, 0)
    names = list(arms)
    with tempfile.TemporaryDirectory() as tmp, https_server(args.server, Path(tmp)) as (port, server):
        wrk(port, 1, args.connections)  # warm-up
        for round_no in range(args.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for name in order:
                with arms[name](), breakpoints_seen(server) as traps:
                    rps = wrk(port, args.duration, args.connections)
                note = ""
                if name in untrapped and traps:
                    contaminated[name] += 1
                    note = f"  (left out: the server has breakpoints on {len(traps)} SSL entry points, set by another tracer)"
                else:
                    results[name].append(rps)
                print(f"[bench] round {round_no + 1}/{args.rounds} {name}: {rps:,.0f} req/s{note}", flush=True)
    if not results["untraced"]:
        raise SystemExit("every untraced run trapped: another tracer hooks libssl on this node; stop it and rerun")
    base = statistics.median(results["untraced"])
    print(
        f"\nHTTPS {args.server}, wrk -t1 -c{args.connections}, {args.duration:g} s x {args.rounds} rounds "
        f"(median req/s; ratio to untraced):"
    )
    for name, values in results.items():
        if not values:
            print(f"  {name:<45} every run left out")
            continue
        median = statistics.median(values)
        left_out = f"   ({contaminated[name]} run(s) left out)" if contaminated[name] else ""
        print(f"  {name:<45} {median:>10,.0f} req/s   ratio {median / base:.3f}{left_out}")
    write_result(
        "tls_untraced",
        None,
        {
            "parameters": {
                "server": args.server,
                "duration_s": args.duration,
                "rounds": args.rounds,
                "connections": args.connections,
            },
            "arms": {
                name: {
                    "median_rps": round(statistics.median(values)) if values else None,
                    "ratio": round(statistics.median(values) / base, 3) if values else None,
                    "runs": len(values),
                    "runs_left_out": contaminated[name],
                }
                for name, values in results.items()
            },
        },
    )


if __name__ == "__main__":
    main()
