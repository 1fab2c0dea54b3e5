"""Record the evidence directories the advisor's tests read (a one-off script, not a test; root).

Runs the real agent (``otel-ebpf run --gpu true --exporter file``) over real programs and keeps
what its file exporter wrote (``traces.jsonl``, ``metrics.jsonl``, ``logs.jsonl``,
``profiles.jsonl``) in ``data/advise/<case>/``:

- ``problems``: one stand-in training loop per problem (:mod:`tests.advise.workloads`: ``sync``,
  ``pageable``, ``tiny_kernels``, ``leak``) and ``examples/llm_server.py`` generating one answer at
  a time (``--max-sequences 1``) while six streamed chat completions arrive together, so five of
  them queue;
- ``clean``: the ``clean`` loop and the same server with no limit, so nobody queues.

Each process runs under its own ``OTEL_SERVICE_NAME`` (``advise-<scenario>``, ``advise-llm``).
Re-record with::

    sudo .venv/bin/python -m tests.advise.record_evidence [case ...]
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.live.file_agent import start_file_agent

REPO = Path(__file__).parents[2]
DATA = Path(__file__).parents[1] / "data" / "advise"
CASES = {"problems": ("sync", "pageable", "tiny_kernels", "leak"), "clean": ("clean",)}
SERVER_LIMIT = {"problems": 1, "clean": 0}
FILES = ("traces.jsonl", "metrics.jsonl", "logs.jsonl", "profiles.jsonl")
CONFIG = """\
gpu:
  enabled: true
  interval_s: 1
  leak_age_s: 1  # an agent lagging less than this behind the calls still sees the growth
  ring_buffer_kb: 65536  # a burst of 30,000 launches with their stacks: none lost
export:
  metric_interval_s: 1
"""
CALLS = 6


def _start(command: list[str], service: str) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OTEL_SERVICE_NAME": service},
    )


def _stream_chat(port: int, number: int) -> None:
    body = {
        "model": "stand-in",
        "stream": True,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": f"q{number}"}],
    }
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60) as response:
        response.raise_for_status()
        for _ in response.iter_lines():
            pass


def record(case: str, out: Path) -> None:
    """Run ``case`` under the agent and put the files it wrote in ``out`` (replaced)."""
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        port_file = tmp / "port"
        server = _start(
            [
                sys.executable,
                "examples/llm_server.py",
                str(port_file),
                "--first-token-ms",
                "150",
                "--token-ms",
                "20",
                "--max-sequences",
                str(SERVER_LIMIT[case]),
            ],
            "advise-llm",
        )
        loops = [_start([sys.executable, "-m", "tests.advise.workloads", s], f"advise-{s}") for s in CASES[case]]
        agent = None
        try:
            for loop in loops:
                assert loop.stdout is not None and loop.stdout.readline().strip() == "ready"
            while not port_file.exists() or not port_file.read_text().strip():
                time.sleep(0.05)
            port = int(port_file.read_text())
            agent = start_file_agent(tmp, [server.pid, *(loop.pid for loop in loops)], CONFIG)
            for loop in loops:
                assert loop.stdin is not None
                loop.stdin.write("go\n")
                loop.stdin.flush()
            with ThreadPoolExecutor(CALLS) as pool:
                list(pool.map(lambda n: _stream_chat(port, n), range(CALLS)))
            for loop in loops:
                assert loop.stdout is not None and loop.stdout.readline().strip() == "done"
            time.sleep(3)  # in-use snapshots and leak checks see the leaked buffers alive
        finally:
            if agent is not None:
                agent.send_signal(signal.SIGINT)
                agent.communicate(timeout=60)
            for loop in loops:
                loop.kill()
                loop.wait()
            server.terminate()
            server.wait()
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for file in FILES:
            if (tmp / "out" / file).exists():
                shutil.copy(tmp / "out" / file, out / file)


def main(cases: list[str]) -> None:
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"no such case: {', '.join(unknown)} (cases: {', '.join(CASES)})")
    for case in cases or CASES:
        record(case, DATA / case)


if __name__ == "__main__":
    main(sys.argv[1:])
