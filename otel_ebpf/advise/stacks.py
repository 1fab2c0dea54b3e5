"""Profiles summed by process and stack, and stacks shown the way a finding quotes them."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.profiles.model import Frame, FrameKind, Profile, SampleKey, Stack

from .evidence import Attributes, process_key

ProcessKey = tuple[str, int]
TOP_FRAMES = 8  # frames a finding quotes, leaf first


@dataclass
class StackTotals:
    """One process's samples of one or more profiles, summed per stack."""

    resource: Attributes
    by_stack: dict[Stack, int] = field(default_factory=lambda: defaultdict(int))
    attributes: dict[Stack, dict[str, Any]] = field(default_factory=dict)  # the sample attributes seen

    @property
    def total(self) -> int:
        return sum(self.by_stack.values())

    def top(self) -> list[tuple[Stack, int]]:
        """Stacks by value, largest first (ties by their text, so the order is always the same)."""
        return sorted(self.by_stack.items(), key=lambda item: (-item[1], stack_text(item[0])))


def totals_by_process(
    profiles: Iterable[Profile], keep: Callable[[SampleKey], bool] = lambda _: True
) -> dict[ProcessKey, StackTotals]:
    """Every kept sample's first value, summed per process and stack over all the profiles (a
    process none of whose samples are kept is left out)."""
    out: dict[ProcessKey, StackTotals] = {}
    for profile in profiles:
        for key, values in profile.samples.items():
            if keep(key):
                totals = out.setdefault(process_key(profile.resource), StackTotals(profile.resource))
                totals.by_stack[key.stack] += values[0]
                totals.attributes.setdefault(key.stack, {}).update(key.attributes)
    return out


def sample_attribute(name: str, value: Any) -> Callable[[SampleKey], bool]:
    """A ``keep`` for :func:`totals_by_process`: samples whose attribute ``name`` is ``value``."""
    return lambda key: dict(key.attributes).get(name) == value


def observed_window_s(profiles: Iterable[Profile]) -> dict[ProcessKey, float]:
    """Per process, the seconds its profiles span (first start to last end)."""
    spans: dict[ProcessKey, tuple[int, int]] = {}
    for p in profiles:
        if p.end_ns <= p.start_ns:
            continue
        key = process_key(p.resource)
        start, end = spans.get(key, (p.start_ns, p.end_ns))
        spans[key] = (min(start, p.start_ns), max(end, p.end_ns))
    return {key: (end - start) / 1e9 for key, (start, end) in spans.items()}


def stack_text(stack: Stack) -> str:
    return " <- ".join(frame.label() for frame in stack)


def top_frames(stack: Stack, limit: int = TOP_FRAMES) -> tuple[str, ...]:
    """The leaf-most ``limit`` frames' labels, leaf first."""
    return tuple(frame.label() for frame in stack[:limit])


def program_frames(stack: Stack) -> list[Frame]:
    """The Python frames of the program itself (not a library's, not the standard library's), leaf
    first: the lines a user would change."""
    return [f for f in stack if f.in_program and f.file and f.line]


def where(stack: Stack) -> str:
    """Who made the call, for a title: the program's innermost Python frame, else the leaf."""
    frames = program_frames(stack)
    if frames:
        return frames[0].label()
    return stack[0].label() if stack else "an unknown stack"


# "  at label module" lines of a leak report's ``code.stacktrace`` (otel_ebpf.gpu.views.format_stack)
_STACKTRACE_LINE = re.compile(r"^\s*at (?P<label>.+?)(?: (?P<module>/\S+))?$")
_PYTHON_LABEL = re.compile(r"^(?P<function>.+) \((?P<file>.+?):(?P<line>\d+)\)$")


def parse_stacktrace(text: str) -> Stack:
    """A leak report's ``code.stacktrace`` back into frames (Python frames keep file and line)."""
    frames = []
    for line in text.splitlines():
        match = _STACKTRACE_LINE.match(line)
        if match is None:
            continue
        label, module = match["label"], match["module"] or ""
        python = _PYTHON_LABEL.match(label) if not module else None
        if python is not None:
            frames.append(
                Frame(python["function"], file=python["file"], line=int(python["line"]), kind=FrameKind.PYTHON)
            )
        else:
            frames.append(Frame(label, module=module))
    return tuple(frames)
