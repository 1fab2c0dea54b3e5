"""``otel-ebpf advise DIR`` as a user runs it: a subprocess over the recorded evidence directories,
and ``--llm`` against a real HTTP server that records what it was sent."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.advise.explain import ExplainError, chat_url
from tests.conftest import AGENT, REPO

DATA = Path(__file__).parents[1] / "data" / "advise"


def advise(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT, "advise", *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_text_report_ranks_the_recorded_problems() -> None:
    run = advise(str(DATA / "problems"))
    assert run.returncode == 0, run.stderr
    titles = [line for line in run.stdout.splitlines() if line[:1].isdigit()]
    assert len(titles) == 6
    assert titles[0].startswith("1. [HIGH] GPU memory leak: 80 allocations kept alive by leaky_cache (")
    assert "[HIGH] Time to first token of stand-in is mostly queueing" in titles[1]
    assert "   try: " in run.stdout and "stack (leaf first):" in run.stdout
    assert "Not checked:" in run.stdout and "data-loader" in run.stdout


def test_json_report() -> None:
    run = advise(str(DATA / "problems"), "--json")
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert [f["rank"] for f in document["findings"]] == [1, 2, 3, 4, 5, 6]
    leak = document["findings"][0]
    assert (leak["rule"], leak["severity"], leak["figures"]["allocations"]) == ("memory-leak", "high", 80)
    assert leak["code"][0]["function"] == "leaky_cache" and leak["code"][0]["file"].endswith("workloads.py")
    assert leak["stack"][0] == "cudaMalloc"
    assert len(document["not_checked"]) == 1 and len(document["sources"]) == 4


def test_clean_run() -> None:
    run = advise(str(DATA / "clean"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("No findings")


def test_a_peak_bandwidth_must_be_positive() -> None:
    run = advise(str(DATA / "problems"), "--peak-bandwidth", "0")
    assert run.returncode == 2 and "--peak-bandwidth: expected a positive number of GB/s" in run.stderr
    assert advise(str(DATA / "problems"), "--peak-bandwidth", "3350").returncode == 0


def test_bad_directories(tmp_path: Path) -> None:
    run = advise(str(tmp_path))
    assert run.returncode == 1 and "no traces.jsonl, metrics.jsonl" in run.stderr
    (tmp_path / "metrics.jsonl").write_text('{"resourceMetrics":[]}\nnot json\n')
    run = advise(str(tmp_path))
    assert run.returncode == 1 and "metrics.jsonl:2: not JSON" in run.stderr
    run = advise(str(tmp_path / "missing"))
    assert run.returncode == 1 and "is not a directory" in run.stderr


# ---- --llm ------------------------------------------------------------------------------------------

SECRET = "sk-proj-Abc123Def456Ghi789Jkl012Mno345"
SOURCE = f"""\
import torch

CACHE = []

# ask jane.doe@example.com before changing this
def cache_batch(batch):
    client = Client(api_key="{SECRET}")
    CACHE.append(batch.to("cuda"))  # never trimmed
    return CACHE[-1]


for batch in range(10):
    cache_batch(batch)
"""


class ChatServer:
    """A real OpenAI-compatible ``/v1/chat/completions`` endpoint on loopback that keeps every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.append((self.path, dict(self.headers), body))
                answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Trim CACHE."}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    server = ChatServer()
    try:
        yield server
    finally:
        server.close()


def leak_directory(tmp_path: Path) -> Path:
    """An evidence directory with one leak report whose stack points at a real source file."""
    source = tmp_path / "train.py"
    source.write_text(SOURCE)
    stacktrace = f"  at cudaMalloc /usr/lib/libcudart.so.12\n  at cache_batch ({source}:8)\n  at <module> ({source}:13)"
    attributes = {
        "cuda.memory.leak.allocations": ("intValue", "12"),
        "cuda.memory.leak.size": ("intValue", str(12 << 20)),
        "cuda.memory.leak.age": ("doubleValue", 61.5),
        "cuda.memory.in_use": ("intValue", str(12 << 20)),
        "cuda.memory.in_use.growth": ("intValue", str(4 << 20)),
        "cuda.api": ("stringValue", "runtime"),
        "cuda.device": ("intValue", "0"),
        "code.stacktrace": ("stringValue", stacktrace),
    }
    record = {
        "timeUnixNano": "1000",
        "eventName": "cuda.memory.leak",
        "body": {"stringValue": "CUDA memory leak suspected"},
        "attributes": [{"key": k, "value": {kind: v}} for k, (kind, v) in attributes.items()],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "trainer"}}]}
    line = {"resourceLogs": [{"resource": resource, "scopeLogs": [{"logRecords": [record]}]}]}
    out = tmp_path / "out"
    out.mkdir()
    (out / "logs.jsonl").write_text(json.dumps(line) + "\n")
    return out


def test_llm_explains_the_top_findings_with_their_source_redacted(tmp_path: Path, chat_server: ChatServer) -> None:
    run = advise(str(leak_directory(tmp_path)), "--llm", chat_server.url, "--llm-model", "local-model")
    assert run.returncode == 0, run.stderr
    assert "Explanation of the top 1 (from http://127.0.0.1:" in run.stdout and "Trim CACHE." in run.stdout
    [(path, headers, body)] = chat_server.requests
    assert path == "/v1/chat/completions"
    assert body["model"] == "local-model"
    assert "Authorization" not in headers
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    content = user["content"]
    assert "Finding 1 [HIGH] GPU memory leak: 12 allocations kept alive by cache_batch" in content
    assert '>    8     CACHE.append(batch.to("cuda"))  # never trimmed' in content  # the line itself, marked
    assert "\n     5 # ask <email> before changing this\n" in content  # three lines either side
    assert "\n    11 \n" in content
    assert ">   13     cache_batch(batch)" in content  # the caller's line too
    assert "client = Client(api_key=REDACTED" in content  # the credential, by its name
    assert SECRET not in json.dumps(body) and "jane.doe" not in json.dumps(body)


def test_llm_sends_the_api_key_only_as_the_bearer_token(tmp_path: Path, chat_server: ChatServer) -> None:
    import os

    env = {**os.environ, "OPENAI_API_KEY": "test-key-1"}
    run = advise(str(leak_directory(tmp_path)), "--llm", chat_server.url + "/v1", "--json", env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["explanation"] == "Trim CACHE."
    [(path, headers, body)] = chat_server.requests
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer test-key-1"
    assert "test-key-1" not in json.dumps(body)


def test_llm_not_asked_when_there_is_nothing_to_explain(chat_server: ChatServer) -> None:
    run = advise(str(DATA / "clean"), "--llm", chat_server.url)
    assert run.returncode == 0, run.stderr
    assert chat_server.requests == []


def test_llm_unreachable_is_an_error_after_the_report(tmp_path: Path) -> None:
    server = ChatServer()
    url = server.url
    server.close()  # nothing listens there now
    run = advise(str(leak_directory(tmp_path)), "--llm", url)
    assert run.returncode == 1 and "--llm: " in run.stderr
    assert "GPU memory leak" in run.stdout


def test_chat_url() -> None:
    assert chat_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert chat_url("https://h/openai/v1/chat/completions") == "https://h/openai/v1/chat/completions"
    with pytest.raises(ExplainError):
        chat_url("file:///etc/passwd")
