"""GenAI semantic conventions for an LLM call seen on the wire: span attributes and metric points.

The HTTP span of the call is kept (its HTTP attributes stay) and becomes the GenAI span: it is
renamed ``"{gen_ai.operation.name} {gen_ai.request.model}"`` and gains the ``gen_ai.*``
attributes. Choices made here:

* TTFT is request start → first event carrying output content (a role-only first chunk does not
  count). It is the span attribute ``gen_ai.response.time_to_first_chunk`` and, on the serving side,
  ``gen_ai.server.time_to_first_token`` (``gen_ai.client.operation.time_to_first_chunk`` on the
  calling side).
* TPOT is (last content event − first content event) / (output tokens − 1): the conventions'
  (duration − TTFT) / (output tokens − 1) with the duration ending at the last token, so that a
  server that holds the connection after its last token does not inflate it.
  ``otel_ebpf.gen_ai.time_per_output_token`` on the span, ``gen_ai.server.time_per_output_token``
  on the serving side; the calling side records every gap between content events in
  ``gen_ai.client.operation.time_per_output_chunk``.
* Token counts come from the response's usage report (input tokens also from the token ids a
  request sent, for the gRPC dialects). Without one, output tokens are the number of content
  events (one token each for these servers) and input tokens the prompt's characters / 4; both
  are then listed in ``otel_ebpf.gen_ai.usage.approximate``. When a capture gap hid part of the
  response (user space behind, its syscalls left out), the events seen count nothing: output
  tokens and TPOT are left out unless the usage report was seen, TTFT when the gap came before
  the first content event, and no time per output chunk spans a gap.
* TTFT of a gRPC streaming call starts at its first request message, not at the stream's opening
  (a client may open the stream long before it sends a request on it).
* The server metrics that the conventions define for successful responses (TTFT, TPOT) are only
  recorded for those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from otel_ebpf.protocol import (
    AttributeValue,
    ConnectionInfo,
    InstrumentKind,
    InstrumentSpec,
    MetricPoint,
    Role,
    SpanDescription,
    StatusCode,
)
from otel_ebpf.redaction import redact_command_line

from .types import GenAIRequest, GenAIResponse

OPERATION_BUCKETS = tuple(0.01 * 2**i for i in range(14))  # 0.01 … 81.92
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16 … 67108864
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
CHARS_PER_TOKEN = 4


def _histogram(name: str, unit: str, description: str, boundaries: Sequence[float]) -> InstrumentSpec:
    return InstrumentSpec(name, InstrumentKind.HISTOGRAM, unit, description, tuple(boundaries))


GENAI_INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    _histogram("gen_ai.client.operation.duration", "s", "GenAI operation duration.", OPERATION_BUCKETS),
    _histogram("gen_ai.client.token.usage", "{token}", "Number of input and output tokens used.", TOKEN_BUCKETS),
    _histogram(
        "gen_ai.client.operation.time_to_first_chunk",
        "s",
        "Time from the request to the first chunk of a streamed response.",
        TTFT_BUCKETS,
    ),
    _histogram(
        "gen_ai.client.operation.time_per_output_chunk",
        "s",
        "Time between consecutive output chunks of a streamed response.",
        TPOT_BUCKETS,
    ),
    _histogram(
        "gen_ai.server.request.duration",
        "s",
        "Generative AI server request duration, to the last byte.",
        OPERATION_BUCKETS,
    ),
    _histogram(
        "gen_ai.server.time_to_first_token", "s", "Time to generate first token for successful responses.", TTFT_BUCKETS
    ),
    _histogram(
        "gen_ai.server.time_per_output_token",
        "s",
        "Time per output token generated after the first token for successful responses.",
        TPOT_BUCKETS,
    ),
)


class GenAICall:
    """One LLM call: the request, what was seen of the response, and the derived figures."""

    __slots__ = (
        "request",
        "response",
        "start_ns",
        "end_ns",
        "output_tokens",
        "input_tokens",
        "approximate",
        "ttft_s",
        "tpot_s",
        "stream_error",
    )

    def __init__(self, request: GenAIRequest, response: GenAIResponse | None, start_ns: int, end_ns: int) -> None:
        self.request, self.response, self.start_ns, self.end_ns = request, response, start_ns, end_ns
        approximate: list[str] = []
        output = response.output_tokens if response is not None else None
        # Counted from the content events only when none can be missing: behind a capture gap
        # they undercount, and TPOT divided by them would be as wrong.
        if output is None and response is not None and response.chunks and not response.gapped:
            output = response.chunks
            approximate.append("output_tokens")
        inputs = response.input_tokens if response is not None else None
        if inputs is None:
            inputs = request.input_tokens
        if inputs is None and request.input_chars:
            inputs = -(-request.input_chars // CHARS_PER_TOKEN)
            approximate.append("input_tokens")
        self.output_tokens, self.input_tokens, self.approximate = output, inputs, tuple(approximate)
        streamed = response is not None and response.streamed
        first = response.first_ns if streamed else None  # type: ignore[union-attr]
        sent = request.sent_ns if request.sent_ns is not None else start_ns
        self.ttft_s = (first - sent) / 1e9 if first is not None else None
        self.tpot_s = None
        if first is not None and output is not None and output > 1:
            self.tpot_s = (response.last_ns - first) / 1e9 / (output - 1)  # type: ignore[union-attr,operator]
        # what the body says went wrong; an HTTP-level error.type (status, cut-off) takes precedence
        self.stream_error = response.error_type if response is not None else None

    @property
    def operation(self) -> str:
        return self.request.route.api.operation

    @property
    def response_model(self) -> str | None:
        return self.response.model if self.response is not None else None

    def _common(self) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.provider.name": self.request.route.provider,
        }
        if self.request.model:
            attributes["gen_ai.request.model"] = self.request.model
        if self.response_model:
            attributes["gen_ai.response.model"] = self.response_model
        return attributes

    def describe(self, http_span: SpanDescription, content_chars: int = 0) -> SpanDescription:
        """The call's HTTP span, renamed and given the ``gen_ai.*`` attributes; prompt and output
        text too, redacted and cut to ``content_chars`` characters, when that is not 0."""
        request, response = self.request, self.response
        attributes = dict(http_span.attributes)
        attributes.update(self._common())
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if request.model_version:
            attributes["otel_ebpf.gen_ai.request.model_version"] = request.model_version
        attributes["otel_ebpf.gen_ai.stream"] = request.stream
        if response is not None:
            if response.response_id:
                attributes["gen_ai.response.id"] = response.response_id
            if response.model_version:
                attributes["otel_ebpf.gen_ai.response.model_version"] = response.model_version
            if response.finish_reasons:
                attributes["gen_ai.response.finish_reasons"] = response.finish_reasons
            if response.streamed:
                attributes["otel_ebpf.gen_ai.output_chunks"] = response.chunks
            if response.gaps_dropped:
                attributes["otel_ebpf.gen_ai.chunks_not_timed"] = response.gaps_dropped
        if self.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = self.input_tokens
        if self.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = self.output_tokens
        if self.approximate:
            attributes["otel_ebpf.gen_ai.usage.approximate"] = self.approximate
        if self.ttft_s is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = self.ttft_s
        if self.tpot_s is not None:
            attributes["otel_ebpf.gen_ai.time_per_output_token"] = self.tpot_s
        if content_chars:
            if request.input_text is not None:
                attributes["gen_ai.input.messages"] = redact_command_line(request.input_text[:content_chars])
            if response is not None and response.output_text is not None:
                attributes["gen_ai.output.messages"] = redact_command_line(response.output_text[:content_chars])
        status, description = http_span.status, http_span.status_description
        if self.stream_error is not None and "error.type" not in attributes:
            attributes["error.type"] = self.stream_error
            status = StatusCode.ERROR
            description = response.error_message or "the LLM response reported an error"  # type: ignore[union-attr]
        name = f"{self.operation} {request.model}" if request.model else self.operation
        return replace(http_span, name=name, attributes=attributes, status=status, status_description=description)

    def metric_points(
        self, conn: ConnectionInfo, server: tuple[str | None, int | None], http_error: str | None
    ) -> list[MetricPoint]:
        """Points for the call, given the server it went to and its HTTP-level ``error.type``."""
        attributes = self._common()
        address, port = server
        if address is not None:
            attributes["server.address"] = address
        if port is not None:
            attributes["server.port"] = port
        error = http_error or self.stream_error
        if error is not None:
            attributes["error.type"] = error
        duration = (self.end_ns - self.start_ns) / 1e9
        if conn.role is Role.SERVER:
            points = [MetricPoint("gen_ai.server.request.duration", duration, attributes)]
            if error is None:
                if self.ttft_s is not None:
                    points.append(MetricPoint("gen_ai.server.time_to_first_token", self.ttft_s, attributes))
                if self.tpot_s is not None:
                    points.append(MetricPoint("gen_ai.server.time_per_output_token", self.tpot_s, attributes))
            return points
        points = [MetricPoint("gen_ai.client.operation.duration", duration, attributes)]
        for kind, count in (("input", self.input_tokens), ("output", self.output_tokens)):
            if count is not None:
                points.append(
                    MetricPoint("gen_ai.client.token.usage", count, {**attributes, "gen_ai.token.type": kind})
                )
        if self.ttft_s is not None:
            points.append(MetricPoint("gen_ai.client.operation.time_to_first_chunk", self.ttft_s, attributes))
            points.extend(
                MetricPoint("gen_ai.client.operation.time_per_output_chunk", gap / 1e9, attributes)
                for gap in self.response.gaps_ns  # type: ignore[union-attr]
            )
        return points
