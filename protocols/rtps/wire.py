"""RTPS wire format (DDSI-RTPS 2.x): one UDP datagram in, its submessages out. Sans-I/O.

:func:`parse_message` never raises: a datagram that is not RTPS gives ``None``, a submessage that
is cut short (the capture cap, or a hostile length) ends the message with ``truncated`` set, and
unknown submessage kinds (vendor-specific ones included) are skipped by their length.

Every submessage carries its own endianness (flag bit 0). Entity ids and GUID prefixes are octet
arrays, never swapped; sequence numbers are (high i32, low u32); the serialized payload begins
with a big-endian encapsulation id whatever the submessage's endianness.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

MAGIC = b"RTPS"
HEADER_SIZE = 20

# Submessage ids (DDSI-RTPS 2.5, 9.4.5.1.1)
PAD = 0x01
ACKNACK = 0x06
HEARTBEAT = 0x07
GAP = 0x08
INFO_TS = 0x09
INFO_SRC = 0x0C
INFO_REPLY_IP4 = 0x0D
INFO_DST = 0x0E
INFO_REPLY = 0x0F
NACK_FRAG = 0x12
HEARTBEAT_FRAG = 0x13
DATA = 0x15
DATA_FRAG = 0x16

SUBMESSAGE_NAMES = {
    PAD: "PAD",
    ACKNACK: "ACKNACK",
    HEARTBEAT: "HEARTBEAT",
    GAP: "GAP",
    INFO_TS: "INFO_TS",
    INFO_SRC: "INFO_SRC",
    INFO_REPLY_IP4: "INFO_REPLY_IP4",
    INFO_DST: "INFO_DST",
    INFO_REPLY: "INFO_REPLY",
    NACK_FRAG: "NACK_FRAG",
    HEARTBEAT_FRAG: "HEARTBEAT_FRAG",
    DATA: "DATA",
    DATA_FRAG: "DATA_FRAG",
}

# Flags
FLAG_E = 0x01  # little-endian
DATA_Q, DATA_D, DATA_K = 0x02, 0x04, 0x08
FRAG_Q, FRAG_K = 0x02, 0x04
INFO_TS_INVALIDATE = 0x02
HEARTBEAT_FINAL = 0x02

PID_PAD = 0x0000
PID_SENTINEL = 0x0001

UNKNOWN_PREFIX = bytes(12)
MAX_PARAMETERS = 256  # a hostile list cannot make us loop long
MAX_SET_BITS = 256  # DDSI caps SequenceNumberSet/FragmentNumberSet bitmaps at 256 bits


@dataclass(frozen=True, slots=True)
class Data:
    """DATA or DATA_FRAG (``fragment_start`` > 0) from writer ``writer_guid``.

    ``payload`` is the captured part of the serialized payload (for DATA_FRAG, of the fragments in
    this submessage), ``payload_size`` its size on the wire (more than ``len(payload)`` when the
    capture was cut). For DATA ``sample_size`` equals ``payload_size``."""

    writer_guid: bytes  # 16 bytes: prefix + entity id
    reader_id: bytes  # 4 bytes, 00000000 = every matched reader
    sn: int
    inline_qos: dict[int, bytes]
    payload: bytes
    payload_size: int
    sample_size: int
    key_only: bool = False
    fragment_start: int = 0  # 1-based first fragment number; 0 for DATA
    fragments: int = 0  # fragments in this submessage
    fragment_size: int = 0
    little_endian: bool = True


@dataclass(frozen=True, slots=True)
class Heartbeat:
    writer_guid: bytes
    reader_id: bytes
    first_sn: int
    last_sn: int
    count: int
    final: bool


@dataclass(frozen=True, slots=True)
class AckNack:
    """``writer_guid``'s prefix is the destination participant (INFO_DST), the reader's is the
    message's source. ``missing`` lists the sequence numbers the reader asks to be resent."""

    reader_guid: bytes
    writer_guid: bytes
    base: int
    missing: tuple[int, ...]
    count: int


@dataclass(frozen=True, slots=True)
class Gap:
    """Sequence numbers ``gap_start`` up to ``list_base`` (exclusive) and those in ``listed`` will
    never come from ``writer_guid``."""

    writer_guid: bytes
    reader_id: bytes
    gap_start: int
    list_base: int
    listed: tuple[int, ...]

    @property
    def lost(self) -> int:
        return max(0, self.list_base - self.gap_start) + len(self.listed)


@dataclass(frozen=True, slots=True)
class NackFrag:
    reader_guid: bytes
    writer_guid: bytes
    sn: int
    missing: tuple[int, ...]
    count: int


@dataclass(frozen=True, slots=True)
class HeartbeatFrag:
    writer_guid: bytes
    reader_id: bytes
    sn: int
    last_fragment: int
    count: int


Submessage = "Data | Heartbeat | AckNack | Gap | NackFrag | HeartbeatFrag"


