"""Which kernel a driver launch runs, and how many kernels a graph launch runs — learnt from the
calls that made the handles. Pure: a function of the decoded calls.

- :class:`KernelNames`: a driver launch (``cuLaunchKernel``, ``cuLaunchKernelEx``) names its kernel
  by an opaque ``CUfunction`` (or ``CUkernel``) handle. The handle came from
  ``cuModuleGetFunction`` or ``cuLibraryGetKernel``, which were given the kernel's name (the probe
  reads it), or from ``cuKernelGetFunction``, which turns a named ``CUkernel`` into a
  ``CUfunction``. Names are kept demangled.
- :class:`GraphKernels`: a graph's kernel nodes are counted as they are added
  (``cudaGraphAddKernelNode``, ``cuGraphAddKernelNode``) or captured (kernels launched on a stream
  between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` of that stream), and an
  instantiated graph (the graph exec a launch names) keeps the count its graph had then. A count
  is known only for a graph whose creation or capture was seen whole, and none of whose nodes
  hides kernels the agent cannot count (a child graph, a node added by the generic
  ``cudaGraphAddNode``). Kernels launched on another stream that joined a capture through an event
  are not seen as captured: such a graph's count is too low (docs/gpu.md says so).

Every table is bounded (least recently used goes first) and counts what it evicted: an evicted
handle is unknown, never wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Generic, TypeVar

from ..profiles.demangle import demangle

MAX_HANDLES = 65536  # per table: kernels a process loads, graphs it builds

Key = tuple[int, int]  # (pid, handle)
V = TypeVar("V")


class HandleTable(Generic[V]):
    """(pid, handle) -> value, least recently used evicted past ``capacity`` (counted)."""

    def __init__(self, capacity: int = MAX_HANDLES) -> None:
        self._items: OrderedDict[Key, V] = OrderedDict()
        self._capacity = capacity
        self.evicted = 0

    def put(self, key: Key, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)
            self.evicted += 1

    def get(self, key: Key) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def pop(self, key: Key) -> None:
        self._items.pop(key, None)

    def forget_processes(self, pids: Collection[int]) -> None:
        for key in [k for k in self._items if k[0] in pids]:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)


class KernelNames:
    """Kernel names by driver handle (``CUfunction`` or ``CUkernel``), demangled."""

    def __init__(self, capacity: int = MAX_HANDLES) -> None:
        self.table: HandleTable[str] = HandleTable(capacity)

    def named(self, pid: int, handle: int, name: str) -> None:
        """``handle`` is the kernel called ``name`` (as the program passed it: mangled or not)."""
        if handle and name:
            self.table.put((pid, handle), demangle(name))

    def same_kernel(self, pid: int, handle: int, kernel: int) -> None:
        """``handle`` (a ``CUfunction``) runs the kernel ``kernel`` (a ``CUkernel``) names."""
        name = self.table.get((pid, kernel))
        if handle and name is not None:
            self.table.put((pid, handle), name)

    def of(self, pid: int, handle: int) -> str | None:
        return self.table.get((pid, handle))


class GraphKernels:
    """Kernel nodes per graph while it is built, and per graph exec from its instantiation."""

    def __init__(self, capacity: int = MAX_HANDLES) -> None:
        self.graphs: HandleTable[int] = HandleTable(capacity)  # only graphs whose count is known
        self.execs: HandleTable[int] = HandleTable(capacity)
        self.captures: HandleTable[int] = HandleTable(capacity)  # (pid, stream) -> kernels captured

    def capture_began(self, pid: int, stream: int) -> None:
        self.captures.put((pid, stream), 0)

    def captured(self, pid: int, stream: int) -> bool:
        """A kernel launched on ``stream``: whether it went into a graph being captured."""
        count = self.captures.get((pid, stream))
        if count is None:
            return False
        self.captures.put((pid, stream), count + 1)
        return True

    def capture_ended(self, pid: int, stream: int, graph: int) -> None:
        """The capture on ``stream`` made ``graph`` (0: the capture failed, no graph)."""
        count = self.captures.get((pid, stream))
        self.captures.pop((pid, stream))
        if not graph:
            return
        if count is None:  # begun before the agent attached, or evicted
            self.graphs.pop((pid, graph))
        else:
            self.graphs.put((pid, graph), count)

    def created(self, pid: int, graph: int) -> None:
        self.graphs.put((pid, graph), 0)

    def kernel_added(self, pid: int, graph: int) -> None:
        count = self.graphs.get((pid, graph))
        if count is not None:
            self.graphs.put((pid, graph), count + 1)

    def opaque_added(self, pid: int, graph: int) -> None:
        """A node whose kernels are not counted: the graph's count is unknown from now on."""
        self.graphs.pop((pid, graph))

    def destroyed(self, pid: int, graph: int) -> None:
        self.graphs.pop((pid, graph))

    def instantiated(self, pid: int, graph: int, graph_exec: int) -> None:
        count = self.graphs.get((pid, graph))
        if count is None:
            self.execs.pop((pid, graph_exec))  # a reused handle must not keep an old count
        else:
            self.execs.put((pid, graph_exec), count)

    def exec_destroyed(self, pid: int, graph_exec: int) -> None:
        self.execs.pop((pid, graph_exec))

    def kernels_of(self, pid: int, graph_exec: int) -> int | None:
        """Kernel nodes of the graph ``graph_exec`` was instantiated from; None: unknown."""
        return self.execs.get((pid, graph_exec))

    def forget_processes(self, pids: Collection[int]) -> None:
        self.graphs.forget_processes(pids)
        self.execs.forget_processes(pids)
        self.captures.forget_processes(pids)
