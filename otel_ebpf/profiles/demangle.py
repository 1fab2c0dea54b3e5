"""Readable C++ names for native frames, by the C++ runtime's own demangler.

Native frames from C++ libraries (PyTorch, NCCL, TensorRT) carry Itanium-ABI mangled names
(``_ZN2at6native…``). ``__cxa_demangle`` in ``libstdc++`` is the demangler GCC's ``c++filt`` and
every debugger use, so it follows each new ABI detail; it is loaded once through ``ctypes``. Where
the library is missing, names stay mangled (said once in the log) — a profile is never lost over it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Any

log = logging.getLogger(__name__)

MAX_NAMES = 1 << 16  # distinct symbols remembered


def _cxa_demangle() -> tuple[Any, Any] | None:
    """(``__cxa_demangle``, ``free``) as ctypes functions; None without a C++ runtime."""
    try:
        runtime = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(None)
    except OSError as exc:
        log.warning("no libstdc++ (%s): C++ frames keep their mangled names", exc)
        return None
    demangle = runtime["__cxa_demangle"]
    # char *__cxa_demangle(const char *mangled, char *buffer, size_t *length, int *status)
    demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    demangle.restype = ctypes.c_void_p  # malloc'd: read, then freed here
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    return demangle, libc.free


_RUNTIME = _cxa_demangle()


@functools.lru_cache(maxsize=MAX_NAMES)
def demangle(name: str) -> str:
    """``name`` demangled when it is a mangled C++ name (``_Z…``), else unchanged."""
    if not name.startswith("_Z") or _RUNTIME is None:
        return name
    demangle_function, free = _RUNTIME
    status = ctypes.c_int(0)
    result = demangle_function(name.encode(), None, None, ctypes.byref(status))
    if not result:
        return name  # status -2: not a valid mangled name (a C symbol that merely starts with _Z)
    try:
        return ctypes.string_at(result).decode(errors="replace")
    finally:
        free(result)
