"""A Redis connection: commands one way, replies the other, each read by a FramedStream."""

from __future__ import annotations

from otel_ebpf.framing import FramedStream
from otel_ebpf.protocol import Direction, Message, Role, Session

from .resp import MAX_LINE, RespFramer


class RedisSession(Session):
    """Routes each direction to its stream; RESP needs no state shared between the two."""

    def __init__(self, role: Role) -> None:
        commands = Direction.INGRESS if role is Role.SERVER else Direction.EGRESS
        self._streams = {
            commands: FramedStream(RespFramer(commands, commands=True), MAX_LINE + 2),
            commands.reverse(): FramedStream(RespFramer(commands.reverse(), commands=False), MAX_LINE + 2),
        }

    @property
    def parse_errors(self) -> int:  # type: ignore[override]
        """Input skipped to the next message start: rejected, or its framing hidden by a gap."""
        return sum(stream.parse_errors + stream.lost for stream in self._streams.values())

    @property
    def buffered(self) -> int:  # type: ignore[override]
        return sum(stream.buffered for stream in self._streams.values())

    def feed(self, direction: Direction, data: bytes, timestamp_ns: int) -> list[Message]:
        return self._streams[direction].feed(data, timestamp_ns)

    def feed_gap(self, direction: Direction, length: int, timestamp_ns: int) -> list[Message]:
        return self._streams[direction].gap(length, timestamp_ns)

    def close(self, timestamp_ns: int) -> list[Message]:
        for stream in self._streams.values():
            stream.close()
        return []
