"""The generic profile model every profile source and exporter shares.

A profile is a set of *samples*, each a stack (leaf first) with one value per *sample type*
(``samples/count`` for CPU; ``bytes/bytes`` and ``launches/count`` for GPU allocations and kernel
launches, say), aggregated over an interval for one *resource* (one process: its service name and
process attributes). The *period type* names what one sample stands for (``cpu/nanoseconds`` with
``period`` = 1e9/frequency for CPU sampling) — Pyroscope names non-CPU profiles after it.

Sources feed a :class:`ProfileBuilder` (bounded: at most ``max_stacks`` distinct stacks per
interval; a sample past that is counted in ``dropped`` and lost) and call :meth:`~ProfileBuilder.take`
every interval; exporters (``otel_ebpf.profiles.otlp``, ``.pprof``, ``.pyroscope``, ``.folded``,
``.flamegraph``) take the resulting :class:`Profile` objects, whatever produced them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

Link = tuple[int, int]  # (trace id, span id)


class FrameKind(str, enum.Enum):
    PYTHON = "python"
    NATIVE = "native"
    KERNEL = "kernel"


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame. ``function`` is always set (``module+0xoffset`` when no symbol is known)."""

    function: str
    file: str = ""  # source file (Python frames)
    line: int = 0  # source line, 0 when unknown
    module: str = ""  # mapped file path (native), "[kernel.kallsyms]" (kernel)
    kind: FrameKind = FrameKind.NATIVE
    address: int = 0  # address in the module's own address space (native), 0 otherwise
    build_id: str = ""
    resolved: bool = True  # False: no symbol found (function is module+0xoffset)

    def label(self) -> str:
        """One-line name as flame graphs show it: ``func (file.py:12)`` or ``func``."""
        if self.kind is FrameKind.PYTHON and self.file:
            return f"{self.function} ({self.file}:{self.line})" if self.line else f"{self.function} ({self.file})"
        return self.function

    @property
    def in_program(self) -> bool:
        """A Python frame of the program itself, not of a library (torch, site-packages) or the
        standard library: the lines a user would change."""
        return self.kind is FrameKind.PYTHON and not any(part in self.file for part in _LIBRARY_PATHS)


_LIBRARY_PATHS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")

Stack = tuple[Frame, ...]  # leaf first


@dataclass(frozen=True, slots=True)
class ValueType:
    type: str
    unit: str


SAMPLES_COUNT = ValueType("samples", "count")
CPU_NANOSECONDS = ValueType("cpu", "nanoseconds")


@dataclass(frozen=True, slots=True)
class SampleKey:
    stack: Stack
    link: Link | None = None
    attributes: tuple[tuple[str, Any], ...] = ()  # sorted (key, value) pairs, e.g. thread.name


@dataclass
class Profile:
    """Aggregated samples of one resource over ``[start_ns, end_ns)``."""

    resource: Mapping[str, Any]
    sample_types: tuple[ValueType, ...]
    period_type: ValueType
    period: int
    start_ns: int
    end_ns: int
    samples: dict[SampleKey, list[int]] = field(default_factory=dict)
    timestamps: dict[SampleKey, list[int]] = field(default_factory=dict)  # optional, per sample key

    @property
    def service_name(self) -> str:
        return str(self.resource.get("service.name", "unknown_service"))

    def total(self, index: int = 0) -> int:
        return sum(values[index] for values in self.samples.values())


