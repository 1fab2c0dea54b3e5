"""Discovery: what SPDP and SEDP announce, kept node-wide in one bounded table.

A writer's GUID names neither its topic nor its type; only the SEDP sample its participant sent
(usually from another socket, and to every other participant on the node) does. The table
therefore belongs to the :class:`~otel_ebpf.protocols.rtps.RTPS` protocol instance and every
session holds a reference to it: whatever socket of whatever process on the node carried the
announcement, every session can name the writer afterwards. It is bounded (LRU per kind); what
it evicts, and samples whose writer it does not know, are counted.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

from .wire import parse_parameters

# Built-in writers (DDSI-RTPS 9.3.1.3)
SPDP_WRITER = bytes.fromhex("000100c2")
SEDP_PUBLICATIONS_WRITER = bytes.fromhex("000003c2")
SEDP_SUBSCRIPTIONS_WRITER = bytes.fromhex("000004c2")
BUILTIN_KIND = 0xC0  # entity kinds with these bits set are built-in

PID_TOPIC_NAME = 0x0005
PID_TYPE_NAME = 0x0007
PID_PARTICIPANT_GUID = 0x0050
PID_ENDPOINT_GUID = 0x005A
PID_ENTITY_NAME = 0x0062
PID_KEY_HASH = 0x0070
PID_STATUS_INFO = 0x0071

ENCAPSULATIONS = {
    0x0000: ("CDR", False),
    0x0001: ("CDR", True),
    0x0002: ("PL_CDR", False),
    0x0003: ("PL_CDR", True),
    0x0006: ("CDR2", False),
    0x0007: ("CDR2", True),
    0x0008: ("D_CDR2", False),
    0x0009: ("D_CDR2", True),
    0x000A: ("PL_CDR2", False),
    0x000B: ("PL_CDR2", True),
}


def is_builtin(entity_id: bytes) -> bool:
    return len(entity_id) == 4 and entity_id[3] & BUILTIN_KIND == BUILTIN_KIND


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A writer or reader SEDP announced, with its ROS 2 reading."""

    guid: bytes
    topic: str  # the DDS topic name: "rt/chatter"
    type_name: str  # "std_msgs::msg::dds_::String_"
    participant: bytes  # participant GUID prefix
    writer: bool
    ros_name: str | None = None  # "/chatter", or the service name "/add_two_ints"
    ros_kind: str | None = None  # "topic", "request", "reply" (None: not a ROS 2 name)
    ros_type: str | None = None  # "std_msgs/msg/String"


@dataclass(frozen=True, slots=True)
class Participant:
    prefix: bytes
    name: str | None  # PID_ENTITY_NAME, when the participant sent one
    vendor: bytes


_ROS_PREFIXES = {"rt/": "topic", "rq/": "request", "rr/": "reply"}


def ros_names(topic: str, type_name: str) -> tuple[str | None, str | None, str | None]:
    """(ROS 2 name, kind, ROS 2 type) of a DDS topic, or Nones when it is no ROS 2 topic.

    ``rt/chatter`` is topic ``/chatter``; ``rq/add_two_intsRequest`` and ``rr/add_two_intsReply``
    are service ``/add_two_ints``; ``std_msgs::msg::dds_::String_`` is ``std_msgs/msg/String``."""
    kind = _ROS_PREFIXES.get(topic[:3])
    if kind is None:
        return None, None, None
    name = "/" + topic[3:]
    if kind == "request":
        name = name.removesuffix("Request")
    elif kind == "reply":
        name = name.removesuffix("Reply")
    parts = type_name.split("::")
    ros_type = None
    if len(parts) == 4 and parts[2] == "dds_":
        base = parts[3].removesuffix("_")
        if kind in ("request", "reply"):
            base = base.removesuffix("_Request").removesuffix("_Response")
        ros_type = f"{parts[0]}/{parts[1]}/{base}"
    return name, kind, ros_type


def _string(value: bytes, le: bool) -> str | None:
    if len(value) < 4:
        return None
    (n,) = struct.unpack_from("<I" if le else ">I", value)
    if n == 0 or n > len(value) - 4:
        return None
    return value[4 : 4 + n].split(b"\0", 1)[0].decode("utf-8", errors="replace")


def parameter_list_payload(payload: bytes) -> tuple[dict[int, bytes], bool] | None:
    """The parameter list of a PL_CDR serialized payload (SPDP/SEDP samples), or None."""
    if len(payload) < 4:
        return None
    encapsulation = ENCAPSULATIONS.get(int.from_bytes(payload[:2], "big"))
    if encapsulation is None or not encapsulation[0].startswith("PL_CDR"):
        return None
    le = encapsulation[1]
    params, _, _ = parse_parameters(payload, 4, len(payload), le)
    return params, le


class DiscoveryTable:
    """Node-wide, bounded: participants and endpoints by GUID (LRU), unknown writers counted."""

    def __init__(self, max_participants: int = 1024, max_endpoints: int = 16384) -> None:
        self.max_participants = max_participants
        self.max_endpoints = max_endpoints
        self.participants: OrderedDict[bytes, Participant] = OrderedDict()
        self.endpoints: OrderedDict[bytes, Endpoint] = OrderedDict()
        # cumulative counters, reported by the protocol as self-metrics
        self.evicted = 0
        self.unknown_writers = 0

    def endpoint(self, guid: bytes) -> Endpoint | None:
        found = self.endpoints.get(guid)
        if found is not None:
            self.endpoints.move_to_end(guid)
        return found

    def writer(self, guid: bytes) -> Endpoint | None:
        """The writer ``guid`` names, counting an unknown one."""
        found = self.endpoint(guid)
        if found is None:
            self.unknown_writers += 1
        return found

    def learn(self, writer_id: bytes, source_prefix: bytes, payload: bytes, inline_qos: dict[int, bytes]) -> bool:
        """Take one sample of a built-in discovery writer; True when it taught something."""
        parsed = parameter_list_payload(payload)
        if parsed is None:
            return False
        params, le = parsed
        if writer_id == SPDP_WRITER:
            guid = params.get(PID_PARTICIPANT_GUID)
            prefix = guid[:12] if guid and len(guid) == 16 else source_prefix
            name = _string(params[PID_ENTITY_NAME], le) if PID_ENTITY_NAME in params else None
            self._put(self.participants, prefix, Participant(prefix, name, b""), self.max_participants)
            return True
        guid = params.get(PID_ENDPOINT_GUID)
        if guid is None or len(guid) != 16:
            key = inline_qos.get(PID_KEY_HASH)
            guid = key if key and len(key) == 16 else None
        if guid is None:
            return False
        topic = _string(params.get(PID_TOPIC_NAME, b""), le)
        type_name = _string(params.get(PID_TYPE_NAME, b""), le)
        if topic is None or type_name is None:
            return False  # a dispose/unregister carries the key only: keep what we knew
        participant = params.get(PID_PARTICIPANT_GUID)
        prefix = participant[:12] if participant and len(participant) == 16 else guid[:12]
        name, kind, ros_type = ros_names(topic, type_name)
        writer = writer_id == SEDP_PUBLICATIONS_WRITER
        self._put(
            self.endpoints,
            guid,
            Endpoint(guid, topic, type_name, prefix, writer, name, kind, ros_type),
            self.max_endpoints,
        )
        return True

    def _put(self, table: OrderedDict, key: bytes, value: object, cap: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > cap:
            table.popitem(last=False)
            self.evicted += 1
