"""PII scrubbing: every kind caught and counted, checksums keep ordinary numbers, ordinary text untouched."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf import pii
from otel_ebpf.pii import (
    KIND_NAMES,
    KINDS,
    PiiScrubber,
    build_scrubber,
    custom_kind,
    filter_content,
)
from otel_ebpf.selfmetrics import SelfMetrics
from tests.pii_corpus import CORPUS, secret_part


def test_the_corpus_covers_every_kind() -> None:
    assert set(CORPUS) == set(KIND_NAMES)


@pytest.mark.parametrize(("kind", "value"), [(k, v) for k, values in CORPUS.items() for v in values])
def test_each_value_becomes_its_placeholder(kind: str, value: str) -> None:
    metrics = SelfMetrics()
    scrubber = PiiScrubber(KINDS, metrics)
    for text in (value, f"see {value} now", json.dumps({"content": f"mine: {value}."})):
        out = scrubber.scrub(text)
        assert secret_part(kind, value) not in out and secret_part(kind, value) not in json.loads(json.dumps(out))
        assert f"<{kind}>" in out, out
    assert dict(scrubber.counts) == {kind: 3}
    assert metrics.snapshot()["otel_ebpf.pii.scrubbed"] == 3


def test_prefixes_that_name_the_value_stay() -> None:
    scrubber = PiiScrubber()
    assert scrubber.scrub("Authorization: Bearer abcdefghij123") == "Authorization: Bearer <credential>"
    assert scrubber.scrub("use Bearer abcdefghij123") == "use Bearer <bearer_token>"
    assert scrubber.scrub('{"api_key": "k-123456"}') == '{"api_key": "<credential>"}'
    assert scrubber.scrub("AccountName=a;AccountKey=" + "x" * 60 + ";") == "AccountName=a;AccountKey=<azure_key>;"
    # already redacted by the command-line rules: not counted twice
    assert scrubber.scrub("token: REDACTED, Bearer REDACTED") == "token: REDACTED, Bearer REDACTED"
    assert dict(scrubber.counts) == {"credential": 2, "bearer_token": 1, "azure_key": 1}


@pytest.mark.parametrize(
    "text",
    [
        "4111111111111112",  # fails Luhn
        "1700000000123456789",  # a nanosecond timestamp: no card issuer starts with 1
        "1234567812345670",  # Luhn-valid, but no issuer prefix
        "0000000000000000",
        "DE89 3704 0044 0532 0130 01",  # IBAN with a wrong check
        "order 12345678901 shipped",
        "v1.2.3.4",
        "10.0.0.1:8080",
        "2024-01-15 10:20:30",
        "sk-short",
        "AKIA-not-a-key",
        "user@localhost",
    ],
)
def test_lookalikes_stay(text: str) -> None:
    scrubber = PiiScrubber()
    assert scrubber.scrub(text) == text
    assert not scrubber.counts


# Ordinary content. A 13-19 digit number that passes Luhn with a card issuer's prefix cannot be told
# from a card number (docs/genai.md says so), so integers stay below 13 digits; timestamps are those
# of 2001-2035, in s, ms, us and ns, whose leading 1 or 2 no card of their length starts with.
_ordinary = st.one_of(
    st.integers(min_value=-(10**12 - 1), max_value=10**12 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=1_000_000_000, max_value=2_082_758_399).flatmap(
        lambda s: st.sampled_from([str(s), str(s * 1000), str(s * 10**6), str(s * 10**9)])
    ),
    st.datetimes().map(lambda d: d.isoformat()),
    st.uuids().map(str),
    st.binary(min_size=8, max_size=32).map(bytes.hex),  # trace / span / request ids
    st.sampled_from(["the model said", "tokens", "finish_reason", "length", "assistant", "user"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ordinary, min_size=1, max_size=30))
def test_ordinary_json_is_left_alone(values: list[str]) -> None:
    text = json.dumps({"id": str(uuid.uuid4()), "values": values, "n": len(values)})
    scrubber = PiiScrubber()
    assert scrubber.scrub(text) == text


def test_user_patterns_and_kind_selection() -> None:
    metrics = SelfMetrics()
    scrubber = build_scrubber(["email"], {"employee_id": r"EMP-\d{6}"}, metrics)
    out = scrubber.scrub("EMP-123456 mailed a@example.org from +14155552671")
    assert out == "<employee_id> mailed <email> from +14155552671"
    assert dict(scrubber.counts) == {"employee_id": 1, "email": 1}


@pytest.mark.parametrize(
    ("name", "pattern", "problem"),
    [
        ("x", "(a)", "non-capturing"),
        ("x", "[", "invalid regular expression"),
        ("x", "a?", "empty text"),
        ("Bad", "a", "lower-case"),
        ("card", "a", "built-in"),
    ],
)
def test_bad_user_patterns_are_refused(name: str, pattern: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        custom_kind(name, pattern)


def test_content_is_filtered_however_many_plain_keys_came_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain keys filter_content remembers are bounded; past the bound it tests each key anew."""
    plain: set[str] = set()
    monkeypatch.setattr(pii, "_PLAIN_KEYS", plain)
    for n in range(pii.MAX_PLAIN_KEYS + 10):
        assert filter_content({f"plugin.key{n}": "a@example.com"}, PiiScrubber().scrub) == {
            f"plugin.key{n}": "a@example.com"
        }
    assert len(plain) == pii.MAX_PLAIN_KEYS
    for _ in range(2):  # a content key is never remembered as plain
        assert filter_content({"http.response.header.x-user": ("a@example.com",)}, PiiScrubber().scrub) == {
            "http.response.header.x-user": ("<email>",)
        }


def test_only_content_attributes_are_filtered() -> None:
    attributes = {
        "gen_ai.input.messages": "a@example.com",
        "http.request.header.x-user": ("a@example.com", "b"),
        "url.path": "/users/a@example.com",
        "gen_ai.usage.input_tokens": 3,
    }
    out = filter_content(attributes, PiiScrubber().scrub)
    assert out == {
        "gen_ai.input.messages": "<email>",
        "http.request.header.x-user": ("<email>", "b"),
        "url.path": "/users/a@example.com",
        "gen_ai.usage.input_tokens": 3,
    }
