"""The protobuf wire format, for the messages the agent writes by hand (pprof, OTLP spans): varints
and length-delimited fields. Hand-written where generated code would cost a protobuf object per
value (:mod:`otel_ebpf.exporters.otlp_proto`) or pull in generated code for one message
(:mod:`otel_ebpf.profiles.pprof`); and read by hand, sans-I/O, for the few fields the agent reads
off the wire (:mod:`otel_ebpf.protocols.genai.triton`)."""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5  # wire types
_UINT64 = 1 << 64
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]  # every one-byte varint, ready made


def varint(value: int) -> bytes:
    """``value`` as a varint; a negative one as its 64-bit two's complement, as protobuf writes int64."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    value %= _UINT64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    """A field's key: its number and wire type."""
    return varint(number << 3 | wire_type)


def length_delimited(key: bytes, payload: bytes) -> bytes:
    """A field of wire type LEN: its key (:func:`tag`), the payload's length, the payload."""
    n = len(payload)
    return key + (_ONE_BYTE[n] if n < 0x80 else varint(n)) + payload


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ``ValueError`` when it runs past the end
    or past 10 bytes."""
    value = shift = 0
    end = min(len(buf), pos + 10)
    while pos < end:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("varint cut short or too long")


def fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Each field of a message, in wire order, as (number, wire type, value): an int for VARINT,
    FIXED64 and FIXED32 (unsigned, little-endian), the payload for LEN. Reading a message the
    capture cut short yields the whole fields before the cut, then raises ``ValueError`` — as
    bytes that are not a message do, at the first field that does not parse (groups included)."""
    pos, end = 0, len(buf)
    while pos < end:
        key = buf[pos]
        if key < 0x80:  # the usual one-byte key (fields 1-15), without a call
            pos += 1
        else:
            key, pos = read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == VARINT:
            value, pos = read_varint(buf, pos)
            yield number, wire_type, value
        elif wire_type == LEN:
            if pos < end and buf[pos] < 0x80:
                length = buf[pos]
                pos += 1
            else:
                length, pos = read_varint(buf, pos)
            if pos + length > end:
                raise ValueError(f"field {number} runs past the message's end")
            yield number, wire_type, buf[pos : pos + length]
            pos += length
        elif wire_type in (FIXED64, FIXED32):
            size = 8 if wire_type == FIXED64 else 4
            if pos + size > end:
                raise ValueError(f"field {number} runs past the message's end")
            yield number, wire_type, int.from_bytes(buf[pos : pos + size], "little")
            pos += size
        else:
            raise ValueError(f"field {number}: wire type {wire_type} is not read")


def packed_varints(payload: bytes) -> list[int]:
    """The values of a packed repeated varint field (``ValueError`` when cut)."""
    values, pos = [], 0
    while pos < len(payload):
        value, pos = read_varint(payload, pos)
        values.append(value)
    return values
