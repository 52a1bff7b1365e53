"""The diurnal simulator (evaluation/ticks.py) and its baseline policies (evaluation/baselines.py): pure."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.jobs import JobConfig
from contracts.messages import Analysis
from evaluation.baselines import OurPolicy, ThresholdPolicy
from evaluation.ticks import (
    EPOCH,
    SimConfig,
    Workload,
    interpolate_rows,
    make_workload,
    oracle,
    simulate,
)


def constant(rate: float, ticks: int, per_slot: float = 100.0) -> Workload:
    return make_workload(np.full(ticks, rate), per_slot)


class Script:
    """Answers with a fixed parallelism at given window ends (simulated seconds); records its calls."""

    name = "script"

    def __init__(self, plan: dict[float, int] | None = None, while_rescaling: int | None = None) -> None:
        self.plan = plan or {}
        self.while_rescaling = while_rescaling
        self.calls: list[tuple[float, bool, Analysis]] = []
        self.completed: list[tuple[int, float, float]] = []

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        t = analysis.window_end - EPOCH
        self.calls.append((t, rescaling, analysis))
        return self.while_rescaling if rescaling else self.plan.get(t)

    def on_rescaled(self, to_parallelism: int, downtime_s: float, completed_at: float) -> None:
        self.completed.append((to_parallelism, downtime_s, completed_at - EPOCH))


def window(utilization: float, parallelism: int, window_end: float = EPOCH + 1000, **extra: object) -> Analysis:
    fields: dict[str, object] = {
        "job_id": "sim", "window_end": window_end, "parallelism": parallelism, "valid": True,
        "true_processing_rate": 100.0, "true_output_rate": 100.0,
        "observed_processing_rate": 100.0 * utilization * parallelism, "utilization": utilization,
        "arrival_rate": 100.0 * utilization * parallelism, "backlog": 0, "closed_at": window_end,
    }
    return Analysis.model_validate(fields | extra)


# ---------------------------------------------------------------- the job model


def test_enough_slots_keep_the_backlog_at_zero() -> None:
    result = simulate(constant(1000, 300), Script(), SimConfig(initial_parallelism=12))
    m = result.metrics
    assert result.backlog.max() == 0 and m.lag_slo_violation_s == 0 and m.max_backlog_s == 0
    assert m.records_processed == m.records_arrived == 300_000
    assert math.isclose(m.mean_utilization, 1000 / 1200)
    assert m.scale_ups == m.scale_downs == 0 and m.downtime_s == 0


def test_too_few_slots_grow_the_backlog_linearly() -> None:
    result = simulate(constant(1000, 200), Script(), SimConfig(initial_parallelism=8, lag_slo_s=10))
    # 1,000 arrive and 800 are processed each second.
    assert np.allclose(result.backlog, 200 * np.arange(1, 201))
    assert math.isclose(result.metrics.mean_utilization, 1.0)
    # Over the SLO once the backlog exceeds 10 s of arrivals (10,000 records): after tick 50.
    assert result.metrics.lag_slo_violation_s == 150
    assert math.isclose(result.metrics.max_backlog_s, 40.0)


def test_a_restart_stops_processing_for_exactly_the_downtime() -> None:
    policy = Script({100.0: 15})
    result = simulate(constant(1000, 300), policy, SimConfig(initial_parallelism=12, restart_downtime_s=20))
    assert [(r.at_s, r.from_parallelism, r.to_parallelism) for r in result.rescales] == [(100.0, 12, 15)]
    assert (result.processed[100:120] == 0).all()
    assert result.processed[99] == 1000 and result.processed[120] == 1500  # drains at full speed
    assert math.isclose(result.backlog[119], 20_000)
    assert policy.completed == [(15, 20.0, 120.0)]
    m = result.metrics
    assert m.downtime_s == 20 and m.scale_ups == 1 and m.scale_downs == 0
    # The restart's slots are paid at the new parallelism.
    assert m.core_seconds == 12 * 100 + 15 * 200
    assert m.records_processed == m.records_arrived == 300_000 and m.final_backlog == 0


def test_the_policy_is_asked_during_a_restart_and_must_hold() -> None:
    policy = Script({100.0: 15})
    simulate(constant(1000, 200), policy, SimConfig(initial_parallelism=12, restart_downtime_s=20))
    during = [(t, a.valid) for t, rescaling, a in policy.calls if rescaling]
    assert during == [(110.0, False)]  # no reports while stopped: an invalid window

    eager = Script({100.0: 15, 130.0: 20}, while_rescaling=30)
    result = simulate(constant(1000, 200), eager, SimConfig(initial_parallelism=12, restart_downtime_s=20))
    assert result.metrics.ignored_decisions == 2  # one window boundary inside each restart
    # Once the restart completed, an answer is a rescale again.
    assert [(r.at_s, r.to_parallelism) for r in result.rescales] == [(100.0, 15), (130.0, 20)]


def test_windows_are_analyzed_as_the_pipeline_does() -> None:
    policy = Script({100.0: 15})
    simulate(constant(1000, 200), policy, SimConfig(initial_parallelism=10, restart_downtime_s=20))
    steady = next(a for t, _, a in policy.calls if t == 50.0)
    assert steady.valid and steady.parallelism == 10
    assert math.isclose(steady.true_processing_rate, 100.0) and math.isclose(steady.utilization, 1.0)
    assert steady.arrival_rate == 1000 and steady.backlog == 0  # fully busy, but keeping up
    after = [(t, a.parallelism, a.valid) for t, rescaling, a in policy.calls if t >= 110 and not rescaling]
    # The window holding the one report sent before the stop closes only when the first report
    # after the restart arrives (a stale window at 10), then windows at 15.
    assert after[:3] == [(110.0, 10, True), (130.0, 15, True), (140.0, 15, True)]
    stale = next(a for t, rescaling, a in policy.calls if t == 110.0 and not rescaling)
    assert math.isclose(stale.true_processing_rate, 100.0)


def test_a_restart_shorter_than_a_window_leaves_a_mixed_invalid_window() -> None:
    policy = Script({100.0: 15})
    simulate(constant(1000, 200), policy, SimConfig(initial_parallelism=10, restart_downtime_s=5))
    mixed = next(a for t, _, a in policy.calls if t == 110.0)
    assert not mixed.valid and "parallelism changed" in (mixed.invalid_reason or "")


def test_core_seconds_and_utilization_account_for_every_tick() -> None:
    rates = np.concatenate([np.full(100, 500.0), np.full(100, 1500.0)])
    result = simulate(make_workload(rates, 100.0), Script({150.0: 20}), SimConfig(initial_parallelism=10))
    assert result.metrics.core_seconds == float(result.parallelism.sum()) == 10 * 150 + 20 * 50
    busy = result.processed.sum() / 100.0
    assert math.isclose(result.metrics.mean_utilization, busy / result.metrics.core_seconds)


@settings(max_examples=40, deadline=None)
@given(
    rates=st.lists(st.floats(0, 3000, allow_nan=False), min_size=20, max_size=250),
    per_slot=st.floats(20, 500),
    noise=st.floats(0, 0.5),
    p0=st.integers(1, 20),
    downtime=st.sampled_from([0.0, 3.0, 7.5, 20.0, 45.0]),
    plan=st.dictionaries(st.integers(1, 25).map(lambda k: 10.0 * k), st.integers(1, 30), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_records_are_conserved(
    rates: list[float], per_slot: float, noise: float, p0: int, downtime: float, plan: dict[float, int], seed: int
) -> None:
    workload = make_workload(np.array(rates), per_slot, noise, seed)
    result = simulate(workload, Script(plan), SimConfig(initial_parallelism=p0, restart_downtime_s=downtime))
    m = result.metrics
    assert math.isclose(m.records_arrived, m.records_processed + m.final_backlog, rel_tol=1e-9, abs_tol=1e-6)
    assert (result.backlog >= 0).all()
    # Never more than the slots paid for can process.
    assert (result.processed <= result.parallelism * workload.slot_rates * workload.dt * (1 + 1e-12)).all()
    assert m.core_seconds == float(result.parallelism.sum())
    # A restart still running at the end has not been counted yet.
    assert m.downtime_s in (downtime * len(result.rescales), downtime * max(0, len(result.rescales) - 1))
    assert 0 <= m.mean_utilization <= 1 + 1e-9


def test_noise_is_seeded_and_mean_preserving() -> None:
    a = make_workload(np.full(20_000, 100.0), 200.0, rate_noise=0.1, seed=7)
    b = make_workload(np.full(20_000, 100.0), 200.0, rate_noise=0.1, seed=7)
    assert np.array_equal(a.slot_rates, b.slot_rates)
    assert abs(a.slot_rates.mean() / 200.0 - 1) < 0.01 and a.slot_rates.std() > 10


def test_oracle_takes_the_fewest_slots_each_tick() -> None:
    workload = make_workload(np.array([1000.0, 1001.0, 0.0]), 100.0)
    assert list(oracle(workload).parallelism) == [10, 11, 1]
    assert oracle(workload).metrics.core_seconds == 22
    assert list(oracle(workload, 0.7).parallelism) == [15, 15, 1]


def test_trace_rows_are_interpolated_per_second() -> None:
    rates = interpolate_rows(np.array([0.0, 60.0]), row_seconds=60)
    assert len(rates) == 120
    assert math.isclose(rates[0], 0.5) and math.isclose(rates[59], 59.5) and rates[60:].max() == 60


# ---------------------------------------------------------------- the threshold baseline


def test_threshold_scales_only_outside_its_band_to_the_midpoint() -> None:
    policy = ThresholdPolicy()
    assert policy.decide(window(0.9, 4), rescaling=False) == 6  # ceil(4 x 0.9 / 0.65)
    assert policy.decide(window(0.8, 4), rescaling=False) is None
    assert policy.decide(window(0.5, 10), rescaling=False) is None
    assert policy.decide(window(0.3, 10), rescaling=False) == 5  # ceil(10 x 0.3 / 0.65)
    assert policy.decide(window(1.0, 30), rescaling=False) == 32  # bounded
    assert policy.decide(window(0.95, 4), rescaling=True) is None
    assert policy.decide(window(0.95, 4, valid=False, invalid_reason="x"), rescaling=False) is None


def test_threshold_waits_five_minutes_after_a_completed_rescale() -> None:
    policy = ThresholdPolicy()
    policy.on_rescaled(6, 20.0, completed_at=EPOCH + 1000)
    assert policy.decide(window(0.95, 6, window_end=EPOCH + 1299), rescaling=False) is None
    assert policy.decide(window(0.95, 6, window_end=EPOCH + 1300), rescaling=False) == 9


def test_threshold_in_the_simulator_scales_up_once_then_stabilizes() -> None:
    # 95 % on 10 slots: up to ceil(10 x 0.95 / 0.65) = 15 at the first settled window.
    rates = np.full(1000, 950.0)
    policy = ThresholdPolicy()
    result = simulate(make_workload(rates, 100.0), policy, SimConfig(initial_parallelism=10, restart_downtime_s=20))
    first = result.rescales[0]
    assert (first.at_s, first.from_parallelism, first.to_parallelism) == (10.0, 10, 15)
    # 950 / 1,500 = 63 %: inside the band, no further action.
    assert len(result.rescales) == 1 and result.metrics.scale_ups == 1


def test_threshold_stabilization_holds_a_second_action_for_300_s() -> None:
    # Load jumps again right after the first scale-up: the second must wait 300 s after completion.
    rates = np.concatenate([np.full(100, 950.0), np.full(900, 2500.0)])
    result = simulate(make_workload(rates, 100.0), ThresholdPolicy(), SimConfig(initial_parallelism=10))
    first, second = result.rescales[:2]
    assert first.at_s == 10.0
    completed = first.at_s + 20
    assert second.at_s >= completed + 300 and second.at_s <= completed + 300 + 20


# ---------------------------------------------------------------- our planner, adapted


def test_our_policy_keeps_up_with_a_step_and_records_what_execute_records() -> None:
    rates = np.concatenate([np.full(600, 500.0), np.full(1800, 1500.0)])
    policy = OurPolicy(JobConfig(target_utilization=0.7, max_parallelism=32))
    result = simulate(make_workload(rates, 100.0), policy, SimConfig(initial_parallelism=8, restart_downtime_s=20))
    assert result.metrics.scale_ups >= 1 and result.metrics.ignored_decisions == 0
    assert result.parallelism[-1] * 100 >= 1500  # keeps up at the end
    assert result.backlog[-1] < 10 * 1500
    assert policy.downtimes == [20.0] * len(result.rescales)
    assert policy.restart_time_s() == 20.0
    assert policy.state["parallelism"] == result.rescales[-1].to_parallelism
