"""RTPS bytes for tests: the recorded Cyclone DDS traffic, a big-endian re-encoder and builders.

Cyclone DDS on x86 sends every submessage little-endian. :func:`to_big_endian` rewrites a
datagram as a big-endian sender would (every submessage field that has an endianness, parameter
lists of discovery payloads turned into PL_CDR_BE, and the rmw request header of service samples
into CDR_BE); submessages it does not know (vendor-specific) stay as they were, flag included.
"""

from __future__ import annotations

import base64
import struct
from pathlib import Path

from otel_ebpf.recording import read_recording

RECORDING = Path(__file__).with_name("data") / "rtps" / "cyclone_scenarios.jsonl"

# submessage ids
PAD, ACKNACK, HEARTBEAT, GAP, INFO_TS, INFO_SRC, INFO_DST = 0x01, 0x06, 0x07, 0x08, 0x09, 0x0C, 0x0E
NACK_FRAG, HEARTBEAT_FRAG, DATA, DATA_FRAG = 0x12, 0x13, 0x15, 0x16
STRING_PIDS = {0x0005, 0x0007, 0x0062}  # topic name, type name, entity name


def recorded_events() -> list:
    with RECORDING.open() as stream:
        _, events = read_recording(stream)
        return list(events)


def _swap(buf: bytearray, off: int, fmt: str) -> int:
    """Re-encode the fields ``fmt`` (struct codes, no byte order) at ``off`` from LE to BE."""
    values = struct.unpack_from("<" + fmt, buf, off)
    struct.pack_into(">" + fmt, buf, off, *values)
    return off + struct.calcsize("<" + fmt)


def _params_be(buf: bytearray, off: int, end: int, strings: bool) -> int:
    """A little-endian parameter list at ``off`` re-encoded; returns the offset after it."""
    while off + 4 <= end:
        pid, length = struct.unpack_from("<HH", buf, off)
        _swap(buf, off, "HH")
        off += 4
        if pid == 0x0001:
            return off
        if strings and pid in STRING_PIDS and length >= 4:
            _swap(buf, off, "I")
        off += length
    return off


