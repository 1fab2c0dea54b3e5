"""Live BPF: LLM calls measured from the wire, on both the serving and the calling side.

``examples/llm_server.py`` (ASGI on hypercorn) streams its first token 300 ms after a request, then
one every 40 ms, 25 in all, with the usage chunk; ``examples/llm_clients.py`` calls it with ``httpx``
streaming, the official ``openai`` client (streaming, non-streaming, embeddings), Ollama's NDJSON API, TGI's
``/generate_stream`` and, last, the first stream again over HTTP/2 (h2c). A second run has the
``openai`` client's Responses API and the ``anthropic`` client's Messages API call it, streamed
(named SSE events) and not, and two streams the server ends with an error event. Both are traced by
pid; what a real OTLP receiver got is held against what the callers themselves saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.live.test_http_live import _latest_points, _wait_for_file
from tests.live.test_tls_live import _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
SERVER = [sys.executable, str(REPO / "examples" / "llm_server.py")]
CLIENTS = [sys.executable, str(REPO / "examples" / "llm_clients.py")]
TOKENS = 25
STREAMED = ("httpx_chat_stream", "openai_chat_stream", "ollama_generate", "tgi_generate_stream", "httpx_chat_stream_h2")
CALLS = 7
OPENAI_COMPATIBLE = (
    "httpx_chat_stream",
    "openai_chat_stream",
    "openai_chat",
    "openai_embeddings",
    "ollama_generate",
    "tgi_generate_stream",
    "httpx_chat_stream_h2",
)
DIALECTS = (
    "openai_responses_stream",
    "openai_responses",
    "openai_responses_stream_failed",
    "anthropic_messages_stream",
    "anthropic_messages_stream_helper",
    "anthropic_messages",
    "anthropic_messages_stream_error",
)


def _traced_calls(tmp: Path, calls: tuple[str, ...]) -> dict[str, Any]:
    """``calls`` once each, in order, traced (after an untraced warm-up round); the callers' own
    records, the spans and the metrics."""
    server = subprocess.Popen(
        [*SERVER, str(tmp / "port"), "--first-token-ms", "300", "--token-ms", "40", "--tokens", str(TOKENS)],
        stdout=subprocess.DEVNULL,
    )
    try:
        port = _wait_for_file(tmp / "port", server)
        only = [arg for call in calls for arg in ("--only", call)]
        clients = subprocess.Popen(
            [*CLIENTS, port, "--wait", "--warm-up", "--tokens", str(TOKENS), *only],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert clients.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp, receiver, "tracepoints", "--pid", str(server.pid), "--pid", str(clients.pid))
            try:
                out, _ = clients.communicate("go\n", timeout=120)
            finally:
                stderr = _stop(agent)
            assert clients.returncode == 0
            receiver.wait_for(lambda r: len(r.spans()) >= 2 * len(calls) and bool(r.metrics()), timeout=10)
            spans, metrics = receiver.spans(), receiver.metrics()
    finally:
        server.kill()
        server.wait()
    records = {record["call"]: record for record in map(json.loads, out.splitlines())}
    return {"calls": records, "spans": spans, "metrics": metrics, "stderr": stderr}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every OpenAI-compatible, Ollama and TGI call once, traced."""
    return _traced_calls(tmp_path_factory.mktemp("genai"), OPENAI_COMPATIBLE)


@pytest.fixture(scope="module")
def dialects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every Responses and Messages call once, traced."""
    return _traced_calls(tmp_path_factory.mktemp("genai-dialects"), DIALECTS)


def _llm_spans(run: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return sorted(
        (s for s in run["spans"] if s["kind"] == kind and "gen_ai.operation.name" in s["attributes"]),
        key=lambda s: s["start_ns"],
    )


def _points(run: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Each series' latest point; a series is also told apart by its scope (the HTTP/1 and HTTP/2
    plugins record the same instruments, each under its own scope)."""
    by_scope: dict[str, list[dict[str, Any]]] = {}
    for point in run["metrics"].get(name, []):
        by_scope.setdefault(point["scope"], []).append(point)
    return [point for points in by_scope.values() for point in _latest_points(points)]


