"""Give back the memory BCC's in-process compiler used once the BPF programs are loaded.

BCC compiles with clang/LLVM inside the agent: about 80 MB of libLLVM/libclang pages and 30 MB of
heap are touched once, at start-up, and never needed again. ``MADV_PAGEOUT`` (Linux 5.4+) drops
those file-backed pages from our resident set (they page back in if ever touched) and
``malloc_trim`` returns the freed heap, so the steady-state RSS reflects the agent's real work.
"""

from __future__ import annotations

import ctypes
import logging
import re

log = logging.getLogger(__name__)

MADV_PAGEOUT = 21
_COMPILER_LIBRARIES = re.compile(r"/lib(LLVM|clang)[^/]*\.so")


def release_compiler_memory(maps_path: str = "/proc/self/maps") -> int:
    """Page out the compiler's libraries and trim the heap; returns the bytes advised."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    advised = 0
    with open(maps_path) as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or not _COMPILER_LIBRARIES.search(fields[5]):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if libc.madvise(start, end - start, MADV_PAGEOUT) == 0:
                advised += end - start
            else:  # EINVAL before Linux 5.4: nothing to gain, nothing lost
                log.debug("madvise(MADV_PAGEOUT) failed for %s: errno %d", fields[5], ctypes.get_errno())
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
    return advised
