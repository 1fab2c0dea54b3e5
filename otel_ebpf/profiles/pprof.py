"""Profiles <-> pprof (``profile.proto`` of github.com/google/pprof), what Pyroscope ingests.

pprof is a small, stable protobuf; it is encoded and decoded here by hand (a few varint helpers)
rather than pulling in generated code for one message. Samples carry their stack leaf first as
``location_id``s; a sample linked to a span gets the ``span_id`` (and ``trace_id``) labels Pyroscope
uses for span profiles.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from otel_ebpf.profiles.model import Frame, FrameKind, Profile, SampleKey, ValueType
from otel_ebpf.protowire import LEN, VARINT, length_delimited, tag, varint


def _field_varint(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value) if value else b""


def _field_bytes(number: int, payload: bytes) -> bytes:
    return length_delimited(tag(number, LEN), payload)


def _packed(number: int, values: list[int]) -> bytes:
    return _field_bytes(number, b"".join(varint(v) for v in values)) if values else b""


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        i = self.index.get(text)
        if i is None:
            i = self.index[text] = len(self.table)
            self.table.append(text)
        return i


def encode(profile: Profile) -> bytes:
    """``profile`` as a serialized (uncompressed) pprof ``Profile``."""
    s = _Strings()
    out = bytearray()
    for vt in profile.sample_types:
        out += _field_bytes(1, _field_varint(1, s(vt.type)) + _field_varint(2, s(vt.unit)))
    mappings: dict[tuple[str, str], int] = {}
    functions: dict[tuple[str, str], int] = {}
    locations: dict[Frame, int] = {}
    body = bytearray()
    for key, values in profile.samples.items():
        ids = []
        for frame in key.stack:
            lid = locations.get(frame)
            if lid is None:
                lid = locations[frame] = len(locations) + 1
                mid = 0
                if frame.kind is not FrameKind.PYTHON and frame.module:
                    mid = mappings.setdefault((frame.module, frame.build_id), len(mappings) + 1)
                fname = frame.file if frame.kind is FrameKind.PYTHON else frame.module
                fid = functions.setdefault((frame.function, fname), len(functions) + 1)
                line = _field_varint(1, fid) + _field_varint(2, frame.line)
                body += _field_bytes(
                    4,
                    _field_varint(1, lid)
                    + _field_varint(2, mid)
                    + _field_varint(3, frame.address)
                    + _field_bytes(4, line),
                )
            ids.append(lid)
        sample = _packed(1, ids) + _packed(2, list(values))
        if key.link is not None:
            sample += _field_bytes(3, _field_varint(1, s("span_id")) + _field_varint(2, s(f"{key.link[1]:016x}")))
            sample += _field_bytes(3, _field_varint(1, s("trace_id")) + _field_varint(2, s(f"{key.link[0]:032x}")))
        out += _field_bytes(2, sample)
    for (module, build_id), mid in mappings.items():
        out += _field_bytes(
            3, _field_varint(1, mid) + _field_varint(5, s(module)) + _field_varint(6, s(build_id)) + _field_varint(7, 1)
        )
    out += body
    for (name, filename), fid in functions.items():
        out += _field_bytes(
            5,
            _field_varint(1, fid)
            + _field_varint(2, s(name))
            + _field_varint(3, s(name))
            + _field_varint(4, s(filename)),
        )
    period_type = _field_bytes(
        11, _field_varint(1, s(profile.period_type.type)) + _field_varint(2, s(profile.period_type.unit))
    )
    tail = _field_varint(9, profile.start_ns) + _field_varint(10, max(0, profile.end_ns - profile.start_ns))
    tail += period_type + _field_varint(12, profile.period)
    for text in s.table:
        out += _field_bytes(6, text.encode())
    return bytes(out + tail)


# ---- decoding (for the flamegraph command and tests) -------------------------------------------


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, i = _read_varint(data, i)
            yield number, wire, value
        elif wire == LEN:
            size, i = _read_varint(data, i)
            yield number, wire, data[i : i + size]
            i += size
        elif wire == 1:
            yield number, wire, int.from_bytes(data[i : i + 8], "little")
            i += 8
        elif wire == 5:
            yield number, wire, int.from_bytes(data[i : i + 4], "little")
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _ints(wire: int, value: int | bytes) -> list[int]:
    if wire == LEN:
        assert isinstance(value, bytes)
        out, i = [], 0
        while i < len(value):
            v, i = _read_varint(value, i)
            out.append(v)
        return out
    assert isinstance(value, int)
    return [value]


def _message(data: bytes) -> dict[int, list]:
    fields: dict[int, list] = {}
    for number, wire, value in _fields(data):
        fields.setdefault(number, []).append((wire, value))
    return fields


def decode(data: bytes, resource: dict | None = None) -> Profile:
    """A pprof profile (gzipped or not) as a :class:`Profile` of ``resource``."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    top = _message(data)
    strings = [v.decode(errors="replace") for _, v in top.get(6, [])]

    def st(i: int) -> str:
        return strings[i] if 0 <= i < len(strings) else ""

    def one(m: dict, n: int) -> int:
        return m[n][-1][1] if n in m else 0

    def value_type(raw: bytes) -> ValueType:
        m = _message(raw)
        return ValueType(st(one(m, 1)), st(one(m, 2)))

    functions = {}
    for _, raw in top.get(5, []):
        m = _message(raw)
        functions[one(m, 1)] = (st(one(m, 2)), st(one(m, 4)))
    mappings = {}
    for _, raw in top.get(3, []):
        m = _message(raw)
        mappings[one(m, 1)] = (st(one(m, 5)), st(one(m, 6)))
    locations: dict[int, Frame] = {}
    for _, raw in top.get(4, []):
        m = _message(raw)
        lines = [_message(line) for _, line in m.get(4, [])]
        name, filename = functions.get(one(lines[-1], 1), ("", "")) if lines else ("", "")
        module, build_id = mappings.get(one(m, 2), ("", ""))
        line = one(lines[-1], 2) if lines else 0
        kind = FrameKind.NATIVE if module else (FrameKind.KERNEL if not filename else FrameKind.PYTHON)
        if module == "[kernel.kallsyms]":
            kind = FrameKind.KERNEL
        locations[one(m, 1)] = Frame(
            name,
            file=filename if kind is FrameKind.PYTHON else "",
            line=line,
            module=module,
            kind=kind,
            address=one(m, 3),
            build_id=build_id,
        )
    types = tuple(value_type(raw) for _, raw in top.get(1, []))
    period_type = value_type(top[11][-1][1]) if 11 in top else ValueType("", "")
    start = one(top, 9)
    profile = Profile(resource or {}, types, period_type, one(top, 12), start, start + one(top, 10))
    for _, raw in top.get(2, []):
        m = _message(raw)
        ids = [i for wire, v in m.get(1, []) for i in _ints(wire, v)]
        values = [v for wire, raw_v in m.get(2, []) for v in _ints(wire, raw_v)]
        labels = {st(one(_message(label), 1)): st(one(_message(label), 2)) for _, label in m.get(3, [])}
        link = None
        if "span_id" in labels and "trace_id" in labels:
            link = (int(labels["trace_id"], 16), int(labels["span_id"], 16))
        key = SampleKey(tuple(locations[i] for i in ids if i in locations), link)
        known = profile.samples.get(key)
        if known is None:
            profile.samples[key] = values
        else:
            for j, v in enumerate(values):
                known[j] += v
    return profile
