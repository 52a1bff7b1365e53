"""The default planner acts only for a real gain: a rescale goes ahead only where its schedule costs less
than the best schedule that holds the current parallelism now (both charged their rescales' penalties),
so a tie holds; and a first step that runs short of the planned rate on purpose (the backlog left to grow
toward its target) is the job's choice (`allow_planned_shortfall`), said in the reason."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from evaluation.jobmodel import JobModel, Operator
from evaluation.simulator import WINDOW_S, PolicyRun, PolicyRunner, rate_factors, simulate
from evaluation.traces import Trace
from plan.cost_plan import PlanProblem, solve
from plan.policies.default import CostPlanner, PlannerMemory
from plan.policy import Plan
from tests.unit.test_cost_planner import window

# ---------------------------------------------------------------- a new user's first step, simulated


def first_step(seed: int) -> PolicyRun:
    """A new user's first try, from the docs: auto mode, a job of 200 rec/s per slot whose rate varies
    5 % from window to window, 5 minutes at 150 rec/s, then 25 at 1,000; no planned shortfall."""
    rates = np.array([150.0] * 30 + [1000.0] * 150)
    trace = Trace("step 150 -> 1,000 rec/s", rates, WINDOW_S, "a step of the load")
    model = JobModel(operators=(Operator("job", 200.0),), downtime_up_s=22.7, downtime_down_s=12.1)
    config = JobConfig(max_parallelism=12, allow_planned_shortfall=False)
    return simulate(trace, model, PolicyRunner(CostPlanner(), config), config, 1, config.backlog_target_s,
                    seed=seed, factors=rate_factors(len(rates), seed, 0.05))


@pytest.mark.parametrize("seed", range(5))
def test_a_step_takes_one_scale_up_and_at_most_one_trim_that_still_carries_the_load(seed: int) -> None:
    """Allowed to run short (the default), two seeds of five trim twice (7 -> 6 -> 5): at 5 slots the
    capacity equals the arrivals, so the restart's backlog (8,000-14,000 records) never drains."""
    run = first_step(seed)
    assert run.scale_ups == 1 and run.scale_downs <= 1 and run.beyond_target_s == 0
    assert run.timeline.parallelism[-1] >= 6
    assert max(run.timeline.backlog[-30:]) < 1000.0  # the last 5 minutes: less than a second of arrivals


# ---------------------------------------------------------------- planner-level


class Posed(CostPlanner):
    """The default planner on a problem given outright (the same with or without the quantiles)."""

    def __init__(self, problem: PlanProblem) -> None:
        super().__init__(action_penalty_slot_s=problem.action_penalty_s)
        self.posed = problem

    def problem(self, memory: PlannerMemory, analysis: Analysis, config: JobConfig, state: PlanState,
                quantiles: bool = True) -> PlanProblem | None:
        return self.posed


def decided(problem: PlanProblem, config: JobConfig | None = None) -> Plan:
    """The planner's decision on `problem`, after the windows it measures the current parallelism over."""
    config = config or JobConfig(max_parallelism=problem.max_parallelism,
                                 allow_planned_shortfall=problem.allow_planned_shortfall)
    planner, state = Posed(problem), PlanState()
    p = problem.parallelism
    for i in range(4):
        state, plan = planner.decide(state, window(10.0 * i, p, float(problem.rates[0]), per_slot=100.0), config)
    return plan


def jumpy(current: int, **kw: object) -> PlanProblem:
    """Six minutes of a jumpy load at 100 rec/s per slot (lower quantile), no restart costs."""
    fields: dict = dict(parallelism=current, backlog=1000.0, rates=np.array([250.0, 150.0, 500.0, 50.0, 200.0, 550.0]),
                        step_s=60.0, capacity=np.arange(7) * 100.0, min_parallelism=1, downtime_up_s=0.0,
                        downtime_down_s=0.0, replay_records=0.0, backlog_target_s=60.0, action_penalty_s=300.0)
    return PlanProblem(**(fields | kw))


def test_a_rescale_that_ties_with_holding_holds_and_says_why() -> None:
    """From 4 slots, 3 slots throughout costs what the best schedule holding 4 now does: the search's order
    picked the rescale."""
    problem = jumpy(4)
    chosen, holding = solve(problem), solve(problem, force_first=4)
    assert chosen.first == 3 and chosen.cost == pytest.approx(holding.cost)  # the tie, in the search
    plan = decided(problem)
    assert plan.action is Action.NONE and plan.reason.code == "planned_hold", plan.reason.message
    assert "holding 4 now" in plan.reason.message and "no real gain" in plan.reason.message
    assert plan.reason.numbers["hold_cost_slot_s"] == pytest.approx(holding.cost, abs=0.1)


def test_a_rescale_the_target_needs_goes_ahead_at_once() -> None:
    """2 slots of 100 rec/s at 450 rec/s now: holding breaks the target."""
    problem = jumpy(2, rates=np.full(10, 450.0), backlog=20_000.0)
    plan = decided(problem)
    assert plan.action is Action.SCALE_UP and plan.reason.code == "cost_plan"


