"""The protobuf wire format, for the messages the agent writes by hand (pprof, OTLP spans): varints
and length-delimited fields. Hand-written where generated code would cost a protobuf object per
value (:mod:`otel_ebpf.exporters.otlp_proto`) or pull in generated code for one message
(:mod:`otel_ebpf.profiles.pprof`)."""

from __future__ import annotations

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
