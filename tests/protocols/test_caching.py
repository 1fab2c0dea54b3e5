"""The per-request caches: bounded, transparent, and parsing exactly as without them."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf.protocol import SharedAttributes
from otel_ebpf.protocols.caching import CACHE_ENTRIES, CACHE_MAX_LEN, memoize, memoize_attributes
from otel_ebpf.protocols.http1.parser import parse_fields
from otel_ebpf.protocols.http_semconv import route_template, split_authority, split_target


def test_memoize_caches_short_arguments_only() -> None:
    calls: list[str] = []

    @memoize
    def upper(text: str) -> str:
        calls.append(text)
        return text.upper()

    assert upper("abc") == upper("abc") == "ABC"
    assert calls == ["abc"]
    long = "x" * (CACHE_MAX_LEN + 1)
    assert upper(long) == upper(long) == long.upper()
    assert calls == ["abc", long, long]  # computed each time, never kept
    assert list(upper.cache) == ["abc"]  # type: ignore[attr-defined]


def test_memoize_keeps_at_most_its_bound_oldest_out_first() -> None:
    calls: list[str] = []

    @memoize
    def upper(text: str) -> str:
        calls.append(text)
        return text.upper()

    for i in range(CACHE_ENTRIES + 10):
        assert upper(str(i)) == str(i)
    assert len(upper.cache) == CACHE_ENTRIES  # type: ignore[attr-defined]
    assert "0" not in upper.cache and str(CACHE_ENTRIES + 9) in upper.cache  # type: ignore[attr-defined]
    calls.clear()
    assert upper("10") == "10" and upper("0") == "0"
    assert calls == ["0"]  # the ten oldest went, "10" was still kept


def test_memoize_attributes_gives_one_shared_object_per_combination_within_its_bound() -> None:
    @memoize_attributes
    def labels(method: str, status: int | None) -> dict[str, str | int]:
        attributes: dict[str, str | int] = {"method": method}
        if status is not None:
            attributes["status"] = status
        return attributes

    first = labels("GET", 200)
    assert type(first) is SharedAttributes and first == {"method": "GET", "status": 200}
    assert labels("GET", 200) is first
    assert labels("GET", None) == {"method": "GET"} and labels("GET", None) is not first
    for status in range(CACHE_ENTRIES):
        labels("POST", status)
    assert labels("GET", 200) is not first  # evicted, oldest first: made anew, equal
    assert labels("GET", 200) == first


def test_memoize_takes_one_argument_so_the_bound_covers_the_key() -> None:
    with pytest.raises(TypeError, match="exactly one argument"):

        @memoize
        def join(a: str, b: str) -> str:
            return a + b


def test_cached_helpers_answer_as_before() -> None:
    long_scheme = "x" * 10_000  # a hostile absolute-form target: never part of a cache key
    for _ in range(2):
        assert split_authority("h", long_scheme) == ("h", None)
        assert split_authority("h:81", "https") == ("h", 81)
        assert split_authority("h", "https") == ("h", 443)
        assert route_template("/users/123") == "/users/{id}"
        assert split_target("/a?b").query == "b"


# The header-line grammar the parser had before it was memoised, kept as the specification of what
# parse_fields returns: one regular expression per line, and for folded or malformed lines the
# line-by-line reading, which takes each unfolded line by the same expression (so both readings
# reject the same lines, a CR inside a name included) and joins a fold to an empty value without a
# leading space.
_REFERENCE_FIELD = re.compile(r"^([^ \t\r\n:]+):[ \t]*(.*?)[ \t]*\r?\n", re.MULTILINE)


def reference_parse_fields(block: bytes) -> tuple[tuple[str, str], ...] | None:
    text = block.decode("latin-1")
    fields = _REFERENCE_FIELD.findall(text)
    if len(fields) == text.count("\n"):
        return tuple((name.lower(), value) for name, value in fields)
    by_line: list[tuple[str, str]] = []
    for raw in text.split("\n"):
        line = raw.rstrip("\r")
        if not line:
            continue
        if line[0] in " \t":
            if not by_line:
                return None
            name, value = by_line[-1]
            more = line.strip(" \t")
            by_line[-1] = (name, f"{value} {more}" if value and more else value or more)
            continue
        field = _REFERENCE_FIELD.fullmatch(raw + "\n")
        if field is None:
            return None
        by_line.append((field[1].lower(), field[2]))
    return tuple(by_line)


FIELD_PARTS = [
    b"Host: h\r\n",
    b"Content-Length: 5\r\n",
    b"X-A:b\n",
    b"X-Pad: \t v \t \r\n",
    b"X-Cr: v\r\r\n",
    b"X-Mid: a\rb\r\n",
    b"X-Empty:\r\n",
    b"X-Blank: \r \r\n",
    b" folded\r\n",
    b"\tfolded\n",
    b"Bad Name: v\r\n",
    b"Bad\r: v\r\n",
    b"NoColon\r\n",
    b":v\r\n",
    b"\r\r\n",
    b"X-Latin: \xe9\xff\r\n",
    b"tail-without-lf",
]


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from(FIELD_PARTS), max_size=8).map(b"".join)
    | st.binary(max_size=64)
    | st.text(" \t\r\n:aZ-é", max_size=40).map(lambda text: text.encode("utf-8"))
)
def test_parse_fields_matches_the_reference_grammar(block: bytes) -> None:
    want = reference_parse_fields(block)
    for _ in range(2):  # the second time from the caches
        assert parse_fields(block) == want
        assert parse_fields(bytearray(block)) == want
