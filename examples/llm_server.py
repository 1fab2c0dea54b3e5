"""A stand-in LLM server that streams like vLLM and Ollama do, with known timing (ASGI, served by
hypercorn over HTTP/1.1 and h2c, as uvicorn or hypercorn serve vLLM's FastAPI app).

It speaks the OpenAI-compatible API (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``; SSE with ``data: [DONE]`` and the ``stream_options.include_usage`` chunk),
OpenAI's Responses API (``/v1/responses``) and Anthropic's Messages API (``/v1/messages``), both
streamed as SSE with named events, Ollama's native NDJSON API (``/api/generate``, ``/api/chat``)
and TGI's ``/generate_stream``. A streamed answer's first token comes ``--first-token-ms`` after
the request, then one every ``--token-ms``; it has ``max_tokens`` tokens (default ``--tokens``;
Responses and Messages stop at ``--tokens`` when the limit is higher, as a model ending its turn
would). With ``--max-sequences N`` at most N answers are generated at once and the rest wait
their turn, as a serving engine's scheduler makes them (vLLM's ``max_num_seqs``). Token counts it
reports: the prompt's characters / 4, rounded up, in; the tokens it sent, out.

A Responses or Messages request for a model named ``*-fails`` is cut by an error event after
three tokens (``response.failed``; Anthropic's ``error`` with ``overloaded_error``).

With ``--echo`` a non-streamed chat or text completion answers with the last message's content
(the prompt) instead of tokens, as a model repeating what it was told would.

Writes the port it listens on (loopback, chosen by the kernel) to PORT_FILE once ready.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

Send = Callable[[dict[str, Any]], Awaitable[None]]


def _prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("messages") or body.get("prompt") or body.get("input") or body.get("inputs") or ""
    return max(1, -(-len(json.dumps(prompt)) // 4))


class LLMServer:
    """The ASGI application: one handler per API, each writing its response through ``send``."""

    def __init__(
        self, first_token_s: float, token_s: float, tokens: int, echo: bool = False, max_sequences: int = 0
    ) -> None:
        self.first_token_s, self.token_s, self.tokens, self.echo = first_token_s, token_s, tokens, echo
        self.scheduler: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Semaphore(max_sequences) if max_sequences else contextlib.nullcontext()
        )
        self.routes: dict[str, Callable[[str, dict[str, Any], Send], Awaitable[None]]] = {
            "/v1/chat/completions": self.openai,
            "/v1/completions": self.openai,
            "/v1/embeddings": self.embeddings,
            "/v1/responses": self.responses,
            "/v1/messages": self.messages,
            "/api/generate": self.ollama,
            "/api/chat": self.ollama,
            "/generate_stream": self.tgi_stream,
        }

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Send
    ) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        handler = self.routes.get(scope["path"]) if scope["method"] == "POST" else None
        if handler is None:
            await _json(send, {"error": {"type": "not_found", "message": scope["path"]}}, 404)
            return
        await handler(scope["path"], json.loads(body), send)

    async def _tokens(self, count: int) -> AsyncIterator[str]:
        """Yields token texts on the server's schedule, once the scheduler lets the answer start."""
        async with self.scheduler:
            await asyncio.sleep(self.first_token_s)
            for i in range(count):
                if i:
                    await asyncio.sleep(self.token_s)
                yield f"tok{i} "

    async def openai(self, path: str, body: dict[str, Any], send: Send) -> None:
        chat = path.endswith("/chat/completions")
        count = int(body.get("max_tokens") or self.tokens)
        model, prompt_tokens = body["model"], _prompt_tokens(body)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": count, "total_tokens": prompt_tokens + count}
        ident = f"cmpl-{time.monotonic_ns()}"
        served = f"{model}-served"  # the response names the model as the server resolved it
        if not body.get("stream"):
            if self.echo:
                text = body["messages"][-1]["content"] if chat else body["prompt"]
            else:
                text = "".join([token async for token in self._tokens(count)])
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            await _json(
                send,
                {
                    "id": ident,
                    "object": "chat.completion" if chat else "text_completion",
                    "model": served,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        await _start_stream(send, b"text/event-stream")

        async def event(chunk: dict[str, Any]) -> None:
            chunk = {
                "id": ident,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "model": served,
                **chunk,
            }
            await _write(send, b"data: " + json.dumps(chunk).encode() + b"\n\n")

        if chat:  # vLLM opens with the role, before any content
            await event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        sent = 0
        async for token in self._tokens(count):
            sent += 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if sent == count else None}
            choice.update({"delta": {"content": token}} if chat else {"text": token})
            await event({"choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await event({"choices": [], "usage": usage})
        await _write(send, b"data: [DONE]\n\n", last=True)

    async def embeddings(self, path: str, body: dict[str, Any], send: Send) -> None:
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        tokens = _prompt_tokens(body)
        await _json(
            send,
            {
                "object": "list",
                "model": body["model"],
                "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    async def ollama(self, path: str, body: dict[str, Any], send: Send) -> None:
        chat = path == "/api/chat"
        count = int((body.get("options") or {}).get("num_predict") or self.tokens)
        await _start_stream(send, b"application/x-ndjson")
        async for token in self._tokens(count):
            line: dict[str, Any] = {"model": body["model"], "created_at": "2026-11-30T00:00:00Z", "done": False}
            line.update({"message": {"role": "assistant", "content": token}} if chat else {"response": token})
            await _write(send, json.dumps(line).encode() + b"\n")
        last = {
            "model": body["model"],
            "done": True,
            "done_reason": "length",
            "prompt_eval_count": _prompt_tokens(body),
            "eval_count": count,
            "total_duration": 1,
            "eval_duration": 1,
        }
        last.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
        await _write(send, json.dumps(last).encode() + b"\n", last=True)

    async def tgi_stream(self, path: str, body: dict[str, Any], send: Send) -> None:
        count = int((body.get("parameters") or {}).get("max_new_tokens") or self.tokens)
        await _start_stream(send, b"text/event-stream")
        sent = 0
        async for token in self._tokens(count):
            sent += 1
            event: dict[str, Any] = {
                "index": sent,
                "token": {"id": sent, "text": token, "logprob": 0.0, "special": False},
                "generated_text": None,
                "details": None,
            }
            if sent == count:
                event["details"] = {"finish_reason": "length", "generated_tokens": count, "seed": None}
            await _write(send, b"data:" + json.dumps(event).encode() + b"\n\n", last=sent == count)

    def _limit(self, requested: Any) -> tuple[int, bool]:
        """(tokens to generate, whether the request's limit stopped them)."""
        limit = int(requested) if requested else self.tokens
        return min(limit, self.tokens), bool(requested) and limit <= self.tokens

    async def responses(self, path: str, body: dict[str, Any], send: Send) -> None:
        count, cut = self._limit(body.get("max_output_tokens"))
        model, prompt_tokens = body["model"], _prompt_tokens(body)
        fails = model.endswith("-fails")
        response: dict[str, Any] = {
            "id": f"resp_{time.monotonic_ns()}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": f"{model}-served",
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
        }
        item: dict[str, Any] = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant"}

        def finish(text: str) -> None:
            part = {"type": "output_text", "text": text, "annotations": []}
            response["output"] = [{**item, "status": "completed", "content": [part]}]
            response["usage"] = {
                "input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": count,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt_tokens + count,
            }
            response["status"] = "incomplete" if cut else "completed"
            response["incomplete_details"] = {"reason": "max_output_tokens"} if cut else None

        if not body.get("stream"):
            finish("".join([token async for token in self._tokens(count)]))
            await _json(send, response)
            return
        await _start_stream(send, b"text/event-stream")
        sequence = iter(range(1 << 30))

        async def event(kind: str, last: bool = False, **fields: Any) -> None:
            data = {"type": kind, "sequence_number": next(sequence), **fields}
            await _named_event(send, kind, data, last)

        await event("response.created", response=response)
        await event("response.in_progress", response=response)
        await event("response.output_item.added", output_index=0, item={**item, "content": []})
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        await event("response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []})
        text = ""
        async for token in self._tokens(3 if fails else count):
            text += token
            await event("response.output_text.delta", **where, delta=token, logprobs=[])
        if fails:
            response.update(status="failed", error={"code": "server_error", "message": "the stand-in failed"})
            await event("response.failed", last=True, response=response)
            return
        finish(text)
        await event("response.output_text.done", **where, text=text, logprobs=[])
        await event("response.content_part.done", **where, part=response["output"][0]["content"][0])
        await event("response.output_item.done", output_index=0, item=response["output"][0])
        await event(f"response.{response['status']}", last=True, response=response)

    async def messages(self, path: str, body: dict[str, Any], send: Send) -> None:
        count, cut = self._limit(body.get("max_tokens"))
        model = body["model"]
        fails = model.endswith("-fails")
        message: dict[str, Any] = {
            "id": f"msg_{time.monotonic_ns()}",
            "type": "message",
            "role": "assistant",
            "model": f"{model}-served",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": _prompt_tokens(body), "output_tokens": 1},
        }
        stop_reason = "max_tokens" if cut else "end_turn"
        if not body.get("stream"):
            text = "".join([token async for token in self._tokens(count)])
            message.update(content=[{"type": "text", "text": text}], stop_reason=stop_reason)
            message["usage"]["output_tokens"] = count
            await _json(send, message)
            return
        await _start_stream(send, b"text/event-stream")
        await _named_event(send, "message_start", {"type": "message_start", "message": message})
        block_start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        await _named_event(send, "content_block_start", block_start)
        await _named_event(send, "ping", {"type": "ping"})
        async for token in self._tokens(3 if fails else count):
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token}}
            await _named_event(send, "content_block_delta", delta)
        if fails:
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
            await _named_event(send, "error", error, last=True)
            return
        await _named_event(send, "content_block_stop", {"type": "content_block_stop", "index": 0})
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": count},
        }
        await _named_event(send, "message_delta", delta)
        await _named_event(send, "message_stop", {"type": "message_stop"}, last=True)


async def _start_stream(send: Send, content_type: bytes) -> None:
    """A streamed response: no length, so HTTP/1.1 frames it chunked and HTTP/2 in DATA frames."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache")],
        }
    )


async def _write(send: Send, data: bytes, last: bool = False) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": not last})


async def _named_event(send: Send, kind: str, data: dict[str, Any], last: bool = False) -> None:
    """An SSE event with its type on an ``event:`` line, as the Responses and Messages APIs send."""
    await _write(send, b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps(data).encode()), last)


async def _json(send: Send, document: dict[str, Any], status: int = 200) -> None:
    body = json.dumps(document).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _serve(args: argparse.Namespace) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    sock = socket.create_server(("127.0.0.1", args.port))
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = config.errorlog = None
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    port = sock.getsockname()[1]
    if args.port_file:
        Path(args.port_file).write_text(f"{port}\n")
    print(f"LLM stand-in on http://127.0.0.1:{port} (HTTP/1.1 and h2c)", flush=True)
    app = LLMServer(args.first_token_ms / 1e3, args.token_ms / 1e3, args.tokens, args.echo, args.max_sequences)
    await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port_file", nargs="?", help="write the chosen port here once listening")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--first-token-ms", type=float, default=300)
    parser.add_argument("--token-ms", type=float, default=40)
    parser.add_argument("--tokens", type=int, default=25)
    parser.add_argument("--echo", action="store_true", help="non-streamed completions answer with the prompt")
    parser.add_argument("--max-sequences", type=int, default=0, help="answers generated at once (0: no limit)")
    try:
        asyncio.run(_serve(parser.parse_args()))
    except KeyboardInterrupt:
        return


if __name__ == "__main__":
    main()
