"""gRPC's length-prefixed messages in one direction of a stream, counted across DATA frames and gaps."""

from __future__ import annotations

PREFIX_SIZE = 5  # 1-byte compressed flag, 4-byte big-endian length


class MessageCounter:
    """Counts the messages one side of a gRPC call sent, as the DATA payload goes by.

    A message's 5-byte prefix may straddle DATA frames (and syscalls); its body may be partly
    uncaptured (:meth:`skip`), which is fine while the skipped bytes stay inside it. Once a gap
    hides where the next message starts, the count is no longer known (``lost``).
    """

    __slots__ = ("count", "compressed", "lost", "_remaining", "_prefix")

    def __init__(self) -> None:
        self.count = 0
        self.compressed = 0  # messages whose compressed flag was set
        self.lost = False
        self._remaining = 0  # body bytes of the current message still to come
        self._prefix = b""  # a prefix cut by the end of a DATA frame

    def feed(self, data: bytes) -> None:
        if self.lost:
            return
        pos, end = 0, len(data)
        while pos < end:
            if self._remaining:
                take = min(self._remaining, end - pos)
                self._remaining -= take
                pos += take
                continue
            prefix = self._prefix + data[pos : pos + PREFIX_SIZE - len(self._prefix)]
            pos += PREFIX_SIZE - len(self._prefix)
            if len(prefix) < PREFIX_SIZE:
                self._prefix = prefix
                return
            self._prefix = b""
            self.count += 1
            self.compressed += prefix[0] & 1
            self._remaining = int.from_bytes(prefix[1:], "big")

    def skip(self, length: int | None) -> None:
        """``length`` payload bytes went uncaptured (``None``: an unknown number)."""
        if length is None or self._prefix or length > self._remaining:
            self.lost = True
        else:
            self._remaining -= length

    @property
    def known_count(self) -> int | None:
        return None if self.lost else self.count
