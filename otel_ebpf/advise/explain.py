"""``--llm URL``: an OpenAI-compatible chat endpoint explains the top findings, with their code.

Nothing is sent unless the user names the endpoint. What is sent is the findings (title, process,
evidence, top stack frames, suggestion) and the source lines around the program's own frames of
each stack (when the files are readable here), and all of it goes through the same redaction as
process command lines (:func:`otel_ebpf.redaction.redact_command_line`) and captured content
(:class:`otel_ebpf.pii.PiiScrubber`) first: a key in a source line leaves as a placeholder.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from otel_ebpf.pii import PiiScrubber
from otel_ebpf.redaction import redact_command_line

from .findings import Finding
from .stacks import program_frames, top_frames

API_KEY_ENV = "OPENAI_API_KEY"  # sent as a bearer token when set, as OpenAI-compatible clients do
CONTEXT_LINES = 3  # source lines quoted either side of a frame's line
FRAMES_QUOTED = 2  # program frames quoted per finding
SYSTEM_PROMPT = (
    "You are a performance engineer for GPU training and LLM serving code. For each finding below, explain in a "
    "few sentences why the quoted code causes the measured numbers, and give the concrete code change to try, "
    "referring to the file and line. Do not invent numbers that are not in the evidence."
)

SourceKey = tuple[str, int]  # (file, line)


class ExplainError(Exception):
    """The endpoint could not be reached or did not answer as an OpenAI-compatible one does."""


def chat_url(url: str) -> str:
    """The chat completions address for what the user gave: a server, its ``/v1``, or the full path."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ExplainError(f"--llm takes an http(s) URL, not {url!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/chat/completions"):
        return url
    return url.rstrip("/") + ("/chat/completions" if path.endswith("/v1") else "/v1/chat/completions")


def quoted_frames(findings: Sequence[Finding]) -> list[SourceKey]:
    """The program's own frames (file, line) whose source the request quotes, in finding order."""
    keys: list[SourceKey] = []
    for finding in findings:
        for frame in program_frames(finding.stack)[:FRAMES_QUOTED]:
            if (frame.file, frame.line) not in keys:
                keys.append((frame.file, frame.line))
    return keys


def read_excerpt(file: str, line: int, context: int = CONTEXT_LINES) -> str | None:
    """Lines ``line ± context`` of ``file``, numbered, the line itself marked; None when unreadable."""
    try:
        lines = Path(file).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    if not 0 < line <= len(lines):
        return None
    first = max(1, line - context)
    return "\n".join(
        f"{'>' if n == line else ' '}{n:5} {lines[n - 1]}" for n in range(first, min(len(lines), line + context) + 1)
    )


def user_prompt(findings: Sequence[Finding], excerpts: Mapping[SourceKey, str]) -> str:
    parts = []
    for rank, f in enumerate(findings, 1):
        lines = [f"Finding {rank} [{f.severity.name}] {f.title}", f"Process: {f.process}"]
        lines += [f"Evidence: {sentence}" for sentence in f.evidence]
        frames = top_frames(f.stack)
        if frames:
            lines.append("Stack (leaf first): " + " <- ".join(frames))
        for frame in program_frames(f.stack)[:FRAMES_QUOTED]:
            excerpt = excerpts.get((frame.file, frame.line))
            if excerpt is not None:
                lines.append(f"Source {frame.file}:{frame.line}:\n{excerpt}")
        lines.append(f"Suggested change: {f.suggestion}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def chat_request(findings: Sequence[Finding], excerpts: Mapping[SourceKey, str], model: str) -> dict[str, Any]:
    """The request body, redacted: secrets and personal data in any text become placeholders."""
    scrubber = PiiScrubber()
    content = scrubber.scrub(redact_command_line(user_prompt(findings, excerpts)))
    return {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}],
        "temperature": 0,
    }


def explain(findings: Sequence[Finding], url: str, model: str, timeout_s: float = 120.0) -> str:
    """Ask the endpoint; its answer's text. Raises :class:`ExplainError`."""
    excerpts = {key: text for key in quoted_frames(findings) if (text := read_excerpt(*key)) is not None}
    body = json.dumps(chat_request(findings, excerpts, model)).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(API_KEY_ENV)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(chat_url(url), data=body, headers=headers, method="POST")  # noqa: S310 — http(s) checked in chat_url
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 — the URL the user named
            answer = json.loads(response.read())
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors; a body that is not JSON
        raise ExplainError(f"{url}: {exc}") from None
    try:
        return str(answer["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError):
        raise ExplainError(f"{url}: no choices[0].message.content in the answer") from None
