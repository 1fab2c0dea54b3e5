"""An agent run that traces one process and writes files, for live tests that read its output."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.conftest import AGENT, REPO
from tests.otlp_receiver import latest_total, load_file_metrics, load_file_spans

# The three ways the socket probe copies a syscall's bytes (bpf/socket_trace.c): in the sock
# tracepoints (the default), at the syscalls' exits (traceparent injection keeps them), or
# tracking fds (kernels before 6.3).
SOCKET_MODES = {
    "copy-in-sock": "capture:\n  socket_mode: tracepoints\n",
    "fd-tracking": "capture:\n  socket_mode: fd-tracking\n",
    "syscall-exits": "capture:\n  socket_mode: tracepoints\ntrace:\n  inject_traceparent: true\n",
}


def start_file_agent(
    tmp: Path,
    pid: int | Sequence[int],
    config_yaml: str,
    timeout: float = 90,
    args: Sequence[str] = (),
    popen: Callable[..., subprocess.Popen] = subprocess.Popen,
) -> subprocess.Popen:
    """``otel-ebpf run --pid PID --exporter file --output TMP/out`` with ``config_yaml`` (a ``--pid``
    for each of several pids, none for none) and more ``args``, started by ``popen`` (another PID
    namespace's, say) and returned once its ready file says the probes are attached."""
    config = tmp / "agent.yaml"
    config.write_text(config_yaml)
    ready = tmp / "ready"
    agent = popen(
        [
            *AGENT,
            "run",
            "--config",
            str(config),
            *(arg for each in ([pid] if isinstance(pid, int) else pid) for arg in ("--pid", str(each))),
            "--exporter",
            "file",
            "--output",
            str(tmp / "out"),
            "--ready-file",
            str(ready),
            *args,
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while not (ready.exists() and ready.read_text().strip()):
        if agent.poll() is not None:
            raise AssertionError(f"agent exited early ({agent.returncode}): {agent.stderr.read()}")
        if time.monotonic() > deadline:
            agent.kill()
            raise AssertionError(f"{ready} did not appear within {timeout}s")
        time.sleep(0.05)
    return agent


def kill_all(*processes: subprocess.Popen | None) -> None:
    """Kill and reap each process still running: what a live test's ``finally`` owes its peers."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


def release(client: subprocess.Popen) -> str:
    """Tell a client that waits for a line on its stdin (until the agent is attached) to go, and
    return the first line it prints."""
    client.stdin.write("go\n")
    client.stdin.flush()
    return client.stdout.readline().strip()


def stop_file_agent(agent: subprocess.Popen) -> str:
    """Stop an agent as a user would (SIGINT), wait for its final flush, and return its stderr;
    it must exit cleanly."""
    agent.send_signal(signal.SIGINT)
    stderr = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, stderr
    return stderr


def serve_one_connection(
    tmp: Path,
    server_script: str | Sequence[str],
    config_yaml: str,
    exchange: Callable[[socket.socket, int], None],
    requests: int,
) -> str:
    """Run a server under an agent with ``config_yaml`` (output in ``tmp/out``) and return the
    agent's stderr. The server (``server_script``: Python, or a command) prints its port, then
    waits for a line on stdin before it accepts (tracking fds, the agent sees only the accepts it
    saw start) and serves one connection until it closes. Once the server is told to go, one
    connection makes ``exchange(sock, n)`` for each of ``requests``; the server must then exit
    cleanly, and the agent is stopped."""
    command = [sys.executable, "-c", server_script] if isinstance(server_script, str) else list(server_script)
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        port = int(server.stdout.readline())
        agent = start_file_agent(tmp, server.pid, config_yaml)
        server.stdin.write("go\n")
        server.stdin.flush()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for n in range(requests):
                exchange(sock, n)
        assert server.wait(timeout=30) == 0
        return stop_file_agent(agent)
    finally:
        kill_all(agent, server)


def whole_server_spans(out: Path) -> list[dict]:
    """The SERVER spans a run wrote to ``out``, each checked whole (no error status, no capture
    gap), with no parse error counted and no socket I/O counted as outside the syscalls."""
    spans = [s for s in load_file_spans(out) if s["kind"] == "SERVER"]
    for span in spans:
        assert span["status_code"] == "UNSET", span
        assert "otel_ebpf.capture.gap" not in span["attributes"], span
    metrics = load_file_metrics(out)
    assert latest_total(metrics, "otel_ebpf.parse.errors") == 0
    assert latest_total(metrics, "otel_ebpf.kernel.drops", reason="socket_io_outside_syscalls") == 0
    return spans
