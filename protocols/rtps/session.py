"""A UDP socket's RTPS session, the node-wide state sessions share, and the fragment stitcher.

One datagram is one RTPS message. Per user-data DATA the session decides whether it is a new
sample (a PRODUCER or CONSUMER span), a copy of one already reported (Cyclone sends a sample once
per reader locator), or a retransmission a reader asked for (counted). DATA_FRAG pieces go to the
stitcher, which reports the sample when every fragment was seen, when the writer moved on, or when
the socket closes or the agent stops (the capture cap may hide some fragments).

Shared state (:class:`RTPSState`, owned by the protocol instance) holds what one socket cannot
know alone: discovery, the highest sequence number each writer sent and the ones readers asked
for, when each sample was sent (publish -> receive latency on the node), which samples each
process already received, and service calls waiting for their reply (the reply comes back on
another socket). Every table is bounded; evictions are counted.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from otel_ebpf.protocol import Direction, Message, RequestStart, Role, Session, SessionOutput, Stitcher

from .discovery import (
    SEDP_PUBLICATIONS_WRITER,
    SEDP_SUBSCRIPTIONS_WRITER,
    SPDP_WRITER,
    DiscoveryTable,
    Endpoint,
    is_builtin,
)
from .types import Call, Control, Sample
from .wire import UNKNOWN_PREFIX, AckNack, Data, Gap, NackFrag, parse_message

DISCOVERY_WRITERS = (SPDP_WRITER, SEDP_PUBLICATIONS_WRITER, SEDP_SUBSCRIPTIONS_WRITER)
REQUEST_HEADER = 16  # rmw_cyclonedds: client GUID (u64) and sequence number (i64)
MAX_NACKED = 1024  # sequence numbers remembered as requested, per writer
FRAGMENT_TIMEOUT_NS = 2 * 10**9  # a fragmented sample not completed by then is reported as seen
CALL_TIMEOUT_NS = 60 * 10**9
MAX_LATENCY_NS = 60 * 10**9  # an INFO_TS further off than this is a clock, not a latency


class _Bounded(OrderedDict):
    """An insertion-ordered table that drops its oldest entries past ``cap``, counting them."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.evicted = 0

    def put(self, key: Hashable, value: object) -> None:
        self[key] = value
        if len(self) > self.cap:
            self.popitem(last=False)
            self.evicted += 1


@dataclass(slots=True)
class _Writer:
    max_sn: int = -1
    nacked: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _PendingCall:
    start_ns: int
    request: Endpoint | None
    size: int


class RTPSState:
    """Node-wide state shared by every RTPS session (see the module docstring)."""

    def __init__(
        self, max_participants: int = 1024, max_endpoints: int = 16384, max_samples: int = 65536, max_calls: int = 4096
    ) -> None:
        self.discovery = DiscoveryTable(max_participants, max_endpoints)
        self.writers: _Bounded = _Bounded(max_endpoints)  # writer GUID -> _Writer (egress side)
        self.sent_at: _Bounded = _Bounded(max_samples)  # (writer GUID, sn) -> send time
        self.received: _Bounded = _Bounded(max_samples)  # (pid, writer GUID, sn) -> None
        self.calls: _Bounded = _Bounded(max_calls)  # (side, pid, client GUID, seq) -> _PendingCall
        self.participants: _Bounded = _Bounded(max_participants)  # pid -> its participant's prefix
        self.unanswered_calls = 0

    def writer(self, guid: bytes) -> _Writer:
        state = self.writers.get(guid)
        if state is None:
            state = _Writer()
            self.writers.put(guid, state)
        return state

    def expire_calls(self, now_ns: int) -> None:
        calls = self.calls
        while calls:
            oldest = next(iter(calls.values()))
            if now_ns - oldest.start_ns < CALL_TIMEOUT_NS:
                return
            calls.popitem(last=False)
            self.unanswered_calls += 1

    def drops(self) -> dict[str, int]:
        return {
            "discovery_evicted": self.discovery.evicted,
            "unknown_writer": self.discovery.unknown_writers,
            "samples_evicted": self.sent_at.evicted + self.received.evicted + self.writers.evicted,
            "calls_evicted": self.calls.evicted,
            "calls_unanswered": self.unanswered_calls,
        }


@dataclass(frozen=True, slots=True)
class Fragment(Message):
    """DATA_FRAG fragments of one sample seen in one datagram; ``first``: this datagram began
    the sample (its RequestStart came with it)."""

    direction: Direction
    start_ns: int
    end_ns: int
    writer_guid: bytes
    sn: int
    numbers: tuple[int, ...]  # fragment numbers carried
    sample_size: int
    fragment_size: int
    first: bool
    endpoint: Endpoint | None
    participant: bytes
    latency_ns: int | None


