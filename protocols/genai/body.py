"""Body taps: what an HTTP parser feeds the content bytes of a recognised request or response to.

A tap is sans-I/O and bounded: :class:`RequestBody` keeps at most ``MAX_REQUEST_BODY`` bytes and
reads the JSON at the end (falling back to a scan of the captured prefix when the capture cut the
body short); :class:`ResponseBody` decodes events as they arrive and keeps counters, timestamps
and a bounded list of gaps, never the stream itself (unless content capture is on, and then at
most ``max_content_chars`` characters).
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .framing import NDJSONDecoder, SSEDecoder, StreamDecoder, WholeBody
from .routes import Api, Route
from .types import GenAIRequest, GenAIResponse

MAX_REQUEST_BODY = 1024 * 1024
_decode = json.JSONDecoder().decode  # json.loads minus its per-call checks, once per event
MAX_GAPS = 4096  # inter-chunk gaps kept per response (4096 chunks ≈ tokens of a long answer)

_OLLAMA = (Api.OLLAMA_GENERATE, Api.OLLAMA_CHAT, Api.OLLAMA_EMBED)
_EMBEDDINGS = (Api.OPENAI_EMBEDDINGS, Api.OLLAMA_EMBED)
# the body key that holds the input, by API: a body without it is not that API's request
_INPUT_KEYS = {
    Api.OPENAI_CHAT: ("messages",),
    Api.OPENAI_COMPLETIONS: ("prompt",),
    Api.OPENAI_EMBEDDINGS: ("input",),
    Api.OPENAI_RESPONSES: ("input",),
    Api.ANTHROPIC_MESSAGES: ("messages",),
    Api.OLLAMA_GENERATE: ("prompt", "model"),
    Api.OLLAMA_CHAT: ("messages",),
    Api.OLLAMA_EMBED: ("input", "prompt"),
    Api.TGI_GENERATE: ("inputs",),
    Api.TGI_STREAM: ("inputs",),
}

# For bodies the capture cut short: top-level keys found in the prefix. A quote inside a JSON
# string is escaped, so an unescaped `"model":` is a key (possibly of a nested object: the first
# one wins, which for these APIs is the top-level one in practice).
_STRING = rb'"((?:[^"\\]|\\.){0,512})"'
_MODEL = re.compile(rb'"model"\s*:\s*' + _STRING)
_STREAM = re.compile(rb'"stream"\s*:\s*(true|false)')
_MAX_TOKENS = re.compile(
    rb'"(?:max_tokens|max_completion_tokens|max_output_tokens|max_new_tokens|num_predict)"\s*:\s*(\d{1,9})'
)
_INCLUDE_USAGE = re.compile(rb'"include_usage"\s*:\s*true')


def _json_string(raw: bytes) -> str | None:
    try:
        value = json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text_chars(value: Any) -> int:
    """Characters of prompt text in a request's input (strings, message lists, content parts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(item) for item in value)
    if isinstance(value, Mapping):
        return _text_chars(value.get("content")) + _text_chars(value.get("text"))
    return 0


