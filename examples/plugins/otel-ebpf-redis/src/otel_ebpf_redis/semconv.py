"""Redis exchanges as OpenTelemetry database spans and metrics (semantic conventions for Redis,
which extend the database ones): ``db.system.name`` ``redis``, ``db.operation.name`` the
command, ``db.query.text`` the command with every argument replaced by ``?``, ``db.namespace``
the database index chosen by SELECT, ``db.response.status_code`` and ``error.type`` the error
prefix of an error reply."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

from otel_ebpf.protocol import (
    AttributeValue,
    ConnectionInfo,
    Exchange,
    InstrumentKind,
    InstrumentSpec,
    MetricPoint,
    Role,
    SpanDescription,
    SpanKind,
    StatusCode,
    put_socket_end,
)

from .resp import Command, Reply

DURATION = "db.client.operation.duration"
INSTRUMENTS = (
    InstrumentSpec(
        DURATION,
        InstrumentKind.HISTOGRAM,
        "s",
        "Duration of database client operations.",
        (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0),
    ),
)
# Commands whose first argument names the operation (CLIENT SETINFO, CONFIG GET): it is part of
# the operation name, not a value.
CONTAINERS = frozenset(
    {
        "ACL",
        "CLIENT",
        "CLUSTER",
        "COMMAND",
        "CONFIG",
        "FUNCTION",
        "LATENCY",
        "MEMORY",
        "MODULE",
        "OBJECT",
        "PUBSUB",
        "SCRIPT",
        "SLOWLOG",
        "XGROUP",
        "XINFO",
    }
)
MAX_NAME = 64


class QueryText(enum.Enum):
    """What ``db.query.text`` holds (plugin option ``query_text``)."""

    SANITIZED = "sanitized"  # the command, its arguments each replaced by ``?``
    OFF = "off"  # no db.query.text at all


_NAME = re.compile(r"[A-Z][A-Z0-9._|-]*")  # module commands have dots: FT.SEARCH, JSON.GET
_SUBCOMMAND = re.compile(r"[A-Z][A-Z0-9_-]*")


def operation_name(command: Command) -> str | None:
    """The command's name, with its subcommand for container commands; None when the name was
    not captured or is not a command name."""
    name = command.name
    if name is None or not _NAME.fullmatch(name):
        return None
    if name in CONTAINERS and command.arg_count > 1:
        sub = command.args[1] if len(command.args) > 1 else None
        if not isinstance(sub, bytes) or not _SUBCOMMAND.fullmatch(sub.decode("ascii", "replace").upper()):
            return None  # CLIENT alone would name a different operation
        name = f"{name} {sub.decode('ascii').upper()}"
    return name[:MAX_NAME]


class RedisExchange(Exchange):
    __slots__ = ("command", "namespace", "query_text", "reply")

    def __init__(self, command: Command, reply: Reply, namespace: str | None, query_text: QueryText) -> None:
        self.command = command
        self.reply = reply
        self.namespace = namespace  # the database index when this command was sent, if known
        self.query_text = query_text

    def _common(self, conn: ConnectionInfo) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {"db.system.name": "redis"}
        operation = operation_name(self.command)
        if operation is not None:
            attributes["db.operation.name"] = operation
        if self.namespace is not None:
            attributes["db.namespace"] = self.namespace
        put_socket_end(attributes, "server", conn.server)
        if self.reply.error is not None:
            attributes["db.response.status_code"] = self.reply.error
            attributes["error.type"] = self.reply.error
        return attributes

    def span(self, conn: ConnectionInfo) -> SpanDescription:
        attributes = self._common(conn)
        operation = attributes.get("db.operation.name")
        if self.query_text is QueryText.SANITIZED and operation is not None:
            words = 2 if " " in str(operation) else 1
            attributes["db.query.text"] = " ".join([str(operation), *["?"] * (self.command.arg_count - words)])
        put_socket_end(attributes, "network.peer", conn.peer)
        if conn.role is Role.SERVER:
            put_socket_end(attributes, "client", conn.client)
        failed = self.reply.error is not None
        return SpanDescription(
            name=str(operation) if operation is not None else "redis",
            kind=SpanKind.SERVER if conn.role is Role.SERVER else SpanKind.CLIENT,
            start_ns=self.command.start_ns,
            end_ns=self.reply.end_ns,
            attributes=attributes,
            status=StatusCode.ERROR if failed else StatusCode.UNSET,
        )

    def metric_points(self, conn: ConnectionInfo) -> Iterable[MetricPoint]:
        """``db.client.operation.duration`` for the client side; the conventions define no
        server-side database metric, so a server's commands give spans only."""
        if conn.role is not Role.CLIENT:
            return ()
        seconds = (self.reply.end_ns - self.command.start_ns) / 1e9
        return (MetricPoint(DURATION, seconds, self._common(conn)),)
