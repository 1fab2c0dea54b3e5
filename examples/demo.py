"""``make demo``: trace an unmodified HTTP service with otel-ebpf and summarize what came out.

1. starts ``examples/http_service.py`` with ``OTEL_SERVICE_NAME=demo-inference`` in its own
   environment (the service itself knows nothing about OpenTelemetry; the agent reads the name from
   ``/proc/<pid>/environ``);
2. starts the agent with the file exporter on that port and waits for its ready file;
3. drives traffic: ``examples/http_client.py`` (keep-alive, mixed routes) and a few ``curl`` calls,
   one with an ``Authorization`` header and secrets in the query string to show redaction; then LLM
   calls (``examples/llm_clients.py``: OpenAI-style SSE streams, Ollama NDJSON, TGI, embeddings)
   against ``examples/llm_server.py`` (``OTEL_SERVICE_NAME=demo-llm``, first token after 300 ms, one
   every 40 ms), traced on the same agent;
4. stops the agent with SIGINT (it flushes and exits) and prints a summary of ``traces.jsonl`` and
   ``metrics.jsonl``, plus whether either secret reached the exported data.

Needs root (the agent loads eBPF programs). Output stays in ``otel-ebpf-data/demo/``.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import summarize

EXAMPLES = Path(__file__).resolve().parent
REPO = EXAMPLES.parent
SERVICE_NAME = "demo-inference"
LLM_SERVICE_NAME = "demo-llm"
SECRET_TOKEN = "demo-secret-token-0123456789"
SECRET_KEY = "demo-secret-api-key-9876543210"
READY_TIMEOUT_S = 90.0  # BCC compiles every probe at start-up: seconds, more on a busy machine
STOP_TIMEOUT_S = 30.0
TAIL_LINES = 20


class DemoError(Exception):
    """A step failed; the message says which and shows what the failing process printed."""


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:]) or "    (no output)"


def _stop(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> int | None:
    """Send ``sig`` and wait; SIGKILL after ``timeout``. Returns the exit code, None if it had to be killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def start_service(python: str) -> tuple[subprocess.Popen[bytes], int]:
    """Start the demo service on a free port; returns it and its port."""
    env = {**os.environ, "OTEL_SERVICE_NAME": SERVICE_NAME}
    proc = subprocess.Popen([python, str(EXAMPLES / "http_service.py"), "--port", "0"], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 15)
    line = proc.stdout.readline().decode().strip() if ready else ""
    if not line.startswith("listening on http://"):
        _stop(proc, signal.SIGTERM, 5)
        raise DemoError(f"the demo service did not start (it printed {line!r})")
    return proc, int(line.rsplit(":", 1)[1])


