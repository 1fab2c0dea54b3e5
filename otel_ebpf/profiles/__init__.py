"""Profiles: stack samples aggregated per resource, symbolized, exported as OTLP profiles, pprof
(Pyroscope), folded stacks and SVG flame graphs. See docs/profiling.md.

- :mod:`.model` — the generic model (frames, stacks, sample/period types, :class:`ProfileBuilder`),
- :mod:`.symbols` — native and kernel symbolization,
- :mod:`.cpython` — CPython detection, frame-walker offsets, code-object resolution,
- :mod:`.merge` — splicing Python frames into native stacks,
- :mod:`.otlp`, :mod:`.pprof`, :mod:`.pyroscope`, :mod:`.folded`, :mod:`.flamegraph` — outputs,
- :mod:`.exporter` — the profile sink the agent writes into.
"""

from otel_ebpf.profiles.model import (
    CPU_NANOSECONDS,
    SAMPLES_COUNT,
    Frame,
    FrameKind,
    Profile,
    ProfileBuilder,
    ValueType,
)

__all__ = ["CPU_NANOSECONDS", "SAMPLES_COUNT", "Frame", "FrameKind", "Profile", "ProfileBuilder", "ValueType"]
