"""Command-line redaction: values of credentials go, the command's shape stays."""

from __future__ import annotations

import pytest

from otel_ebpf.redaction import redact_command_line


@pytest.mark.parametrize(
    ("command_line", "expected"),
    [
        ("python3 -m http.server 8000", "python3 -m http.server 8000"),
        (
            "curl -H Authorization: Bearer abc.def http://h/x?api_key=k1&q=cats",
            "curl -H Authorization: Bearer REDACTED http://h/x?api_key=REDACTED&q=REDACTED",
        ),
        ("app --password hunter2 --port 80", "app --password REDACTED --port 80"),
        ("app --db-password=abc --verbose", "app --db-password=REDACTED --verbose"),
        ("psql postgres://bob:s3cret@db/x", "psql postgres://bob:REDACTED@db/x"),
        ("tool API_KEY=abc TOKEN:def", "tool API_KEY=REDACTED TOKEN:REDACTED"),
        ("curl -H x-api-key:abc -H Cookie: session=1", "curl -H x-api-key:REDACTED -H Cookie: REDACTED"),
        ("worker --token-file /etc/tok --workers 4", "worker --token-file REDACTED --workers 4"),
    ],
)
def test_redact_command_line(command_line: str, expected: str) -> None:
    assert redact_command_line(command_line) == expected
    assert redact_command_line(expected) == expected  # idempotent
