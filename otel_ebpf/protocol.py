"""The protocol plugin API.

A protocol plugin turns the bytes of one connection into *exchanges* (a request paired with its
response) that know how to describe themselves as a span and as metric points. Built-in protocols
(``otel_ebpf.protocols.*``) and third-party ones use this same API and register the same way: an
entry point in the ``otel_ebpf.protocols`` group whose object is a :class:`Protocol` instance.

Everything here is sans-I/O: a session is fed bytes with the timestamp of the syscall that moved them
and returns messages; it never touches sockets, BPF, clocks or globals, it resumes at any byte
boundary, and it never raises on hostile input (it reports it through :attr:`Session.parse_errors`).

The pipeline owns everything around a plugin: which connection the bytes came from, the addresses
of both ends, ids, resources and exporters. A plugin only sees ``(direction, bytes, timestamp)``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]
Attributes = Mapping[str, AttributeValue]


class Direction(enum.IntEnum):
    """Which way bytes moved, seen from the observed process."""

    EGRESS = 0  # written / sent by the observed process
    INGRESS = 1  # read / received by the observed process

    def reverse(self) -> Direction:
        return Direction.INGRESS if self is Direction.EGRESS else Direction.EGRESS


class Transport(enum.Enum):
    """A connection's ``network.transport``."""

    TCP = "tcp"
    UDP = "udp"
    UNIX = "unix"  # a unix domain stream socket


STREAMS = frozenset({Transport.TCP, Transport.UNIX})  # the byte streams: what a stream protocol runs on


class Role(enum.Enum):
    """The observed process's part in a connection."""

    CLIENT = "client"  # it sends requests (EGRESS requests, INGRESS responses)
    SERVER = "server"  # it serves requests (INGRESS requests, EGRESS responses)


class SpanKind(enum.Enum):
    """Mirrors ``opentelemetry.trace.SpanKind`` so plugins need not import the SDK."""

    SERVER = "server"
    CLIENT = "client"
    PRODUCER = "producer"
    CONSUMER = "consumer"
    INTERNAL = "internal"


class StatusCode(enum.Enum):
    UNSET = "unset"
    OK = "ok"
    ERROR = "error"


@dataclass(frozen=True)
class Sniff:
    """Result of :meth:`Protocol.sniff`.

    ``role`` is the observed process's role implied by the bytes (e.g. a request line arriving
    INGRESS means the process is a server); ``None`` when the bytes do not tell.
    """

    matched: bool
    need_more: bool = False
    role: Role | None = None


