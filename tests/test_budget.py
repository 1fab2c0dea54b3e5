"""The CPU budget controller: shed in proportion to a sustained excess, recover when there is room;
and the cap that holds the agent to its budget on traffic the kernel does not shed."""

from __future__ import annotations

import pytest

from otel_ebpf.budget import ALLOWANCE_S, MAX_CUT, MIN_KEEP, SETPOINT, CpuBudget, CpuCap


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


def test_periods_the_cap_held_are_over_budget_and_cut_to_what_was_taken() -> None:
    """Held by the cap to its budget (0.5 of a core, waiting part of each second), the agent reads
    as at its budget, not over it; the kernel shed a third of the requests on the ring's backlog.
    Two such periods are over budget all the same, and the cut aims at the setpoint from what the
    kernel copied: no deeper (the reader's speed while it ran is not what it was offered)."""
    budget = CpuBudget(0.5)
    budget.update(0.0, 0.0, 0, 0, paused_s=0.0)
    assert budget.update(0.5, 1.0, 3000, 1000, paused_s=0.3) == 1.0
    assert budget.update(1.0, 2.0, 6000, 2000, paused_s=0.6) == pytest.approx((2 / 3) * SETPOINT)


def test_the_share_does_not_grow_while_the_cap_holds_the_agent() -> None:
    """Cut to 0.45 by two seconds at a whole core; then a second of little CPU in which the reader
    still waited (the cap's debt): the share stays (it would double in a quiet second)."""
    budget = CpuBudget(0.5)
    budget.update(0.0, 0.0)
    budget.update(1.0, 1.0)
    assert budget.update(2.0, 2.0) == pytest.approx(SETPOINT * 0.5)
    assert budget.update(2.1, 3.0, paused_s=0.8) == pytest.approx(SETPOINT * 0.5)
    assert budget.update(2.2, 4.0, paused_s=0.8) == pytest.approx(SETPOINT * 0.5 * 2)


def test_a_cut_never_raises_the_share() -> None:
    """Two capped periods of little CPU (the cap caught up with an old burst): no cut, no rise."""
    budget = CpuBudget(0.5)
    budget.update(0.0, 0.0)
    assert budget.update(0.05, 1.0, paused_s=0.9) == 1.0
    assert budget.update(0.1, 2.0, paused_s=1.8) == 1.0


def run_capped(cap: CpuCap, demand: float, seconds: float, step: float = 0.01) -> tuple[float, float]:
    """The agent wanting ``demand`` cores for ``seconds``, in steps of ``step`` s, waiting whenever
    the cap says so: CPU used and time paused."""
    cpu = wall = paused = 0.0
    cap.pause(cpu, wall)
    while wall < seconds:
        cpu += demand * step
        wall += step
        pause = cap.pause(cpu, wall)
        wall += pause
        paused += pause
    return cpu, paused


def test_within_budget_the_cap_never_pauses() -> None:
    assert run_capped(CpuCap(0.5), 0.45, 60.0)[1] == 0.0


def test_over_budget_the_cap_holds_the_average_to_the_budget_after_its_allowance() -> None:
    """Offered two cores' work, the agent runs ahead of its budget by its allowance, then no further:
    over a minute it used the budget and the allowance, to within one step."""
    cap = CpuCap(0.5)
    cpu, paused = run_capped(cap, 2.0, 60.0)
    assert cpu == pytest.approx(0.5 * 60.0 + 0.5 * ALLOWANCE_S, abs=2.0 * 0.01)
    assert paused > 40.0


def test_the_allowance_is_spent_before_the_first_pause() -> None:
    """At one core against a budget of 0.5 the bucket empties at 0.5 s of CPU per second."""
    cap = CpuCap(0.5, allowance_s=2.0)
    cap.pause(0.0, 0.0)
    assert cap.pause(1.0, 1.0) == 0.0  # 1.0 s of CPU allowed ahead, 0.5 of it spent
    assert cap.pause(2.0, 2.0) == 0.0  # all of it
    assert cap.pause(3.0, 3.0) == pytest.approx(0.5 / 0.5)  # 0.5 s of CPU over: a second at 0.5


def test_a_pause_refills_what_it_waited_for() -> None:
    cap = CpuCap(0.5, allowance_s=0.0)
    cap.pause(0.0, 0.0)
    assert cap.pause(0.5, 0.5) == pytest.approx(0.5)  # 0.25 s of CPU over: half a second at 0.5
    assert cap.pause(0.5, 1.0) == 0.0  # waited it out, used nothing meanwhile
    assert cap.pause(0.5, 5.0) == 0.0  # idle time refills only up to the allowance (none)
    assert cap.pause(0.6, 5.1) == pytest.approx(0.1)