@dataclass(slots=True)
class RtpsMessage:
    """One datagram: the header's participant, and the submessages that name entities (the
    INFO_* ones are applied as they come: source and destination prefixes, timestamp)."""

    version: tuple[int, int]
    vendor: bytes
    guid_prefix: bytes
    submessages: list = field(default_factory=list)
    kinds: dict[int, int] = field(default_factory=dict)  # submessage id -> how many
    timestamp_ns: int | None = None  # the last INFO_TS (source time), Unix ns
    dest_prefix: bytes = UNKNOWN_PREFIX  # the last INFO_DST
    truncated: bool = False  # cut short by the capture or malformed
    malformed: int = 0  # submessages that could not be read


@functools.lru_cache(maxsize=4096)  # a node has few GUIDs and prints each on every sample
def guid_hex(guid: bytes) -> str:
    """GUIDs print as DDS tools print them: prefix words and entity id in hex, dot-separated."""
    h = guid.hex()
    return ".".join(h[i : i + 8] for i in range(0, len(h), 8))


def _sn(buf: bytes, off: int, le: bool) -> int:
    high, low = struct.unpack_from("<iI" if le else ">iI", buf, off)
    return (high << 32) | low


def _set(buf: bytes, off: int, end: int, le: bool, width: int) -> tuple[int, tuple[int, ...], int]:
    """A SequenceNumberSet (width 8) or FragmentNumberSet (width 4): (base, members, next offset)."""
    if width == 8:
        base = _sn(buf, off, le)
    else:
        (base,) = struct.unpack_from("<I" if le else ">I", buf, off)
    off += width
    (bits,) = struct.unpack_from("<I" if le else ">I", buf, off)
    off += 4
    bits = min(bits, MAX_SET_BITS)
    words = (bits + 31) // 32
    if off + 4 * words > end:
        raise struct.error("set bitmap past the submessage")
    members: list[int] = []
    fmt = "<I" if le else ">I"
    for w in range(words):
        (word,) = struct.unpack_from(fmt, buf, off + 4 * w)
        if not word:
            continue
        for b in range(32):
            i = 32 * w + b
            if i < bits and word & (0x80000000 >> b):
                members.append(base + i)
    return base, tuple(members), off + 4 * words


def parse_parameters(buf: bytes, off: int, end: int, le: bool) -> tuple[dict[int, bytes], int, bool]:
    """A parameter list from ``off``: ({pid: value} (first occurrence wins), offset after the
    sentinel, whether the sentinel was reached). Never raises."""
    params: dict[int, bytes] = {}
    fmt = "<HH" if le else ">HH"
    for _ in range(MAX_PARAMETERS):
        if off + 4 > end:
            return params, off, False
        pid, length = struct.unpack_from(fmt, buf, off)
        off += 4
        if pid == PID_SENTINEL:
            return params, off, True
        if off + length > end:
            return params, end, False
        if pid != PID_PAD:
            params.setdefault(pid & 0x3FFF if pid & 0x4000 else pid, buf[off : off + length])
        off += length
    return params, off, False


def parse_message(buf: bytes, length: int | None = None) -> RtpsMessage | None:
    """The RTPS message in ``buf`` (the captured prefix of a ``length``-byte datagram), or None
    when the datagram is not RTPS. Never raises."""
    if len(buf) < HEADER_SIZE or buf[:4] != MAGIC:
        return None
    msg = RtpsMessage((buf[4], buf[5]), bytes(buf[6:8]), bytes(buf[8:20]))
    if length is not None and length > len(buf):
        msg.truncated = True
    source = msg.guid_prefix
    off, n = HEADER_SIZE, len(buf)
    while off + 4 <= n:
        kind, flags = buf[off], buf[off + 1]
        le = bool(flags & FLAG_E)
        (size,) = struct.unpack_from("<H" if le else ">H", buf, off + 2)
        body = off + 4
        if size == 0 and kind not in (PAD, INFO_TS):
            size = n - body  # "to the end of the message"
        declared = body + size
        end = min(declared, n)  # parse what was captured: a DATA keeps its header and a payload prefix
        if declared > n:
            msg.truncated = True
        msg.kinds[kind] = msg.kinds.get(kind, 0) + 1
        try:
            source = _submessage(msg, kind, flags, le, buf, body, end, source, declared)
        except (struct.error, ValueError, IndexError):
            msg.malformed += 1
        if body + size > n:
            break
        off = body + size
    return msg