NO_MATCH = Sniff(matched=False)
NEED_MORE = Sniff(matched=False, need_more=True)


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection. An inet end has an IP address and a port. A unix socket's end has
    its path for address ("" when unnamed, "@name" when abstract), port 0, and a ``socket_id``:
    the socket's identity while it lives, which the other end's peer names (a path is shared by
    every connection accepted on it)."""

    address: str
    port: int
    socket_id: int = 0


# put_socket_end runs for every span: its usual keys are not formatted again each time
_END_KEYS = {prefix: (f"{prefix}.address", f"{prefix}.port") for prefix in ("network.peer", "client", "server")}


def put_socket_end(attributes: dict[str, AttributeValue], prefix: str, end: Endpoint | None) -> None:
    """``<prefix>.address`` and ``<prefix>.port`` (``network.peer``, ``client``, ``server``) of a
    connection's end, as far as it has them: an unnamed unix socket has neither, a named one its
    path and no port."""
    if end is not None:
        address_key, port_key = _END_KEYS.get(prefix) or (f"{prefix}.address", f"{prefix}.port")
        if end.address:
            attributes[address_key] = end.address
        if end.port:
            attributes[port_key] = end.port


# ConnectionInfo, MetricPoint, SpanDescription and RequestStart are made for every exchange: plain
# dataclasses with slots, which cost a fifth of a frozen one to construct. Treat them as values.
@dataclass(slots=True)
class ConnectionInfo:
    """What the pipeline knows about the connection an exchange travelled on.

    ``local`` is the observed process's end, ``peer`` the other end; either may be ``None`` when the
    agent could not learn the tuple (a socket that predates the agent and has left ``/proc``).
    ``scheme`` is ``"https"`` when the bytes were captured as TLS plaintext. ``isns``: the TCP
    handshake's initial sequence numbers (client's, server's) of a connection to another host,
    which its other end's agent sees alike.
    """

    role: Role
    local: Endpoint | None = None
    peer: Endpoint | None = None
    transport: Transport = Transport.TCP
    scheme: str = "http"
    isns: tuple[int, int] | None = None

    @property
    def server(self) -> Endpoint | None:
        return self.local if self.role is Role.SERVER else self.peer

    @property
    def client(self) -> Endpoint | None:
        return self.peer if self.role is Role.SERVER else self.local


class InstrumentKind(enum.Enum):
    HISTOGRAM = "histogram"
    COUNTER = "counter"
    UP_DOWN_COUNTER = "up_down_counter"
    GAUGE = "gauge"  # a reading (ProcessMetrics.observe): the last one is the value


@dataclass(frozen=True)
class InstrumentSpec:
    """A metric instrument a protocol records into; the pipeline creates it once per resource."""

    name: str
    kind: InstrumentKind
    unit: str
    description: str
    boundaries: tuple[float, ...] | None = None  # explicit histogram buckets


class SharedAttributes(dict[str, AttributeValue]):
    """Metric attributes made once for a combination of labels and carried by many points, never
    changed after: a plugin keeps one per combination it meets
    (:func:`otel_ebpf.protocols.caching.memoize_attributes`). The aggregator finds their series
    by the object itself, where other attributes have their items sorted into a key per point."""

    __slots__ = ()


@dataclass(slots=True)
class MetricPoint:
    instrument: str  # InstrumentSpec.name
    value: float
    attributes: Attributes = field(default_factory=dict)


@dataclass(slots=True)
class SpanDescription:
    """Everything about a span that the protocol decides; ids and resource come from the pipeline."""

    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: Attributes
    status: StatusCode = StatusCode.UNSET
    status_description: str | None = None


class Message(ABC):
    """One protocol message (a request or a response) parsed from one direction of a connection.

    ``start_ns`` is the timestamp of the syscall that carried its first byte, ``end_ns`` that of the
    syscall that carried its last byte.
    """

    __slots__ = ()  # lets ``@dataclass(slots=True)`` messages stay dict-free
    direction: Direction
    start_ns: int
    end_ns: int


Carrier = Sequence[tuple[str, str]]  # (lower-case name, value) pairs, as HTTP header fields


@dataclass(slots=True)
class RequestStart:
    """A request has begun: what names and routes it (an HTTP head, gRPC call metadata) is known,
    its body may still be on the way.

    A session returns it from ``feed``, before the request's :class:`Message` (which may come in
    the same call or much later). It lets the pipeline decide the request's trace context when the
    request starts, so that work the process does on its behalf (outgoing calls made while serving
    it) can become its children. ``start_ns`` must equal the ``start_ns`` of the span that the
    request's exchange will describe; that is how the two are matched. ``carrier`` holds the
    fields that may carry a propagated context (``traceparent``, ``tracestate``, ``b3``...);
    ``stream`` identifies the request among concurrent ones on a multiplexed connection (HTTP/2
    stream id; ``None`` where requests are answered in order). A plugin that never returns one
    still works: its exchanges get their context when they complete, without propagation.

    ``message_id`` (messaging protocols: RTPS's (writer GUID, sequence number)) names what travels
    on the wire, the same in the sending and the receiving process, and across the sockets of
    one process. Set, it replaces the rules for connections: an EGRESS start (PRODUCER, or a
    CLIENT request) takes its parent by thread causality and is remembered under the id; an
    INGRESS start (CONSUMER, SERVER) with the same id on the node becomes its child, and stays the
    context of its thread until the thread receives the next one (what a thread publishes while
    processing a received sample continues the trace). Its exchange names it back through
    :attr:`Exchange.message_start`, since it may complete on another socket.
    """

    direction: Direction
    start_ns: int
    carrier: Carrier = ()
    stream: int | None = None
    message_id: Hashable | None = None


SessionOutput = Message | RequestStart


class Exchange(ABC):
    """A request with its response (or what was seen of them): one span and its metric points.

    ``message_start``: (direction, message id) of the :class:`RequestStart` that began it, for an
    exchange announced by message id rather than by connection and start time. ``emits_span``
    False: the exchange stands for control traffic (RTPS HEARTBEAT/ACKNACK/GAP) and gives metric
    points only."""

    __slots__ = ()
    emits_span: bool = True

    @property
    def message_start(self) -> tuple[Direction, Hashable] | None:
        return None

    @abstractmethod
    def span(self, conn: ConnectionInfo) -> SpanDescription:
        """Describe this exchange as a span, given the connection it travelled on."""

    @abstractmethod
    def metric_points(self, conn: ConnectionInfo) -> Iterable[MetricPoint]:
        """Metric points for the instruments the protocol declared."""


class Session(ABC):
    """Parses both directions of one connection. Sans-I/O, never raises on bad input."""

    parse_errors: int = 0  # malformed input the session skipped past (exported as a self-metric)
    # messages reported with parts the capture could not tell, e.g. header fields compressed
    # against state from before the capture started (exported as a self-metric)
    partial_messages: int = 0
    # bytes held for unfinished messages; the replay tests (otel_ebpf.protocol_testing) check it
    # stays bounded
    buffered: int = 0

    @abstractmethod
    def feed(self, direction: Direction, data: bytes, timestamp_ns: int) -> Iterable[SessionOutput]:
        """Bytes that moved in ``direction`` in one syscall at ``timestamp_ns``: the messages they
        complete, each request optionally announced by a :class:`RequestStart` first."""

    @abstractmethod
    def feed_gap(self, direction: Direction, length: int, timestamp_ns: int) -> Iterable[SessionOutput]:
        """``length`` bytes moved in ``direction`` but were not captured (past the payload cap).

        Called right after the ``feed`` of the captured prefix of the same syscall. A session that
        is inside a body of known length just skips them; otherwise it must resynchronise.
        """

    @abstractmethod
    def close(self, timestamp_ns: int) -> Iterable[SessionOutput]:
        """The connection closed: finish messages delimited by close (read-until-close bodies)."""

    def finish_held(self) -> Iterable[SessionOutput]:
        """The agent is stopping and the connection stays open: the messages held only because
        the capture hid where they end (not those still arriving), as they stand. None by default."""
        return ()


class Stitcher(ABC):
    """Pairs the messages of one connection into exchanges (FIFO, stream id, ...)."""

    unmatched: int = 0  # messages dropped without a partner (exported as a self-metric)

    @abstractmethod
    def add(self, message: Message) -> Iterable[Exchange]:
        """Take one message; return the exchanges it completes."""

    @abstractmethod
    def flush(self, timestamp_ns: int) -> Iterable[Exchange]:
        """The connection is gone (or the agent stops): return what can still be reported (e.g.
        requests never answered, as exchanges with an error), and forget the rest. The pipeline
        calls it after adding the messages ``Session.close`` returned."""


class Protocol(ABC):
    """A protocol plugin.

    Subclasses are registered under the ``otel_ebpf.protocols`` entry point; the agent constructs
    each with the ``protocols.<name>`` section of its configuration. A constructor rejects an
    unknown or invalid option with ``ValueError("<option>: <problem>")``.
    """

    name: str  # short, stable, lowercase: "http1"
    transports: frozenset[Transport] = STREAMS
    instruments: Sequence[InstrumentSpec] = ()
    # Plugins sniff a connection in ascending order (then by name), unless ``protocols.enabled``
    # lists an order: a plugin whose sniff is more specific than another's (HTTP/2's upgrade
    # request is also an HTTP/1 request) goes first.
    sniff_order: int = 100

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        if options:
            raise ValueError(f"{next(iter(options))}: unknown option for protocol {self.name!r}")

    @abstractmethod
    def sniff(self, direction: Direction, data: bytes) -> Sniff:
        """Cheap check on the first bytes seen in one direction of a connection."""

    @abstractmethod
    def new_session(self, role: Role) -> Session:
        """A parser for both directions of one connection where the observed process has ``role``."""

    @abstractmethod
    def new_stitcher(self, role: Role) -> Stitcher:
        """A request/response pairer for one connection."""

    def new_process_session(self, role: Role, process: int) -> Session:
        """The session for one socket of process ``process`` (an opaque id: its pid). The
        pipeline calls this; the default is :meth:`new_session`. A plugin whose sessions share
        state across the sockets of one process overrides it (RTPS sends a request from one
        socket and gets the reply on another)."""
        return self.new_session(role)

    def drops(self) -> Mapping[str, int]:
        """Cumulative counts of what state shared by the plugin's sessions dropped or could not
        resolve, by reason (exported as ``otel_ebpf.protocol.drops``). Default: none."""
        return {}


ENTRY_POINT_GROUP = "otel_ebpf.protocols"


def load_protocols(
    enabled: Iterable[str] | None = None, options: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Protocol]:
    """Construct every registered protocol plugin (only those named in ``enabled`` when given).

    The plugins come in the order they sniff: ``enabled``'s, else by :attr:`Protocol.sniff_order`.
    ``options`` maps a plugin name to its options; plugins are registered under their name. Raises
    ``LookupError`` naming plugins that ``enabled`` asks for but are not installed, ``ImportError``
    for a plugin whose module fails to import, ``TypeError`` when an entry point is not a
    :class:`Protocol` subclass, and ``ValueError`` from a plugin that rejects its options.
    """
    found: dict[str, type[Protocol]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if enabled is not None and ep.name not in enabled:
            continue  # a plugin not asked for is not imported: a broken one cannot stop the agent
        try:
            cls = ep.load()
        except Exception as exc:  # whatever the plugin's import raises
            raise ImportError(f"protocol plugin {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Protocol)):
            raise TypeError(f"entry point {ep.name!r} ({ep.value}) is not an otel_ebpf Protocol")
        found[cls.name] = cls
    wanted = sorted(found, key=lambda name: (found[name].sniff_order, name)) if enabled is None else list(enabled)
    missing = [name for name in wanted if name not in found]
    if missing:
        raise LookupError(
            f"protocol plugin(s) not installed: {', '.join(missing)} (installed: {', '.join(sorted(found)) or 'none'})"
        )
    options = options or {}
    return [found[name](options.get(name)) for name in wanted]