def _histogram_count(run: dict[str, Any], name: str, **attributes: Any) -> int:
    return sum(
        p["count"] for p in _points(run, name) if all(p["attributes"].get(k) == v for k, v in attributes.items())
    )


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_every_call_is_one_genai_span_per_side(run: dict[str, Any], kind: str) -> None:
    spans = _llm_spans(run, kind)
    # in call order: the callers run the calls one after another
    assert [s["name"] for s in spans] == [
        "chat llama-3-8b",
        "chat gpt-oss-20b",
        "chat gpt-oss-20b",
        "embeddings bge-small",
        "text_completion llama3.2",
        "text_completion",
        "chat llama-3-8b",
    ]
    providers = [s["attributes"]["gen_ai.provider.name"] for s in spans]
    assert providers == ["openai"] * 4 + ["ollama", "huggingface.tgi", "openai"]
    versions = [s["attributes"]["network.protocol.version"] for s in spans]
    assert versions == ["1.1"] * 6 + ["2"]
    assert run["calls"]["httpx_chat_stream_h2"]["http_version"] == "HTTP/2"
    failed = [
        (s["name"], s["status_code"], s["attributes"])
        for s in spans
        if s["status_code"] != "UNSET" or "error.type" in s["attributes"]
    ]
    assert not failed


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_streams_give_ttft_tpot_and_exact_tokens(run: dict[str, Any], kind: str) -> None:
    spans = _llm_spans(run, kind)
    streamed = [spans[0], spans[1], spans[4], spans[5], spans[6]]
    for span, name in zip(streamed, STREAMED, strict=True):
        a = span["attributes"]
        seen = run["calls"][name]
        assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.30, abs=0.03), name
        assert a["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.040, abs=0.010), name
        assert a["gen_ai.usage.output_tokens"] == TOKENS == seen["usage"]["completion_tokens"], name
        assert a["otel_ebpf.gen_ai.output_chunks"] == TOKENS == seen["chunks"], name
        assert a["otel_ebpf.gen_ai.stream"] is True
        if "prompt_tokens" in seen["usage"]:  # as the server reported them
            assert a["gen_ai.usage.input_tokens"] == seen["usage"]["prompt_tokens"], name
            assert "otel_ebpf.gen_ai.usage.approximate" not in a
        else:  # TGI reports no input tokens: counted from the prompt, and said so
            assert a["otel_ebpf.gen_ai.usage.approximate"] == ["input_tokens"]
        if seen["model"] is not None:
            assert a["gen_ai.response.model"] == seen["model"], name
        assert a["gen_ai.response.finish_reasons"] == ["length"], name
    assert streamed[0]["attributes"]["gen_ai.request.model"] == "llama-3-8b"
    assert streamed[0]["attributes"]["gen_ai.response.model"] == "llama-3-8b-served"


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_non_streaming_completion_and_embeddings(run: dict[str, Any], kind: str) -> None:
    spans = _llm_spans(run, kind)
    chat, embeddings = spans[2]["attributes"], spans[3]["attributes"]
    seen = run["calls"]
    assert chat["otel_ebpf.gen_ai.stream"] is False
    assert chat["gen_ai.usage.output_tokens"] == TOKENS
    assert chat["gen_ai.usage.input_tokens"] == seen["openai_chat"]["usage"]["prompt_tokens"]
    assert "gen_ai.response.time_to_first_chunk" not in chat
    assert (spans[2]["end_ns"] - spans[2]["start_ns"]) / 1e9 == pytest.approx(0.30 + 24 * 0.040, abs=0.15)
    assert embeddings["gen_ai.operation.name"] == "embeddings"
    assert embeddings["gen_ai.usage.input_tokens"] == seen["openai_embeddings"]["usage"]["prompt_tokens"]
    assert "gen_ai.usage.output_tokens" not in embeddings


def test_serving_side_histograms(run: dict[str, Any]) -> None:
    assert _histogram_count(run, "gen_ai.server.request.duration") == CALLS
    assert _histogram_count(run, "gen_ai.server.time_to_first_token") == len(STREAMED)
    assert _histogram_count(run, "gen_ai.server.time_per_output_token") == len(STREAMED)
    assert _histogram_count(run, "gen_ai.server.time_to_first_token", **{"gen_ai.request.model": "llama-3-8b"}) == 2
    ttft = _points(run, "gen_ai.server.time_to_first_token")
    assert all(p["unit"] == "s" and p["explicit_bounds"][:3] == [0.001, 0.005, 0.01] for p in ttft)
    # every first token landed in the (0.25, 0.5] bucket
    assert sum(p["bucket_counts"][9] for p in ttft) == len(STREAMED)


def test_calling_side_histograms(run: dict[str, Any]) -> None:
    assert _histogram_count(run, "gen_ai.client.operation.duration") == CALLS
    assert _histogram_count(run, "gen_ai.client.operation.time_to_first_chunk") == len(STREAMED)
    assert _histogram_count(run, "gen_ai.client.operation.time_per_output_chunk") == len(STREAMED) * (TOKENS - 1)
    assert _histogram_count(run, "gen_ai.client.token.usage", **{"gen_ai.token.type": "output"}) == CALLS - 1
    assert _histogram_count(run, "gen_ai.client.token.usage", **{"gen_ai.token.type": "input"}) == CALLS
    usage = _points(run, "gen_ai.client.token.usage")
    assert {p["unit"] for p in usage} == {"{token}"}
    output = [p for p in usage if p["attributes"]["gen_ai.token.type"] == "output"]
    assert sum(p["sum"] for p in output) == (CALLS - 1) * TOKENS
    # the HTTP conventions still describe the same exchanges
    assert _histogram_count(run, "http.client.request.duration") == CALLS


def test_content_never_exported_by_default(run: dict[str, Any]) -> None:
    for span in run["spans"]:
        assert not {"gen_ai.input.messages", "gen_ai.output.messages"} & set(span["attributes"])
        assert "sk-test-not-a-secret" not in json.dumps(span["attributes"])


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_responses_and_messages_calls_are_genai_spans(dialects: dict[str, Any], kind: str) -> None:
    spans = _llm_spans(dialects, kind)
    assert [s["name"] for s in spans] == [
        "chat gpt-5-mini",
        "chat gpt-5-mini",
        "chat gpt-fails",
        "chat claude-sonnet-4-5",
        "chat claude-haiku-4-5",
        "chat claude-sonnet-4-5",
        "chat claude-fails",
    ]
    assert [s["attributes"]["gen_ai.provider.name"] for s in spans] == ["openai"] * 3 + ["anthropic"] * 4
    assert all(s["attributes"]["gen_ai.operation.name"] == "chat" for s in spans)
    for span, call in zip(spans, DIALECTS, strict=True):
        a, seen = span["attributes"], dialects["calls"][call]
        assert a["gen_ai.response.model"] == seen["model"], call
        assert a["gen_ai.response.id"].startswith("resp_" if "responses" in call else "msg_"), call
        if "fail" in call or "error" in call:
            continue
        assert span["status_code"] == "UNSET" and "error.type" not in a, call
        assert a["gen_ai.usage.input_tokens"] == seen["usage"]["input_tokens"], call
        assert a["gen_ai.usage.output_tokens"] == TOKENS == seen["usage"]["output_tokens"], call
        assert "otel_ebpf.gen_ai.usage.approximate" not in a, call
        # the Responses API's outcome is its status (or why it is incomplete); Anthropic's its stop_reason
        outcome = seen["status"] if "responses" in call else seen["stop_reason"]
        reason = "max_output_tokens" if outcome == "incomplete" else outcome
        assert a["gen_ai.response.finish_reasons"] == [reason], call
    non_streamed = [spans[1]["attributes"], spans[5]["attributes"]]
    assert [a["otel_ebpf.gen_ai.stream"] for a in non_streamed] == [False, False]
    assert [a["gen_ai.request.max_tokens"] for a in non_streamed] == [TOKENS, TOKENS]
    assert not any("gen_ai.response.time_to_first_chunk" in a for a in non_streamed)


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_responses_and_messages_streams_give_ttft_and_tpot(dialects: dict[str, Any], kind: str) -> None:
    spans = _llm_spans(dialects, kind)
    for index, call in ((0, "openai_responses_stream"), (3, "anthropic_messages_stream"), (4, DIALECTS[4])):
        a, seen = spans[index]["attributes"], dialects["calls"][call]
        assert a["otel_ebpf.gen_ai.stream"] is True, call
        assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.30, abs=0.03), call
        assert a["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.040, abs=0.010), call
        assert a["otel_ebpf.gen_ai.output_chunks"] == TOKENS == seen["chunks"], call


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_error_events_end_streams_as_errors(dialects: dict[str, Any], kind: str) -> None:
    spans = _llm_spans(dialects, kind)
    for index, call, error in ((2, DIALECTS[2], "server_error"), (6, DIALECTS[6], "overloaded_error")):
        span, seen = spans[index], dialects["calls"][call]
        a = span["attributes"]
        assert span["status_code"] == "ERROR" and a["error.type"] == error, call
        assert a["otel_ebpf.gen_ai.output_chunks"] == 3 == seen["chunks"], call
        assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.30, abs=0.03), call
        assert a["gen_ai.usage.output_tokens"] == 3 and "output_tokens" in a["otel_ebpf.gen_ai.usage.approximate"]
    assert dialects["calls"][DIALECTS[2]]["status"] == "failed"
    assert dialects["calls"][DIALECTS[6]]["error"] == "overloaded_error"


