"""Splice Python frames into native stacks.

Inputs, all leaf first: kernel frames, native user frames (frame-pointer unwound by the kernel,
symbolized), and the Python frames the BPF walker read, each marked when it is the first frame of
one ``_PyEval_EvalFrameDefault`` call (3.11+ run several Python frames per C-level call).

Two cases:

- **The native stack is whole** — it reaches a thread root (``_start``, ``__libc_start_main``,
  ``clone``/``start_thread``) — and holds exactly one ``_PyEval_EvalFrameDefault`` per group of
  Python frames: each of those frames is replaced by its group, so C → Python → C → Python
  interleavings come out in their true order.
- **Otherwise** (the interpreter was built without frame pointers, as this machine's pyenv and
  Debian Pythons are, so the kernel's unwind stops or goes astray inside libpython): keep the native
  frames from the leaf up to the first one that is in the interpreter's own ELF, lies outside every
  mapped file, or is an eval frame — those were unwound from registers and real frame pointers and are trustworthy
  — and put every Python frame above them. The result can miss C frames between Python frames, but
  it never puts a frame on the wrong side of another.
"""

from __future__ import annotations

from collections.abc import Sequence

from otel_ebpf.profiles.model import Frame, Stack

EVAL_FUNCTIONS = frozenset({"_PyEval_EvalFrameDefault"})
THREAD_ROOTS = frozenset(
    {"_start", "__libc_start_main", "__libc_start_call_main", "clone", "clone3", "start_thread", "__clone", "__clone3"}
)


def python_groups(frames: Sequence[Frame], entries: Sequence[bool]) -> list[list[Frame]]:
    """Python frames (leaf first) cut into one group per ``_PyEval_EvalFrameDefault`` call."""
    groups: list[list[Frame]] = []
    current: list[Frame] = []
    for frame, entry in zip(frames, entries):
        current.append(frame)
        if entry:
            groups.append(current)
            current = []
    if current:
        if groups:
            groups[-1].extend(current)  # root frames without the mark belong to the last call
        else:
            groups.append(current)
    return groups


def merge(
    kernel: Sequence[Frame],
    native: Sequence[Frame],
    python: Sequence[Frame] = (),
    entries: Sequence[bool] = (),
    interpreter: str = "",
) -> Stack:
    """One stack, leaf first: kernel frames, then native and Python frames spliced (see module doc).

    ``interpreter`` is the path of the ELF that runs the eval loop (libpython or the executable)."""
    if not python:
        return (*kernel, *native)
    evals = [i for i, frame in enumerate(native) if frame.function in EVAL_FUNCTIONS]
    groups = python_groups(python, entries or [False] * len(python))
    whole = bool(native) and native[-1].function in THREAD_ROOTS and all(f.resolved for f in native)
    if whole and evals and len(evals) == len(groups):
        out: list[Frame] = list(kernel)
        group = iter(groups)
        for frame in native:
            if frame.function in EVAL_FUNCTIONS:
                out.extend(next(group))
            else:
                out.append(frame)
        return tuple(out)
    trusted: list[Frame] = []
    for frame in native:
        # A frame outside every file mapping is an unwinding error; one in a file without a symbol
        # for it (libz's static functions) is real code, named module+0xoffset.
        if not frame.module or frame.function in EVAL_FUNCTIONS or (interpreter and frame.module == interpreter):
            break
        trusted.append(frame)
    return (*kernel, *trusted, *python)