class RequestBody:
    """Collects a candidate request's body; :meth:`finish` decides whether it is an LLM call."""

    def __init__(self, route: Route, capture_content: bool = False) -> None:
        self.route = route
        self.errors = 0  # a request body is read at its end, as far as it came: never an error
        self._capture = capture_content
        self._buf = bytearray()
        self._truncated = False

    def feed(self, data: bytes, timestamp_ns: int) -> None:
        room = MAX_REQUEST_BODY - len(self._buf)
        if len(data) > room:
            self._truncated = True
        self._buf += data[: max(room, 0)]

    def gap(self, length: int | None) -> None:
        self._truncated = True

    def finish(self) -> GenAIRequest | None:
        """The request as an LLM call, or ``None`` when its body is not one."""
        if not self._truncated:
            try:
                body = json.loads(self._buf)
            except ValueError:  # cut short by the connection's end or a gap: read what came
                return self._from_prefix(bytes(self._buf))
            return self._from_json(body) if isinstance(body, dict) else None
        return self._from_prefix(bytes(self._buf))

    def _from_json(self, body: dict) -> GenAIRequest | None:
        api = self.route.api
        keys = _INPUT_KEYS[api]
        if not any(key in body for key in keys):
            return None
        model = body.get("model")
        options = body.get("options") if api in _OLLAMA else body.get("parameters")
        options = options if isinstance(options, Mapping) else {}
        max_tokens = next(
            (
                _int(source.get(key))
                for source, key in (
                    (body, "max_tokens"),
                    (body, "max_completion_tokens"),
                    (body, "max_output_tokens"),
                    (options, "max_new_tokens"),
                    (options, "num_predict"),
                )
                if _int(source.get(key)) is not None
            ),
            None,
        )
        stream_options = body.get("stream_options")
        prompt = body.get(keys[0])
        return GenAIRequest(
            route=self.route,
            model=model if isinstance(model, str) else None,
            stream=self._streams(body.get("stream")),
            max_tokens=max_tokens,
            include_usage=isinstance(stream_options, Mapping) and stream_options.get("include_usage") is True,
            input_chars=_text_chars(prompt),
            truncated=False,
            input_text=json.dumps(prompt, ensure_ascii=False) if self._capture and prompt is not None else None,
        )

    def _from_prefix(self, prefix: bytes) -> GenAIRequest | None:
        api = self.route.api
        if not any(b'"%s"' % key.encode() in prefix for key in _INPUT_KEYS[api]):
            return None
        model = _MODEL.search(prefix)
        stream = _STREAM.search(prefix)
        max_tokens = _MAX_TOKENS.search(prefix)
        return GenAIRequest(
            route=self.route,
            model=_json_string(model.group(1)) if model else None,
            stream=self._streams(None if stream is None else stream.group(1) == b"true"),
            max_tokens=int(max_tokens.group(1)) if max_tokens else None,
            include_usage=_INCLUDE_USAGE.search(prefix) is not None,
            input_chars=None,
            truncated=True,
        )

    def _streams(self, flag: Any) -> bool:
        api = self.route.api
        if api is Api.TGI_STREAM:
            return True
        if api in _EMBEDDINGS or api is Api.TGI_GENERATE:
            return False
        if isinstance(flag, bool):
            return flag
        return api in _OLLAMA  # Ollama streams unless told not to; OpenAI does not unless told to