class ProfileBuilder:
    """Aggregates samples per resource; bounded, with every sample it could not keep counted."""

    def __init__(
        self,
        sample_types: Sequence[ValueType],
        period_type: ValueType,
        period: int,
        max_stacks: int = 10_000,
        max_timestamps: int = 0,
    ) -> None:
        if not sample_types:
            raise ValueError("a profile needs at least one sample type")
        self.sample_types = tuple(sample_types)
        self.period_type = period_type
        self.period = period
        self.max_stacks = max_stacks
        self.max_timestamps = max_timestamps  # per sample key; 0 keeps none
        self.dropped = 0  # samples lost to the max_stacks cap, since creation
        self._profiles: dict[tuple[tuple[str, Any], ...], Profile] = {}
        self._stacks = 0
        self._start_ns: int | None = None

    def add(
        self,
        resource: Mapping[str, Any],
        stack: Stack,
        values: Sequence[int],
        *,
        link: Link | None = None,
        attributes: Mapping[str, Any] | None = None,
        timestamp_ns: int | None = None,
    ) -> bool:
        """Add one sample (or pre-aggregated samples) for ``resource``. False when dropped."""
        if len(values) != len(self.sample_types):
            raise ValueError(f"expected {len(self.sample_types)} values, got {len(values)}")
        if self._start_ns is None and timestamp_ns is not None:
            self._start_ns = timestamp_ns
        rkey = tuple(sorted(resource.items()))
        profile = self._profiles.get(rkey)
        if profile is None:
            profile = self._profiles[rkey] = Profile(
                MappingProxyType(dict(resource)), self.sample_types, self.period_type, self.period, 0, 0
            )
        key = SampleKey(stack, link, tuple(sorted(attributes.items())) if attributes else ())
        known = profile.samples.get(key)
        if known is None:
            if self._stacks >= self.max_stacks:
                self.dropped += 1
                return False
            self._stacks += 1
            profile.samples[key] = list(values)
        else:
            for i, value in enumerate(values):
                known[i] += value
        if timestamp_ns is not None and self.max_timestamps:
            stamps = profile.timestamps.setdefault(key, [])
            if len(stamps) < self.max_timestamps:
                stamps.append(timestamp_ns)
        return True

    def __len__(self) -> int:
        return self._stacks

    def take_resource(self, resource: Mapping[str, Any], end_ns: int, label: Mapping[str, Any]) -> list[Profile]:
        """The profile of one resource aggregated since the last take, each sample given the
        ``label`` attributes (its process exited: it is wanted now, not at the end of the
        interval, and marked as the state at exit); the other resources go on."""
        profile = self._profiles.pop(tuple(sorted(resource.items())), None)
        if profile is None or not profile.samples:
            return []
        self._stacks -= len(profile.samples)
        profile.start_ns, profile.end_ns = self._start_ns or end_ns, end_ns
        relabel = {
            key: replace(key, attributes=tuple(sorted({**dict(key.attributes), **label}.items())))
            for key in profile.samples
        }
        profile.samples = {relabel[key]: values for key, values in profile.samples.items()}
        profile.timestamps = {relabel[key]: stamps for key, stamps in profile.timestamps.items()}
        return [profile]

    def take(self, end_ns: int, start_ns: int | None = None) -> list[Profile]:
        """The profiles aggregated since the last take (empty ones left out), and a fresh start."""
        start = start_ns if start_ns is not None else (self._start_ns or end_ns)
        profiles = [p for p in self._profiles.values() if p.samples]
        for profile in profiles:
            profile.start_ns, profile.end_ns = start, end_ns
        self._profiles = {}
        self._stacks = 0
        self._start_ns = None
        return profiles


def merge_profiles(profiles: Sequence[Profile]) -> list[Profile]:
    """Profiles of the same resource and types summed into one each (for files holding many intervals)."""
    merged: dict[tuple, Profile] = {}
    for profile in profiles:
        key = (tuple(sorted(profile.resource.items())), profile.sample_types, profile.period_type)
        into = merged.get(key)
        if into is None:
            merged[key] = into = Profile(
                profile.resource,
                profile.sample_types,
                profile.period_type,
                profile.period,
                profile.start_ns,
                profile.end_ns,
            )
        into.start_ns = min(into.start_ns, profile.start_ns) if into.start_ns else profile.start_ns
        into.end_ns = max(into.end_ns, profile.end_ns)
        for sample, values in profile.samples.items():
            known = into.samples.get(sample)
            if known is None:
                into.samples[sample] = list(values)
            else:
                for i, value in enumerate(values):
                    known[i] += value
    return list(merged.values())
