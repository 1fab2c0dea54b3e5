"""Callers of a Triton LLM model as applications make them: ``tritonclient.grpc``'s unary
``infer`` and its streaming ``start_stream`` / ``async_stream_infer``, against
``triton_server.py`` (or a real Triton serving a vLLM or TensorRT-LLM model named alike).

    python examples/triton_clients.py PORT [--wait] [--warm-up] [--tokens N] [--only CALL]

Prints one JSON line per call: what the caller itself saw (model, version, token counts the
responses reported, responses with text, the error), so a test can hold the agent's figures
against it. Every call has a client, and so a connection, of its own. ``--wait`` and
``--warm-up`` as in ``llm_clients.py``.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

PROMPT = "Say something about eBPF, one word at a time."
# a channel of its own: grpc shares one connection among channels to the same target otherwise
CHANNEL_ARGS = [("grpc.use_local_subchannel_pool", 1)]


def _inputs(tokens: int, counts: bool) -> list[grpcclient.InferInput]:
    """What Triton's vLLM backend takes: the prompt, a token limit, the additional-output flags."""
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
    limit = grpcclient.InferInput("max_tokens", [1], "INT32")
    limit.set_data_from_numpy(np.array([tokens], dtype=np.int32))
    inputs = [text, limit]
    if counts:
        for name in ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason"):
            flag = grpcclient.InferInput(name, [1], "BOOL")
            flag.set_data_from_numpy(np.array([True]))
            inputs.append(flag)
    return inputs


def _first(result: grpcclient.InferResult, name: str) -> Any:
    values = result.as_numpy(name)
    return None if values is None else values.reshape(-1)[0]


def _client(port: int) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{port}", channel_args=CHANNEL_ARGS)


def triton_infer(port: int, tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    with _client(port) as client:
        result = client.infer("llama-3-8b-trt", _inputs(tokens, counts=True), request_id="req-unary")
    response = result.get_response()
    return {
        "call": "triton_infer",
        "seconds": round(time.monotonic() - started, 4),
        "model": response.model_name,
        "version": response.model_version,
        "id": response.id,
        "usage": {
            "input_tokens": int(_first(result, "num_input_tokens")),
            "output_tokens": int(_first(result, "num_output_tokens")),
        },
        "finish_reason": _first(result, "finish_reason").decode(),
        "text": _first(result, "text_output").decode(),
    }


def _stream(port: int, tokens: int, name: str, model: str, counts: bool, final: bool) -> dict[str, Any]:
    """One request on a stream of its own, read to its end (its final response, its error, or
    ``tokens`` responses)."""
    results: queue.Queue = queue.Queue()
    record: dict[str, Any] = {"call": name, "model": None, "chunks": 0, "error": None, "finish_reason": None}
    output_tokens = input_tokens = 0
    started = time.monotonic()
    with _client(port) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(
            model, _inputs(tokens, counts), request_id=f"req-{name}", enable_empty_final_response=final
        )
        while True:
            result, error = results.get(timeout=30)
            if error is not None:
                record["error"] = str(error)
                break
            response = result.get_response()
            record["model"], record["version"] = response.model_name, response.model_version
            if result.as_numpy("text_output") is not None:
                record["chunks"] += 1
                record.setdefault("first_token_s", round(time.monotonic() - started, 4))
            if counts:
                output_tokens += int(_first(result, "num_output_tokens") or 0)
                input_tokens = int(_first(result, "num_input_tokens") or input_tokens)
                reason = _first(result, "finish_reason")
                record["finish_reason"] = reason.decode() if reason is not None else record["finish_reason"]
            if response.parameters["triton_final_response"].bool_param or (not final and record["chunks"] == tokens):
                break
        client.stop_stream()
    record["seconds"] = round(time.monotonic() - started, 4)
    if counts:
        record["usage"] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    return record


def triton_stream(port: int, tokens: int) -> dict[str, Any]:
    return _stream(port, tokens, "triton_stream", "llama-3-8b-vllm", counts=True, final=True)


def triton_stream_plain(port: int, tokens: int) -> dict[str, Any]:
    """No additional outputs asked for: only the text tells the tokens."""
    return _stream(port, tokens, "triton_stream_plain", "mistral-7b", counts=False, final=False)


def triton_stream_fails(port: int, tokens: int) -> dict[str, Any]:
    return _stream(port, tokens, "triton_stream_fails", "llama-fails", counts=False, final=False)


CALLS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "triton_infer": triton_infer,
    "triton_stream": triton_stream,
    "triton_stream_plain": triton_stream_plain,
    "triton_stream_fails": triton_stream_fails,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--wait", action="store_true", help="print 'ready', then wait for a line on stdin")
    parser.add_argument("--tokens", type=int, default=25, help="max_tokens of each generation")
    parser.add_argument("--only", choices=sorted(CALLS), action="append", help="run only these calls (repeatable)")
    parser.add_argument("--warm-up", action="store_true", help="make each call once first, without printing it")
    args = parser.parse_args()
    if args.warm_up:
        for name in args.only or CALLS:
            CALLS[name](args.port, args.tokens)
    if args.wait:
        print("ready", flush=True)
        sys.stdin.readline()
    for name in args.only or CALLS:
        print(json.dumps(CALLS[name](args.port, args.tokens)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
