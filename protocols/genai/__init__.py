"""LLM calls seen from the wire: a layer the HTTP plugins feed, not a protocol of its own.

An OpenAI-compatible (Chat Completions, Responses), Anthropic Messages, Ollama or TGI call is an
HTTP exchange whose bodies say more than HTTP does; a Triton / KServe v2 ``ModelInfer`` or
``ModelStreamInfer`` a gRPC call whose messages do (:mod:`.triton`). The HTTP/1 and HTTP/2 parsers ask
:class:`GenAIOptions` whether a request head names an LLM API (:mod:`.routes`); for those only,
they feed the request's and the response's content bytes, with the timestamp of the syscall that
moved them, to body taps (:mod:`.body`), which decode streamed events incrementally
(:mod:`.framing`), read each in the route's dialect and keep bounded counters. The exchange then
describes itself with the GenAI conventions on top of the HTTP ones (:mod:`.semconv`).

Options (the ``genai`` key of ``protocols.http1`` and ``protocols.http2``):

``enabled``
    Read LLM calls (default ``true``); ``false`` leaves every exchange plain HTTP.
``routes``
    Extra paths, for gateways that mount an API elsewhere: ``{path: api}`` or
    ``{path: {api: ..., provider: ...}}``, with ``api`` one of ``openai_chat``,
    ``openai_completions``, ``openai_embeddings``, ``openai_responses``, ``anthropic_messages``,
    ``ollama_generate``, ``ollama_chat``, ``ollama_embed``, ``tgi_generate``, ``tgi_generate_stream``,
    ``triton_infer``, ``triton_stream_infer``.
``capture_content``
    Export prompts (``gen_ai.input.messages``) and output text (``gen_ai.output.messages``), at
    most ``max_content_chars`` characters each, with credentials redacted (default ``false``:
    content never leaves the agent).
``max_content_chars``
    Default 4096.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .body import RequestBody, ResponseBody
from .routes import GRPC_APIS, Api, Recognizer, Route, parse_routes
from .semconv import GENAI_INSTRUMENTS, GenAICall
from .triton import TritonRequestBody, TritonResponseBody
from .types import GenAIRequest, GenAIResponse

__all__ = [
    "GENAI_INSTRUMENTS",
    "Api",
    "GenAICall",
    "GenAIOptions",
    "GenAIRequest",
    "GenAIResponse",
    "Recognizer",
    "RequestBody",
    "ResponseBody",
    "Route",
    "TritonRequestBody",
    "TritonResponseBody",
    "genai_option",
]

_OPTIONS = ("enabled", "routes", "capture_content", "max_content_chars")


@dataclass(frozen=True)
class GenAIOptions:
    """The parsed ``genai`` option: what an HTTP plugin hands its parsers."""

    recognizer: Recognizer
    capture_content: bool = False
    max_content_chars: int = 4096

    @property
    def content_chars(self) -> int:
        """How much prompt and output text an exchange exports (0: none)."""
        return self.max_content_chars if self.capture_content else 0

    def request_body(self, method: str, target: str) -> RequestBody | None:
        """A tap for a request head that names an LLM API; ``None`` for every other request."""
        route = self.recognizer.match(method, target)
        if route is None:
            return None
        tap = TritonRequestBody if route.api in GRPC_APIS else RequestBody
        return tap(route, self.capture_content)

    def response_body(self, route: Route, headers: Any) -> ResponseBody:
        tap = TritonResponseBody if route.api in GRPC_APIS else ResponseBody
        return tap(route, headers, self.capture_content, self.max_content_chars)


def genai_option(value: Any, key: str = "genai") -> GenAIOptions | None:
    """Parse the ``genai`` plugin option (``None`` when disabled); raises ``ValueError``."""
    if value is None:
        value = {}
    if isinstance(value, bool):
        value = {"enabled": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: expected a mapping ({', '.join(_OPTIONS)})")
    unknown = sorted(set(value) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown option (options: {', '.join(_OPTIONS)})")
    for flag in ("enabled", "capture_content"):
        if not isinstance(value.get(flag, False), bool):
            raise ValueError(f"{key}.{flag}: expected true or false")
    if not value.get("enabled", True):
        return None
    limit = value.get("max_content_chars", 4096)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"{key}.max_content_chars: expected a non-negative integer")
    return GenAIOptions(
        Recognizer(parse_routes(value.get("routes"), f"{key}.routes")), bool(value.get("capture_content", False)), limit
    )
