"""OTLP/JSON ``ExportTraceServiceRequest`` lines written straight from SDK spans, without protobuf.

Why this exists: the file exporter writes every HTTP exchange the agent sees on a node. Going
``ReadableSpan`` → ``encode_spans`` (protobuf messages) → ``json_format.MessageToDict`` (a
pure-Python walk over field descriptors) → hex ids costs ~150 µs a span, most of the agent's CPU at
tens of thousands of requests a second. Writing the JSON text directly costs ~10 µs
(``bench/file_export.py`` measures both).

Why text and not dicts handed to ``json.dumps``: measured on 512-span batches of HTTP spans, a
batch's worth of dicts serialized in one call costs ~33 µs a span (the dicts live long enough to
be traversed by several garbage-collector passes), dicts serialized span by span ~15 µs (the C
encoder copies every dict's items into a fresh list of tuples), text ~10 µs. Strings go through the
very function ``json.dumps(..., ensure_ascii=False)`` escapes them with and floats through
``float.__repr__`` as there, so the text is the one ``json.dumps`` would produce.

"The same document" is meant byte for byte: :meth:`SpanJsonEncoder.encode` returns what
``to_json_line(encode_spans(spans))`` returns (the tests hold the two side by side). That is the
protobuf JSON mapping of what the SDK's OTLP encoder builds, with OTLP's hex ids:

- fields in field-number order, lowerCamelCase, a field omitted when it holds its default (0, "",
  empty list) — except a set ``AnyValue`` member (``{"intValue":"0"}``) and a present message
  (``resource``, ``scope``, ``status``, an empty ``arrayValue``), which appear even when empty,
  as ``{}``;
- 64-bit integers as decimal strings, 32-bit ones and enums as numbers, bytes as base64, trace and
  span ids as lowercase hex, non-finite doubles as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
- compact separators, non-ASCII characters unescaped;
- spans grouped by resource, then by instrumentation scope, both compared by equality, in order of
  first appearance;
- an attribute the SDK encoder cannot encode (an int outside int64, an unsupported type, a key that
  is not a string) is logged and dropped, the rest of its span kept; an id or a time that protobuf
  would refuse fails the whole batch, as there;
- except that a string with lone surrogates has each of them written as ``?``, where the SDK
  encoder drops the attribute or fails the batch (see :mod:`.otlp_proto`).
"""

from __future__ import annotations

import base64
import json.encoder
from collections.abc import Mapping, Sequence
from math import isfinite
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span as PB2Span
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind

from .span_groups import IdentityCache, encode_attributes, group_spans

_KINDS = {kind: PB2Span.SpanKind.Value(f"SPAN_KIND_{kind.name}") for kind in SpanKind}
_LOCAL = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_REMOTE = _LOCAL | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_INT64 = 1 << 63
_UINT64 = 1 << 64
_NON_FINITE = {float("inf"): '"Infinity"', float("-inf"): '"-Infinity"'}
_MAX_KEY_PREFIXES = 4096
_KEY_PREFIXES: dict[str, str] = {}
# Encoded KeyValues of string and int attributes by (key, value) (span_groups.encode_attributes)
_MAX_PAIRS = 16384
_PAIRS: dict[tuple[str, str | int], str] = {}
# The escaping json.dumps(..., ensure_ascii=False) applies to every string (C implementation).
_escape = json.encoder.encode_basestring


class SpanJsonEncoder:
    """Turns span batches into OTLP/JSON lines, keeping each resource's and scope's encoding
    (:class:`~.span_groups.IdentityCache`).

    Not safe for concurrent calls: an SDK exporter's ``export`` is called by one thread at a time.
    """

    def __init__(self, max_cached: int = 1024) -> None:
        self._resources = IdentityCache[Resource, str](max_cached, _resource)
        self._scopes = IdentityCache[InstrumentationScope | None, str](max_cached, _scope)

    def encode(self, spans: Sequence[ReadableSpan]) -> str:
        """``spans`` as one line of OTLP/JSON (no newline), grouped as ``encode_spans`` groups them."""
        grouped = group_spans(spans, _span)
        if not grouped:
            return "{}"
        # Formatted level by level rather than as nested _object()s: every level copies the line.
        return '{"resourceSpans":[%s]}' % ",".join(
            '{"resource":%s,"scopeSpans":[%s]%s}'
            % (
                self._resources.get(resource),
                ",".join(
                    '{"scope":%s,"spans":[%s]%s}'
                    % (self._scopes.get(scope), ",".join(encoded), _schema_url(scope.schema_url if scope else None))
                    for scope, encoded in scopes.items()
                ),
                _schema_url(resource.schema_url),
            )
            for resource, scopes in grouped.items()
        )


def _object(fields: list[str]) -> str:
    """A JSON object from its serialized ``"name":value`` members."""
    return "{%s}" % ",".join(fields)


