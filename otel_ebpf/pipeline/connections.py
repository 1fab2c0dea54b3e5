"""Connection tracking and protocol dispatch: connection events in, exchanges out.

Each tracked connection first runs the plugins' ``sniff`` over its bytes until one claims it; from
then on that plugin's session parses both directions and its stitcher pairs the messages. A
connection no plugin claims within a bounded amount of traffic is handed back to the kernel as
"ignore" so it stops copying its bytes. The table is an LRU with a hard cap; evictions are counted.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..protocol import (
    ConnectionInfo,
    Direction,
    Endpoint,
    Exchange,
    Protocol,
    RequestStart,
    Role,
    Session,
    SessionOutput,
    Stitcher,
    Transport,
)
from ..selfmetrics import SelfMetrics
from .events import ConnClose, ConnData, ConnKey, ConnOpen

log = logging.getLogger(__name__)

# How much undecided traffic a connection may show before it is declared unknown.
SNIFF_MAX_EVENTS = 16
SNIFF_MAX_BYTES = 64 * 1024
# Bytes of one direction sniffed at most (a plugin that needs more says NO): past the default
# capture cap, as an HTTP/1 request line of several KiB (a long URL) may be cut by the cap or span
# two reads, and still be told once its response claims the connection.
SNIFF_HEAD = 8192
# Changes of a connection's TCP retransmission count kept to place them in its exchanges.
RETRANSMISSION_MARKS = 8
TLS_RECORD_MAX = 2**14 + 2048  # a TLS record's length at most (RFC 8446, 5.2)


def tls_record_start(data: bytes) -> bool:
    """Whether ``data`` begins with a TLS record header: content type 20-23 (change_cipher_spec,
    alert, handshake, application_data), version 3.x (SSL 3.0 to TLS 1.3, whose records say 3.3)
    and a length a record may have."""
    return (
        len(data) >= 5
        and 20 <= data[0] <= 23
        and data[1] == 3
        and data[2] <= 4
        and int.from_bytes(data[3:5], "big") <= TLS_RECORD_MAX
    )


class Claim(NamedTuple):
    """The plugin that claimed a connection, in the role it found, with its session and stitcher."""

    protocol: Protocol
    role: Role
    session: Session
    stitcher: Stitcher


@dataclass
class Connection:
    key: ConnKey
    role: Role | None = None
    local: Endpoint | None = None
    peer: Endpoint | None = None
    transport: Transport = Transport.TCP
    protocol: Protocol | None = None
    session: Session | None = None
    stitcher: Stitcher | None = None
    unknown: bool = False
    tls: bool = False  # its bytes come as TLS plaintext
    isns: tuple[int, int] | None = None  # (client, server) initial sequence numbers, to join across hosts
    exchanges: int = 0
    # undecided traffic, kept until a plugin claims the connection
    pending: list[ConnData] = field(default_factory=list)
    pending_bytes: int = 0
    heads: dict[Direction, bytearray] = field(default_factory=dict)
    head_start: dict[Direction, int] = field(default_factory=dict)  # index into pending
    # cumulative counters already reported for this connection's session and stitcher
    reported_errors: int = 0
    reported_unmatched: int = 0
    reported_partial: int = 0
    # The socket's TCP retransmissions as its data events counted them (TCP health): the running
    # count, and (timestamp, count) at its last changes, with the count before the oldest kept.
    retransmissions: int = 0
    retransmission_marks: list[tuple[int, int]] = field(default_factory=list)
    retransmitted_before: int = 0
    # info() as last made, with what it was made of: made again only when that changed
    _info: tuple[tuple, ConnectionInfo] | None = field(default=None, repr=False, compare=False)

    def claimed(self) -> Claim:
        """What ``ConnectionTracker._claim`` set, all together; only for a claimed connection."""
        if self.protocol is None or self.role is None or self.session is None or self.stitcher is None:
            raise RuntimeError(f"connection {self.key} is not claimed by a protocol")
        return Claim(self.protocol, self.role, self.session, self.stitcher)

    def note_retransmissions(self, timestamp_ns: int, count: int) -> None:
        """The socket's running retransmission count changed, as of the syscall at ``timestamp_ns``."""
        self.retransmissions = count
        marks = self.retransmission_marks
        marks.append((timestamp_ns, count))
        if len(marks) > RETRANSMISSION_MARKS:
            self.retransmitted_before = marks.pop(0)[1]

    def retransmissions_between(self, start_ns: int, end_ns: int) -> int:
        """Segments the socket retransmitted between the syscalls at ``start_ns`` and ``end_ns``
        (an exchange's first and last): what its data events said at each."""

        def count_at(timestamp_ns: int) -> int:
            count = self.retransmitted_before
            for ts, n in self.retransmission_marks:
                if ts > timestamp_ns:
                    break
                count = n
            return count

        return count_at(end_ns) - count_at(start_ns)

    def info(self) -> ConnectionInfo:
        """What the exchanges of this connection are told about it: one object for as long as it
        holds (a UDP socket's peer changes with its datagrams), since they treat it as a value."""
        made = (self.role, self.local, self.peer, self.transport, self.tls, self.isns)
        cached = self._info
        if cached is not None and cached[0] == made:
            return cached[1]
        scheme = "https" if self.tls else "http"
        info = ConnectionInfo(self.role or Role.SERVER, self.local, self.peer, self.transport, scheme, self.isns)
        self._info = (made, info)
        return info

    def start_tls(self) -> None:
        """Plaintext from the SSL probes from now on: what the ciphertext before it looked like
        (a handshake seen before the library was hooked, judged "unknown") no longer counts."""
        self.tls = True
        self.unknown = False
        self.protocol = self.session = self.stitcher = None
        self.pending.clear()
        self.pending_bytes = 0
        self.heads.clear()
        self.head_start.clear()