def _request_header(payload: bytes) -> tuple[int, int] | None:
    """(client GUID, sequence number) from the 16 bytes after the encapsulation header."""
    if len(payload) < 4 + REQUEST_HEADER:
        return None
    little = payload[1] & 1  # odd encapsulation ids are the little-endian ones
    return struct.unpack_from("<Qq" if little else ">Qq", payload, 4)


class RTPSSession(Session):
    """One UDP socket of process ``pid``: each feed is one datagram."""

    def __init__(self, state: RTPSState, pid: int) -> None:
        self.state = state
        self.pid = pid
        self.parse_errors = 0
        self.partial_messages = 0
        # fragmented samples this socket is carrying: (writer GUID, sn) -> None
        self._open: _Bounded = _Bounded(1024)

    def feed(self, direction: Direction, data: bytes, timestamp_ns: int) -> list[SessionOutput]:
        msg = parse_message(data)
        if msg is None:
            self.parse_errors += 1
            return []
        self.parse_errors += msg.malformed
        state, egress = self.state, direction is Direction.EGRESS
        if egress:
            state.participants.put(self.pid, msg.guid_prefix)
        local = msg.guid_prefix if egress else state.participants.get(self.pid, b"")
        out: list[SessionOutput] = []
        controls: dict[bytes, list[int]] = {}  # writer GUID -> [retransmissions, requested, lost]
        for sub in msg.submessages:
            if isinstance(sub, Data):
                entity = sub.writer_guid[12:]
                if is_builtin(entity):
                    if entity in DISCOVERY_WRITERS and not sub.fragment_start:
                        state.discovery.learn(entity, sub.writer_guid[:12], sub.payload, sub.inline_qos)
                    continue
                self._data(direction, sub, timestamp_ns, msg.timestamp_ns, local, out, controls)
            elif isinstance(sub, (AckNack, NackFrag)):
                writer = sub.writer_guid
                if writer[:12] == UNKNOWN_PREFIX and not egress and local:
                    writer = local + writer[12:]  # sent to us: our participant's writer
                if is_builtin(writer[12:]):
                    continue
                missing = sub.missing if isinstance(sub, AckNack) else (sub.sn,)
                if missing:
                    nacked = state.writer(writer).nacked
                    if len(nacked) < MAX_NACKED:
                        nacked.update(missing[: MAX_NACKED - len(nacked)])
                    controls.setdefault(writer, [0, 0, 0])[1] += len(missing)
            elif isinstance(sub, Gap) and not egress and not is_builtin(sub.writer_guid[12:]):
                if sub.lost:
                    controls.setdefault(sub.writer_guid, [0, 0, 0])[2] += sub.lost
        for writer, (retransmitted, requested, lost) in controls.items():
            out.append(
                Control(
                    direction,
                    timestamp_ns,
                    timestamp_ns,
                    state.discovery.endpoint(writer),
                    local,
                    retransmitted,
                    requested,
                    lost,
                )
            )
        state.expire_calls(timestamp_ns)
        return out

    def _data(
        self,
        direction: Direction,
        sub: Data,
        ts: int,
        source_ts: int | None,
        local: bytes,
        out: list[SessionOutput],
        controls: dict[bytes, list[int]],
    ) -> None:
        state, guid, sn = self.state, sub.writer_guid, sub.sn
        key = (guid, sn)
        fragment = sub.fragment_start > 0
        if fragment and key in self._open:  # a further piece of a sample this socket started
            out.append(self._fragment(direction, sub, ts, False, None, local, None))
            return
        latency = None
        if direction is Direction.EGRESS:
            writer = state.writer(guid)
            if sn <= writer.max_sn:  # a copy for another reader, or a resend
                if sn in writer.nacked:
                    writer.nacked.discard(sn)
                    controls.setdefault(guid, [0, 0, 0])[0] += 1
                return
            writer.max_sn = sn
            state.sent_at.put(key, ts)
        else:
            seen = (self.pid, guid, sn)
            if seen in state.received:
                return
            state.received.put(seen, None)
            sent = state.sent_at.get(key)
            if sent is not None and ts >= sent:
                latency = ts - sent
            elif source_ts is not None and 0 <= ts - source_ts <= MAX_LATENCY_NS:
                latency = ts - source_ts
        endpoint = state.discovery.writer(guid)
        if endpoint is None:
            self.partial_messages += 1  # reported without its topic: discovery was not seen
        elif endpoint.ros_kind in ("request", "reply") and not fragment:
            self._call(direction, endpoint, sub, ts, out)
            return
        out.append(RequestStart(direction, ts, message_id=("sample", guid, sn)))
        if fragment:
            self._open.put(key, None)
            out.append(self._fragment(direction, sub, ts, True, endpoint, local, latency))
            return
        out.append(Sample(direction, ts, ts, guid, sn, endpoint, sub.sample_size, 0, local, latency, sub.key_only))

    @staticmethod
    def _fragment(
        direction: Direction,
        sub: Data,
        ts: int,
        first: bool,
        endpoint: Endpoint | None,
        local: bytes,
        latency: int | None,
    ) -> Fragment:
        numbers = tuple(range(sub.fragment_start, sub.fragment_start + sub.fragments))
        return Fragment(
            direction,
            ts,
            ts,
            sub.writer_guid,
            sub.sn,
            numbers,
            sub.sample_size,
            sub.fragment_size,
            first,
            endpoint,
            local,
            latency,
        )

    def _call(self, direction: Direction, endpoint: Endpoint, sub: Data, ts: int, out: list[SessionOutput]) -> None:
        """A service request or reply: the 16-byte request header pairs them."""
        header = _request_header(sub.payload)
        if header is None:
            self.partial_messages += 1
            return
        client_guid, seq = header
        calls, egress = self.state.calls, direction is Direction.EGRESS
        if endpoint.ros_kind == "request":
            side = "client" if egress else "server"
            calls.put((side, self.pid, client_guid, seq), _PendingCall(ts, endpoint, sub.sample_size))
            out.append(RequestStart(direction, ts, message_id=("call", client_guid, seq)))
            return
        # A reply: the server sends it (its SERVER span ends), the client receives it (CLIENT). A
        # reply for a call this process did not make (another client of the service) is no one's.
        side = "server" if egress else "client"
        pending = calls.pop((side, self.pid, client_guid, seq), None)
        if pending is None:
            return
        request_direction = Direction.INGRESS if egress else Direction.EGRESS
        out.append(
            Call(
                request_direction,
                pending.start_ns,
                ts,
                client_guid,
                seq,
                pending.request,
                endpoint,
                pending.size,
                sub.sample_size,
            )
        )

    def feed_gap(self, direction: Direction, length: int, timestamp_ns: int) -> list[Message]:
        # The tail of a datagram past the capture cap: its submessages were parsed as far as they
        # were captured (a cut DATA keeps its header and declared size); nothing to resynchronise.
        return []

    def close(self, timestamp_ns: int) -> list[Message]:
        return []


