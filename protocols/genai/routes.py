"""Which HTTP requests are LLM calls: API styles, their paths, and the options that extend them.

Recognition has two stages. Here, a request head is matched by method and path (cheap, memoised),
so that only candidate requests have their bodies looked at; then :mod:`.body` confirms the match
from the JSON body (a ``/generate`` route that does not receive ``{"inputs": ...}`` stays plain
HTTP), or for a gRPC dialect from the request message (:mod:`.triton`: a ``ModelInfer`` of an
image classifier stays a plain gRPC call).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..caching import memoize


class Api(enum.Enum):
    """The request/response dialects the GenAI layer reads."""

    OPENAI_CHAT = "openai_chat"  # POST …/chat/completions (OpenAI, vLLM, SGLang, TGI messages API, Ollama /v1)
    OPENAI_COMPLETIONS = "openai_completions"  # POST …/completions
    OPENAI_EMBEDDINGS = "openai_embeddings"  # POST …/embeddings
    OPENAI_RESPONSES = "openai_responses"  # POST …/responses (SSE with named events)
    ANTHROPIC_MESSAGES = "anthropic_messages"  # POST …/v1/messages (SSE with named events)
    OLLAMA_GENERATE = "ollama_generate"  # POST /api/generate (NDJSON stream by default)
    OLLAMA_CHAT = "ollama_chat"  # POST /api/chat
    OLLAMA_EMBED = "ollama_embed"  # POST /api/embed, /api/embeddings
    TGI_GENERATE = "tgi_generate"  # POST /generate
    TGI_STREAM = "tgi_generate_stream"  # POST /generate_stream (SSE)
    TRITON_INFER = "triton_infer"  # gRPC inference.GRPCInferenceService/ModelInfer (KServe v2)
    TRITON_STREAM = "triton_stream_infer"  # gRPC …/ModelStreamInfer (Triton's streaming extension)

    @property
    def operation(self) -> str:
        """``gen_ai.operation.name``."""
        return _OPERATIONS[self]

    @property
    def default_provider(self) -> str:
        """``gen_ai.provider.name`` when the configuration names none."""
        return _PROVIDERS[self.value.split("_", 1)[0]]


_OPERATIONS = {
    Api.OPENAI_CHAT: "chat",
    Api.OPENAI_COMPLETIONS: "text_completion",
    Api.OPENAI_EMBEDDINGS: "embeddings",
    Api.OPENAI_RESPONSES: "chat",
    Api.ANTHROPIC_MESSAGES: "chat",
    Api.OLLAMA_GENERATE: "text_completion",
    Api.OLLAMA_CHAT: "chat",
    Api.OLLAMA_EMBED: "embeddings",
    Api.TGI_GENERATE: "text_completion",
    Api.TGI_STREAM: "text_completion",
    Api.TRITON_INFER: "text_completion",
    Api.TRITON_STREAM: "text_completion",
}
# "openai" names the API dialect of OpenAI-compatible servers too, as the conventions use it; a
# gateway that knows better says so with a route's ``provider``. KServe v2 servers (KServe, MLServer,
# OpenVINO) answer ModelInfer exactly as Triton does: "triton" names the dialect, not the server.
_PROVIDERS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "ollama": "ollama",
    "tgi": "huggingface.tgi",
    "triton": "triton",
}
GRPC_APIS = frozenset((Api.TRITON_INFER, Api.TRITON_STREAM))  # read from gRPC messages, not JSON


@dataclass(frozen=True, slots=True)
class Route:
    api: Api
    provider: str


# Path suffixes: gateways mount the same APIs under prefixes (``/openai/deployments/x/chat/completions``).
_BUILT_IN_SUFFIXES: tuple[tuple[str, Api], ...] = (
    ("/chat/completions", Api.OPENAI_CHAT),
    ("/completions", Api.OPENAI_COMPLETIONS),
    ("/embeddings", Api.OPENAI_EMBEDDINGS),
    ("/responses", Api.OPENAI_RESPONSES),
    ("/v1/messages", Api.ANTHROPIC_MESSAGES),  # the version keeps a chat app's own /messages out
)
_BUILT_IN_PATHS: dict[str, Api] = {
    "/api/generate": Api.OLLAMA_GENERATE,
    "/api/chat": Api.OLLAMA_CHAT,
    "/api/embed": Api.OLLAMA_EMBED,
    "/api/embeddings": Api.OLLAMA_EMBED,
    "/generate": Api.TGI_GENERATE,
    "/generate_stream": Api.TGI_STREAM,
    "/inference.GRPCInferenceService/ModelInfer": Api.TRITON_INFER,
    "/inference.GRPCInferenceService/ModelStreamInfer": Api.TRITON_STREAM,
}


class Recognizer:
    """Maps a request's method and target to a :class:`Route`, or ``None`` for other requests.

    ``routes`` adds or overrides exact paths (a gateway's own path for an OpenAI-style API, a
    provider name); they are checked before the built-in paths and suffixes.
    """

    def __init__(self, routes: Mapping[str, Route] | None = None) -> None:
        self._exact = {path: Route(api, api.default_provider) for path, api in _BUILT_IN_PATHS.items()}
        self._exact.update(routes or {})
        self._match_path = memoize(self._route_for_path)

    def match(self, method: str, target: str) -> Route | None:
        if method != "POST":
            return None
        return self._match_path(target)

    def _route_for_path(self, target: str) -> Route | None:
        path = target.split("?", 1)[0]
        if "://" in path:  # absolute-form target of a forward proxy
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        path = path.rstrip("/") or "/"
        route = self._exact.get(path)
        if route is not None:
            return route
        for suffix, api in _BUILT_IN_SUFFIXES:
            if path.endswith(suffix):
                return Route(api, api.default_provider)
        return None


def parse_routes(value: Any, key: str) -> dict[str, Route]:
    """``{path: api}`` or ``{path: {api: ..., provider: ...}}`` from the configuration; raises
    ``ValueError("<key>...: <problem>")``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: expected a mapping of path to API style")
    apis = {api.value: api for api in Api}
    routes: dict[str, Route] = {}
    for path, spec in value.items():
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"{key}: route {path!r} must be a path starting with '/'")
        provider = None
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"api", "provider"}
            if unknown:
                raise ValueError(f"{key}.{path}: unknown field {sorted(unknown)[0]!r} (fields: api, provider)")
            provider = spec.get("provider")
            spec = spec.get("api")
        if spec not in apis:
            raise ValueError(f"{key}.{path}: API style must be one of {', '.join(sorted(apis))}, not {spec!r}")
        if provider is not None and (not isinstance(provider, str) or not provider):
            raise ValueError(f"{key}.{path}: provider must be a non-empty string")
        api = apis[spec]
        routes[path.rstrip("/") or "/"] = Route(api, provider or api.default_provider)
    return routes