def test_responses_and_messages_metrics(dialects: dict[str, Any]) -> None:
    count = len(DIALECTS)
    assert _histogram_count(dialects, "gen_ai.server.request.duration") == count
    assert _histogram_count(dialects, "gen_ai.client.operation.duration") == count
    for error in ("server_error", "overloaded_error"):
        assert _histogram_count(dialects, "gen_ai.server.request.duration", **{"error.type": error}) == 1
    # the serving side's TTFT and TPOT are for successful responses only; the calling side times every stream
    assert _histogram_count(dialects, "gen_ai.server.time_to_first_token") == 3
    assert _histogram_count(dialects, "gen_ai.server.time_per_output_token") == 3
    assert _histogram_count(dialects, "gen_ai.client.operation.time_to_first_chunk") == 5
    gaps = 3 * (TOKENS - 1) + 2 * (3 - 1)
    assert _histogram_count(dialects, "gen_ai.client.operation.time_per_output_chunk") == gaps
    anthropic = {"gen_ai.provider.name": "anthropic", "gen_ai.token.type": "output"}
    usage = [p for p in _points(dialects, "gen_ai.client.token.usage") if p["attributes"].items() >= anthropic.items()]
    assert sum(p["sum"] for p in usage) == 3 * TOKENS + 3
    ttft = _points(dialects, "gen_ai.server.time_to_first_token")
    assert sum(p["bucket_counts"][9] for p in ttft) == 3  # every first token in (0.25, 0.5]
    for span in dialects["spans"]:
        assert "not-a-secret" not in json.dumps(span["attributes"])
