"""Memoisation for the per-request work of protocol plugins.

A node sees the same start lines, header sections, paths and authorities again and again, so a
plugin may keep what it derived from them instead of deriving it for every request.
:func:`memoize` does that within fixed bounds, so that hostile or high-cardinality input costs
cache misses, never unbounded memory.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypeVar

_Key = TypeVar("_Key", str, bytes)
_Result = TypeVar("_Result")

CACHE_ENTRIES = 1024  # per memoised function; the least recently used entry goes first
CACHE_MAX_LEN = 256  # longer arguments (characters or bytes) are not cached


def memoize(function: Callable[[_Key], _Result]) -> Callable[[_Key], _Result]:
    """Memoise a pure function of one string or bytes argument.

    At most ``CACHE_ENTRIES`` results are kept, least recently used first out, and only for
    arguments of at most ``CACHE_MAX_LEN`` characters or bytes. That bounds the memory a function
    may hold to what ``CACHE_ENTRIES`` such arguments parse to: about a megabyte, and under 10 MB
    for header sections made of the smallest possible fields. One argument only, so that the
    length bound covers the whole key. Results are shared between callers, so they must be
    immutable (strings, numbers, tuples of them, frozen dataclasses).

    Entries stay in the agent's memory until evicted, header values (credentials included) among
    them; they never reach an exporter by this way.
    """
    if len(inspect.signature(function).parameters) != 1:
        raise TypeError(f"memoize: {function.__qualname__} must take exactly one argument")
    cached = functools.lru_cache(maxsize=CACHE_ENTRIES)(function)

    @functools.wraps(function)
    def memoized(*args: _Key, **kwargs: _Key) -> _Result:
        if kwargs or len(args[0]) > CACHE_MAX_LEN:  # a (rare) call by keyword, a long argument
            return function(*args, **kwargs)
        return cached(*args)

    memoized.cache_info = cached.cache_info  # type: ignore[attr-defined]
    memoized.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return memoized