def short(current: int, allowed: bool = False) -> PlanProblem:
    """1,010 rec/s for 30 min, slots of 200 rec/s (lower quantile): 5 slots carry 1,000."""
    return PlanProblem(parallelism=current, backlog=0.0, rates=np.full(30, 1010.0), step_s=60.0,
                       capacity=np.arange(13) * 200.0, min_parallelism=1, downtime_up_s=20.0, downtime_down_s=12.0,
                       replay_records=0.0, backlog_target_s=60.0, action_penalty_s=300.0,
                       allow_planned_shortfall=allowed)


def test_a_plan_moves_to_run_short_now_only_by_the_jobs_choice_and_says_so() -> None:
    """From 6 slots the cheapest schedule trims to 5, letting the backlog grow toward its 60-s target
    (10 rec/s for 30 min: 18,000 records of the 60,600 allowed). Without the setting the plan holds 6; with
    it, it trims and says why."""
    assert solve(short(6, allowed=True)).first == 5 and solve(short(6)).first == 6
    plan = decided(short(6))
    assert plan.action is Action.NONE and plan.reason.code == "planned_hold"
    assert "short" not in plan.reason.message
    plan = decided(short(6, allowed=True), JobConfig(max_parallelism=12, allow_planned_shortfall=True))
    assert plan.action is Action.SCALE_DOWN and plan.to_parallelism == 5
    assert "runs short on purpose (1,000 rec/s at 5 against the planned 1,010 rec/s now)" in plan.reason.message
    assert "allow_planned_shortfall" in plan.reason.message


def test_a_parallelism_that_runs_short_may_be_held_and_the_reason_says_so() -> None:
    """At 5 slots already, holding keeps the target for less than a restart to 6: it holds, and says the
    current parallelism runs short. Where nothing within bounds carries the rate, the reason says that."""
    plan = decided(short(5))
    assert plan.action is Action.NONE and "the current parallelism runs short" in plan.reason.message
    plan = decided(PlanProblem(**(short(5).__dict__ | {"capacity": np.arange(6) * 200.0})))
    assert "no parallelism within bounds carries the rate" in plan.reason.message


def test_the_planner_takes_the_setting_from_the_job() -> None:
    planner, state = CostPlanner(), PlanState()
    for i in range(3):
        state, _ = planner.decide(state, window(10.0 * i, 2, 300.0), JobConfig(max_parallelism=8))
    memory = PlannerMemory.model_validate(state.policy_state)
    for allowed in (False, True):
        config = JobConfig(max_parallelism=8, allow_planned_shortfall=allowed)
        problem = planner.problem(memory, window(20.0, 2, 300.0), config, state)
        assert problem is not None and problem.allow_planned_shortfall is allowed


# ---------------------------------------------------------------- properties


@st.composite
def problems(draw: st.DrawFn) -> PlanProblem:
    n = draw(st.integers(2, 6))
    steps = draw(st.integers(1, 8))
    return PlanProblem(
        parallelism=draw(st.integers(1, n)), backlog=draw(st.sampled_from([0.0, 500.0, 3000.0, 12_000.0])),
        rates=np.asarray(draw(st.lists(st.sampled_from([50.0, 150.0, 250.0, 300.0, 450.0, 550.0, 700.0]),
                                       min_size=steps, max_size=steps))),
        step_s=60.0, capacity=np.arange(n + 1) * 100.0, min_parallelism=draw(st.integers(1, n)),
        downtime_up_s=draw(st.sampled_from([0.0, 20.0])), downtime_down_s=draw(st.sampled_from([0.0, 10.0])),
        replay_records=draw(st.sampled_from([0.0, 1000.0])), backlog_target_s=60.0,
        action_penalty_s=draw(st.sampled_from([0.0, 30.0, 300.0])),
        allow_planned_shortfall=draw(st.booleans()))


def carries(problem: PlanProblem, p: int) -> bool:
    return bool(problem.capacity[p] >= problem.rates[0])


@settings(max_examples=150, deadline=None)
@given(problems())
def test_a_plans_first_step_carries_the_planned_rate_unless_the_job_allows_otherwise(problem: PlanProblem) -> None:
    chosen = solve(problem)
    bounds = range(problem.min_parallelism, problem.max_parallelism + 1)
    if not problem.allow_planned_shortfall and any(carries(problem, p) for p in bounds):
        assert carries(problem, chosen.first) or chosen.first == problem.parallelism


@settings(max_examples=150, deadline=None)
@given(problems())
def test_the_planner_never_rescales_where_holding_keeps_the_target_for_no_more(problem: PlanProblem) -> None:
    """Where holding now (within bounds) keeps the target as well as the plan and costs no more than it,
    the planner holds; where it rescales, holding costs more or breaks the target."""
    current = problem.parallelism
    config = JobConfig(max_parallelism=problem.max_parallelism, min_parallelism=problem.min_parallelism,
                       allow_planned_shortfall=problem.allow_planned_shortfall, align_to_partitions=False)
    plan = decided(problem, config)
    if current < problem.min_parallelism:
        return
    chosen, holding = solve(problem), solve(problem, force_first=current)
    if holding.violation_s <= chosen.violation_s and holding.cost <= chosen.cost:
        assert plan.action is Action.NONE, plan.reason.message
    if plan.action is not Action.NONE:
        assert holding.violation_s > chosen.violation_s or holding.cost > chosen.cost
