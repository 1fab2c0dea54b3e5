"""OTLP ``ExportTraceServiceRequest`` bytes written straight from SDK spans, without protobuf objects.

Why this exists: the OTLP exporter sends every span the agent makes. The SDK's path, ``encode_spans``
(one protobuf message per span, attribute and value) then ``SerializeToString``, costs ~75 µs per
HTTP span here, more than everything else the agent does for a request; writing the protobuf wire
format directly costs a small fraction of that (``bench/file_export.py`` measures both side by side).

"The same bytes" is meant literally: :meth:`SpanProtoEncoder.encode` returns what
``encode_spans(spans).SerializeToString()`` returns (the tests hold the two side by side), which is
protobuf's canonical encoding of what the SDK encoder builds:

- fields in field-number order; a scalar or string field omitted when it holds its default (0, ""),
  a set ``AnyValue`` member and a present message (``resource``, ``scope``, ``status``, a key's
  ``value``) written even when empty;
- ``int64`` as a varint of its two's complement (ten bytes when negative), times as ``fixed64``,
  span flags as ``fixed32``, doubles as little-endian IEEE 754;
- spans grouped by resource, then by instrumentation scope (:func:`~.span_groups.group_spans`);
- an attribute the SDK encoder cannot encode (an int outside int64, an unsupported type, a key that
  is not a string) is logged and dropped, the rest of its span kept; an id or a time that protobuf
  would refuse fails the whole batch, as there.

Where the two differ: a string with lone surrogates (which ``json.loads`` makes of a body's
``"\ud800"``, so a hostile peer can send one) has each of them written as ``?``. The SDK encoder
drops such an attribute and fails the whole batch on such a span name or status message: one
request could lose 511 others.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span as PB2Span
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind

from ..protowire import length_delimited, varint
from .span_groups import IdentityCache, encode_attributes, group_spans

_UINT64 = 1 << 64
_INT64 = 1 << 63
_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_fixed32 = struct.Struct("<I").pack
_KINDS = {kind: b"\x30" + varint(PB2Span.SpanKind.Value(f"SPAN_KIND_{kind.name}")) for kind in SpanKind}
# field 16 (fixed32): the tag takes two bytes
_LOCAL = b"\x85\x01" + _fixed32(SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
_REMOTE = b"\x85\x01" + _fixed32(
    SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
)
_LINK_LOCAL = b"\x35" + _LOCAL[2:]  # field 6 of a Link
_LINK_REMOTE = b"\x35" + _REMOTE[2:]
_MAX_KEYS = 4096
_KEYS: dict[str, bytes] = {}  # attribute key -> the KeyValue's key field
_MAX_FIELDS = 16384

# Tags (field number << 3 | wire type) of the length-delimited fields written below.
_SPAN_ATTRIBUTE = b"\x4a"  # Span.attributes (9)
_EVENT_ATTRIBUTE = b"\x1a"  # Span.Event.attributes (3), InstrumentationScope.attributes (3)
_LINK_ATTRIBUTE = b"\x22"  # Span.Link.attributes (4)
_FIRST = b"\x0a"  # field 1: Resource.attributes, KeyValueList.values, ArrayValue.values, ...
_TAGS = (_SPAN_ATTRIBUTE, _EVENT_ATTRIBUTE, _LINK_ATTRIBUTE, _FIRST)
# per tag: (key, str or int value) -> the attribute's whole field (span_groups.encode_attributes)
_FIELDS: dict[bytes, dict[tuple[str, str | int], bytes]] = {tag: {} for tag in _TAGS}


class SpanProtoEncoder:
    """Turns span batches into serialized ``ExportTraceServiceRequest`` messages, keeping each
    resource's and scope's encoding (:class:`~.span_groups.IdentityCache`).

    Not safe for concurrent calls: an exporter's ``export`` is called by one thread at a time.
    """

    def __init__(self, max_cached: int = 1024) -> None:
        self._resources = IdentityCache[Resource, bytes](max_cached, _resource)
        self._scopes = IdentityCache[InstrumentationScope | None, bytes](max_cached, _scope)

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        """``spans`` as ``encode_spans(spans).SerializeToString()`` would write them."""
        out: list[bytes] = []
        for resource, scopes in group_spans(spans, _span).items():
            body = [self._resources.get(resource)]
            for scope, encoded in scopes.items():
                scope_spans = [self._scopes.get(scope), *encoded]
                if scope is not None and scope.schema_url:
                    scope_spans.append(_string(b"\x1a", scope.schema_url))
                body.append(length_delimited(b"\x12", b"".join(scope_spans)))
            if resource.schema_url:
                body.append(_string(b"\x1a", resource.schema_url))
            out.append(length_delimited(_FIRST, b"".join(body)))
        return b"".join(out)


def _string(tag: bytes, text: str) -> bytes:
    return length_delimited(tag, text.encode("utf-8", "replace"))  # lone surrogates become "?"


def _time(tag: bytes, nanos: int) -> bytes:
    if not 0 <= nanos < _UINT64:
        raise ValueError(f"Value out of range: {nanos}")
    return tag + _fixed64(nanos)


def _resource(resource: Resource) -> bytes:
    return length_delimited(_FIRST, b"".join(_attributes(_FIRST, resource.attributes)))  # ResourceSpans.resource (1)


def _scope(scope: InstrumentationScope | None) -> bytes:
    fields: list[bytes] = []
    if scope is not None:
        if scope.name:
            fields.append(_string(b"\x0a", scope.name))
        if scope.version:
            fields.append(_string(b"\x12", scope.version))
        fields += _attributes(_EVENT_ATTRIBUTE, scope.attributes)
    return length_delimited(_FIRST, b"".join(fields))  # ScopeSpans.scope (1)


def _span(span: ReadableSpan) -> bytes:
    context, parent = span.context, span.parent
    fields = [_ids(context)]
    if context.trace_state:
        fields.append(_string(b"\x1a", ",".join([f"{key}={value}" for key, value in context.trace_state.items()])))
    if parent:
        fields.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    if span.name:
        fields.append(_string(b"\x2a", span.name))
    fields.append(_KINDS[span.kind])
    if span.start_time:
        fields.append(_time(b"\x39", span.start_time))
    if span.end_time:
        fields.append(_time(b"\x41", span.end_time))
    fields += _attributes(_SPAN_ATTRIBUTE, span.attributes)
    if span.dropped_attributes:
        fields.append(b"\x50" + varint(span.dropped_attributes))
    events, links = span.events, span.links
    if events:
        fields += [length_delimited(b"\x5a", _event(event)) for event in events]
    if span.dropped_events:
        fields.append(b"\x60" + varint(span.dropped_events))
    if links:
        fields += [length_delimited(b"\x6a", _link(link)) for link in links]
    if span.dropped_links:
        fields.append(b"\x70" + varint(span.dropped_links))
    status = span.status
    if status is not None:
        code = status.status_code.value
        if status.description:
            message = _string(b"\x12", status.description)
            fields.append(length_delimited(b"\x7a", message + b"\x18" + varint(code) if code else message))
        else:
            fields.append(b"\x7a\x02\x18" + varint(code) if code else b"\x7a\x00")
    fields.append(_REMOTE if parent and parent.is_remote else _LOCAL)
    return length_delimited(b"\x12", b"".join(fields))  # ScopeSpans.spans (2)


def _event(event: Event) -> bytes:
    fields = []
    if event.timestamp:
        fields.append(_time(b"\x09", event.timestamp))
    if event.name:
        fields.append(_string(b"\x12", event.name))
    fields += _attributes(_EVENT_ATTRIBUTE, event.attributes)
    if event.dropped_attributes:
        fields.append(b"\x20" + varint(event.dropped_attributes))
    return b"".join(fields)


def _link(link: Link) -> bytes:
    # The SDK encoder leaves a link's trace state out; so does this one.
    fields = [_ids(link.context), *_attributes(_LINK_ATTRIBUTE, link.attributes)]
    if link.dropped_attributes:
        fields.append(b"\x28" + varint(link.dropped_attributes))
    fields.append(_LINK_REMOTE if link.context.is_remote else _LINK_LOCAL)
    return b"".join(fields)


def _ids(context: SpanContext) -> bytes:
    # to_bytes, as in the SDK encoder, refuses ids that are negative or too wide
    return b"\x0a\x10" + context.trace_id.to_bytes(16, "big") + b"\x12\x08" + context.span_id.to_bytes(8, "big")


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """Each attribute as a ``KeyValue`` field ``tag`` (recurring ones remembered per tag)."""
    if not attributes:
        return []
    return encode_attributes(attributes, _KEY_VALUES[tag], _FIELDS[tag], _MAX_FIELDS)


def _key_value(tag: bytes, key: str, value: Any) -> bytes:
    """A ``KeyValue`` as field ``tag``."""
    return length_delimited(tag, _key(key) + length_delimited(b"\x12", _any_value(value)))


_KEY_VALUES = {tag: partial(_key_value, tag) for tag in _TAGS}


def _key(key: str) -> bytes:
    """A ``KeyValue``'s key field, remembered: attribute keys are a small, fixed vocabulary."""
    field = _KEYS.get(key)
    if field is None:
        if not isinstance(key, str):
            raise TypeError(f"attribute key {key!r} is not a string")
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        field = _KEYS[key] = _string(_FIRST, key) if key else b""
    return field


def _any_value(value: Any) -> bytes:
    """One ``AnyValue``'s fields, types tested in the SDK encoder's order where they overlap (a bool
    is an int, str and bytes are sequences)."""
    if isinstance(value, str):
        return _string(b"\x0a", value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise ValueError(f"Value out of range: {value}")
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + _double(value)
    if value is None:
        return b""
    if isinstance(value, bytes):
        return length_delimited(b"\x3a", value)
    if isinstance(value, Sequence):
        return length_delimited(b"\x2a", b"".join([length_delimited(_FIRST, _any_value(item)) for item in value]))
    if isinstance(value, Mapping):
        pairs = [_key_value(_FIRST, str(key), item) for key, item in value.items()]
        return length_delimited(b"\x32", b"".join(pairs))
    raise TypeError(f"Invalid type {type(value)} of value {value}")