@dataclass(slots=True)
class _Assembly:
    first: Fragment
    end_ns: int
    seen: set[int]
    total: int


class FragmentStitcher(Stitcher):
    """Samples and calls pass through; DATA_FRAG pieces become one sample each."""

    def __init__(self, max_open: int = 256) -> None:
        self.unmatched = 0
        self._max_open = max_open
        self._open: OrderedDict[tuple[bytes, int], _Assembly] = OrderedDict()

    def add(self, message: Message) -> list:
        # Any datagram on the socket moves time on: samples whose last fragments never came
        # (lost, or past the capture cap) are reported once they are FRAGMENT_TIMEOUT_NS old.
        done = self._expire(message.start_ns) if self._open else []
        if not isinstance(message, Fragment):
            return [*done, message]
        key = (message.writer_guid, message.sn)
        assembly = self._open.get(key)
        if assembly is None:
            if not message.first:
                return done  # a copy of a sample already reported
            size = max(1, message.fragment_size)
            assembly = _Assembly(message, message.end_ns, set(), max(1, -(-message.sample_size // size)))
            self._open[key] = assembly
            if len(self._open) > self._max_open:
                _, oldest = self._open.popitem(last=False)
                done.append(self._sample(oldest))
        elif message.first:  # same writer and number started again: the writer restarted
            return done
        assembly.seen.update(n for n in message.numbers if n <= assembly.total)
        assembly.end_ns = max(assembly.end_ns, message.end_ns)
        if len(assembly.seen) >= assembly.total:
            del self._open[key]
            done.append(self._sample(assembly))
        return done

    def _expire(self, now_ns: int) -> list:
        done = []
        while self._open:
            oldest = next(iter(self._open.values()))
            if now_ns - oldest.end_ns < FRAGMENT_TIMEOUT_NS:
                break
            self._open.popitem(last=False)
            done.append(self._sample(oldest))
        return done

    @staticmethod
    def _sample(assembly: _Assembly) -> Sample:
        f = assembly.first
        return Sample(
            f.direction,
            f.start_ns,
            assembly.end_ns,
            f.writer_guid,
            f.sn,
            f.endpoint,
            f.sample_size,
            assembly.total,
            f.participant,
            f.latency_ns,
        )

    def flush(self, timestamp_ns: int) -> list:
        """The socket is gone or the agent stops: report samples whose fragments were not all seen."""
        done = [self._sample(a) for a in self._open.values()]
        self._open.clear()
        return done
