"""Memoisation for the per-request work of protocol plugins.

A node sees the same start lines, header sections, paths and authorities again and again, so a
plugin may keep what it derived from them instead of deriving it for every request.
:func:`memoize` does that within fixed bounds, so that hostile or high-cardinality input costs
cache misses, never unbounded memory; :func:`memoize_attributes` does it for the attributes of
metric points, which the aggregator then recognises by identity.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from otel_ebpf.protocol import AttributeValue, SharedAttributes

_Key = TypeVar("_Key", str, bytes)
_Result = TypeVar("_Result")

CACHE_ENTRIES = 1024  # per memoised function; the least recently used entry goes first
CACHE_MAX_LEN = 256  # longer arguments (characters or bytes) are not cached


def memoize(function: Callable[[_Key], _Result]) -> Callable[[_Key], _Result]:
    """Memoise a pure function of one string or bytes argument, passed by position.

    At most ``CACHE_ENTRIES`` results are kept, the oldest first out, and only for arguments of
    at most ``CACHE_MAX_LEN`` characters or bytes. That bounds the memory a function may hold to
    what ``CACHE_ENTRIES`` such arguments parse to: about a megabyte, and under 10 MB for header
    sections made of the smallest possible fields. One argument only, so that the length bound
    covers the whole key. Results are shared between callers, so they must be immutable (strings,
    numbers, tuples of them, frozen dataclasses).

    A hit is one dictionary lookup inside the wrapper: ``functools.lru_cache`` behind a wrapper
    that checks the length costs three times as much, and these run several times per request.
    Oldest-first rather than least-recently-used: under a stream of distinct arguments a
    recurring one is computed again once per ``CACHE_ENTRIES`` misses, which costs one call.

    Entries stay in the agent's memory until evicted, header values (credentials included) among
    them; they never reach an exporter by this way.
    """
    if len(inspect.signature(function).parameters) != 1:
        raise TypeError(f"memoize: {function.__qualname__} must take exactly one argument")
    cache: dict[_Key, _Result] = {}

    @functools.wraps(function)
    def memoized(argument: _Key) -> _Result:
        try:
            return cache[argument]
        except KeyError:
            pass
        result = function(argument)
        if len(argument) <= CACHE_MAX_LEN:
            _keep(cache, argument, result)
        return result

    memoized.cache = cache  # type: ignore[attr-defined]  # for tests: what is kept
    return memoized


def memoize_attributes(
    function: Callable[..., dict[str, AttributeValue]],
) -> Callable[..., SharedAttributes]:
    """Memoise a function that builds metric attributes from hashable labels (a method, a status,
    a server): the same :class:`~otel_ebpf.protocol.SharedAttributes` for the same arguments,
    passed by position, which the aggregator keys its series by without sorting their items.

    At most ``CACHE_ENTRIES`` results are kept, the oldest first out. The arguments are labels of
    low cardinality, as metric attributes must be; where one comes from the wire (a client's
    ``Host``), the header limits of the parser bound its length.
    """
    cache: dict[tuple[Hashable, ...], SharedAttributes] = {}

    @functools.wraps(function)
    def memoized(*arguments: Hashable) -> SharedAttributes:
        try:
            return cache[arguments]
        except KeyError:
            pass
        result = SharedAttributes(function(*arguments))
        _keep(cache, arguments, result)
        return result

    return memoized


def _keep(cache: dict[Any, Any], key: Any, result: Any) -> None:
    """Put ``result`` under ``key``, the oldest entry out first when ``CACHE_ENTRIES`` are kept."""
    if len(cache) >= CACHE_ENTRIES:
        del cache[next(iter(cache))]
    cache[key] = result