def _set_be(buf: bytearray, off: int, base_fmt: str) -> int:
    off = _swap(buf, off, base_fmt)
    (bits,) = struct.unpack_from("<I", buf, off)
    off = _swap(buf, off, "I")
    for _ in range((min(bits, 256) + 31) // 32):
        off = _swap(buf, off, "I")
    return off


def _payload_be(buf: bytearray, off: int, end: int) -> None:
    """Discovery payloads become PL_CDR_BE; a sample whose first 16 bytes are the rmw request
    header (service samples) becomes CDR_BE. Other user payloads keep their encapsulation (a
    little-endian payload in a big-endian submessage is legal and common)."""
    if end - off < 4:
        return
    encapsulation = buf[off : off + 2]
    if encapsulation == b"\x00\x03":  # PL_CDR_LE
        buf[off : off + 2] = b"\x00\x02"
        _params_be(buf, off + 4, end, strings=True)


def to_big_endian(datagram: bytes, service_payloads: bool = False) -> bytes:
    """The same RTPS message as a big-endian sender would put it on the wire.
    ``service_payloads``: also re-encode CDR_LE payloads' first 16 bytes (u64, i64), which is
    right for service request/reply samples only."""
    buf = bytearray(datagram)
    off = 20
    while off + 4 <= len(buf):
        kind, flags = buf[off], buf[off + 1]
        (size,) = struct.unpack_from("<H" if flags & 1 else ">H", buf, off + 2)
        body = off + 4
        to_end = size == 0 and kind not in (PAD, INFO_TS)
        end = len(buf) if to_end else min(len(buf), body + size)
        if flags & 1 and kind < 0x80:  # vendor-specific submessages keep their own encoding
            buf[off + 1] = flags & ~1
            _swap(buf, off + 2, "H")
            try:
                _submessage_be(buf, kind, flags, body, end, service_payloads)
            except struct.error:
                pass  # cut short by the capture: what fits is re-encoded
        if to_end:
            break
        off = body + size
    return bytes(buf)


def _submessage_be(buf: bytearray, kind: int, flags: int, off: int, end: int, service_payloads: bool) -> None:
    if kind == INFO_TS and not flags & 0x02:
        _swap(buf, off, "iI")
    elif kind == INFO_SRC:
        _swap(buf, off, "I")
    elif kind == HEARTBEAT:
        _swap(buf, off + 8, "iIiII")
    elif kind == ACKNACK:
        after = _set_be(buf, off + 8, "iI")
        _swap(buf, after, "I")
    elif kind == GAP:
        after = _swap(buf, off + 8, "iI")
        _set_be(buf, after, "iI")
    elif kind == NACK_FRAG:
        after = _swap(buf, off + 8, "iI")
        after = _set_be(buf, after, "I")
        _swap(buf, after, "I")
    elif kind == HEARTBEAT_FRAG:
        _swap(buf, off + 8, "iIII")
    elif kind in (DATA, DATA_FRAG):
        (to_qos,) = struct.unpack_from("<H", buf, off + 2)
        _swap(buf, off, "HH")
        _swap(buf, off + 12, "iI")
        if kind == DATA_FRAG:
            _swap(buf, off + 20, "IHHI")
        payload = off + 4 + to_qos
        if flags & 0x02:  # inline QoS
            payload = _params_be(buf, payload, end, strings=False)
        first_fragment = kind == DATA or struct.unpack_from(">I", buf, off + 20)[0] == 1
        if first_fragment:
            _payload_be(buf, payload, end)
            if service_payloads and buf[payload : payload + 2] == b"\x00\x01" and end - payload >= 20:
                buf[payload : payload + 2] = b"\x00\x00"  # CDR_BE
                _swap(buf, payload + 4, "Qq")


def header(prefix: bytes, vendor: bytes = b"\x01\x10") -> bytes:
    return b"RTPS\x02\x05" + vendor + prefix


def submessage(kind: int, body: bytes, little: bool = True, flags: int = 0) -> bytes:
    return struct.pack("<BBH" if little else ">BBH", kind, flags | int(little), len(body)) + body


def sn(value: int, little: bool = True) -> bytes:
    return struct.pack("<iI" if little else ">iI", value >> 32, value & 0xFFFFFFFF)


def data(reader: bytes, writer: bytes, seq: int, payload: bytes, little: bool = True, qos: bytes = b"") -> bytes:
    """A DATA submessage carrying ``payload`` (flag D), with inline QoS when given (flag Q)."""
    body = struct.pack("<HH" if little else ">HH", 0, 16) + reader + writer + sn(seq, little) + qos + payload
    return submessage(DATA, body, little, 0x04 | (0x02 if qos else 0))


def param_string(pid: int, text: str, little: bool = True) -> bytes:
    raw = text.encode() + b"\0"
    value = struct.pack("<I" if little else ">I", len(raw)) + raw
    value += b"\0" * (-len(value) % 4)
    return struct.pack("<HH" if little else ">HH", pid, len(value)) + value


def param(pid: int, value: bytes, little: bool = True) -> bytes:
    return struct.pack("<HH" if little else ">HH", pid, len(value)) + value


def sentinel(little: bool = True) -> bytes:
    return struct.pack("<HH" if little else ">HH", 1, 0)


def sedp_publication(prefix: bytes, entity: bytes, topic: str, type_name: str, little: bool = True) -> bytes:
    """A SEDP publication DATA (PL_CDR) announcing writer ``prefix + entity``."""
    params = (
        param(0x005A, prefix + entity, little)
        + param(0x0050, prefix + b"\0\0\x01\xc1", little)
        + param_string(0x0005, topic, little)
        + param_string(0x0007, type_name, little)
        + sentinel(little)
    )
    payload = (b"\x00\x03" if little else b"\x00\x02") + b"\x00\x00" + params
    return data(bytes(4), bytes.fromhex("000003c2"), 1, payload, little)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()
