"""Secrets out of process command lines before they become ``process.command_line``.

Command lines routinely carry credentials (``curl -H 'Authorization: Bearer …'``, ``--password x``,
``https://user:pass@host/?api_key=…``). The resource attribute keeps the command's shape and drops
the values: what an operator needs to tell processes apart, nothing an attacker could reuse.
"""

from __future__ import annotations

import re
from collections.abc import Callable

REDACTED = "REDACTED"
_SENSITIVE = r"(?:authorization|token|secret|passw(?:or)?d|api[-_]?key|apikey|cookie|credential)"


def _keep_scheme(match: re.Match[str]) -> str:
    name, separator, scheme = match.group(1, 2, 3)
    return f"{name}{separator}{scheme + ' ' if scheme else ''}{REDACTED}"


_RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # scheme://user:password@host
    (re.compile(r"(://[^/\s:@]+):[^@\s/]+@"), rf"\1:{REDACTED}@"),
    # query-string values
    (re.compile(r"([?&][^=\s&#]+)=[^&\s#]+"), rf"\1={REDACTED}"),
    # name=value / name: value where the name looks sensitive (optional auth scheme kept)
    (
        re.compile(
            rf"(?i)([\w.-]*{_SENSITIVE}[\w.-]*)(\s*[:=]\s*)(?!(?:bearer|basic|token)\s+{REDACTED})"
            rf"(?:(bearer|basic|token)\s+)?(?!{REDACTED})[^\s&]+"
        ),
        _keep_scheme,
    ),
    # --password value
    (re.compile(rf"(?i)(\s--?[\w-]*{_SENSITIVE}[\w-]*)\s+(?!{REDACTED})(?!-)\S+"), rf"\1 {REDACTED}"),
)


def redact_command_line(command_line: str) -> str:
    for pattern, replacement in _RULES:
        command_line = pattern.sub(replacement, command_line)
    return command_line
