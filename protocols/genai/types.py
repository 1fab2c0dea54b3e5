"""What the GenAI layer learned about one request and its response."""

from __future__ import annotations

from dataclasses import dataclass

from .routes import Route


@dataclass(frozen=True, slots=True)
class GenAIRequest:
    """A recognised LLM request. Fields the body did not tell (or the capture lost) are ``None``.

    ``input_chars`` counts the prompt's characters when the whole body was captured; it backs an
    approximate input-token count when the response reports no usage. ``input_text`` is the prompt
    as JSON, only when content capture is enabled. The gRPC dialects (:mod:`.triton`) also tell
    the model's version, the input tokens the request itself counts (token ids sent), and
    ``sent_ns``: when the first request message was complete, where time to first token starts
    (a streaming call may be opened long before it is used).
    """

    route: Route
    model: str | None
    stream: bool
    max_tokens: int | None
    include_usage: bool
    input_chars: int | None
    truncated: bool  # the capture held only part of the body
    input_text: str | None = None
    model_version: str | None = None
    input_tokens: int | None = None
    sent_ns: int | None = None


@dataclass(frozen=True, slots=True)
class GenAIResponse:
    """What a response said, streamed or not.

    ``chunks`` counts events that carried output content; ``first_ns`` / ``last_ns`` are the
    timestamps of the first and last of them (``None`` without any; ``first_ns`` also when a
    capture gap came before the first seen). ``gaps_ns`` holds the time between consecutive
    content events, bounded (``gaps_dropped`` counts those left out), none across a capture gap.
    Token counts come from the response's own usage report, ``None`` when it gave none.
    ``gapped``: a capture gap hid part of the body, so events may be missing.
    """

    streamed: bool
    events: int
    chunks: int
    first_ns: int | None
    last_ns: int | None
    gaps_ns: tuple[int, ...]
    gaps_dropped: int
    model: str | None
    response_id: str | None
    finish_reasons: tuple[str, ...]
    input_tokens: int | None
    output_tokens: int | None
    error_type: str | None
    finished: bool  # the stream's own end marker was seen ([DONE], "done": true, TGI details)
    decode_errors: int
    output_text: str | None = None
    model_version: str | None = None
    error_message: str | None = None  # what an error response said, for the span's status (cut)
    gapped: bool = False

    @property
    def reached_end(self) -> bool:
        """The stream sent its last event: its end marker or an error event. Clients stop reading
        there (the OpenAI and Anthropic SDKs close the response), so a connection closed or a
        stream reset after it, before HTTP's own end (the last chunk, END_STREAM), cut nothing of
        the call short."""
        return self.streamed and (self.finished or self.error_type is not None)
