"""Live BPF: personal data and secrets in captured headers and LLM bodies never leave the node.

``examples/llm_server.py --echo`` answers each chat completion with its prompt; a client on
loopback sends prompts holding every value of the corpus (``tests/pii_corpus.py``) and headers
holding some of them, allow-listed in ``capture_headers``. The agent traces both (content capture
on) and exports to a real OTLP receiver and to files. No value may appear in any payload the
receiver got or any file written, and ``otel_ebpf.pii.scrubbed`` must count exactly what was
there: each body value twice per span (prompt and echoed output), each header value once, on the
server's span and the client's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import AGENT, REPO
from tests.live.test_http_live import _wait_for_file
from tests.live.test_tls_live import _stop
from tests.otlp_receiver import OTLPReceiver, latest_total
from tests.pii_corpus import CORPUS, secret_part

pytestmark = pytest.mark.bpf
REQUESTS = 3
HEADERS = {
    "x-user-email": ("email", 0),
    "x-user-phone": ("phone", 0),
    "x-session": ("jwt", 0),
    "x-upstream-key": ("openai_key", 0),
    "x-cloud-key": ("aws_access_key", 0),
}
# the prompt's values already redacted by the command-line rules that content has always passed
# (a credential-named field's value): never exported, but not counted as PII
REDACTED_BEFORE = {"credential"}
CLIENT = r"""
import http.client, json, sys
port, prompt, headers, n = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4})
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json", **headers})
    answer = json.loads(conn.getresponse().read())
    assert answer["choices"][0]["message"]["content"] == prompt
    conn.close()
print("done", flush=True)
"""


def test_pii_in_headers_and_llm_bodies_never_leaves(tmp_path: Path) -> None:
    prompt = "Customer record: " + "; ".join(v for values in CORPUS.values() for v in values) + ". Thanks!"
    headers = {name: CORPUS[kind][i] for name, (kind, i) in HEADERS.items()}
    config = tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "protocols": {
                    "http1": {
                        "capture_headers": sorted(HEADERS),
                        "genai": {"capture_content": True, "max_content_chars": 16384},
                    }
                }
            }
        )
    )
    server = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "examples" / "llm_server.py"),
            str(tmp_path / "port"),
            "--first-token-ms",
            "1",
            "--echo",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        port = _wait_for_file(tmp_path / "port", server)
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, port, prompt, json.dumps(headers), str(REQUESTS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            ready = tmp_path / "agent.ready"
            agent = subprocess.Popen(
                [
                    *AGENT,
                    "run",
                    "--config",
                    str(config),
                    "--pid",
                    str(server.pid),
                    "--pid",
                    str(client.pid),
                    "--exporter",
                    "otlp",
                    "--exporter",
                    "file",
                    "--output",
                    str(tmp_path / "out"),
                    "--otlp-endpoint",
                    receiver.grpc_endpoint,
                    "--ready-file",
                    str(ready),
                ],
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "OTEL_EBPF_GPU": "false"},
            )
            _wait_for_file(ready, agent)
            out, _ = client.communicate("go\n", timeout=120)
            assert out == "done\n" and client.returncode == 0
            _stop(agent)
            receiver.wait_for(lambda r: len(r.spans()) >= 2 * REQUESTS and bool(r.metrics()), timeout=10)
            spans, metrics = receiver.spans(), receiver.metrics()
            payloads = [
                (f"OTLP {signal} request {i}", r.SerializeToString())
                for signal in ("traces", "metrics", "logs", "profiles")
                for i, r in enumerate(receiver.requests(signal))
            ]
    finally:
        server.kill()
        server.wait()

    llm = [s for s in spans if "gen_ai.input.messages" in s["attributes"]]
    assert sorted(s["kind"] for s in llm) == ["CLIENT"] * REQUESTS + ["SERVER"] * REQUESTS
    assert all("<email>" in s["attributes"]["gen_ai.output.messages"] for s in llm)
    assert all(s["attributes"]["http.request.header.x-user-email"] == ["<email>"] for s in llm)
    files = [(str(p), p.read_bytes()) for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert files
    # Where each leak was found, with the bytes around it, so that a failure says which signal,
    # span or file carried it.
    leaked = [
        (kind, where, blob[max(0, at - 200) : at + 200])
        for kind, values in CORPUS.items()
        for value in values
        for where, blob in payloads + files
        if (at := blob.find(secret_part(kind, value).encode())) >= 0
    ]
    assert not leaked
    for kind, values in CORPUS.items():
        in_body = 0 if kind in REDACTED_BEFORE else 2 * len(values)
        in_headers = sum(1 for k, _ in HEADERS.values() if k == kind)
        expected = 2 * REQUESTS * (in_body + in_headers)  # per span; a server span and a client span
        assert latest_total(metrics, "otel_ebpf.pii.scrubbed", kind=kind) == expected, kind
