"""CPU samples (from :mod:`otel_ebpf.probes.cpu`) -> merged, symbolized stacks -> :class:`ProfileBuilder`.

Raw stacks are aggregated *before* symbolization (a hot loop repeats the same few stacks), so each
distinct stack is symbolized once per interval and each address once per process (cached).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from otel_ebpf.profiles import cpython, merge
from otel_ebpf.profiles.cpython import CodeResolver, PythonProcess
from otel_ebpf.profiles.model import CPU_NANOSECONDS, SAMPLES_COUNT, Link, Profile, ProfileBuilder, Stack
from otel_ebpf.profiles.symbols import Symbolizer

MAX_RAW_STACKS = 65536  # raw stack -> merged stack cache, per interval

ResourceFor = Callable[[int], Mapping[str, Any]]
LinkFor = Callable[[int, int, int], "Link | None"]  # (pid, tid, event time)


class RawSampleLike(Protocol):
    """What the profiler reads of a sample (:class:`otel_ebpf.probes.cpu.RawSample`)."""

    # read-only: a frozen dataclass satisfies only read-only protocol members
    @property
    def timestamp_ns(self) -> int: ...

    @property
    def pid(self) -> int: ...

    @property
    def tid(self) -> int: ...

    @property
    def comm(self) -> str: ...

    @property
    def user(self) -> tuple[int, ...]: ...

    @property
    def kernel(self) -> tuple[int, ...]: ...

    @property
    def py_status(self) -> int: ...

    @property
    def py_frames(self) -> tuple[cpython.RawPyFrame, ...]: ...


Resolved = tuple[RawSampleLike, Stack, Mapping[str, Any]]  # sample, merged stack, resource


def cpu_builder(frequency_hz: int, max_stacks: int) -> ProfileBuilder:
    """The builder of CPU profiles: one ``samples/count`` value; period ``cpu/nanoseconds``."""
    return ProfileBuilder((SAMPLES_COUNT,), CPU_NANOSECONDS, 1_000_000_000 // frequency_hz, max_stacks)


class CpuProfiler:
    """Turns raw samples into profile samples: merge (kernel, native, Python), resource, span link."""

    def __init__(
        self,
        builder: ProfileBuilder,
        resource_for: ResourceFor,
        link_for: LinkFor | None = None,
        symbolizer: Symbolizer | None = None,
        resolver: CodeResolver | None = None,
    ) -> None:
        self.builder = builder
        self.resource_for = resource_for
        self.link_for = link_for
        self.symbolizer = symbolizer or Symbolizer()
        self.resolver = resolver or CodeResolver()
        # (pid, user, kernel, python frames) -> merged stack, for this interval
        self._stacks: dict[tuple, Stack] = {}
        self.samples = 0

    def add(self, samples: Iterable[RawSampleLike], python: Mapping[int, PythonProcess | None]) -> None:
        self.add_resolved(self.resolve(samples, python))

    def resolve(self, samples: Iterable[RawSampleLike], python: Mapping[int, PythonProcess | None]) -> list[Resolved]:
        """Each sample with its merged, symbolized stack and its process's resource. Done as samples
        arrive: code objects, maps and /proc are read from the live process, which may be gone a
        second later."""
        resolved = []
        for sample in samples:
            process = python.get(sample.pid)
            key = (sample.pid, sample.user, sample.kernel, sample.py_frames if process else ())
            stack = self._stacks.get(key)
            if stack is None:
                if len(self._stacks) >= MAX_RAW_STACKS:
                    self._stacks.clear()
                stack = self._stacks[key] = self.stack(sample, process)
            resolved.append((sample, stack, self.resource_for(sample.pid)))
        return resolved

    def add_resolved(self, resolved: Iterable[Resolved]) -> None:
        """Aggregate resolved samples, each linked to the span its thread was serving (``link_for``)."""
        for sample, stack, resource in resolved:
            self.samples += 1
            link = self.link_for(sample.pid, sample.tid, sample.timestamp_ns) if self.link_for else None
            self.builder.add(
                resource,
                stack,
                (1,),
                link=link,
                attributes={"thread.id": sample.tid},
                timestamp_ns=sample.timestamp_ns,
            )

    def stack(self, sample: RawSampleLike, process: PythonProcess | None) -> Stack:
        symbolizer = self.symbolizer
        kernel = [symbolizer.kernel_frame(address) for address in sample.kernel]
        # Return addresses point after the call: look up address - 1 (the call itself) except for
        # the leaf, which is the interrupted instruction.
        native = [
            symbolizer.user_frame(sample.pid, address if i == 0 else address - 1)
            for i, address in enumerate(sample.user)
        ]
        if process is None or not sample.py_frames:
            return merge.merge(kernel, native)
        python, entries = self.resolver.frames(process, sample.py_frames)
        return merge.merge(kernel, native, python, entries, process.binary)

    def take(self, end_ns: int) -> list[Profile]:
        """The interval's profiles; the stack cache starts over (bounded by one interval)."""
        self._stacks = {}
        return self.builder.take(end_ns)

    def forget(self, pid: int) -> None:
        self.symbolizer.forget(pid)
        self.resolver.forget(pid)
