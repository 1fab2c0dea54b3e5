"""Personal data and secrets out of captured content before it leaves the node.

Captured content — GenAI prompts and outputs (``capture_content``), allow-listed HTTP headers and
gRPC metadata — can carry what the application's users typed: e-mail addresses, phone and card
numbers, IBANs, and the application's own credentials. :class:`PiiScrubber` replaces each with a
typed placeholder (``<email>``, ``<card>``, ``<openai_key>``, ...) and counts it per kind.

One combined pass: every kind is one alternative of a single regular expression, so a text is
scanned once whatever the number of kinds. A kind whose shape alone would match ordinary data
(long numbers, letter-digit codes) is confirmed by its checksum — Luhn and an issuer prefix for
cards, ISO 13616 mod-97 for IBANs — and left alone when the check fails. Only the agent's copy of
the text is touched; what the application sends is never changed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .selfmetrics import SelfMetrics

_TOKEN = r"A-Za-z0-9_\-"
MAX_PATTERNS = 256  # combined patterns kept, by set of kinds
# Texts shorter than this (most header values) go through the pattern of every kind at once: one
# scan of a few dozen characters costs less than looking for the kinds' hints.
SHORT = 64
# a value that is not part of a longer word or number on its left / right
_END = r"(?![\w\-]|\.\w)"
_GROUPS = rf"\d{{3,4}}[ .\-]\d{{3,4}}{_END}"  # the last two digit groups of a phone number


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if i % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


# Issuer prefixes (ISO/IEC 7812 IIN ranges of the card networks) and the lengths they issue: a
# Luhn-valid number outside them (a timestamp, an id) is not a card.
_CARD_PREFIXES = (
    (("4",), (13, 16, 19)),  # Visa
    (tuple(str(p) for p in range(51, 56)) + tuple(str(p) for p in range(2221, 2721)), (16,)),  # Mastercard
    (("34", "37"), (15,)),  # American Express
    (("6011", "65") + tuple(str(p) for p in range(644, 650)), (16, 19)),  # Discover
    (tuple(str(p) for p in range(3528, 3590)), (16, 19)),  # JCB
    (("36", "38", "39") + tuple(str(p) for p in range(300, 306)), (14, 16)),  # Diners Club
    (("62",), (16, 17, 18, 19)),  # UnionPay
)


def _is_card(text: str) -> bool:
    digits = "".join(c for c in text if c.isdigit())
    if len(set(digits)) == 1 or not _luhn(digits):
        return False
    return any(digits.startswith(prefixes) and len(digits) in lengths for prefixes, lengths in _CARD_PREFIXES)


def _is_iban(text: str) -> bool:
    """ISO 13616: the country code and check digits moved to the end, letters as 10..35, mod 97 = 1."""
    compact = text.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


@dataclass(frozen=True)
class PiiKind:
    """One kind of personal data or secret: its pattern, and a check that confirms a match.

    Built-in kinds give the character a match starts with apart, as a character class body
    (``first``); ``pattern`` is then the rest, which may look behind at that character. A kind
    without ``first`` (a user's) is a whole pattern. ``pattern`` may hold an empty group named
    ``keep``: what comes before it (a field name, an auth scheme) stays, only the rest is replaced.
    A built-in kind's match starts a word (the character before it is none) unless ``inside_word``;
    ``left`` extends a match leftwards: the e-mail kind is found at its ``@``."""

    name: str
    pattern: str
    first: str | None = None
    check: Callable[[str], bool] | None = None
    # substrings one of which every match holds (in lower case when ``hints_folded``): a text
    # without any leaves the kind out of its pass
    hints: tuple[str, ...] = ()
    hints_folded: bool = False
    left: re.Pattern[str] | None = None
    inside_word: bool = False

    @property
    def placeholder(self) -> str:
        return f"<{self.name}>"


# credential-looking field and header names, by first letter
_CREDENTIAL_NAMES = {
    "a": r"uthorization|pi[-_]?key|ccess[-_]?token|uth[-_]?token|ws_secret_access_key",
    "p": r"roxy-authorization|assw(?:or)?d",
    "x": r"-api-key",
    "r": r"efresh[-_]?token",
    "s": r"ecret[-_]?key",
    "c": r"lient[-_]?secret",
}
_CREDENTIAL_HINTS = ("auth", "api", "access", "aws_secret", "passw", "refresh", "secret")
_CREDENTIAL = (
    "(?:"
    + "|".join(rf"(?<=[{letter}{letter.upper()}])(?i:{rest})" for letter, rest in _CREDENTIAL_NAMES.items())
    + r")[\"']?\s*[:=]\s*[\"']?(?:(?i:bearer|basic|token|digest)\s+)?(?P<keep>)(?!<|REDACTED\b)"
    r"[^\s\"',;&<]{4,}"
)
_NUMBER_START = r"(?<![.+\-].)"  # numbers: not after a dot, sign or dash either (a word character is excluded already)
# Order decides between kinds matching at the same position: the more specific first.
KINDS: tuple[PiiKind, ...] = (
    PiiKind(
        "private_key",
        r"----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z)",
        r"\-",
        hints=("PRIVATE KEY-----",),
    ),
    PiiKind("jwt", r"yJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*", "e", hints=("eyJ",)),
    # a credential-named field or header, in JSON, YAML, a query string or a header block
    PiiKind(
        "credential",
        _CREDENTIAL,
        "".join(c + c.upper() for c in _CREDENTIAL_NAMES),
        hints=_CREDENTIAL_HINTS,
        hints_folded=True,
    ),
    PiiKind(
        "bearer_token",
        r"(?:earer|EARER)\s+(?P<keep>)(?!<|REDACTED\b)[A-Za-z0-9._~+/=\-]{8,}",
        "Bb",
        hints=("earer", "EARER"),
    ),
    PiiKind("anthropic_key", rf"k-ant-[{_TOKEN}]{{20,}}", "s", hints=("sk-ant-",)),
    PiiKind("openai_key", rf"k-(?:proj-|svcacct-|admin-)?[{_TOKEN}]{{20,}}", "s", hints=("sk-",)),
    PiiKind("huggingface_token", r"f_[A-Za-z0-9]{30,}", "h", hints=("hf_",)),
    PiiKind(
        "github_token",
        r"(?:h[pousr]_[A-Za-z0-9]{36,255}|ithub_pat_[A-Za-z0-9_]{22,255})",
        "g",
        hints=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    PiiKind("aws_access_key", r"(?:KIA|SIA|BIA|CCA)[A-Z0-9]{16}\b", "A", hints=("AKIA", "ASIA", "ABIA", "ACCA")),
    PiiKind("gcp_api_key", r"Iza[0-9A-Za-z_\-]{35}", "A", hints=("AIza",)),
    PiiKind(
        "azure_key",
        r"(?:(?<=A)ccountKey|(?<=S)haredAccessKey)=(?P<keep>)[A-Za-z0-9+/]{40,}={0,2}",
        "AS",
        hints=("Key=",),
    ),
    PiiKind(
        "email",
        r"(?<=[\w.%+\-]@)(?:[A-Za-z0-9\-]{1,63}\.)+[A-Za-z]{2,24}\b",
        "@",
        hints=("@",),
        left=re.compile(r"[\w.%+\-]{1,64}\Z"),
        inside_word=True,
    ),
    PiiKind("iban", r"[A-Z]\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b", "A-Z", _is_iban),
    PiiKind("card", rf"{_NUMBER_START}(?:[ \-]?\d){{12,18}}{_END}", "0-9", _is_card),
    # international (+country code) or grouped national numbers; a bare digit run is an id, not a phone
    PiiKind(
        "phone",
        rf"{_NUMBER_START}(?:(?<=\+)(?:\d{{1,3}}[ .\-]?(?:\(\d{{2,4}}\)|\d{{2,4}})[ .\-]?{_GROUPS}"
        rf"|\d{{7,15}}{_END})|(?<=\()\d{{2,4}}\)[ .\-]?{_GROUPS}|(?<=\d)\d{{1,3}}[ .\-]{_GROUPS})",
        r"+(0-9",
    ),
)
KIND_NAMES: tuple[str, ...] = tuple(kind.name for kind in KINDS)


def custom_kind(name: str, pattern: str) -> PiiKind:
    """A user-supplied kind; ``ValueError`` naming the problem when the pattern is unusable."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", name):
        raise ValueError(f"{name!r}: a pattern name is lower-case letters, digits and _ (at most 32)")
    if name in KIND_NAMES:
        raise ValueError(f"{name!r}: a built-in kind has this name")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{name}: invalid regular expression: {exc}") from None
    if compiled.groups:  # the combined pattern identifies kinds by their groups
        raise ValueError(f"{name}: use non-capturing groups (?:...) only")
    if compiled.search(""):
        raise ValueError(f"{name}: the pattern matches empty text")
    return PiiKind(name, pattern)