# What a connection produced: a request that started, or an exchange that completed, with the
# thread whose syscall produced it (0 when none did: a close, a flush).
Outcome = tuple[Connection, RequestStart | Exchange, int]


def _on_this_host(peer: Endpoint | None) -> bool:
    return peer is None or _is_loopback(peer.address)


@functools.lru_cache(maxsize=1024)  # parsing an address costs ~2 µs, once per connection opened
def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


class ConnectionTracker:
    """Bounded table of connections; turns connection events into request starts and completed
    exchanges."""

    def __init__(
        self,
        protocols: Sequence[Protocol],
        selfmetrics: SelfMetrics,
        max_connections: int = 16384,
        on_unknown: Callable[[ConnKey], None] | None = None,
        on_ciphertext: Callable[[ConnKey], None] | None = None,
    ) -> None:
        self._protocols = list(protocols)
        self._metrics = selfmetrics
        self._max = max_connections
        self.on_unknown = on_unknown  # told which connections no plugin claimed
        self.on_ciphertext = on_ciphertext  # told which of those were TLS no SSL probe decrypted
        self._table: OrderedDict[ConnKey, Connection] = OrderedDict()
        self._reported_drops: dict[tuple[str, str], int] = {}  # (protocol, reason) -> reported
        self._failed: set[str] = set()  # protocols whose failure was logged

    def __len__(self) -> int:
        return len(self._table)

    # ---- events ----------------------------------------------------------------------------------

    def open(self, event: ConnOpen) -> None:
        """What the kernel knows of a connection. Generations make keys unique per connection, so
        a key already in the table is this connection, its data sorted ahead of its announcement
        (stamped alike; older recordings stamped the announcement later): fill in what it lacks."""
        if event.local is None or event.peer is None:
            self._metrics.add("otel_ebpf.connections.without_tuple")
        conn = self._table.get(event.key) or self._insert(event.key)
        conn.role = conn.role or event.role
        conn.local, conn.peer, conn.transport = conn.local or event.local, conn.peer or event.peer, event.transport
        # Only a connection between hosts needs joining by its ISNs: one on this host is joined
        # by trace assembly, and its spans need not carry two more attributes.
        if event.client_isn is not None and event.server_isn is not None and not _on_this_host(conn.peer):
            conn.isns = (event.client_isn, event.server_isn)

    def data(self, event: ConnData) -> list[Outcome]:
        key = event.key  # a property that builds the tuple
        conn = self._table.get(key)
        if conn is None:
            conn = self._insert(key)  # its open event was lost or predates a restart
        else:
            self._table.move_to_end(key)
            if event.after_loss:
                self._drop_partial(conn)
        not_captured = event.length - len(event.data) - len(event.tail)
        if not_captured > 0:
            self._metrics.add("otel_ebpf.payload.not_captured", not_captured)
        if event.tls != conn.tls:
            if not event.tls:
                return []  # ciphertext sent before the kernel knew the connection is TLS
            conn.start_tls()
            self._metrics.add("otel_ebpf.connections.tls")
        if conn.unknown:
            return []
        if event.retransmissions != conn.retransmissions:
            conn.note_retransmissions(event.timestamp_ns, event.retransmissions)
        if event.peer is not None:
            # A UDP socket is unconnected: the peer is the datagram's, and what the exchanges this
            # datagram completes describe (they are reported before the next datagram comes).
            conn.peer = event.peer
        try:
            return self._sniff(conn, event) if conn.session is None else self._feed(conn, event)
        except Exception as exc:  # noqa: BLE001 -- a plugin's bug or limit costs its connection, not the agent
            self._give_up(conn, exc)
            return []

    def close(self, event: ConnClose) -> list[Outcome]:
        conn = self._table.pop(event.key, None)
        if conn is not None and event.after_loss:
            self._drop_partial(conn)
        # requests still waiting on a socket that moved bytes through io_uring or splice, which no
        # syscall shows, may have had their responses there: counted, not reported as failed
        shed_waiting = "response_unseen" if event.unseen_io else None
        return self._finish(conn, event.timestamp_ns, closed=True, shed_waiting=shed_waiting, tls=event.tls)

    def close_process(self, pid: int, timestamp_ns: int) -> list[Outcome]:
        done: list[Outcome] = []
        for key in [k for k in self._table if k[0] == pid]:
            done += self._finish(self._table.pop(key), timestamp_ns, closed=True)
        return done

    def finish_held(self) -> list[Outcome]:
        """Agent stopping: the messages sessions hold only because the capture hid where they end
        (``Session.finish_held``), as they stand; connections stay open."""
        done: list[Outcome] = []
        for conn in [conn for conn in self._table.values() if conn.session is not None]:
            claim = conn.claimed()
            try:
                done += self._stitch(conn, claim.stitcher, claim.session.finish_held(), 0)
            except Exception as exc:  # noqa: BLE001 -- as in data()
                self._give_up(conn, exc)
        return done

    def flush_all(self, timestamp_ns: int) -> list[Outcome]:
        """Agent stopping: report what every connection still holds (connections stay open)."""
        done: list[Outcome] = []
        while self._table:
            _, conn = self._table.popitem(last=False)
            done += self._finish(conn, timestamp_ns, closed=False)
        return done

    # ---- internals -------------------------------------------------------------------------------

    def _insert(self, key: ConnKey) -> Connection:
        while len(self._table) >= self._max:
            _, evicted = self._table.popitem(last=False)
            self._metrics.add("otel_ebpf.connections.evicted")
            self._finish(evicted, 0, closed=False, shed_waiting="evicted")  # open: what it holds is lost
        conn = Connection(key)
        self._table[key] = conn
        self._metrics.add("otel_ebpf.connections.opened")
        self._metrics.set("otel_ebpf.connections.tracked", len(self._table))
        return conn

    def _sniff(self, conn: Connection, event: ConnData) -> list[Outcome]:
        conn.pending.append(event)
        conn.pending_bytes += len(event.data)
        head = conn.heads.setdefault(event.direction, bytearray())
        if not head:
            conn.head_start[event.direction] = len(conn.pending) - 1
        head += event.data[: SNIFF_HEAD - len(head)]
        matched, undecided = self._try_sniff(conn, event.direction, head)
        if matched is None and not undecided and conn.head_start[event.direction] < len(conn.pending) - 1:
            # The head began in an earlier syscall (garbage that looked like the start of a
            # message, e.g. the tail of a body seen mid-stream): this syscall may start one itself.
            head[:] = event.data[:SNIFF_HEAD]
            conn.head_start[event.direction] = len(conn.pending) - 1
            matched, undecided = self._try_sniff(conn, event.direction, head)
        if matched is not None:
            protocol, role = matched
            return self._claim(conn, protocol, role, self._claim_start(conn, protocol, event.direction))
        if not undecided or len(head) >= SNIFF_HEAD:
            head.clear()  # these bytes start no known message: try again from the next syscall
        if len(conn.pending) >= SNIFF_MAX_EVENTS or conn.pending_bytes >= SNIFF_MAX_BYTES:
            self._judge_ciphertext(conn)
            conn.unknown = True
            conn.pending.clear()
            conn.heads.clear()
            self._metrics.add("otel_ebpf.connections.unknown_protocol")
            if self.on_unknown is not None:
                self.on_unknown(conn.key)
        return []

    def _try_sniff(
        self, conn: Connection, direction: Direction, head: bytearray
    ) -> tuple[tuple[Protocol, Role | None] | None, bool]:
        """((protocol, role) of the first plugin that claims ``head``, or None; whether any needs more)."""
        undecided = False
        for protocol in self._protocols:
            if conn.transport not in protocol.transports:
                continue
            verdict = protocol.sniff(direction, bytes(head))
            if verdict.matched:
                return (protocol, verdict.role), undecided
            undecided |= verdict.need_more
        return None, undecided

    @staticmethod
    def _claim_start(conn: Connection, protocol: Protocol, direction: Direction) -> int:
        """Where the claimed connection's bytes begin: the head that matched, or an earlier one of
        the other direction that the same protocol could not yet decide on (a request whose line
        the capture cap cut, claimed by its response)."""
        start = conn.head_start[direction]
        for other, head in conn.heads.items():
            if other is not direction and head and protocol.sniff(other, bytes(head)).need_more:
                start = min(start, conn.head_start[other])
        return start

    def _claim(self, conn: Connection, protocol: Protocol, role: Role | None, start: int) -> list[Outcome]:
        conn.protocol = protocol
        conn.role = role or conn.role or Role.SERVER
        conn.session = protocol.new_process_session(conn.role, conn.key[0])
        conn.stitcher = protocol.new_stitcher(conn.role)
        replay, conn.pending = conn.pending[start:], []
        conn.heads.clear()
        done: list[Outcome] = []
        for event in replay:
            done += self._feed(conn, event)
        return done

    def _feed(self, conn: Connection, event: ConnData) -> list[Outcome]:
        claim = conn.claimed()  # once per event: the calls below use what it holds
        session, stitcher = claim.session, claim.stitcher
        done = self._stitch(conn, stitcher, session.feed(event.direction, event.data, event.timestamp_ns), event.tid)
        gap = event.length - len(event.data) - len(event.tail)
        if gap > 0:
            done += self._stitch(conn, stitcher, session.feed_gap(event.direction, gap, event.timestamp_ns), event.tid)
        if event.tail:
            done += self._stitch(
                conn, stitcher, session.feed(event.direction, event.tail, event.timestamp_ns), event.tid
            )
        self._account(conn, claim)
        return done

    @staticmethod
    def _stitch(conn: Connection, stitcher: Stitcher, outputs: Iterable[SessionOutput], tid: int) -> list[Outcome]:
        done: list[Outcome] = []
        for output in outputs:
            if isinstance(output, RequestStart):
                done.append((conn, output, tid))
            else:
                done += [(conn, exchange, tid) for exchange in stitcher.add(output)]
        return done

    def _finish(
        self,
        conn: Connection | None,
        timestamp_ns: int,
        closed: bool,
        shed_waiting: str | None = None,
        tls: bool = False,
    ) -> list[Outcome]:
        """What ``conn`` still holds: the messages its close ends (``closed``), then the exchanges
        still waiting, unanswered, or with ``shed_waiting`` those counted in ``spans.shed`` under
        that reason instead. ``tls``: the SSL probes knew the connection, so ciphertext and no
        plaintext means it closed after its handshake, not that its TLS library went unhooked."""
        if conn is None:
            return []
        self._metrics.set("otel_ebpf.connections.tracked", len(self._table))
        if conn.session is None:
            if closed and not tls:  # before any plugin claimed it
                self._judge_ciphertext(conn)
            return []
        claim = conn.claimed()
        try:
            done = self._stitch(conn, claim.stitcher, claim.session.close(timestamp_ns), 0) if closed else []
            waiting = list(claim.stitcher.flush(timestamp_ns))
        except Exception as exc:  # noqa: BLE001 -- as in data()
            self._give_up(conn, exc)
            return []
        if shed_waiting and waiting:
            self._metrics.add("otel_ebpf.spans.shed", len(waiting), {"reason": shed_waiting})
            waiting = []
        self._account(conn, claim)
        return done + [(conn, exchange, 0) for exchange in waiting]

    def _judge_ciphertext(self, conn: Connection) -> None:
        """A connection no plugin claimed, judged unknown or closed: when its bytes began with a
        TLS record and no plaintext came from the SSL probes, its TLS library is not hooked (or was
        hooked after the connection began, or it carried no application data). Counted and told,
        so that a user knows why a TLS service makes no spans."""
        if conn.tls or conn.transport is not Transport.TCP or not conn.pending:
            return
        if not tls_record_start(conn.pending[0].data):
            return
        self._metrics.add("otel_ebpf.connections.tls_ciphertext")
        if self.on_ciphertext is not None:
            self.on_ciphertext(conn.key)

    def _give_up(self, conn: Connection, exc: Exception) -> None:
        """A plugin raised on this connection's bytes. Only the connection pays: what its session
        held is lost and it is left alone like one no plugin claims (the kernel stops copying it);
        the failure is counted, and logged with its traceback once per protocol."""
        name = conn.protocol.name if conn.protocol is not None else "sniff"
        self._metrics.add("otel_ebpf.protocol.failures", 1, {"protocol": name})
        if name not in self._failed:
            self._failed.add(name)
            log.warning(
                "protocol %s raised on a connection of process %d; connection left alone (counted in "
                "otel_ebpf.protocol.failures, later failures not logged)",
                name,
                conn.key[0],
                exc_info=exc,
            )
        conn.unknown = True
        conn.session = conn.stitcher = None
        conn.pending.clear()
        conn.heads.clear()
        if self.on_unknown is not None:
            self.on_unknown(conn.key)

    def _drop_partial(self, conn: Connection) -> None:
        """The kernel lost events of this connection and counted the exchanges they belonged to as
        shed: what the session and stitcher hold of them is incomplete and goes unreported (a
        request whose response was lost is no failed request). The kernel resumes copying at the
        start of a message, where a new session picks up."""
        if conn.session is None:
            return
        self._account(conn)
        protocol, role = conn.claimed()[:2]
        conn.session = protocol.new_process_session(role, conn.key[0])
        conn.stitcher = protocol.new_stitcher(role)
        conn.reported_errors = conn.reported_unmatched = conn.reported_partial = 0

    def _account(self, conn: Connection, claim: Claim | None = None) -> None:
        """Report growth of the session's and stitcher's own error counters; ``claim``: the
        connection's, when the caller holds it."""
        if claim is None:
            if conn.session is None:
                return
            claim = conn.claimed()
        protocol, _, session, stitcher = claim
        drops = protocol.drops()
        if drops:
            self._account_protocol(protocol.name, drops)
        errors, unmatched = session.parse_errors, stitcher.unmatched
        if errors != conn.reported_errors:
            self._metrics.add("otel_ebpf.parse.errors", errors - conn.reported_errors, {"protocol": protocol.name})
            conn.reported_errors = errors
        partial = session.partial_messages
        if partial != conn.reported_partial:
            self._metrics.add(
                "otel_ebpf.messages.partial", partial - conn.reported_partial, {"protocol": protocol.name}
            )
            conn.reported_partial = partial
        if unmatched != conn.reported_unmatched:
            self._metrics.add(
                "otel_ebpf.messages.unmatched", unmatched - conn.reported_unmatched, {"protocol": protocol.name}
            )
            conn.reported_unmatched = unmatched

    def _account_protocol(self, protocol: str, drops: Mapping[str, int]) -> None:
        """Report growth of a plugin's shared-state drop counters (Protocol.drops)."""
        reported = self._reported_drops
        for reason, total in drops.items():
            before = reported.get((protocol, reason), 0)
            if total != before:
                self._metrics.add("otel_ebpf.protocol.drops", total - before, {"protocol": protocol, "reason": reason})
                reported[(protocol, reason)] = total