def _string(text: str) -> str:
    """``text`` as a JSON string, lone surrogates written as ``?`` (as :mod:`.otlp_proto` does)."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode("utf-8", "replace").decode()
    return _escape(text)


def _schema_url(schema_url: str | None) -> str:
    """The last member of a ``ResourceSpans`` or ``ScopeSpans``, with its leading comma, if any."""
    return f',"schemaUrl":{_string(schema_url)}' if schema_url else ""


def _resource(resource: Resource) -> str:
    fields: list[str] = []
    _add_attributes(fields, resource.attributes, 0)
    return _object(fields)


def _scope(scope: InstrumentationScope | None) -> str:
    fields: list[str] = []
    if scope is not None:
        if scope.name:
            fields.append(f'"name":{_string(scope.name)}')
        if scope.version:
            fields.append(f'"version":{_string(scope.version)}')
        _add_attributes(fields, scope.attributes, 0)
    return _object(fields)


def _span(span: ReadableSpan) -> str:
    context, parent = span.context, span.parent
    fields = [_ids(context)]
    if context.trace_state:
        trace_state = ",".join([f"{key}={value}" for key, value in context.trace_state.items()])
        fields.append(f'"traceState":{_string(trace_state)}')
    if parent:
        fields.append(f'"parentSpanId":"{parent.span_id.to_bytes(8, "big").hex()}"')
    if span.name:
        fields.append(f'"name":{_string(span.name)}')
    fields.append(f'"kind":{_KINDS[span.kind]}')
    if span.start_time:
        fields.append(f'"startTimeUnixNano":{_fixed64(span.start_time)}')
    if span.end_time:
        fields.append(f'"endTimeUnixNano":{_fixed64(span.end_time)}')
    _add_attributes(fields, span.attributes, span.dropped_attributes)
    events, links = span.events, span.links
    if events:
        fields.append('"events":[%s]' % ",".join([_event(event) for event in events]))
    if span.dropped_events:
        fields.append(f'"droppedEventsCount":{span.dropped_events}')
    if links:
        fields.append('"links":[%s]' % ",".join([_link(link) for link in links]))
    if span.dropped_links:
        fields.append(f'"droppedLinksCount":{span.dropped_links}')
    status = span.status
    if status is not None:
        status_fields = []
        if status.description:
            status_fields.append(f'"message":{_string(status.description)}')
        if status.status_code.value:
            status_fields.append(f'"code":{status.status_code.value}')
        fields.append(f'"status":{_object(status_fields)}')
    fields.append(f'"flags":{_flags(parent)}')
    return _object(fields)


def _event(event: Event) -> str:
    fields = []
    if event.timestamp:
        fields.append(f'"timeUnixNano":{_fixed64(event.timestamp)}')
    if event.name:
        fields.append(f'"name":{_string(event.name)}')
    _add_attributes(fields, event.attributes, event.dropped_attributes)
    return _object(fields)


def _link(link: Link) -> str:
    # The SDK encoder leaves a link's trace state out; so does this one.
    fields = [_ids(link.context)]
    _add_attributes(fields, link.attributes, link.dropped_attributes)
    fields.append(f'"flags":{_flags(link.context)}')
    return _object(fields)


def _ids(context: SpanContext) -> str:
    # to_bytes, as in the SDK encoder, refuses ids that are negative or too wide
    trace_id, span_id = context.trace_id.to_bytes(16, "big"), context.span_id.to_bytes(8, "big")
    return f'"traceId":"{trace_id.hex()}","spanId":"{span_id.hex()}"'


def _flags(context: SpanContext | None) -> int:
    return _REMOTE if context and context.is_remote else _LOCAL


def _fixed64(nanos: int) -> str:
    if not 0 <= nanos < _UINT64:
        raise ValueError(f"Value out of range: {nanos}")
    return '"%d"' % nanos


def _add_attributes(fields: list[str], attributes: Mapping[str, Any] | None, dropped: int) -> None:
    if attributes:
        encoded = encode_attributes(attributes, _key_value, _PAIRS, _MAX_PAIRS)
        if encoded:
            fields.append('"attributes":[%s]' % ",".join(encoded))
    if dropped:
        fields.append(f'"droppedAttributesCount":{dropped}')


def _key_value(key: str, value: Any) -> str:
    return _key_prefix(key) + _any_value(value) + "}"


def _key_prefix(key: str) -> str:
    """A ``KeyValue`` up to its value, remembered: attribute keys are a small, fixed vocabulary."""
    prefix = _KEY_PREFIXES.get(key)
    if prefix is None:
        if not isinstance(key, str):
            raise TypeError(f"attribute key {key!r} is not a string")
        if len(_KEY_PREFIXES) >= _MAX_KEY_PREFIXES:
            _KEY_PREFIXES.clear()
        prefix = _KEY_PREFIXES[key] = f'{{"key":{_string(key)},"value":' if key else '{"value":'
    return prefix


def _any_value(value: Any) -> str:
    """One ``AnyValue``, types tested in the SDK encoder's order where they overlap (a bool is an
    int, str and bytes are sequences)."""
    if isinstance(value, str):
        return f'{{"stringValue":{_string(value)}}}'
    if isinstance(value, bool):
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise ValueError(f"Value out of range: {value}")
        return '{"intValue":"%d"}' % value
    if isinstance(value, float):
        if isfinite(value):
            return f'{{"doubleValue":{float.__repr__(value)}}}'
        return '{"doubleValue":%s}' % _NON_FINITE.get(value, '"NaN"')
    if value is None:
        return "{}"
    if isinstance(value, bytes):
        return '{"bytesValue":"%s"}' % base64.b64encode(value).decode("ascii")
    if isinstance(value, Sequence):
        values = ",".join([_any_value(item) for item in value])
        return '{"arrayValue":{"values":[%s]}}' % values if values else '{"arrayValue":{}}'
    if isinstance(value, Mapping):
        pairs = ",".join([_key_prefix(str(key)) + _any_value(item) + "}" for key, item in value.items()])
        return '{"kvlistValue":{"values":[%s]}}' % pairs if pairs else '{"kvlistValue":{}}'
    raise TypeError(f"Invalid type {type(value)} of value {value}")
