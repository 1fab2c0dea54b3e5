"""Callers of an LLM server, as applications make them: ``httpx`` streaming and the official
``openai`` and ``anthropic`` clients, over every API style ``llm_server.py`` speaks.

    python examples/llm_clients.py PORT [--wait] [--repeat N] [--tokens N]

Prints one JSON line per call: what the caller itself saw (model, usage, chunks with content), so a
test can hold the agent's figures against it. With ``--wait`` it prints ``ready`` and waits for a
line on stdin first (so that an agent can attach to it before any connection exists); with
``--warm-up`` it makes each call once before that, so that what the clients do only the first time
(imports, building the response types: 0.3 s for the first Responses stream) is not in the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai

PROMPT = [{"role": "user", "content": "Say something about eBPF, one word at a time."}]


def _record(name: str, started: float, model: str | None, usage: Any, chunks: int, **extra: Any) -> dict[str, Any]:
    return {
        "call": name,
        "seconds": round(time.monotonic() - started, 4),
        "model": model,
        "usage": usage,
        "chunks": chunks,
        **extra,
    }


def httpx_chat_stream(base: str, tokens: int, http2: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    body = {
        "model": "llama-3-8b",
        "messages": PROMPT,
        "stream": True,
        "max_tokens": tokens,
        "stream_options": {"include_usage": True},
    }
    model, usage, chunks = None, None, 0
    with (
        httpx.Client(http1=not http2, http2=http2) as client,
        client.stream("POST", f"{base}/v1/chat/completions", json=body) as response,
    ):
        version = response.http_version
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            model = chunk["model"]
            usage = chunk.get("usage") or usage
            chunks += sum(1 for c in chunk["choices"] if c["delta"].get("content"))
    return _record(
        "httpx_chat_stream_h2" if http2 else "httpx_chat_stream", started, model, usage, chunks, http_version=version
    )


def httpx_chat_stream_h2(base: str, tokens: int) -> dict[str, Any]:
    """The same stream over HTTP/2 (h2c, prior knowledge), as gateways and gRPC-era clients speak."""
    return httpx_chat_stream(base, tokens, http2=True)


def openai_chat_stream(base: str, tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test-not-a-secret")
    stream = client.chat.completions.create(
        model="gpt-oss-20b", messages=PROMPT, stream=True, max_tokens=tokens, stream_options={"include_usage": True}
    )
    model, usage, chunks = None, None, 0
    for chunk in stream:
        model = chunk.model
        if chunk.usage is not None:
            usage = chunk.usage.model_dump(include={"prompt_tokens", "completion_tokens"})
        chunks += sum(1 for c in chunk.choices if c.delta.content)
    client.close()
    return _record("openai_chat_stream", started, model, usage, chunks)


def openai_chat(base: str, tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    with openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test-not-a-secret") as client:
        reply = client.chat.completions.create(model="gpt-oss-20b", messages=PROMPT, max_tokens=tokens)
    usage = reply.usage.model_dump(include={"prompt_tokens", "completion_tokens"}) if reply.usage else None
    return _record("openai_chat", started, reply.model, usage, 1)


def openai_embeddings(base: str, tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    with openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test-not-a-secret") as client:
        reply = client.embeddings.create(model="bge-small", input=["first text", "second text"])
    return _record("openai_embeddings", started, reply.model, {"prompt_tokens": reply.usage.prompt_tokens}, 0)


def openai_responses_stream(base: str, tokens: int, model: str = "gpt-5-mini") -> dict[str, Any]:
    """The Responses API streamed: typed events, usage in ``response.completed``."""
    started = time.monotonic()
    with openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test-not-a-secret", max_retries=0) as client:
        stream = client.responses.create(model=model, input=PROMPT, stream=True)
        served, usage, chunks, status = None, None, 0, None
        for event in stream:
            if event.type == "response.output_text.delta":
                chunks += bool(event.delta)
            elif event.type in ("response.completed", "response.incomplete", "response.failed"):
                served, status = event.response.model, event.response.status
                if event.response.usage is not None:
                    usage = event.response.usage.model_dump(include={"input_tokens", "output_tokens"})
    name = "openai_responses_stream" if model == "gpt-5-mini" else "openai_responses_stream_failed"
    return _record(name, started, served, usage, chunks, status=status)


def openai_responses_stream_failed(base: str, tokens: int) -> dict[str, Any]:
    """A Responses stream the server ends with ``response.failed`` after three tokens."""
    return openai_responses_stream(base, tokens, model="gpt-fails")


def openai_responses(base: str, tokens: int) -> dict[str, Any]:
    """The Responses API, not streamed; ``max_output_tokens`` ends it (status ``incomplete``)."""
    started = time.monotonic()
    with openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test-not-a-secret", max_retries=0) as client:
        reply = client.responses.create(model="gpt-5-mini", input="Why is the sky blue?", max_output_tokens=tokens)
    usage = reply.usage.model_dump(include={"input_tokens", "output_tokens"}) if reply.usage else None
    return _record("openai_responses", started, reply.model, usage, 1, status=reply.status)


def _anthropic_client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-test-not-a-secret", max_retries=0)


def anthropic_messages_stream(base: str, tokens: int, model: str = "claude-sonnet-4-5") -> dict[str, Any]:
    """``messages.create(stream=True)``: the raw events, usage in ``message_start`` and ``message_delta``."""
    started = time.monotonic()
    served, usage, chunks, stop, error = None, {}, 0, None, None
    with _anthropic_client(base) as client:
        try:
            for event in client.messages.create(model=model, messages=PROMPT, max_tokens=1024, stream=True):
                if event.type == "message_start":
                    served, usage["input_tokens"] = event.message.model, event.message.usage.input_tokens
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    chunks += bool(event.delta.text)
                elif event.type == "message_delta":
                    stop, usage["output_tokens"] = event.delta.stop_reason, event.usage.output_tokens
        except anthropic.APIStatusError as exc:  # the stream's error event
            error = exc.body["error"]["type"] if isinstance(exc.body, dict) else str(exc.body)
    name = "anthropic_messages_stream" if model == "claude-sonnet-4-5" else "anthropic_messages_stream_error"
    return _record(name, started, served, usage, chunks, stop_reason=stop, error=error)


def anthropic_messages_stream_error(base: str, tokens: int) -> dict[str, Any]:
    """A Messages stream the server ends with an ``error`` event (``overloaded_error``) after three tokens."""
    return anthropic_messages_stream(base, tokens, model="claude-fails")


def anthropic_messages_stream_helper(base: str, tokens: int) -> dict[str, Any]:
    """``messages.stream``: the SDK's helper, which accumulates the message as it streams."""
    started = time.monotonic()
    chunks = 0
    with (
        _anthropic_client(base) as client,
        client.messages.stream(model="claude-haiku-4-5", messages=PROMPT, max_tokens=1024) as stream,
    ):
        for text in stream.text_stream:
            chunks += bool(text)
        final = stream.get_final_message()
    usage = final.usage.model_dump(include={"input_tokens", "output_tokens"})
    return _record(
        "anthropic_messages_stream_helper", started, final.model, usage, chunks, stop_reason=final.stop_reason
    )


