"""An append-only file that only ever holds whole records, even on a full disk.

A buffered file object that hits ``ENOSPC`` keeps the unwritten rest in its buffer and writes it
later, glued to whatever comes next: a cut-off line followed by the next batch. Here a record is
written with unbuffered ``os.write`` calls until all of it is on the file, and a failure cuts the
file back to the end of the last whole record before the error is raised, so the file is always a
run of whole records and writing resumes cleanly once space returns. Used by the file exporters
(JSON Lines) and by the spool's segments.
"""

from __future__ import annotations

import os
from pathlib import Path


class AppendOnlyFile:
    """Whole-record appends to ``path`` (created if missing, appended to if present)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.size = os.fstat(self._fd).st_size  # end of the last whole record
        self._torn = False  # a failed cut-back left part of a record after ``size``

    @property
    def closed(self) -> bool:
        return self._fd is None

    def append(self, record: bytes) -> None:
        """Write all of ``record`` or nothing; raises ``OSError`` (the file then ends where it did)."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        if self._torn:  # O_APPEND writes at the end of the file: remove the torn part first
            os.ftruncate(self._fd, self.size)
            self._torn = False
        view = memoryview(record)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except OSError:
            if written:
                try:
                    os.ftruncate(self._fd, self.size)
                except OSError:
                    self._torn = True
            raise
        self.size += len(view)

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
