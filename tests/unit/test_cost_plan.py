"""The default planner's dynamic program (plan.cost_plan): the schedule it solves is the cheapest
that keeps the backlog target, its cost is the model's, and its next best differs in the first step."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.backends import DEFAULT_RAMP_S, BackendKind, planned_costs
from contracts.plan_state import Downtimes
from plan.cost_plan import PlanProblem, describe, first_steps, solve


def problem(rates: list[float], current: int = 2, backlog: float = 0.0, per_slot: float = 100.0,
            max_parallelism: int = 6, **kw: float) -> PlanProblem:
    return PlanProblem(parallelism=current, backlog=backlog, rates=np.asarray(rates, dtype=float), step_s=60.0,
                       capacity=np.arange(max_parallelism + 1) * per_slot, min_parallelism=1,
                       downtime_up_s=kw.get("up", 20.0), downtime_down_s=kw.get("down", 10.0),
                       replay_records=kw.get("replay", 0.0), backlog_target_s=kw.get("target", 60.0),
                       action_penalty_s=kw.get("penalty", 30.0), ramp_up_s=kw.get("ramp", 0.0))


def replay(pr: PlanProblem, schedule: list[int]) -> tuple[float, float, list[float]]:
    """The problem's model run step by step: cost (as the planner counts it), violation, backlogs."""
    per_record = 1 / (pr.capacity[-1] / pr.max_parallelism)
    b, q, cost, violation, levels = pr.backlog, pr.parallelism, 0.0, 0.0, []
    for rate, p in zip(pr.rates, schedule, strict=True):
        down = 0.0 if p == q else min(pr.step_s, pr.downtime_up_s if p > q else pr.downtime_down_s)
        ramp = min(pr.ramp_up_s, pr.step_s - down) if p > q else 0.0  # at q's capacity
        peak = b + rate * down + (pr.replay_records if p != q else 0.0)
        b = max(0.0, peak + rate * (pr.step_s - down) - pr.capacity[p] * (pr.step_s - down - ramp)
                - pr.capacity[q] * ramp)
        limit = pr.backlog_target_s * rate
        excess = ((max(0.0, peak - limit) if p != q else 0.0) + max(0.0, b - limit)) / max(rate, 1.0)
        cost += p * pr.step_s + (pr.action_penalty_s if p != q else 0.0) + pr.violation_weight * excess
        violation += excess
        levels.append(b)
        q = p
    return cost + per_record * b, violation, levels


def test_steady_load_holds_the_fewest_slots_that_carry_it() -> None:
    schedule = solve(problem([250.0] * 30, current=3, penalty=300.0))
    # Near the horizon's end a backlog within target is cheaper than slots: only the first steps matter.
    assert set(schedule.parallelism[:20].tolist()) == {3} and schedule.violation_s == 0


def test_it_scales_down_when_the_saving_over_the_horizon_pays_for_the_restart() -> None:
    assert solve(problem([150.0] * 30, current=4, penalty=300.0)).first == 2
    # With a horizon of one step the restart's backlog is not worth a slot for a minute.
    assert solve(problem([150.0], current=4, penalty=10_000.0)).first == 4


def test_it_scales_up_ahead_of_a_forecast_rise_only_when_waiting_would_break_the_target() -> None:
    rising = [150.0] * 5 + [550.0] * 25
    schedule = solve(problem(rising, current=2, penalty=300.0))
    assert schedule.first == 2  # no need to pay for slots five minutes early
    assert schedule.parallelism[5:7].max() == 6 and schedule.violation_s == 0


def test_executors_changed_in_place_make_a_scale_up_cheaper_than_a_restart_so_it_can_wait_longer() -> None:
    # A rise from 150 to 700 rec/s in the fourth minute, a 60 s backlog target, 2 of 8 slots now. A restart
    # stops the job for 40 s and replays: the planner scales up a step before the rise. In place, the old slots
    # keep running while the new executors register (15 s): the rise is met when it comes, for less.
    rising = [150.0] * 3 + [700.0] * 20
    restart = solve(problem(rising, current=2, max_parallelism=8, penalty=300.0, up=40.0, replay=2000.0))
    in_place = solve(problem(rising, current=2, max_parallelism=8, penalty=300.0, up=0.0, down=1.0, ramp=15.0))
    assert restart.violation_s == 0 and in_place.violation_s == 0
    first_up = [int(np.argmax(s.parallelism > 2)) for s in (restart, in_place)]
    assert first_up == [2, 3]
    assert in_place.cost < restart.cost


