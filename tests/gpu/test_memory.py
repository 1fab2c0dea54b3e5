"""Allocation pairing, in-use bytes and leak suspicion (otel_ebpf/gpu/memory.py), without BPF."""

from __future__ import annotations

from otel_ebpf.gpu.memory import Allocation, AllocationTable, LeakReporter

S = 1_000_000_000


def alloc(
    ptr: int, size: int, ts: float, stack: str = "a", pid: int = 1, layer: str = "runtime", device: int = 0
) -> Allocation:
    return Allocation(pid, layer, device, ptr, size, int(ts * S), stack)


def test_frees_pair_with_allocations_by_pid_layer_and_pointer() -> None:
    table = AllocationTable()
    table.allocate(alloc(0x10, 100, 0))
    table.allocate(alloc(0x10, 7, 0, layer="pytorch"))  # the same address at another layer
    table.allocate(alloc(0x10, 5, 0, pid=2))  # and in another process
    table.allocate(alloc(0x20, 50, 0, device=1))
    assert table.in_use() == {(1, "runtime", 0): 100, (1, "pytorch", 0): 7, (2, "runtime", 0): 5, (1, "runtime", 1): 50}
    freed = table.free(1, "runtime", 0x10)
    assert freed is not None and freed.size == 100
    assert table.in_use()[(1, "runtime", 0)] == 0 and table.in_use()[(1, "pytorch", 0)] == 7
    assert table.free(1, "runtime", 0x10) is None  # a double free, or memory from before the agent
    assert table.unmatched_frees == 1 and len(table) == 3


def test_a_full_table_evicts_the_oldest_and_its_bytes_leave_in_use() -> None:
    table = AllocationTable(capacity=2)
    for i in range(3):
        table.allocate(alloc(0x10 + i, 10, i))
    assert table.evicted == 1 and len(table) == 2
    assert table.in_use() == {(1, "runtime", 0): 20}
    assert table.free(1, "runtime", 0x10) is None  # the evicted one: never negative in-use
    assert table.in_use() == {(1, "runtime", 0): 20}


def test_an_allocation_over_a_live_pointer_replaces_it() -> None:
    table = AllocationTable()
    table.allocate(alloc(0x10, 10, 0))
    table.allocate(alloc(0x10, 30, 1))  # its free was missed
    assert table.replaced == 1 and table.in_use() == {(1, "runtime", 0): 30}


def test_process_exit_forgets_its_allocations() -> None:
    table = AllocationTable()
    table.allocate(alloc(0x10, 10, 0, pid=1))
    table.allocate(alloc(0x20, 5, 1, pid=1))
    table.allocate(alloc(0x10, 10, 0, pid=2))
    table.allocate(alloc(0x10, 7, 0, pid=3))
    held = table.remove_processes({1, 3})
    assert {pid: [(a.ptr, a.size) for a in allocs] for pid, allocs in held.items()} == {
        1: [(0x10, 10), (0x20, 5)],
        3: [(0x10, 7)],
    }
    assert table.in_use() == {(2, "runtime", 0): 10} and len(table) == 1


def grow(
    table: AllocationTable,
    steps: int,
    start: float,
    every: float = 0.1,
    stack: str = "leak",
    check: bool = True,
    age: float = 0.5,
) -> list:
    """One leaked allocation per step, leak checks after each; returns every report."""
    reports = []
    for i in range(steps):
        t = start + i * every
        table.allocate(alloc(0x1000 + int(t * 1000), 1024, t, stack))
        if check:
            reports += table.leaks(int(t * S), int(age * S))
    return reports


def test_old_allocations_from_one_stack_are_leaks_while_in_use_grows() -> None:
    table = AllocationTable()
    table.allocate(alloc(0x1, 1 << 20, 0.0, "weights"))  # one long-lived buffer: never a leak
    reports = grow(table, 20, 0.05)
    assert reports and {r.stack for r in reports} == {"leak"}
    last = reports[-1]
    # at t=1.95 the allocations made up to t=1.45 are older than the age
    assert (last.count, last.bytes, last.pid, last.layer, last.device) == (15, 15 * 1024, 1, "runtime", 0)
    assert last.oldest_ns == int(0.05 * S) and last.in_use_bytes == (1 << 20) + 20 * 1024
    assert last.growth_bytes == 5 * 1024  # over the last 0.5 s


def test_no_leak_when_in_use_stops_growing() -> None:
    table = AllocationTable()
    grow(table, 10, 0.0)
    # later checks: nothing new allocated, in-use flat for longer than the age
    assert [r for t in (2.0, 2.5, 3.0) for r in table.leaks(int(t * S), int(0.5 * S))] == []


def test_a_single_old_allocation_is_not_reported() -> None:
    table = AllocationTable()
    table.allocate(alloc(0x1, 100, 0.0, "once"))
    reports = grow(table, 20, 0.05, stack="churn")  # in-use grows through the checks
    assert reports and {r.stack for r in reports} == {"churn"}  # "once" has one suspect: min_count is 2


def test_the_first_check_has_no_history_to_compare_with() -> None:
    table = AllocationTable()
    grow(table, 10, 0.0, check=False)
    assert table.leaks(int(5.0 * S), int(0.5 * S)) == []  # growth is judged between checks


def test_reporter_repeats_a_stack_only_when_it_leaked_more() -> None:
    table = AllocationTable()
    reporter = LeakReporter()
    reports = grow(table, 10, 0.0)
    first = reporter.new(reports)
    assert len(first) == 4 and [r.count for r in first] == [2, 3, 4, 5]  # once per growth
    assert reporter.new(reports) == []  # the same reports again: nothing new
    more = reporter.new(grow(table, 5, 1.0))
    assert more and more[0].count > first[-1].count
    reporter.forget_processes({1})
    assert reporter.new(reports[-1:]) == reports[-1:]
