"""The CPU budget controller: shed in proportion to a sustained excess, recover when there is room."""

from __future__ import annotations

import pytest

from otel_ebpf.budget import MAX_CUT, MIN_KEEP, SETPOINT, CpuBudget


def feed(budget: CpuBudget, usages: list[float]) -> list[float]:
    """Share kept after each one-second period at the given CPU usage (cores)."""
    cpu, keeps = 0.0, []
    budget.update(cpu, 0.0)
    for second, used in enumerate(usages, start=1):
        cpu += used
        keeps.append(budget.update(cpu, float(second)))
    return keeps


def test_within_budget_everything_is_copied() -> None:
    assert feed(CpuBudget(0.5), [0.1, 0.45, 0.5, 0.3]) == [1.0, 1.0, 1.0, 1.0]


def test_one_busy_period_is_no_overload() -> None:
    assert feed(CpuBudget(0.5), [2.0, 0.1, 2.0, 0.1]) == [1.0, 1.0, 1.0, 1.0]


def test_sustained_excess_sheds_in_proportion_then_recovers() -> None:
    """Each cut aims at the setpoint (0.45 of a core here), each step back up too, at most doubling."""
    keeps = feed(CpuBudget(0.5), [1.0, 1.0, 1.0, 1.0, 0.5, 0.2, 0.2, 0.2])
    assert SETPOINT == pytest.approx(0.9)
    assert keeps == pytest.approx([1.0, 0.45, 0.45, 0.45**2, 0.45**2, 0.45**2 * 2, 0.45**2 * 4, 1.0])


def test_the_period_after_a_cut_is_not_judged_alone() -> None:
    """The cut reached the setpoint; the next period, still busy with the ring's backlog of the old
    share, shows the old usage: no second cut on it."""
    keeps = feed(CpuBudget(0.5), [1.0, 1.0, 0.95, 0.45, 0.45])
    assert keeps == pytest.approx([1.0, 0.45, 0.45, 0.45, 0.45])


def test_the_cut_scales_what_was_copied_when_the_kernel_also_shed_on_backlog() -> None:
    """User space fell behind: the kernel copied only 1 request in 5 (it shed the rest on backlog),
    and the agent's CPU shows what it could do, not what there was. One cut brings it to the setpoint."""
    budget = CpuBudget(0.5)
    budget.update(0.0, 0.0, 0, 0)
    budget.update(1.0, 1.0, 1000, 800)
    assert budget.update(2.0, 2.0, 2000, 1600) == pytest.approx(0.2 * SETPOINT * 0.5 / 1.0)


def test_a_second_with_everything_shed_cuts_by_at_most_max_cut() -> None:
    budget = CpuBudget(0.5)
    budget.update(0.0, 0.0, 0, 0)
    budget.update(1.0, 1.0, 1000, 1000)
    assert budget.update(2.0, 2.0, 2000, 2000) == 1 / MAX_CUT


def test_the_share_grows_back_in_proportion_to_the_room() -> None:
    keeps = feed(CpuBudget(0.5), [1.0, 1.0, 0.3])
    assert keeps[1] == pytest.approx(SETPOINT * 0.5)
    assert keeps[2] == pytest.approx(keeps[1] * SETPOINT * 0.5 / 0.3)


def test_the_share_never_reaches_zero() -> None:
    assert feed(CpuBudget(0.01), [100.0] * 20)[-1] == MIN_KEEP


def test_a_clock_that_did_not_move_changes_nothing() -> None:
    budget = CpuBudget(0.5)
    budget.update(0.0, 5.0)
    assert budget.update(10.0, 5.0) == 1.0