class PiiScrubber:
    """Replaces the selected kinds in texts by their placeholders; ``counts`` says how many of each."""

    def __init__(self, kinds: Iterable[PiiKind] = KINDS, selfmetrics: SelfMetrics | None = None) -> None:
        """``selfmetrics``: where each replacement is counted too (``otel_ebpf.pii.scrubbed``)."""
        self.kinds = tuple(kinds)
        self._selfmetrics = selfmetrics
        if not self.kinds:
            raise ValueError("no kinds to scrub")
        every = self._combine(range(len(self.kinds)))  # compiled now: a bad pattern fails here, not later
        self._every = every
        self._keeps = {index: f"keep{index}" in every.groupindex for index in range(len(self.kinds))}
        # one combined pattern per set of kinds that may occur in a text (see PiiKind.hints)
        self._patterns: dict[frozenset[int], re.Pattern[str]] = {frozenset(range(len(self.kinds))): every}
        self._always = frozenset(i for i, kind in enumerate(self.kinds) if not kind.hints)
        self._hints = [(hint, i, kind.hints_folded) for i, kind in enumerate(self.kinds) for hint in kind.hints]
        self._fold = any(kind.hints_folded for kind in self.kinds)
        self.counts: Counter[str] = Counter()

    def _pattern_for(self, text: str) -> re.Pattern[str] | None:
        """The combined pattern of the kinds whose hints ``text`` holds (None: no kind can match)."""
        folded = text.lower() if self._fold else text
        active = self._always.union(
            [i for hint, i, in_folded in self._hints if hint in (folded if in_folded else text)]
        )
        if not active:
            return None
        pattern = self._patterns.get(active)
        if pattern is None:
            if len(self._patterns) >= MAX_PATTERNS:
                self._patterns.clear()
            pattern = self._patterns[active] = self._combine(active)
        return pattern

    def _combine(self, indices: Iterable[int]) -> re.Pattern[str]:
        """One pattern for the kinds ``indices``. The built-in kinds share one leading character
        class — their first characters — so the engine skips in C every position no kind can start
        at; one test then drops a position inside a word (most digits of a number, most letters),
        and each kind left looks behind at its first character. A user's kind is one more
        alternative. An empty group at the end of each names the kind (the last group a match closes)."""
        firsts: list[str] = []
        word_start: list[str] = []  # the alternatives of kinds that start a word, and of those that need not
        inside_word: list[str] = []
        whole: list[str] = []
        for index in sorted(indices):
            kind = self.kinds[index]
            pattern = kind.pattern.replace("(?P<keep>)", f"(?P<keep{index}>)")
            if kind.first is None:
                whole.append(f"(?:{pattern})(?P<k{index}>)")
                continue
            firsts.append(kind.first)
            (inside_word if kind.inside_word else word_start).append(f"(?<=[{kind.first}])(?:{pattern})(?P<k{index}>)")
        branches = ([rf"(?<!\w.)(?:{'|'.join(word_start)})"] if word_start else []) + inside_word
        parts = [f"[{''.join(dict.fromkeys(firsts))}](?:{'|'.join(branches)})"] if branches else []
        return re.compile("|".join(parts + whole))

    def scrub(self, text: str) -> str:
        pattern = self._every if len(text) < SHORT else self._pattern_for(text)
        if pattern is None:
            return text
        pieces: list[str] = []
        done = 0  # text before this is copied or replaced
        for match in pattern.finditer(text):
            index = int(match.lastgroup[1:])  # type: ignore[index]
            kind = self.kinds[index]
            start, end = match.span()
            if kind.left is not None:
                before = kind.left.search(text, max(done, start - 64), start)
                if before is None:
                    continue
                start = before.start()
            if kind.check is not None and not kind.check(text[start:end]):
                continue
            self.counts[kind.name] += 1
            if self._selfmetrics is not None:
                self._selfmetrics.add("otel_ebpf.pii.scrubbed", 1, {"kind": kind.name})
            pieces += (text[done : match.end(f"keep{index}") if self._keeps[index] else start], kind.placeholder)
            done = end
        if not pieces:
            return text
        pieces.append(text[done:])
        return "".join(pieces)