def anthropic_messages(base: str, tokens: int) -> dict[str, Any]:
    """Not streamed; ``max_tokens`` ends it (``stop_reason`` ``max_tokens``)."""
    started = time.monotonic()
    with _anthropic_client(base) as client:
        reply = client.messages.create(model="claude-sonnet-4-5", messages=PROMPT, max_tokens=tokens)
    usage = reply.usage.model_dump(include={"input_tokens", "output_tokens"})
    return _record("anthropic_messages", started, reply.model, usage, 1, stop_reason=reply.stop_reason)


def ollama_generate(base: str, tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    body = {"model": "llama3.2", "prompt": "Why is the sky blue?", "options": {"num_predict": tokens}}
    usage, chunks = None, 0
    with httpx.Client() as client, client.stream("POST", f"{base}/api/generate", json=body) as response:
        for line in response.iter_lines():
            if not line:
                continue
            event = json.loads(line)
            chunks += bool(event.get("response"))
            if event.get("done"):
                usage = {"prompt_tokens": event["prompt_eval_count"], "completion_tokens": event["eval_count"]}
    return _record("ollama_generate", started, body["model"], usage, chunks)


def tgi_generate_stream(base: str, tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    body = {"inputs": "What is deep learning?", "parameters": {"max_new_tokens": tokens}}
    usage, chunks = None, 0
    with httpx.Client() as client, client.stream("POST", f"{base}/generate_stream", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                chunks += 1
                if event.get("details"):
                    usage = {"completion_tokens": event["details"]["generated_tokens"]}
    return _record("tgi_generate_stream", started, None, usage, chunks)


CALLS: dict[str, Callable[[str, int], dict[str, Any]]] = {
    call.__name__: call
    for call in (
        httpx_chat_stream,
        openai_chat_stream,
        openai_chat,
        openai_embeddings,
        ollama_generate,
        tgi_generate_stream,
        httpx_chat_stream_h2,
        openai_responses_stream,
        openai_responses,
        openai_responses_stream_failed,
        anthropic_messages_stream,
        anthropic_messages_stream_helper,
        anthropic_messages,
        anthropic_messages_stream_error,
    )
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--wait", action="store_true", help="print 'ready', then wait for a line on stdin")
    parser.add_argument("--repeat", type=int, default=1, help="run the whole sequence this many times")
    parser.add_argument("--tokens", type=int, default=25, help="max_tokens of each generation")
    parser.add_argument("--only", choices=sorted(CALLS), action="append", help="run only these calls (repeatable)")
    parser.add_argument("--warm-up", action="store_true", help="make each call once first, without printing it")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    if args.warm_up:
        for name in args.only or CALLS:
            CALLS[name](base, args.tokens)
    if args.wait:
        print("ready", flush=True)
        sys.stdin.readline()
    for _ in range(args.repeat):
        for name in args.only or CALLS:
            print(json.dumps(CALLS[name](base, args.tokens)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
