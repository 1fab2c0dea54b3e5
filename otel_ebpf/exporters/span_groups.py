"""What the direct span encoders (:mod:`.otlp_json`, :mod:`.otlp_proto`) share: spans grouped as
the SDK's OTLP encoder groups them, encodings kept per object identity, and attributes encoded
with their recurring pairs remembered."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

_logger = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")
E = TypeVar("E")

SpanGroups = dict[Resource, dict[InstrumentationScope | None, list[E]]]


def group_spans(spans: Sequence[ReadableSpan], encode_span: Callable[[ReadableSpan], E]) -> SpanGroups[E]:
    """``encode_span`` of every span, by resource, then by instrumentation scope, both compared by
    equality and in order of first appearance, as ``encode_spans`` groups them."""
    grouped: SpanGroups[E] = {}
    # Equal resources are merged, but hashing a Resource serializes its attributes, so each
    # (resource, scope) object pair is looked up once per batch. The batch keeps both alive.
    groups: dict[tuple[int, int], list[E]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        group = groups.get((id(resource), id(scope)))
        if group is None:
            group = grouped.setdefault(resource, {}).setdefault(scope, [])
            groups[(id(resource), id(scope))] = group
        group.append(encode_span(span))
    return grouped


class IdentityCache(Generic[K, V]):
    """``encode(obj)`` per object identity, for immutable objects; oldest evicted first.

    The agent gives all spans of a process one ``Resource`` object and all spans of a protocol one
    ``InstrumentationScope``, so their encodings are reused across batches. An entry holds a
    reference to its object, so the ``id`` cannot be reused while the entry lives; the oldest entry
    is evicted beyond ``capacity`` objects, which bounds how many resources of exited processes the
    cache keeps alive.
    """

    def __init__(self, capacity: int, encode: Callable[[K], V]) -> None:
        self._entries: dict[int, tuple[K, V]] = {}
        self._capacity = capacity
        self._encode = encode

    def get(self, obj: K) -> V:
        entry = self._entries.get(id(obj))
        if entry is None:
            if len(self._entries) >= self._capacity:
                del self._entries[next(iter(self._entries))]
            entry = self._entries[id(obj)] = (obj, self._encode(obj))
        return entry[1]


def encode_attributes(
    attributes: Mapping[str, Any], encode: Callable[[str, Any], E], known: dict[tuple[str, str | int], E], limit: int
) -> list[E]:
    """``encode(key, value)`` of each attribute; one that cannot be encoded is logged and dropped.

    This loop is an encoder's hot spot. The agent's attributes repeat (methods, routes, addresses,
    status codes), so a string's or an int's encoding is remembered in ``known`` by (key, value),
    up to ``limit`` pairs (then ``known`` starts again empty); only those two exact types, so that
    neither ``True`` nor ``1.0`` can stand for ``1``.
    """
    encoded: list[E] = []
    for key, value in attributes.items():
        try:
            kind = type(value)
            if kind is str or kind is int:
                pair = known.get((key, value))
                if pair is None:
                    if len(known) >= limit:
                        known.clear()
                    pair = known[(key, value)] = encode(key, value)
                encoded.append(pair)
            else:
                encoded.append(encode(key, value))
        except Exception:
            _logger.exception("attribute %r cannot be encoded as OTLP, dropped", key)
    return encoded
