"""The Responses and Messages dialects on recorded traffic: every split point, gaps, hostile bytes.

``data/genai/*.json`` were recorded by ``record_genai_dialects.py``: the real ``openai`` client's
Responses API and the real ``anthropic`` client's Messages API (``create(stream=True)``, the
``messages.stream`` helper, not streamed, and streams the server ends with ``response.failed`` or an
``error`` event) against ``examples/llm_server.py`` (first token after 300 ms, then one every
40 ms, 8 tokens), one connection per call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, Exchange, Role, StatusCode
from otel_ebpf.protocol_testing import (
    Chunk,
    as_role,
    assert_every_split,
    assert_survives_gaps,
    capped,
    load_recording,
    mutate,
    replay,
)
from otel_ebpf.protocols.genai import Api, Route, genai_option
from otel_ebpf.protocols.http1 import HTTP1

DATA = Path(__file__).parent / "data" / "genai"
SERVER = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8000), Endpoint("127.0.0.1", 50000))
CLIENT = ConnectionInfo(Role.CLIENT, Endpoint("127.0.0.1", 50000), Endpoint("127.0.0.1", 8000))
TOKENS = 8
PROMPT_TOKENS = 20  # the stand-in's count for examples/llm_clients.py's PROMPT

# per recording: name, provider, response model, input and output tokens, output chunks (None: not
# streamed), finish reasons, error.type
EXPECTED: dict[str, tuple] = {
    "openai_responses_stream": (
        "chat gpt-5-mini", "openai", "gpt-5-mini-served", PROMPT_TOKENS, TOKENS, TOKENS, ("completed",), None,
    ),
    "openai_responses": (
        "chat gpt-5-mini", "openai", "gpt-5-mini-served", 6, TOKENS, None, ("max_output_tokens",), None,
    ),
    "openai_responses_stream_failed": (
        "chat gpt-fails", "openai", "gpt-fails-served", 12, 3, 3, ("failed",), "server_error",
    ),
    "anthropic_messages_stream": (
        "chat claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5-served", PROMPT_TOKENS, TOKENS, TOKENS, ("end_turn",),
        None,
    ),
    "anthropic_messages_stream_helper": (
        "chat claude-haiku-4-5", "anthropic", "claude-haiku-4-5-served", PROMPT_TOKENS, TOKENS, TOKENS, ("end_turn",),
        None,
    ),
    "anthropic_messages": (
        "chat claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5-served", PROMPT_TOKENS, TOKENS, None, ("max_tokens",),
        None,
    ),
    "anthropic_messages_stream_error": (
        "chat claude-fails", "anthropic", "claude-fails-served", PROMPT_TOKENS, 3, 3, None, "overloaded_error",
    ),
}  # fmt: skip
STREAMS = [name for name, expected in EXPECTED.items() if expected[5] is not None]


def _recording(name: str) -> list[Chunk]:
    return load_recording(DATA / f"{name}.json")


def _span(exchange: Exchange, role: Role) -> dict[str, Any]:
    span = exchange.span(SERVER if role is Role.SERVER else CLIENT)
    return {"name": span.name, "status": span.status, **span.attributes}


def _figures(exchange: Exchange) -> tuple:
    """What the layer read, times included (a split piece keeps its syscall's timestamp)."""
    span = exchange.span(SERVER)
    keys = (
        "gen_ai.provider.name",
        "gen_ai.response.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "otel_ebpf.gen_ai.output_chunks",
        "gen_ai.response.finish_reasons",
        "error.type",
        "gen_ai.response.id",
        "gen_ai.response.time_to_first_chunk",
        "otel_ebpf.gen_ai.time_per_output_token",
    )
    return (span.name, span.status, *(span.attributes.get(key) for key in keys))


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("role", list(Role))
def test_recorded_calls_give_what_the_client_saw(name: str, role: Role) -> None:
    chunks = as_role(_recording(name), role)
    run = replay(chunks, role, HTTP1())
    assert len(run.exchanges) == 1 and run.session.parse_errors == 0
    span = _span(run.exchanges[0], role)
    model, provider, served, inputs, outputs, chunk_count, reasons, error = EXPECTED[name]
    got = (
        span["name"],
        span["gen_ai.provider.name"],
        span["gen_ai.response.model"],
        span["gen_ai.usage.input_tokens"],
        span["gen_ai.usage.output_tokens"],
        span.get("otel_ebpf.gen_ai.output_chunks"),
        span.get("gen_ai.response.finish_reasons"),
        span.get("error.type"),
    )
    assert got == EXPECTED[name]
    assert span["gen_ai.operation.name"] == "chat"
    assert span["gen_ai.response.id"].startswith("resp_" if provider == "openai" else "msg_")
    assert span["status"] is (StatusCode.ERROR if error else StatusCode.UNSET)
    # the client's own record of the call, saved with the recording
    seen = json.loads(json.loads((DATA / f"{name}.json").read_text())["description"])
    assert seen["model"] == served
    if error is None:
        assert seen["usage"] == {"input_tokens": inputs, "output_tokens": outputs}
    if chunk_count is None:
        assert span["otel_ebpf.gen_ai.stream"] is False and "gen_ai.response.time_to_first_chunk" not in span
        return
    assert seen["chunks"] == chunk_count
    assert span["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.30, abs=0.03)
    assert span["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.040, abs=0.010)
    if error:  # no usage report, or only message_start's: the rest is counted, and said so
        approximate = ("output_tokens",) if provider == "anthropic" else ("output_tokens", "input_tokens")
        assert span["otel_ebpf.gen_ai.usage.approximate"] == approximate
    else:
        assert "otel_ebpf.gen_ai.usage.approximate" not in span


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_split_point_gives_the_same_figures(name: str) -> None:
    chunks = _recording(name)
    expected = [_figures(replay(chunks, Role.SERVER, HTTP1()).exchanges[0])]
    assert_every_split(chunks, HTTP1(), _figures, expected, longest=800)


@pytest.mark.parametrize("name", STREAMS)
def test_gaps_anywhere_never_raise_and_stay_bounded(name: str) -> None:
    assert_survives_gaps(_recording(name), HTTP1(), max_buffered=64 * 1024)


@pytest.mark.parametrize("name", ["openai_responses_stream", "anthropic_messages_stream"])
def test_a_stream_cut_off_midway_keeps_what_was_seen(name: str) -> None:
    chunks = _recording(name)
    first_delta = next(i for i, c in enumerate(chunks) if b".delta" in c.data or b"_delta" in c.data)
    run = replay(chunks[: first_delta + 3], Role.SERVER, HTTP1())
    span = _span(run.exchanges[0], Role.SERVER)
    assert span["error.type"] == "connection_closed" and span["status"] is StatusCode.ERROR
    assert span["otel_ebpf.gen_ai.output_chunks"] == 3
    assert span["gen_ai.usage.output_tokens"] == 3
    assert "output_tokens" in span["otel_ebpf.gen_ai.usage.approximate"]
    assert span["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.30, abs=0.03)


def test_a_whole_body_the_capture_cut_short_still_names_the_model() -> None:
    """The per-syscall payload cap cuts the non-streamed Responses body before its usage."""
    run = replay(capped(_recording("openai_responses"), 600), Role.SERVER, HTTP1())
    span = _span(run.exchanges[0], Role.SERVER)
    assert span["name"] == "chat gpt-5-mini" and span["gen_ai.response.model"] == "gpt-5-mini-served"
    assert "gen_ai.usage.output_tokens" not in span and span["status"] is StatusCode.UNSET


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(list(EXPECTED)))
def test_mutated_recordings_never_raise(data: st.DataObject, name: str) -> None:
    tokens = (
        b"event: error\ndata: {\n\n",
        b'data: {"type": "message_delta", "delta": 5, "usage": []}\n\n',
        b'data: {"type": "response.completed", "response": {"usage": {"input_tokens": -1}}}\n\n',
        b'data: {"type": "response.output_text.delta", "delta": null}\n\n',
        b"\r\n\r\n",
        b"0\r\n\r\n",
    )
    for role in Role:
        for exchange in replay(mutate(data.draw, as_role(_recording(name), role), tokens), role, HTTP1()).exchanges:
            exchange.span(SERVER if role is Role.SERVER else CLIENT)
            exchange.metric_points(SERVER if role is Role.SERVER else CLIENT)


def _sse_call(path: str, request: dict[str, Any], events: list[bytes]) -> tuple[dict[str, Any], int]:
    """One streamed call, by hand: (its span, parse errors counted)."""
    body = json.dumps(request).encode()
    head = b"POST %s HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % (path.encode(), len(body))
    content = b"".join(events)
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(content)
    chunks = [Chunk(Direction.INGRESS, 1, head + body), Chunk(Direction.EGRESS, 2, response)]
    chunks += [Chunk(Direction.EGRESS, 100_000_000 * (i + 1), event) for i, event in enumerate(events)]
    run = replay(chunks, Role.SERVER, HTTP1())
    return _span(run.exchanges[0], Role.SERVER), run.session.parse_errors


def _event(kind: str, **data: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps({"type": kind, **data}).encode())


def test_anthropic_cache_tokens_count_as_input_and_tool_input_as_output() -> None:
    usage = {"input_tokens": 5, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000, "output_tokens": 1}
    tool = {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a'}}
    span, errors = _sse_call(
        "/anthropic/v1/messages",
        {"model": "claude", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        [
            _event("message_start", message={"id": "msg_1", "model": "claude-x", "usage": usage}),
            _event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "hmm"}),
            b"event: content_block_delta\ndata: " + json.dumps(tool).encode() + b"\n\n",
            b"event: ping\ndata: {broken\n\n",  # counted, skipped
            _event("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 7}),
            _event("message_stop"),
        ],
    )
    assert span["gen_ai.usage.input_tokens"] == 1105
    assert span["gen_ai.usage.output_tokens"] == 7
    assert span["otel_ebpf.gen_ai.output_chunks"] == 2
    assert span["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert span["gen_ai.request.max_tokens"] == 64
    assert errors == 1


def test_a_responses_error_event_names_its_code_and_function_call_deltas_are_output() -> None:
    span, errors = _sse_call(
        "/openai/v1/responses?api-version=preview",
        {"model": "gpt", "input": "hi", "stream": True, "max_output_tokens": 50},
        [
            _event("response.created", response={"id": "resp_9", "model": "gpt-x", "status": "in_progress"}),
            _event("response.function_call_arguments.delta", delta='{"city":'),
            _event("response.reasoning_summary_text.delta", delta="thinking"),
            _event("response.audio.delta", delta="AAAA"),  # not counted: not text
            _event("error", code="rate_limit_exceeded", message="slow down"),
        ],
    )
    assert span["name"] == "chat gpt" and span["gen_ai.request.max_tokens"] == 50
    assert span["gen_ai.response.id"] == "resp_9" and span["gen_ai.response.model"] == "gpt-x"
    assert span["otel_ebpf.gen_ai.output_chunks"] == 2
    assert span["error.type"] == "rate_limit_exceeded" and span["status"] is StatusCode.ERROR
    assert "gen_ai.response.finish_reasons" not in span  # in_progress is no outcome
    assert errors == 0


@pytest.mark.parametrize(
    ("method", "target", "api"),
    [
        ("POST", "/v1/responses", Api.OPENAI_RESPONSES),
        ("POST", "/openai/v1/responses?api-version=preview", Api.OPENAI_RESPONSES),
        ("POST", "/v1/messages", Api.ANTHROPIC_MESSAGES),
        ("POST", "/gateway/anthropic/v1/messages", Api.ANTHROPIC_MESSAGES),
        ("POST", "/chat/42/messages", None),  # a chat app's own messages
        ("POST", "/v1/messages/count_tokens", None),
        ("GET", "/v1/responses/resp_1", None),
    ],
)
def test_the_new_paths_are_recognised(method: str, target: str, api: Api | None) -> None:
    options = genai_option(None)
    assert options is not None
    route = options.recognizer.match(method, target)
    assert (route.api if route else None) is api
    if route is not None:
        assert route == Route(api, "anthropic" if api is Api.ANTHROPIC_MESSAGES else "openai")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/responses", {"model": "m", "messages": []}), ("/v1/messages", {"model": "m", "input": "x"})],
)
def test_a_body_without_the_dialects_input_stays_plain_http(path: str, body: dict[str, Any]) -> None:
    span, _ = _sse_call(path, body, [_event("message_stop")])
    assert not any(key.startswith("gen_ai.") for key in span)


@pytest.mark.parametrize(
    ("name", "prompt"),
    [
        ("openai_responses_stream", "Say something about eBPF"),
        ("openai_responses", "Why is the sky blue?"),
        ("anthropic_messages_stream_helper", "Say something about eBPF"),
    ],
)
def test_content_capture_reads_each_dialects_output(name: str, prompt: str) -> None:
    protocol = HTTP1({"genai": {"capture_content": True}})
    span = _span(replay(_recording(name), Role.SERVER, protocol).exchanges[0], Role.SERVER)
    assert span["gen_ai.output.messages"] == "".join(f"tok{i} " for i in range(TOKENS))
    assert prompt in span["gen_ai.input.messages"]
