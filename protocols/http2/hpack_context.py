"""HPACK decoding for one direction of a connection, tolerant of a capture that began mid-stream.

A header block can only be decoded against the dynamic table its encoder built from every block
before it. When the capture missed some of those blocks (the agent attached to a live connection,
or a gap swallowed a HEADERS frame), the table is partly unknown. What is still safe to decode:

* static-table references and literals, always;
* dynamic entries inserted since the capture (re)started: HPACK inserts at the front, so the
  ``k``-th newest entry we saw is at index ``62 + k`` in the encoder's table too.

This holds whatever the real table size is: the encoder's table and ours are both newest-first
prefixes of the same sequence of insertions, so wherever both have an entry it is the same entry;
ours being shorter (we evicted early) only yields unknowns, ours being longer (we evicted late)
only keeps entries the encoder will never reference. So the table here honours every size update
up to :data:`MAX_TABLE_SIZE`, never raises for an out-of-range dynamic index, and answers such an
index with :data:`UNKNOWN` (name and value): a reference to an entry from before the capture is
reported as unknown, never resolved to a wrong header. An unknown entry that the block inserts
again (a literal whose *name* is an unknown reference) is inserted as unknown, so that the
positions of everything inserted after it stay aligned.

Decoding follows the wire from the connection's start when the preface was seen (``complete``);
then an out-of-range index is a protocol error, as for any decoder.
"""

from __future__ import annotations

from hpack import Decoder, HPACKError
from hpack.table import HeaderTable

from ..http_semconv import Headers

MAX_TABLE_SIZE = 64 * 1024  # dynamic table size honoured at most (RFC 7541 default: 4096)
MAX_HEADER_LIST = 64 * 1024  # decoded size of one header block (names + values + 32 per field)
MAX_CACHED_BLOCKS = 256

# The name and value of a dynamic entry the capture did not see; compared by identity, so no
# header on the wire, whatever its bytes, can be taken for it.
UNKNOWN = bytes(bytearray(b"\x00unknown"))
_UNKNOWN_ENTRY = (UNKNOWN, UNKNOWN)
_STATIC_ENTRIES = HeaderTable.STATIC_TABLE_LENGTH


class TolerantHeaderTable(HeaderTable):
    """A :class:`hpack.table.HeaderTable` whose missing dynamic entries are :data:`UNKNOWN`.

    ``version`` changes whenever the table does, so decoded blocks can be cached until then.
    """

    def __init__(self, complete: bool) -> None:
        super().__init__()
        self.complete = complete  # every insertion since the connection began was seen
        self.version = 0

    def get_by_index(self, index: int) -> tuple[bytes, bytes]:
        if index > _STATIC_ENTRIES and not self.complete:
            offset = index - _STATIC_ENTRIES - 1
            entries = self.dynamic_entries
            return entries[offset] if offset < len(entries) else _UNKNOWN_ENTRY
        return super().get_by_index(index)

    def add(self, name: bytes, value: bytes) -> None:
        super().add(name, value)
        self.version += 1

    # the base class's maxsize is a property; only its setter changes
    @HeaderTable.maxsize.setter  # type: ignore[attr-defined]
    def maxsize(self, newmax: int) -> None:
        HeaderTable.maxsize.fset(self, min(int(newmax), MAX_TABLE_SIZE))  # type: ignore[attr-defined]
        self.version += 1


class HpackContext:
    """The HPACK decoder of one direction: header blocks in, ``(name, value)`` fields out."""

    def __init__(self, complete: bool = False) -> None:
        self.decoder = Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.decoder.max_allowed_table_size = 2**32  # size updates are clamped by the table
        self.table = TolerantHeaderTable(complete)
        if not complete:
            self.table.maxsize = MAX_TABLE_SIZE  # unknown: the largest is the safe guess (see above)
        self.decoder.header_table = self.table
        # Blocks that left the table as it was, by their bytes: a steady connection sends the
        # same all-indexed blocks again and again (pure functions of the block and the table).
        self._cache: dict[bytes, tuple[Headers, int]] = {}
        self._cache_version = 0

    @property
    def complete(self) -> bool:
        return self.table.complete

    def decode(self, block: bytes) -> tuple[Headers, int] | None:
        """``(fields, unknown)``: the fields decoded in wire order (names lower-case, values
        Latin-1 like HTTP/1's) and how many fields the capture could not tell (left out).
        ``None`` when the block does not decode: the table is then reset to unknown."""
        table = self.table
        if table.version != self._cache_version:
            self._cache.clear()
            self._cache_version = table.version
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        try:
            raw = self.decoder.decode(block, raw=True)
        except (HPACKError, ValueError, IndexError):
            self.lose()
            return None
        fields = []
        unknown = 0
        for name, value in raw:
            if name is UNKNOWN or value is UNKNOWN:
                unknown += 1
            else:
                fields.append((name.decode("latin-1").lower(), value.decode("latin-1")))
        result = (tuple(fields), unknown)
        if table.version == self._cache_version and len(self._cache) < MAX_CACHED_BLOCKS:
            self._cache[block] = result
        return result

    def lose(self) -> None:
        """Insertions were missed (a block lost in a gap, or one that did not decode): from now
        on only entries inserted after this point are known."""
        table = self.table
        table.dynamic_entries.clear()
        table._current_size = 0  # noqa: SLF001 -- HeaderTable keeps no public way to empty itself
        table.complete = False
        table.maxsize = MAX_TABLE_SIZE  # size updates may have been lost too