def test_the_in_place_costs_planned_are_the_backends_learned_ones() -> None:
    measured = Downtimes(up=[11.0, 13.0], down=[0.4])
    in_place = planned_costs(BackendKind.IN_PLACE, measured, 30.0, 20.0, 500.0)
    assert (in_place.up_pause_s, in_place.up_ramp_s, in_place.down_pause_s, in_place.replay_records) == \
        (0.0, 13.0, 0.4, 0.0)
    restart = planned_costs(BackendKind.RESTART, measured, 30.0, 20.0, 500.0)
    assert (restart.up_pause_s, restart.up_ramp_s, restart.down_pause_s, restart.replay_records) == \
        (30.0, 0.0, 20.0, 500.0)
    assert planned_costs(BackendKind.IN_PLACE, Downtimes(), 30.0, 20.0, 500.0).up_ramp_s == DEFAULT_RAMP_S


def test_the_schedules_backlog_and_cost_are_the_models() -> None:
    pr = problem([150.0, 420.0, 420.0, 90.0, 90.0, 300.0], current=2, backlog=3000.0, replay=500.0)
    schedule = solve(pr)
    cost, violation, levels = replay(pr, schedule.parallelism.tolist())
    assert schedule.cost == pytest.approx(cost) and schedule.violation_s == pytest.approx(violation)
    assert np.allclose(schedule.backlog, levels)


@settings(max_examples=200, deadline=None)
@given(rates=st.lists(st.floats(0.0, 600.0), min_size=1, max_size=4), current=st.integers(1, 4),
       backlog=st.floats(0.0, 20_000.0), target=st.floats(5.0, 120.0), ramp=st.sampled_from([0.0, 15.0, 90.0]))
def test_the_planned_cost_is_the_cost_of_its_schedule(rates: list[float], current: int, backlog: float,
                                                      target: float, ramp: float) -> None:
    pr = problem(rates, current=current, backlog=backlog, max_parallelism=4, target=target, ramp=ramp)
    planned = solve(pr)
    cost, violation, levels = replay(pr, planned.parallelism.tolist())
    assert planned.cost == pytest.approx(cost) and planned.violation_s == pytest.approx(violation, abs=1e-9)
    assert np.allclose(planned.backlog, levels)


def test_where_a_schedule_keeps_the_target_the_planner_nearly_always_finds_one_within_5_percent() -> None:
    """Brute force over every schedule of 400 small random problems (those that start where the search may:
    `first_steps`). The DP keeps a few paths per (step,
    parallelism), one per backlog bucket, ranked by cost plus the work their backlog needs: a heuristic.
    Where some schedule keeps the target, the planner's keeps it at most 5 % above the cheapest in at
    least 98 % of the problems (1,116 of 1,117 when measured); the misses are loads that jump many-fold
    within the horizon, where two backlogs share a bucket."""
    rng = np.random.default_rng(7)
    feasible = good = 0
    for _ in range(400):
        steps = int(rng.integers(1, 5))
        pr = problem(rng.uniform(20.0, 600.0, steps).tolist(), current=int(rng.integers(1, 5)),
                     backlog=float(rng.uniform(0, 20_000)), max_parallelism=4, target=float(rng.uniform(30, 120)))
        starts = first_steps(pr)  # where the search may start: the parallelisms that carry the rate now
        runs = [replay(pr, list(s)) for s in itertools.product(range(1, 5), repeat=steps) if starts[s[0] - 1]]
        within = [cost for cost, violation, _ in runs if violation <= 1e-6]
        if not within:
            continue
        feasible += 1
        planned = solve(pr)
        good += planned.violation_s <= 1e-6 and planned.cost <= min(within) * 1.05 + 1e-6
    assert feasible >= 200 and good >= 0.98 * feasible, (good, feasible)


def test_the_alternative_differs_in_its_first_step_and_costs_no_less() -> None:
    pr = problem([250.0] * 10, current=3)
    chosen = solve(pr)
    other = solve(pr, forbid_first=chosen.first)
    assert other.first != chosen.first and other.cost >= chosen.cost
    assert describe(solve(problem([250.0] * 10, current=3, penalty=300.0)), 60.0) == "3 now"
    rising = describe(solve(problem([150.0] * 3 + [550.0] * 3, current=2, penalty=300.0)), 60.0)
    assert rising.startswith("2 now, ") and rising.endswith(" from +3 min")


def test_a_cheaper_schedule_that_uses_the_backlog_allowance_is_found() -> None:
    """At a steady 250 rec/s on 3 slots of 100, dropping to 1 slot for a minute builds 10,000 records,
    within the 15,000 the target allows, and 3 slots drain them: cheaper, and the DP keeps the dearer
    low-backlog path apart from the cheap high-backlog one long enough to find it."""
    pr = problem([250.0] * 10, current=3)
    schedule = solve(pr)
    assert schedule.cost < replay(pr, [3] * 10)[0] and schedule.violation_s == 0


def test_a_load_beyond_every_parallelism_takes_the_largest() -> None:
    schedule = solve(problem([5_000.0] * 5, current=2))
    assert schedule.first == 6 and schedule.violation_s > 0


def test_bad_problems_are_refused() -> None:
    with pytest.raises(ValueError):
        solve(problem([]))
    with pytest.raises(ValueError):
        solve(problem([-1.0]))