def start_llm_server(python: str, port_file: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The stand-in LLM server on a free port; returns it and its port."""
    env = {**os.environ, "OTEL_SERVICE_NAME": LLM_SERVICE_NAME}
    proc = subprocess.Popen(
        [python, str(EXAMPLES / "llm_server.py"), str(port_file)], stdout=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + 15
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc, signal.SIGTERM, 5)
            raise DemoError("the LLM stand-in server did not start")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def start_agent(agent: str, output: Path, ports: Sequence[int]) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the agent and wait until its probes are attached; returns it and its log file."""
    ready = output / "agent.ready"
    log = output / "agent.log"
    cmd = [
        agent,
        "run",
        "--exporter",
        "file",
        "--output",
        str(output),
        *(f"--port={port}" for port in ports),
        "--ready-file",
        str(ready),
    ]
    print("$ " + " ".join(cmd))
    with log.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None:
            raise DemoError(f"the agent exited with status {proc.returncode} before it was ready:\n{_tail(log)}")
        if time.monotonic() > deadline:
            _stop(proc, signal.SIGINT, 5)
            raise DemoError(f"the agent was not ready after {READY_TIMEOUT_S:.0f} s:\n{_tail(log)}")
        time.sleep(0.1)
    return proc, log


def drive_traffic(python: str, port: int, requests: int) -> None:
    """The Python client's mixed keep-alive load, then a few curl requests (new connections)."""
    base = f"http://127.0.0.1:{port}"
    print(f"\n$ python examples/http_client.py --port {port} --requests {requests}")
    client = subprocess.run(
        [python, str(EXAMPLES / "http_client.py"), "--port", str(port), "--requests", str(requests)], check=False
    )
    if client.returncode != 0:
        raise DemoError(f"the HTTP client failed with status {client.returncode}")

    if shutil.which("curl") is None:
        print("curl not found (make bootstrap installs it): skipping the curl requests")
        return
    curls = [
        ["-H", f"Authorization: Bearer {SECRET_TOKEN}", f"{base}/users/42?api_key={SECRET_KEY}&q=cats"],
        ["-X", "POST", "-H", "Content-Type: application/json", "-d", '{"inputs": [0.1, 0.2, 0.3]}', f"{base}/predict"],
        [f"{base}/error"],
        [f"{base}/no/such/route"],
    ]
    for args in curls:
        shown = " ".join(f"'{a}'" if " " in a or "&" in a else a for a in args)
        result = subprocess.run(
            ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", *args], capture_output=True, text=True, check=False
        )
        print(f"$ curl {shown}  -> {result.stdout or result.stderr.strip()}")


def drive_llm_calls(python: str, port: int) -> None:
    """Every kind of LLM call the stand-in serves, once, as applications make them."""
    print(f"\n$ python examples/llm_clients.py {port}")
    clients = subprocess.run([python, str(EXAMPLES / "llm_clients.py"), str(port)], check=False)
    if clients.returncode != 0:
        raise DemoError(f"the LLM clients failed with status {clients.returncode}")


def redaction_report(output: Path) -> str:
    """Whether either secret the demo sent appears anywhere in what the agent exported."""
    exported = ""
    for name in (summarize.TRACES_FILE, summarize.METRICS_FILE):
        path = output / name
        if path.exists():
            exported += path.read_text(errors="replace")
    lines = ["", "Redaction (secrets sent by the curl request):"]
    for label, secret in (("Authorization header", SECRET_TOKEN), ("api_key query value", SECRET_KEY)):
        lines.append(f"  {label:<22} {'LEAKED into exported data' if secret in exported else 'not exported'}")
    queries = sorted(
        {
            str(s.attributes[key])
            for s in summarize.read_spans(output / summarize.TRACES_FILE)
            for key in ("url.query", "url.full")
            if key in s.attributes and "q=cats" in str(s.attributes[key])
        }
    )
    for q in queries:
        lines.append(f"  exported as: {q}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 1 when a step failed or the agent exported no spans."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", default=str(REPO / ".venv/bin/otel-ebpf"), help="otel-ebpf executable")
    parser.add_argument("--output", type=Path, default=REPO / "otel-ebpf-data/demo", help="file exporter directory")
    parser.add_argument("--requests", type=int, default=300, help="requests the Python client sends")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # keep our lines in order with the children's

    if os.geteuid() != 0:
        print("demo: the agent loads eBPF programs and needs root: sudo make demo", file=sys.stderr)
        return 1
    if not Path(args.agent).exists():
        print(f"demo: {args.agent} not found: run 'make bootstrap' first", file=sys.stderr)
        return 1
    shutil.rmtree(args.output, ignore_errors=True)  # a fresh run: the exporter appends
    args.output.mkdir(parents=True)

    service = llm = agent = None
    try:
        service, port = start_service(sys.executable)
        print(f"demo service (OTEL_SERVICE_NAME={SERVICE_NAME}) listening on 127.0.0.1:{port}")
        llm, llm_port = start_llm_server(sys.executable, args.output / "llm.port")
        print(f"LLM stand-in (OTEL_SERVICE_NAME={LLM_SERVICE_NAME}) listening on 127.0.0.1:{llm_port}")
        agent, log = start_agent(args.agent, args.output, [port, llm_port])
        print(f"agent ready (log: {log})")
        drive_traffic(sys.executable, port, args.requests)
        drive_llm_calls(sys.executable, llm_port)
        time.sleep(0.5)  # let the last responses' events reach the agent before it stops
        status = _stop(agent, signal.SIGINT, STOP_TIMEOUT_S)
        if status is None:
            raise DemoError(f"the agent did not stop within {STOP_TIMEOUT_S:.0f} s of SIGINT:\n{_tail(log)}")
        if status != 0:
            raise DemoError(f"the agent exited with status {status}:\n{_tail(log)}")
    except DemoError as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        for proc, sig in ((agent, signal.SIGINT), (service, signal.SIGTERM), (llm, signal.SIGTERM)):
            if proc is not None:
                _stop(proc, sig, 10)

    print()
    print(summarize.format_summary(args.output))
    print(redaction_report(args.output))
    if not summarize.read_spans(args.output / summarize.TRACES_FILE):
        print(f"\ndemo failed: the agent exported no spans (log: {args.output / 'agent.log'})", file=sys.stderr)
        return 1
    print(f"\nAll output is in {args.output}/ (traces.jsonl, metrics.jsonl, agent.log).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
