"""Device memory: allocations paired with their frees, in-use bytes, and leak suspicion.

Allocations are keyed by (pid, layer, device pointer): the same address can be live at two layers
at once (PyTorch carves tensors out of a segment it got from ``cudaMalloc``), never twice in one.
The table is bounded; when full, the oldest allocation is evicted and counted — its bytes leave the
in-use figures, so an evicted allocation can never turn in-use negative when its free arrives (the
free is then counted as unmatched, like a free of memory allocated before the agent attached).

Leaks: the allocations still alive past ``leak_age_ns`` whose process's in-use bytes (at that layer)
grew over the last ``leak_age_ns``, grouped by the stack that made them. A stack is reported when
at least ``min_count`` of its allocations are that old (one long-lived buffer — the weights — is
not a leak; the same line allocating again and again without freeing is), and again only when it
has leaked more since its last report.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Collection, Hashable, Iterator
from dataclasses import dataclass, field


@dataclass(slots=True)
class Allocation:
    pid: int
    layer: str
    device: int
    ptr: int
    size: int
    ts_ns: int
    stack: Hashable  # what the views group by (a resolved stack); opaque here
    memory: str = "device"  # what it is (cuda.memory.kind): device, managed, pinned_host


@dataclass(frozen=True)
class LeakReport:
    """One stack suspected of leaking in one process."""

    pid: int
    layer: str
    device: int
    stack: Hashable
    count: int  # allocations from this stack alive past the age
    bytes: int
    oldest_ns: int  # allocation time of the oldest
    in_use_bytes: int  # the process's in-use bytes at this layer and device when reported
    growth_bytes: int  # how much that grew over the leak window


@dataclass
class _Usage:
    in_use: int = 0
    history: deque = field(default_factory=deque)  # (ts, in_use) at each leak check, oldest first


class AllocationTable:
    """Live allocations by (pid, layer, pointer), with in-use totals per (pid, layer, device)."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self._live: OrderedDict[tuple[int, str, int], Allocation] = OrderedDict()
        self._usage: dict[tuple[int, str, int], _Usage] = {}
        self.evicted = 0  # allocations forgotten because the table was full
        self.unmatched_frees = 0  # frees of pointers not in the table (allocated before attach, evicted)
        self.replaced = 0  # allocations at a pointer still live (its free was missed)

    def __len__(self) -> int:
        return len(self._live)

    def allocate(self, alloc: Allocation) -> None:
        key = (alloc.pid, alloc.layer, alloc.ptr)
        previous = self._live.pop(key, None)
        if previous is not None:  # its free was never seen: it is gone now
            self.replaced += 1
            self._account(previous, -previous.size)
        elif len(self._live) >= self.capacity:
            _, oldest = self._live.popitem(last=False)
            self.evicted += 1
            self._account(oldest, -oldest.size)
        self._live[key] = alloc
        self._account(alloc, alloc.size)

    def free(self, pid: int, layer: str, ptr: int) -> Allocation | None:
        """The allocation ``ptr`` named, now released; None (and counted) when unknown."""
        alloc = self._live.pop((pid, layer, ptr), None)
        if alloc is None:
            self.unmatched_frees += 1
            return None
        self._account(alloc, -alloc.size)
        return alloc

    def remove_processes(self, pids: Collection[int]) -> dict[int, list[Allocation]]:
        """Processes exited (their device memory went with them): what each still held, oldest
        first. One pass over the table however many exited, so a burst of exits costs one."""
        held: dict[int, list[Allocation]] = {}
        for key in [k for k in self._live if k[0] in pids]:
            held.setdefault(key[0], []).append(self._live.pop(key))
        for key in [k for k in self._usage if k[0] in pids]:
            del self._usage[key]
        return held

    def _account(self, alloc: Allocation, delta: int) -> None:
        usage = self._usage.setdefault((alloc.pid, alloc.layer, alloc.device), _Usage())
        usage.in_use += delta

    def in_use(self) -> dict[tuple[int, str, int], int]:
        """In-use bytes by (pid, layer, device)."""
        return {key: usage.in_use for key, usage in self._usage.items()}

    def live(self) -> Iterator[Allocation]:
        return iter(self._live.values())

    def leaks(self, now_ns: int, leak_age_ns: int, min_count: int = 2) -> list[LeakReport]:
        """Stacks whose old, still-live allocations make a growing in-use (see the module doc).
        Call it periodically (every fraction of the leak age): it keeps the in-use history."""
        growing: dict[tuple[int, str, int], int] = {}
        for key, usage in self._usage.items():
            usage.history.append((now_ns, usage.in_use))
            # keep one sample at least leak_age old, to compare with
            while len(usage.history) > 1 and usage.history[1][0] <= now_ns - leak_age_ns:
                usage.history.popleft()
            then_ns, then = usage.history[0]
            if then_ns <= now_ns - leak_age_ns and usage.in_use > then:
                growing[key] = usage.in_use - then
        if not growing:
            return []
        groups: dict[tuple[int, str, int, Hashable], list[Allocation]] = {}
        cutoff = now_ns - leak_age_ns
        for alloc in self._live.values():  # insertion order: oldest first, so stop at the cutoff
            if alloc.ts_ns > cutoff:
                break
            if (alloc.pid, alloc.layer, alloc.device) in growing:
                groups.setdefault((alloc.pid, alloc.layer, alloc.device, alloc.stack), []).append(alloc)
        reports = []
        for (pid, layer, device, stack), allocs in groups.items():
            if len(allocs) < min_count:
                continue
            usage = self._usage[(pid, layer, device)]
            reports.append(
                LeakReport(
                    pid,
                    layer,
                    device,
                    stack,
                    len(allocs),
                    sum(a.size for a in allocs),
                    min(a.ts_ns for a in allocs),
                    usage.in_use,
                    growing[(pid, layer, device)],
                )
            )
        return reports


class LeakReporter:
    """Reports each leaking stack once, and again only when it has leaked more since."""

    def __init__(self, max_stacks: int = 10_000) -> None:
        self._reported: OrderedDict[tuple, int] = OrderedDict()  # (pid, layer, device, stack) -> count
        self._max = max_stacks

    def new(self, reports: list[LeakReport]) -> list[LeakReport]:
        fresh = []
        for report in reports:
            key = (report.pid, report.layer, report.device, report.stack)
            if self._reported.get(key, 0) >= report.count:
                continue
            self._reported[key] = report.count
            self._reported.move_to_end(key)
            if len(self._reported) > self._max:
                self._reported.popitem(last=False)
            fresh.append(report)
        return fresh

    def forget_processes(self, pids: Collection[int]) -> None:
        for key in [k for k in self._reported if k[0] in pids]:
            del self._reported[key]
