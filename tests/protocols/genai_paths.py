"""For the generated conversations: requests the GenAI layer leaves alone.

Hypothesis also draws the string constants of the code under test, such as the GenAI layer's
routes (``/responses``, ``/generate``): a POST there is an LLM call, whose random body would not
parse as one and would count as a parse error where the tests expect none.
"""

from __future__ import annotations

from otel_ebpf.protocols.genai.routes import Recognizer

_ROUTES = Recognizer()


def llm_call(method: str, target: str) -> bool:
    """Whether the GenAI layer would read ``method target`` as an LLM call."""
    return _ROUTES.match(method, target) is not None