def _submessage(
    msg: RtpsMessage, kind: int, flags: int, le: bool, buf: bytes, off: int, end: int, source: bytes, declared: int
) -> bytes:
    """Apply one submessage to ``msg``; returns the source prefix for the ones after it."""
    u32 = "<I" if le else ">I"
    if kind == INFO_TS:
        if not flags & INFO_TS_INVALIDATE and off + 8 <= end:
            sec, frac = struct.unpack_from("<iI" if le else ">iI", buf, off)
            msg.timestamp_ns = sec * 1_000_000_000 + (frac * 1_000_000_000 >> 32)
        else:
            msg.timestamp_ns = None
    elif kind == INFO_DST:
        if off + 12 > end:
            raise ValueError("short INFO_DST")
        msg.dest_prefix = bytes(buf[off : off + 12])
    elif kind == INFO_SRC:
        if off + 20 > end:
            raise ValueError("short INFO_SRC")
        return bytes(buf[off + 8 : off + 20])
    elif kind in (DATA, DATA_FRAG):
        msg.submessages.append(_data(kind, flags, le, buf, off, end, source, declared))
    elif kind == HEARTBEAT:
        if off + 28 > end:
            raise ValueError("short HEARTBEAT")
        (count,) = struct.unpack_from(u32, buf, off + 24)
        msg.submessages.append(
            Heartbeat(
                source + bytes(buf[off + 4 : off + 8]),
                bytes(buf[off : off + 4]),
                _sn(buf, off + 8, le),
                _sn(buf, off + 16, le),
                count,
                bool(flags & HEARTBEAT_FINAL),
            )
        )
    elif kind == ACKNACK:
        base, missing, after = _set(buf, off + 8, end, le, 8)
        count = struct.unpack_from(u32, buf, after)[0] if after + 4 <= end else 0
        msg.submessages.append(
            AckNack(
                source + bytes(buf[off : off + 4]),
                msg.dest_prefix + bytes(buf[off + 4 : off + 8]),
                base,
                missing,
                count,
            )
        )
    elif kind == GAP:
        start = _sn(buf, off + 8, le)
        base, listed, _ = _set(buf, off + 16, end, le, 8)
        msg.submessages.append(
            Gap(source + bytes(buf[off + 4 : off + 8]), bytes(buf[off : off + 4]), start, base, listed)
        )
    elif kind == NACK_FRAG:
        sn = _sn(buf, off + 8, le)
        _, missing, after = _set(buf, off + 16, end, le, 4)
        count = struct.unpack_from(u32, buf, after)[0] if after + 4 <= end else 0
        msg.submessages.append(
            NackFrag(
                source + bytes(buf[off : off + 4]), msg.dest_prefix + bytes(buf[off + 4 : off + 8]), sn, missing, count
            )
        )
    elif kind == HEARTBEAT_FRAG:
        if off + 24 > end:
            raise ValueError("short HEARTBEAT_FRAG")
        last, count = struct.unpack_from("<II" if le else ">II", buf, off + 16)
        msg.submessages.append(
            HeartbeatFrag(
                source + bytes(buf[off + 4 : off + 8]), bytes(buf[off : off + 4]), _sn(buf, off + 8, le), last, count
            )
        )
    return source


def _data(kind: int, flags: int, le: bool, buf: bytes, off: int, end: int, source: bytes, declared: int) -> Data:
    if off + 20 > end:
        raise ValueError("short DATA header")
    (to_qos,) = struct.unpack_from("<H" if le else ">H", buf, off + 2)
    reader_id = bytes(buf[off + 4 : off + 8])
    writer_guid = source + bytes(buf[off + 8 : off + 12])
    sn = _sn(buf, off + 12, le)
    frag_start = frags = frag_size = sample_size = 0
    if kind == DATA_FRAG:
        if off + 32 > end:
            raise ValueError("short DATA_FRAG header")
        frag_start, frags, frag_size, sample_size = struct.unpack_from("<IHHI" if le else ">IHHI", buf, off + 20)
        if frag_start == 0:
            raise ValueError("fragment numbers start at 1")
        has_qos, key_only = bool(flags & FRAG_Q), bool(flags & FRAG_K)
    else:
        has_qos, key_only = bool(flags & DATA_Q), bool(flags & DATA_K)
    qos_at = off + 4 + to_qos
    if qos_at > end:
        raise ValueError("inline QoS past the submessage")
    qos: dict[int, bytes] = {}
    payload_at = qos_at
    if has_qos:
        qos, payload_at, _ = parse_parameters(buf, qos_at, end, le)
    payload = bytes(buf[payload_at:end])
    # The serialized payload is padded to 4 bytes; the encapsulation options' low 2 bits say by
    # how much (XTypes 7.6.3.1.2): the sample's own size leaves the padding out.
    padding = payload[3] & 0x3 if len(payload) >= 4 and frag_start <= 1 else 0
    if kind == DATA_FRAG:
        # The last fragment of a sample is shorter; the wire size of this submessage's fragments.
        first_byte = (frag_start - 1) * frag_size
        wire = max(0, min(frags * frag_size, sample_size - first_byte))
        return Data(
            writer_guid,
            reader_id,
            sn,
            qos,
            payload,
            wire,
            max(0, sample_size - padding),
            key_only,
            frag_start,
            frags,
            frag_size,
            le,
        )
    has_payload = bool(flags & (DATA_D | DATA_K))
    size = max(0, declared - payload_at) if has_payload else 0
    return Data(
        writer_guid,
        reader_id,
        sn,
        qos,
        payload if has_payload else b"",
        size,
        max(0, size - padding) if has_payload else 0,
        key_only,
        little_endian=le,
    )