class ResponseBody:
    """Reads a recognised request's response body as it arrives.

    The framing follows the response's ``content-type``: ``text/event-stream`` is SSE,
    ``application/x-ndjson`` (and any non-JSON Ollama body) NDJSON, anything else one JSON
    document. Each event is interpreted in the route's dialect.
    """

    def __init__(self, route: Route, headers: Any, capture_content: bool = False, max_content_chars: int = 0) -> None:
        self.route = route
        content_type = next((v for n, v in headers if n == "content-type"), "").lower()
        self._decoder: StreamDecoder | WholeBody
        if "text/event-stream" in content_type:
            self._decoder = SSEDecoder()
        elif "ndjson" in content_type or (route.api in _OLLAMA and "json" not in content_type):
            self._decoder = NDJSONDecoder()
        else:
            self._decoder = WholeBody()
        self._streamed = not isinstance(self._decoder, WholeBody)
        self._text: list[str] | None = [] if capture_content else None
        self._text_room = max_content_chars
        self.events = 0
        self.chunks = 0
        self.decode_errors = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self._gaps = array("q")
        self.gaps_dropped = 0
        # A capture gap hid part of the body: events may be missing, so the content events seen
        # count no tokens, the first seen may not be the first, and the time across a gap is no
        # time between two chunks.
        self.gapped = False
        self._across_gap = False
        self.model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] = []
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.error_type: str | None = None
        self.error_message: str | None = None
        self.model_version: str | None = None
        self.finished = False

    @property
    def errors(self) -> int:
        return self.decode_errors + self._decoder.errors

    def feed(self, data: bytes, timestamp_ns: int) -> None:
        for ts, payload in self._decoder.feed(data, timestamp_ns):
            self._event(payload, ts)

    def gap(self, length: int | None) -> None:
        self._decoder.gap()
        self.gapped = self._across_gap = True

    def finish(self) -> GenAIResponse:
        if isinstance(self._decoder, WholeBody):
            for ts, payload in self._decoder.finish():
                self._event(payload, ts, truncated=self._decoder.truncated)
        return GenAIResponse(
            streamed=self._streamed,
            events=self.events,
            chunks=self.chunks,
            first_ns=self.first_ns,
            last_ns=self.last_ns,
            gaps_ns=tuple(self._gaps),
            gaps_dropped=self.gaps_dropped,
            model=self.model,
            response_id=self.response_id,
            finish_reasons=tuple(self.finish_reasons),
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            error_type=self.error_type,
            finished=self.finished,
            decode_errors=self.errors,
            output_text="".join(self._text) if self._text is not None else None,
            model_version=self.model_version,
            error_message=self.error_message,
            gapped=self.gapped,
        )

    # -- one event --------------------------------------------------------------------------------

    def _event(self, payload: bytes, ts: int, truncated: bool = False) -> None:
        self.events += 1
        if payload == b"[DONE]":
            self.finished = True
            return
        try:
            event = _decode(payload.decode("utf-8", "replace"))
        except ValueError:
            if truncated:
                self._scan_truncated(payload)
            else:
                self.decode_errors += 1
            return
        if not isinstance(event, dict):
            self.decode_errors += 1
            return
        text = self._READERS[self.route.api](self, event)
        error = event.get("error")
        if error is not None:
            self.error_type = _error_type(error)
        if text or (text == "" and not self._streamed):
            self._content(text, ts)

    def _content(self, text: str, ts: int) -> None:
        self.chunks += 1
        if self.chunks == 1 and not self.gapped:
            self.first_ns = ts
        elif self.last_ns is not None and not self._across_gap:
            if len(self._gaps) < MAX_GAPS:
                self._gaps.append(ts - self.last_ns)
            else:
                self.gaps_dropped += 1
        self._across_gap = False
        self.last_ns = ts
        if self._text is not None and self._text_room > 0:
            self._text.append(text[: self._text_room])
            self._text_room -= len(text)

    def _openai(self, event: dict) -> str | None:
        self._take_model(event.get("model"))
        if isinstance(event.get("id"), str):
            self.response_id = event["id"]
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            self.input_tokens = _int(usage.get("prompt_tokens"))
            completion = _int(usage.get("completion_tokens"))
            if completion is not None or self.route.api is not Api.OPENAI_EMBEDDINGS:
                self.output_tokens = completion
        choices = event.get("choices")
        if not isinstance(choices, list):
            return None
        texts: list[str] = []
        for choice in choices:
            if not isinstance(choice, Mapping):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self.finish_reasons.append(reason)
            # a streamed chunk carries `delta`, a whole response `message` (chat) or `text`
            part = choice.get("delta") or choice.get("message") or choice
            if not isinstance(part, Mapping):
                continue
            for key in ("content", "text", "reasoning_content", "reasoning"):
                value = part.get(key)
                if isinstance(value, str) and value:
                    texts.append(value)
            if part.get("tool_calls"):
                texts.append(json.dumps(part["tool_calls"]))
        return "".join(texts) if texts else ("" if choices else None)

    def _ollama(self, event: dict) -> str | None:
        self._take_model(event.get("model"))
        text = event.get("response")
        message = event.get("message")
        if isinstance(message, Mapping):
            text = message.get("content")
        if event.get("done") is True:
            self.finished = True
            reason = event.get("done_reason")
            if isinstance(reason, str):
                self.finish_reasons.append(reason)
            self.input_tokens = _int(event.get("prompt_eval_count"))
            if self.route.api is not Api.OLLAMA_EMBED:
                self.output_tokens = _int(event.get("eval_count"))
        elif self.route.api is Api.OLLAMA_EMBED:
            self.input_tokens = _int(event.get("prompt_eval_count"))
        return text if isinstance(text, str) else None

    def _tgi(self, event: dict) -> str | None:
        details = event.get("details")
        if isinstance(details, Mapping):
            self.finished = True
            reason = details.get("finish_reason")
            if isinstance(reason, str):
                self.finish_reasons.append(reason)
            self.output_tokens = _int(details.get("generated_tokens"))
            prefill = details.get("prefill")
            if isinstance(prefill, list) and prefill:
                self.input_tokens = len(prefill)
        token = event.get("token")
        if isinstance(token, Mapping):  # streamed: one token per event, special ones carry no text
            text = token.get("text")
            return "" if token.get("special") is True else (text if isinstance(text, str) else None)
        text = event.get("generated_text")
        return text if isinstance(text, str) and not self._streamed else None

    def _openai_responses(self, event: dict) -> str | None:
        """A Responses API body (a ``response`` object) or one of its stream's typed events."""
        if not self._streamed:
            return self._response_object(event)
        kind = event.get("type")
        if kind in _RESPONSES_DELTAS:
            delta = event.get("delta")
            return delta if isinstance(delta, str) else None
        if kind == "error":  # {"type": "error", "code": ..., "message": ...}
            code = event.get("code")
            self.error_type = code if isinstance(code, str) and code else "error"
            return None
        response = event.get("response")
        if isinstance(response, Mapping):  # response.created, .in_progress and the terminal events
            self._response_object(response)
        return None

    def _response_object(self, response: Mapping) -> str | None:
        """Model, id, usage and outcome of a ``response`` object; its output text when not streamed."""
        self._take_model(response.get("model"))
        if isinstance(response.get("id"), str):
            self.response_id = response["id"]
        usage = response.get("usage")
        if isinstance(usage, Mapping):
            self.input_tokens = _int(usage.get("input_tokens"))
            self.output_tokens = _int(usage.get("output_tokens"))
        status = response.get("status")
        if status in _RESPONSES_ENDS:
            self.finished = True
            incomplete = response.get("incomplete_details")
            reason = incomplete.get("reason") if isinstance(incomplete, Mapping) else None
            self.finish_reasons.append(reason if isinstance(reason, str) else status)
        if response.get("error") is not None:
            self.error_type = _error_type(response["error"])
        output = response.get("output")
        if self._streamed or not isinstance(output, list):
            return None
        texts: list[str] = []
        for item in output:
            if not isinstance(item, Mapping):
                continue
            if isinstance(item.get("arguments"), str):  # a function call
                texts.append(item["arguments"])
            parts = item.get("content")
            for part in parts if isinstance(parts, list) else ():
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
        return "".join(texts)

    def _anthropic(self, event: dict) -> str | None:
        """An Anthropic Messages body (a ``message``) or one of its stream's typed events."""
        if not self._streamed:
            self._anthropic_message(event, event.get("usage"), output_total=True)
            blocks = event.get("content")
            return "".join(map(_anthropic_block_text, blocks)) if isinstance(blocks, list) else None
        kind = event.get("type")
        if kind == "content_block_delta":
            return _anthropic_block_text(event.get("delta"))
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            # its output count is a placeholder (1) until message_delta gives the total
            self._anthropic_message(event["message"], event["message"].get("usage"), output_total=False)
        elif kind == "message_delta" and isinstance(event.get("delta"), Mapping):
            self._anthropic_message(event["delta"], event.get("usage"), output_total=True)
        elif kind == "message_stop":
            self.finished = True
        return None

    def _anthropic_message(self, message: Mapping, usage: Any, output_total: bool) -> None:
        """Model, id, stop reason and usage of a message (or of a message_delta)."""
        self._take_model(message.get("model"))
        if isinstance(message.get("id"), str):
            self.response_id = message["id"]
        reason = message.get("stop_reason")
        if isinstance(reason, str):
            self.finish_reasons.append(reason)
        if not isinstance(usage, Mapping):
            return
        # input tokens as the conventions count them: cache reads and writes included
        counts = [_int(usage.get(key)) for key in _ANTHROPIC_INPUT_KEYS]
        if counts[0] is not None:
            self.input_tokens = sum(count or 0 for count in counts)
        if output_total:
            self.output_tokens = _int(usage.get("output_tokens"))

    def _take_model(self, model: Any) -> None:
        if isinstance(model, str) and model:
            self.model = model

    def _scan_truncated(self, prefix: bytes) -> None:
        """A whole-body response the capture cut short: what its prefix tells."""
        model = _MODEL.search(prefix)
        if model:
            self.model = _json_string(model.group(1))

    # each API's reader: one event (or a whole body) → its output text, noting what else it says
    _READERS: ClassVar[dict[Api, Callable[[ResponseBody, dict], str | None]]] = {
        Api.OPENAI_CHAT: _openai,
        Api.OPENAI_COMPLETIONS: _openai,
        Api.OPENAI_EMBEDDINGS: _openai,
        Api.OPENAI_RESPONSES: _openai_responses,
        Api.ANTHROPIC_MESSAGES: _anthropic,
        Api.OLLAMA_GENERATE: _ollama,
        Api.OLLAMA_CHAT: _ollama,
        Api.OLLAMA_EMBED: _ollama,
        Api.TGI_GENERATE: _tgi,
        Api.TGI_STREAM: _tgi,
    }


# Responses stream events that carry output (text, reasoning, a refusal, a tool call's arguments)
_RESPONSES_DELTAS = frozenset(
    f"response.{part}.delta"
    for part in ("output_text", "refusal", "reasoning_text", "reasoning_summary_text", "function_call_arguments")
)
_RESPONSES_ENDS = frozenset(("completed", "incomplete", "failed", "cancelled"))
_ANTHROPIC_INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _anthropic_block_text(block: Any) -> str:
    """The output in a content block or a stream's delta of one: text, thinking, a tool call's input."""
    if not isinstance(block, Mapping):
        return ""
    for key in ("text", "thinking", "partial_json"):  # text_delta, thinking_delta, input_json_delta
        value = block.get(key)
        if isinstance(value, str):
            return value
    tool_input = block.get("input")  # a whole tool_use block
    return json.dumps(tool_input) if isinstance(tool_input, Mapping) else ""


def _error_type(error: Any) -> str:
    """``error.type`` from an error object (``{"type": ..., "code": ...}``) or message."""
    if isinstance(error, Mapping):
        for key in ("type", "code"):
            value = error.get(key)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, int):
                return str(value)
    return "error"