def build_scrubber(kinds: Iterable[str], patterns: Mapping[str, str], selfmetrics: SelfMetrics) -> PiiScrubber:
    """The scrubber for the ``pii`` settings: built-in kinds by name, then the user's patterns."""
    by_name = {kind.name: kind for kind in KINDS}
    selected = [by_name[name] for name in kinds]
    return PiiScrubber([*selected, *(custom_kind(name, pattern) for name, pattern in patterns.items())], selfmetrics)


# span attributes that hold captured content (prefixes end with ".")
CONTENT_ATTRIBUTES = (
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "http.request.header.",
    "http.response.header.",
    "rpc.grpc.request.metadata.",
    "rpc.grpc.response.metadata.",
    "rpc.request.metadata.",
    "rpc.response.metadata.",
)


# Attribute keys seen that name no captured content: nearly all of a span's, every time. A set
# difference over them, in C, replaces a prefix test per key per span; bounded, as plugins may
# name keys after what they parsed.
_PLAIN_KEYS: set[str] = set()
MAX_PLAIN_KEYS = 4096


def filter_content(attributes: Mapping[str, Any], content_filter: Callable[[str], str]) -> Mapping[str, Any]:
    """``attributes`` with every captured-content value (a string or a list of strings) passed
    through ``content_filter``; the rest as they are (``attributes`` itself when it holds no content)."""
    keys = []
    for key in attributes.keys() - _PLAIN_KEYS:
        if key.startswith(CONTENT_ATTRIBUTES):
            keys.append(key)
        elif len(_PLAIN_KEYS) < MAX_PLAIN_KEYS:
            _PLAIN_KEYS.add(key)
    if not keys:
        return attributes
    filtered = dict(attributes)
    for key in keys:
        value = attributes[key]
        if isinstance(value, str):
            filtered[key] = content_filter(value)
        elif isinstance(value, (list, tuple)):
            filtered[key] = type(value)(content_filter(v) if isinstance(v, str) else v for v in value)
    return filtered
