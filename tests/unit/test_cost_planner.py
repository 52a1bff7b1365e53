"""The default planner: its dynamic program, the arrival level, the capacity quantiles, and the policy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.analyses import Analysis, ForecastView
from contracts.backends import DEFAULT_RAMP_S, BackendKind, planned_costs
from contracts.decisions import Action
from contracts.jobs import JobConfig, Mode
from contracts.plan_state import Downtimes, PlanState
from evaluation.model_files import demo_model
from evaluation.simulator import PolicyRun, PolicyRunner, rate_factors, simulate
from evaluation.traces import load_trace
from plan.capacity_estimate import Measured, capacities, in_waves
from plan.cost_plan import PlanProblem, describe, solve
from plan.forecast_skill import ForecastSkill, note
from plan.level import LevelState, update
from plan.policies.default import CostPlanner, PlannerMemory, planned_rates
from plan.policy import Plan
from plan.proactive import predicted_recovery_s


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
    """Brute force over every schedule of 400 small random problems. The DP keeps a few paths per (step,
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
        runs = [replay(pr, list(s)) for s in itertools.product(range(1, 5), repeat=steps)]
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


# ---------------------------------------------------------------- the arrival level


def run_level(rates: list[float]) -> tuple[LevelState, list[int]]:
    state, fired = LevelState(), []
    for i, rate in enumerate(rates):
        state, shift = update(state, 10.0 * i, rate)
        if shift:
            fired.append(i)
    return state, fired


def test_a_step_is_detected_within_a_few_windows_and_the_level_restarts_from_it() -> None:
    rng = np.random.default_rng(1)
    rates = list(100 * rng.lognormal(0, 0.05, 60)) + list(400 * rng.lognormal(0, 0.05, 10))
    state, fired = run_level(rates)
    assert len(fired) == 1 and 60 <= fired[0] <= 62
    assert state.level() == pytest.approx(400, rel=0.1)


def test_noisy_steady_load_seldom_fires() -> None:
    alarms = 0
    for seed in range(10):
        rates = list(500 * np.random.default_rng(seed).lognormal(0, 0.1, 500))
        alarms += len(run_level(rates)[1])
    assert alarms <= 10  # 5,000 windows (about 14 hours): at most one false shift in 500 windows


# A live run of wiki (2026-11-27): seconds from the load's start, arrival rate measured. The job's first
# window is partial (126 rec/s against about 220); the load rises to about 290, then falls by two thirds.
WIKI_LIVE = [(16, 126), (26, 224), (36, 246), (46, 274), (56, 273), (66, 296), (76, 285), (96, 274), (106, 263),
             (116, 235), (126, 225), (136, 232), (146, 208), (156, 218), (166, 189), (176, 157), (186, 155),
             (196, 150), (206, 116), (216, 152), (226, 108), (236, 135), (246, 115), (256, 107), (266, 94),
             (276, 92), (286, 83), (296, 90), (306, 100), (316, 88), (326, 108), (336, 100), (346, 115), (356, 98)]


def test_one_outlier_does_not_blunt_the_detector_for_the_rest_of_the_run() -> None:
    """Counted whole, the first window's jump made the noise 0.22 for the run, and the fall was never
    detected (the scale-down waited for the job's delay); counted at most 3 sigmas, it is within a minute."""
    state, fired = LevelState(), []
    for t, rate in WIKI_LIVE:
        state, shift = update(state, float(t), float(rate))
        if shift:
            fired.append(t)
    assert any(150 <= t <= 240 for t in fired), fired
    assert state.sigma < 0.18


@given(outlier=st.floats(0.2, 5.0), seed=st.integers(0, 1000))
@settings(max_examples=30, deadline=None)
def test_the_noise_estimate_is_the_levels_not_an_outliers(outlier: float, seed: int) -> None:
    rates = [300.0, 300.0 * outlier, *(300.0 * np.random.default_rng(seed).lognormal(0, 0.03, 60))]
    state, _ = run_level(rates)
    # 3 % noise. A window off by 2x (or half) that does not fire a shift counts at most 3 sigmas of the prior,
    # and biases the level it is averaged into for a minute: the estimate stays within 3x of the noise
    # (counted whole it reached 4x).
    assert state.sigma < 0.09


def test_the_upper_level_is_above_the_mean_and_narrows_with_windows() -> None:
    state, _ = run_level([200.0, 210.0, 190.0])
    wide = state.upper_level()
    state, _ = run_level([200.0, 210.0, 190.0, 200.0, 205.0, 195.0])
    assert wide is not None and state.upper_level() is not None
    assert wide > state.upper_level() > state.level()  # type: ignore[operator]


def test_the_trend_finds_a_rising_load_where_it_is_now() -> None:
    rng = np.random.default_rng(3)
    rates = [200.0 + 1.5 * 10 * i for i in range(12)]  # 1.5 rec/s per second, 10-s windows
    state, _ = run_level([r * rng.lognormal(0, 0.03) for r in rates])
    trend = state.trend(110.0)
    assert trend is not None and trend.span_s == 50.0
    assert trend.slope == pytest.approx(1.5, rel=0.25)
    assert trend.rate == pytest.approx(rates[-1], rel=0.05)  # where the level (the mean) lags by 37 rec/s


@given(seed=st.integers(0, 10_000))
@settings(max_examples=50, deadline=None)
def test_a_steady_load_has_no_trend_and_its_rate_is_the_mean(seed: int) -> None:
    rates = list(300.0 * np.random.default_rng(seed).lognormal(0, 0.05, 20))
    state, _ = run_level(rates)
    trend = state.trend(190.0)
    assert trend is not None
    # At TREND_T = 2 a steady load shows a slope about 1 time in 10 (6 points); what it shows is small.
    assert abs(trend.slope) * trend.span_s < 0.35 * trend.rate
    if trend.slope == 0:
        assert trend.rate == pytest.approx(float(np.mean(rates[-6:])))


def test_no_trend_from_too_few_windows() -> None:
    state, _ = run_level([100.0, 200.0, 300.0])
    assert state.trend(20.0) is None


# ---------------------------------------------------------------- capacities and rates


def test_capacity_is_measured_where_known_and_pooled_elsewhere() -> None:
    known = {"2": Measured(capacity=400.0, n=100), "4": Measured(capacity=760.0, n=100)}
    cap = capacities(known, 8, noise_cv=0.0, z=1.28)
    assert cap[2] == pytest.approx(400.0, rel=0.02) and cap[4] == pytest.approx(760.0, rel=0.02)
    assert cap[1] <= 200.0  # no better than linear below a measured point
    assert 760.0 < cap[8] < 2 * 760.0  # sub-linear beyond, along the fitted curve
    assert (np.diff(cap[1:]) >= 0).all()


def test_one_noisy_window_at_a_new_parallelism_does_not_outweigh_the_rest() -> None:
    known = {"2": Measured(capacity=400.0, n=200), "8": Measured(capacity=1000.0, n=1)}  # truth near 1500
    cap = capacities(known, 8, noise_cv=0.1, z=1.28)
    assert cap[8] > 1100.0


def batch_window(t: float, records_per_task: float, arrival: float, backlog: int, fixed: float = 0.19,
                 per_record: float = 1 / 242, overhead: float = 0.3) -> Analysis:
    """A one-slot window of a micro-batch job whose tasks cost `fixed` + records x `per_record`
    busy seconds (the calibrated demo job's costs)."""
    busy = fixed + records_per_task * per_record
    return Analysis(job_id="j", window_end=t, parallelism=1, valid=True, true_processing_rate=records_per_task / busy,
                    true_output_rate=0.0, observed_processing_rate=arrival, utilization=0.5,
                    batch_overhead_s=overhead, batch_work_s=busy, arrival_rate=arrival, backlog=backlog, closed_at=t)


def test_small_batches_measured_before_the_correction_is_known_do_not_hold_the_capacity_down() -> None:
    # Live (cos, 2026-11-27): a job that starts at a low load measures 140-170 rec/s per slot in small
    # batches for minutes, its full batches 240. Averaged in uncorrected, those windows held the planned
    # capacity at one slot near 200 rec/s for the rest of the run.
    planner, memory = CostPlanner(), PlannerMemory()
    full = 1250.0
    truth = full / (0.19 + full / 242)
    sizes = [60, 80, 100, 120, 90, 70, 110, 100, 130, 85, 95, 105]
    for i, x in enumerate(sizes):
        memory = planner._learn(memory, batch_window(10.0 * i, x, arrival=x, backlog=50))
    assert memory.known["1"].provisional and memory.known["1"].capacity < 0.75 * truth
    memory = planner._learn(memory, batch_window(200.0, full, arrival=300.0, backlog=6000))
    assert not memory.known["1"].provisional
    for i, x in enumerate([100, 90, 120, 80, 110, 100]):
        memory = planner._learn(memory, batch_window(210.0 + 10 * i, x, arrival=x, backlog=50))
    assert memory.known["1"].capacity == pytest.approx(truth, rel=0.03)


def test_a_window_without_micro_batch_metrics_is_never_provisional() -> None:
    planner, memory = CostPlanner(), PlannerMemory()
    window = batch_window(10.0, 100, arrival=100, backlog=0).model_copy(update={"batch_overhead_s": None,
                                                                              "batch_work_s": None})
    memory = planner._learn(memory, window)
    assert not memory.known["1"].provisional
    measured = memory.known["1"]
    assert measured.learned(50.0, provisional=True) == measured  # a provisional window moves no corrected estimate
    assert measured.learned(50.0, provisional=False).n == 2


def test_a_forecast_raises_the_planned_rate_only_when_it_is_trusted() -> None:
    view = ForecastView(values=[100.0, 150.0, 200.0], upper=[110.0, 170.0, 230.0], start=60.0, step_s=60.0,
                        method="arima", wape=0.05)
    rates = planned_rates(100.0, view, 0.0, 4, 60.0)
    assert rates[0] == 100.0 and rates[-1] == pytest.approx(230.0)
    assert (planned_rates(100.0, view, 0.0, 4, 60.0, trusted=False) == 100.0).all()
    far = view.model_copy(update={"values": [300.0, 300.0, 300.0]})
    assert (planned_rates(100.0, far, 0.0, 4, 60.0) == 100.0).all()

    narrow = planned_rates(100.0, view, 0.0, 4, 60.0, band=math.log(1.05))  # errors of 5 % at most
    assert narrow[-1] == pytest.approx(200.0 * 1.05)  # the interval no wider than the errors seen


def test_the_expected_rates_follow_the_point_forecast_down_too() -> None:
    falling = ForecastView(values=[200.0, 150.0, 100.0], upper=[220.0, 180.0, 130.0], start=60.0, step_s=60.0,
                           method="arima", wape=0.05)
    assert (planned_rates(200.0, falling, 0.0, 4, 60.0) == 200.0).all()  # planned with: never below the level
    expected = planned_rates(200.0, falling, 0.0, 4, 60.0, band=0.0, floor=False)
    assert expected[0] == 200.0  # before the forecast's first point: the level
    assert expected[1:].tolist() == pytest.approx([175.0, 125.0, 100.0])  # the point forecast at the steps' middles
    assert (planned_rates(200.0, falling, 0.0, 4, 60.0, trusted=False, floor=False) == 200.0).all()


def flat_forecast(start: float, value: float, ratio: float = 1.0) -> ForecastView:
    values = [value * (1 + (ratio - 1) * i / 14) for i in range(15)]
    return ForecastView(values=values, upper=[v * 1.5 for v in values], start=start, step_s=60.0,
                        method="arima", wape=0.05)


def test_a_forecast_earns_trust_by_predicting_the_change_that_came_and_loses_it_otherwise() -> None:
    skill = ForecastSkill()
    for minute in range(14):  # it predicts no change, and none comes
        skill = note(skill, minute * 60.0, 100.0, flat_forecast(minute * 60.0 + 60, 100.0))
    assert skill.trusted() and skill.band() < 0.01
    for minute in range(14, 40):  # it predicts +50 % in 15 min, and nothing comes
        skill = note(skill, minute * 60.0, 100.0, flat_forecast(minute * 60.0 + 60, 100.0, ratio=1.5))
    assert not skill.trusted() and skill.band() > 0.2


def test_a_level_shift_takes_the_forecasts_trust_away() -> None:
    planner, config, state = CostPlanner(), JobConfig(max_parallelism=8), PlanState()
    for i in range(90):  # 15 minutes of a steady 300 rec/s, forecast right
        now = 10.0 * i
        analysis = window(now, 2, 300.0).model_copy(update={"forecast": flat_forecast(now + 60, 300.0)})
        state, _ = planner.decide(state, analysis, config)
    assert PlannerMemory.model_validate(state.policy_state).skill.trusted()
    for i in range(90, 96):
        now = 10.0 * i
        analysis = window(now, 2, 900.0).model_copy(update={"forecast": flat_forecast(now + 60, 900.0)})
        state, _ = planner.decide(state, analysis, config)
    memory = PlannerMemory.model_validate(state.policy_state)
    assert memory.level.shifts == 1 and not memory.skill.trusted()


# ---------------------------------------------------------------- the policy


def window(t: float, p: int, arrival: float, per_slot: float = 200.0, backlog: int = 0) -> Analysis:
    return Analysis(job_id="j", window_end=t, parallelism=p, valid=True, true_processing_rate=per_slot,
                    true_output_rate=per_slot, observed_processing_rate=min(arrival, per_slot * p),
                    utilization=min(1.0, arrival / (per_slot * p)), arrival_rate=arrival, backlog=backlog, closed_at=t)


def test_the_decision_shows_the_schedule_its_cost_and_the_next_best() -> None:
    planner, config, state = CostPlanner(), JobConfig(max_parallelism=8), PlanState()
    for i in range(8):
        state, plan = planner.decide(state, window(10.0 * i, 2, 300.0), config)
    assert plan.action is Action.NONE and plan.reason.code == "planned_hold"
    state, plan = planner.decide(state, window(80.0, 2, 700.0, backlog=20_000), config)
    assert plan.action is Action.NONE and plan.reason.code == "measuring_level"  # one window of the step
    assert "plan " in plan.reason.message and plan.recommended is not None and plan.recommended > 2
    state, plan = planner.decide(state, window(90.0, 2, 700.0, backlog=27_000), config)
    assert plan.action is Action.SCALE_UP and plan.reason.code == "cost_plan"
    assert plan.reason.message.startswith(f"plan {plan.to_parallelism} now")
    assert "over 30 min costs" in plan.reason.message and "next best" in plan.reason.message
    assert plan.reason.numbers["planned_rate_now"] >= 700.0  # the level restarted at the step
    numbers = plan.reason.numbers
    assert numbers["alternative_first"] != plan.to_parallelism
    assert numbers["alternative_cost_slot_s"] >= numbers["plan_cost_slot_s"]  # type: ignore[operator]


def simulated(name: str, start: int, seed: int) -> PolicyRun:
    """The planner on 2 h of a synthetic trace at a 1,400 rec/s peak, in the simulator, from `start` slots."""
    trace = load_trace(name, hours=2.0, peak=1400.0, regime="real-time", seed=seed)
    config = JobConfig(max_parallelism=12, backlog_target_s=60.0)
    return simulate(trace, demo_model(), PolicyRunner(CostPlanner(), config), config, start, 60.0, seed=seed,
                    factors=rate_factors(len(trace.rates), seed))


@pytest.mark.parametrize("seed", range(5))
def test_a_step_up_takes_one_scale_up_and_stays_within_target(seed: int) -> None:
    run = simulated("step-up", 2, seed)
    assert run.scale_ups == 1 and run.beyond_target_s == 0
    assert run.timeline.parallelism[-1] >= math.ceil(1400 / 215)


def test_after_a_rescale_it_measures_before_it_plans_again_unless_the_backlog_runs_away() -> None:
    planner, config = CostPlanner(), JobConfig(max_parallelism=8, stabilization_windows=0)
    state = PlanState()
    for i in range(8):
        state, plan = planner.decide(state, window(10.0 * i, 2, 300.0), config)
    state, plan = planner.decide(state, window(80.0, 4, 300.0), config)  # the job now runs at 4
    assert plan.action is Action.NONE and plan.reason.code == "measuring"
    state, plan = planner.decide(state, window(90.0, 4, 300.0), config)
    assert plan.reason.code == "measuring"
    state, plan = planner.decide(state, window(100.0, 4, 300.0), config)
    assert plan.reason.code == "cost_plan" and plan.to_parallelism == 2  # three windows measured: back down
    state, plan = planner.decide(state, window(110.0, 2, 300.0), config)
    state, plan = planner.decide(state, window(120.0, 2, 1500.0, backlog=200_000), config)
    assert plan.action is Action.SCALE_UP  # heading beyond the target: no waiting


@pytest.mark.parametrize("seed", range(3))
def test_a_drop_takes_no_scale_up(seed: int) -> None:
    run = simulated("drop", 8, seed)
    assert run.scale_ups == 0 and run.scale_downs >= 1 and run.beyond_target_s == 0
    assert run.timeline.parallelism[-1] <= 3


def expected_now(rates: list[float]) -> tuple[float, float]:
    """The arrival rate a recovery prediction starts from after these windows, and the level's mean."""
    planner, config, state = CostPlanner(), JobConfig(max_parallelism=8), PlanState()
    for i, rate in enumerate(rates):
        state, _ = planner.decide(state, window(10.0 * i, 2, rate), config)
    memory, last = PlannerMemory.model_validate(state.policy_state), window(10.0 * (len(rates) - 1), 2, rates[-1])
    problem = planner.problem(memory, last, config, state, quantiles=False)
    assert problem is not None
    values, _ = planner.expected_rates(memory, last, problem)
    return values[0], memory.level.level() or 0.0


def test_a_recovery_is_predicted_from_the_rate_now_on_a_ramp_and_a_step() -> None:
    """On a ramp the level (restarted at each shift it fires) lags; across a step the trend line does:
    the prediction starts from whichever is further along the change."""
    ramp = [100.0 + 20.0 * i for i in range(20)]  # 2 rec/s per second
    now, level = expected_now(ramp)
    assert now == pytest.approx(ramp[-1], rel=0.03) and level < now - 20
    falling = ramp[::-1]
    now, level = expected_now(falling)
    assert now == pytest.approx(falling[-1], rel=0.1) and level >= now
    step = [300.0] * 10 + [900.0] * 2
    now, _ = expected_now(step)
    assert now == pytest.approx(900.0, rel=0.01)
    steady = [300.0 * f for f in np.random.default_rng(5).lognormal(0, 0.03, 12)]
    now, level = expected_now(steady)
    assert now == pytest.approx(level, rel=0.05)


def test_the_jobs_limits_hold_and_a_rescale_carries_its_predicted_recovery() -> None:
    def scale_up(config: JobConfig) -> tuple[PlanState, Plan]:
        planner, state = CostPlanner(), PlanState()
        for i in range(8):
            state, _ = planner.decide(state, window(10.0 * i, 2, 300.0), config)
        state, _ = planner.decide(state, window(80.0, 2, 1500.0, backlog=8_000), config)  # the new level's first
        return planner.decide(state, window(90.0, 2, 1500.0, backlog=20_000), config)

    state, plan = scale_up(JobConfig(max_parallelism=12))
    assert plan.action is Action.SCALE_UP and plan.to_parallelism >= 8
    predicted = plan.reason.numbers["predicted_recovery_s"]
    assert predicted is not None
    # A prediction of what will be observed: the point estimates of capacity and arrivals, not the
    # quantiles the plan keeps the target with (those would predict a slower recovery).
    memory, last = PlannerMemory.model_validate(state.policy_state), window(90.0, 2, 1500.0, backlog=20_000)
    config = JobConfig(max_parallelism=12)
    point = CostPlanner().problem(memory, last, config, state, quantiles=False)
    cautious = CostPlanner().problem(memory, last, config, state)
    assert point is not None and cautious is not None
    to = plan.to_parallelism
    assert predicted == pytest.approx(predicted_recovery_s(
        last, config, to, state.downtimes, lambda p: float(point.capacity[p]), rates=(point.rates, point.step_s)))
    slower = predicted_recovery_s(last, config, to, state.downtimes, lambda p: float(cautious.capacity[p]),
                                  rates=(cautious.rates, cautious.step_s))
    assert slower is None or slower > predicted  # here None: no recovery within the search at all
    assert state.pending_recovery is not None and state.rescale_decided_at == 90.0
    _, plan = scale_up(JobConfig(max_parallelism=12, max_scale_up_factor=1.0))
    assert plan.to_parallelism == 4 and "max_scale_up_factor" in plan.reason.message
    _, plan = scale_up(JobConfig(max_parallelism=12, excluded_periods="00:00-24:00"))
    assert plan.action is Action.NONE and plan.reason.code == "excluded_period"
    assert plan.recommended >= 8


def test_in_recommend_mode_noise_does_not_flip_the_recommendation() -> None:
    """8 slots of 250 rec/s at 1,400 rec/s, both jittered 5 %: 6 slots carry it with 7 % to spare, near the
    estimates' margin. The recommendation settles on one size and stays there."""
    rng = np.random.default_rng(11)
    planner, config, state = CostPlanner(), JobConfig(mode=Mode.RECOMMEND), PlanState()
    wanted = []
    for i in range(180):
        rate, per_slot = 1400 * (1 + rng.normal(0, 0.05)), 250 * (1 + rng.normal(0, 0.05))
        analysis = window(10.0 * i, 8, rate, per_slot=per_slot, backlog=int(abs(rng.normal(0, 0.5)) * rate))
        state, plan = planner.decide(state, analysis, config)
        if plan.action is not Action.NONE:
            wanted.append(plan.to_parallelism)
    assert len(wanted) >= 170 and set(wanted[5:]) == {6}, wanted


def test_a_micro_batch_jobs_fixed_cost_per_batch_takes_its_share_of_the_planned_capacity() -> None:
    """Full batches of 4 s of work per slot and 1 s of overhead each: a saturated job does 80 % of what
    its DS2 rate says. The planner learns both from the windows and plans with 80 %."""
    planner, config = CostPlanner(), JobConfig(max_parallelism=8)
    plain, batched = PlanState(), PlanState()
    for i in range(8):
        saturated = window(10.0 * i, 2, 300.0, backlog=30_000)
        plain, _ = planner.decide(plain, saturated, config)
        batched, _ = planner.decide(batched, saturated.model_copy(update={"batch_overhead_s": 1.0,
                                                                          "batch_work_s": 4.0}), config)
    now = window(80.0, 2, 300.0)
    memory = PlannerMemory.model_validate(batched.policy_state)
    assert memory.batch is not None and memory.batch.efficiency == pytest.approx(0.8)
    with_batches = planner.problem(memory, now, config, batched)
    without = planner.problem(PlannerMemory.model_validate(plain.policy_state), now, config, plain)
    assert with_batches is not None and without is not None
    assert with_batches.capacity[1:] == pytest.approx(0.8 * without.capacity[1:])
    # Below saturation a batch's work says nothing about a full one: the overhead alone costs latency.
    light = PlanState()
    for i in range(8):
        light, _ = planner.decide(light, window(10.0 * i, 2, 300.0).model_copy(
            update={"batch_overhead_s": 1.0, "batch_work_s": 0.3}), config)
    light_memory = PlannerMemory.model_validate(light.policy_state)
    assert light_memory.batch is not None and light_memory.batch.efficiency == 1.0


def test_a_scale_up_is_not_reversed_until_the_load_drops_or_the_delay_passes() -> None:
    planner, config = CostPlanner(), JobConfig(max_parallelism=12, scale_down_delay_s=300.0)
    state, t = PlanState(), 0.0
    for _ in range(8):
        state, plan = planner.decide(state, window(t, 2, 300.0), config)
        t += 10.0
    state, plan = planner.decide(state, window(t, 2, 1000.0, backlog=10_000), config)
    assert plan.reason.code == "measuring_level"
    t += 10.0
    state, plan = planner.decide(state, window(t, 2, 1000.0, backlog=20_000), config)
    assert plan.action is Action.SCALE_UP
    up, t_up = plan.to_parallelism, t
    # At the new parallelism each slot turns out faster than planned: fewer slots would do.
    codes = []
    for _ in range(8):
        t += 10.0
        state, plan = planner.decide(state, window(t, up, 1000.0, per_slot=400.0), config)
        codes.append(plan.reason.code)
        assert plan.action is not Action.SCALE_DOWN, codes
    assert "scale_down_delayed" in codes and "scaled up" in plan.reason.message
    # The load drops: a level shift, and the scale-down goes ahead at once.
    for _ in range(12):
        t += 10.0
        state, plan = planner.decide(state, window(t, up, 200.0, per_slot=400.0), config)
        if plan.action is Action.SCALE_DOWN:
            break
    assert plan.action is Action.SCALE_DOWN and t - t_up < 300.0  # before the delay had passed


def test_a_drop_is_measured_for_two_windows_before_the_one_scale_down() -> None:
    planner, config = CostPlanner(), JobConfig(max_parallelism=12)
    state, t = PlanState(), 0.0
    for _ in range(10):
        state, plan = planner.decide(state, window(t, 6, 1000.0), config)
        t += 10.0
    # The first window straddles the drop (half of it at the old rate), then the new level.
    state, plan = planner.decide(state, window(t, 6, 600.0), config)
    assert plan.action is Action.NONE and plan.reason.code == "measuring_level"
    downs = []
    for _ in range(3):
        t += 10.0
        state, plan = planner.decide(state, window(t, 6, 200.0), config)
        if plan.action is Action.SCALE_DOWN:
            downs.append(plan.to_parallelism)
    assert downs and downs[0] <= 2  # straight to the new level's size, not to the straddling window's


def test_a_fixed_task_count_runs_in_waves_and_the_plan_never_pays_for_an_idle_slot() -> None:
    """In place, the query runs 4 tasks whatever its executors: on 3 they take two waves, as on 2. A step
    that 3 busy slots would carry (520 rec/s at 230 per slot) needs 4; without the task count the
    planner chooses 3."""
    capacity = np.array([0.0, 230.0, 460.0, 690.0, 920.0])
    assert list(in_waves(capacity, [4])) == [0.0, 230.0, 460.0, 460.0, 920.0]
    assert list(in_waves(capacity, [])) == list(capacity)
    eight = in_waves(np.arange(9.0), [8])
    assert list(eight[5:8]) == [4.0, 4.0, 4.0] and eight[3] == pytest.approx(8 / 3)
    assert list(in_waves(capacity, [4, 2])) == [0.0, 230.0, 460.0, 460.0, 460.0]  # the slowest stage bounds

    def first_scale_up(tasks: int | None) -> int:
        planner, config, state = CostPlanner(), JobConfig(max_parallelism=4), PlanState()
        for i in range(8):
            state, plan = planner.decide(state, window(10.0 * i, 1, 150.0, per_slot=230.0).model_copy(
                update={"shuffle_partitions": tasks}), config)
        for i, backlog in enumerate((3_000, 5_000, 7_000)):
            state, plan = planner.decide(state, window(80.0 + 10 * i, 1, 520.0, per_slot=230.0, backlog=backlog)
                                         .model_copy(update={"shuffle_partitions": tasks}), config)
            if plan.action is Action.SCALE_UP:
                return plan.to_parallelism
        raise AssertionError("no scale-up at the step")

    assert first_scale_up(None) == 3
    assert first_scale_up(4) == 4
