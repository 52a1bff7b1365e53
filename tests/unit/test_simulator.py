"""The one simulator (evaluation/simulator.py): the job model under a policy, window by window. Pure."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.analyses import Analysis
from contracts.jobs import JobConfig
from evaluation.jobmodel import EPOCH, JobModel, Operator
from evaluation.simulator import PolicyRunner, simulate
from evaluation.traces import Trace
from plan.policies.reactive import ReactivePolicy
from plan.policies.threshold import ThresholdPolicy

W = 10.0
CONFIG = JobConfig(max_parallelism=32)


def model(per_slot: float = 100.0, downtime: float = 20.0, checkpoint: float = 0.0) -> JobModel:
    return JobModel((Operator("job", per_slot),), checkpoint_interval_s=checkpoint, downtime_up_s=downtime,
                    downtime_down_s=downtime)


def trace(*rates: float, windows: int | None = None) -> Trace:
    values = np.array(rates if windows is None else [rates[0]] * windows, dtype=float)
    return Trace("test", values, W, "test load")


class Script:
    """Answers with a fixed parallelism at given window ends (simulated seconds); records its calls."""

    name = "script"

    def __init__(self, plan: dict[float, int] | None = None, while_rescaling: int | None = None) -> None:
        self.plan = plan or {}
        self.while_rescaling = while_rescaling
        self.calls: list[tuple[float, bool, Analysis]] = []
        self.completed: list[tuple[int, int, float, float]] = []

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        t = analysis.window_end - EPOCH
        self.calls.append((t, rescaling, analysis))
        return self.while_rescaling if rescaling else self.plan.get(t)

    def on_rescaled(self, from_parallelism: int, to_parallelism: int, downtime_s: float, completed_at: float,
                    backend: str | None = None) -> None:
        self.completed.append((from_parallelism, to_parallelism, downtime_s, completed_at - EPOCH))

    def planned_capacity(self, analysis: Analysis) -> float | None:
        return None


def run(load: Trace, policy: object, p0: int, job: JobModel | None = None, noise: float = 0.0):  # type: ignore[no-untyped-def]
    return simulate(load, job or model(), policy, CONFIG, p0, backlog_target_s=60.0, rate_noise=noise)  # type: ignore[arg-type]


def test_enough_slots_keep_the_backlog_at_zero() -> None:
    result = run(trace(1000.0, windows=30), Script(), 12)
    assert max(result.timeline.backlog) == 0 and result.beyond_target_s == 0 and result.lag_max_s == 0
    assert result.records_arrived == 300_000 and result.final_backlog == 0
    assert math.isclose(result.mean_utilization, 1000 / 1200)
    assert result.actions == 0 and result.slot_seconds == 12 * 300


def test_too_few_slots_grow_the_backlog_linearly() -> None:
    result = run(trace(1000.0, windows=20), Script(), 8)
    # 1,000 arrive and 800 are processed each second.
    assert np.allclose(result.timeline.backlog, 2000 * np.arange(1, 21))
    assert math.isclose(result.mean_utilization, 1.0)
    # Beyond the 60 s target once the backlog exceeds 60,000 records: the windows from 310 s on... of 200 s none.
    assert result.beyond_target_s == 0 and result.lag_max_s == pytest.approx(40.0)


def test_a_job_started_after_its_load_finds_a_backlog_and_pays_from_its_start() -> None:
    script = Script()
    result = simulate(trace(1000.0, windows=30), model(), script, CONFIG, 12, backlog_target_s=60.0,  # type: ignore[arg-type]
                      rate_noise=0.0, start_s=25.0)
    # 25 s of arrivals wait (10-s windows); then 1,200/s drain them at 200/s net.
    assert np.allclose(result.timeline.backlog[:4], [10_000, 20_000, 24_000, 22_000])
    assert result.timeline.backlog[-1] == 0 and result.records_arrived == 300_000
    assert result.slot_seconds == pytest.approx(12 * (300 - 25))
    assert script.calls[0][0] == 30.0  # the first window with a report: the one the job started in
    assert result.lag_max_s == pytest.approx(24.0)  # from the window the job started in


def test_a_restart_stops_processing_for_exactly_the_downtime_and_pays_the_new_slots() -> None:
    # Both reports of a window fall in it: the decision on the window labelled 100 s is taken at 100 s.
    policy = Script({100.0: 15})
    result = run(trace(1000.0, windows=30), policy, 12)
    assert (result.scale_ups, result.scale_downs) == (1, 0)
    # Stopped from 100 s to 120 s: 20,000 records pile up, then drain at 1,500 - 1,000 rec/s.
    assert result.timeline.backlog[9:13] == pytest.approx([0, 10_000, 20_000, 15_000])
    assert policy.completed == [(12, 15, 20.0, 120.0)]
    # The restart's slots are paid at the new parallelism.
    assert result.slot_seconds == 12 * 100 + 15 * 200
    assert result.final_backlog == pytest.approx(0)


def in_place(per_slot: float = 100.0, ramp: float = 15.0, hold: float = 2.0, checkpoint: float = 5.0) -> JobModel:
    return JobModel((Operator("job", per_slot),), checkpoint_interval_s=checkpoint, downtime_up_s=20.0,
                    downtime_down_s=20.0, in_place=True, ramp_up_s=ramp, hold_down_s=hold)


def test_an_in_place_scale_up_runs_at_the_old_capacity_until_its_executors_registered_and_replays_nothing() -> None:
    policy = Script({100.0: 15})
    result = run(trace(*[1000.0] * 10, *[1400.0] * 20), policy, 12, in_place())
    # The load steps up at 100 s. Until 115 s the 12 old slots run (1,200/s against 1,400/s): 3,000 records wait, then
    # 1,500/s drain them at 100/s net. No pause, no replay (a restart would stop 20 s and replay its checkpoint).
    assert result.timeline.backlog[9:13] == pytest.approx([0, 2_000, 2_500, 1_500])
    assert result.timeline.backlog[-1] == pytest.approx(0) and result.final_backlog == pytest.approx(0)
    assert policy.completed == [(12, 15, 15.0, 115.0)]  # what execute records: the time to new capacity
    assert result.slot_seconds == 12 * 100 + 15 * 200  # the new executors are paid from the request on
    # The reporter learns the new parallelism once they registered: the windows of the ramp report the old one.
    reported = {t: a.parallelism for t, _, a in policy.calls}
    assert (reported[110.0], reported[120.0]) == (12, 15)
    # Every window is reported (nothing stopped), and the policy is told a rescale is in flight meanwhile.
    assert [t for t, rescaling, _ in policy.calls if rescaling] == [110.0]


def test_an_in_place_scale_down_stops_processing_only_for_its_hold() -> None:
    policy = Script({100.0: 8})
    result = run(trace(700.0, windows=20), policy, 12, in_place(hold=2.0))
    # 2 s held: 1,400 records wait, then 800/s drain them at 100/s net.
    assert result.timeline.backlog[9:11] == pytest.approx([0, 1_400 - 800])
    assert policy.completed == [(12, 8, 2.0, 102.0)]
    assert result.slot_seconds == 12 * 100 + 8 * 100


def test_no_window_closes_while_the_job_is_stopped_and_the_next_one_follows_the_restart() -> None:
    policy = Script({100.0: 15, 130.0: 20}, while_rescaling=30)
    result = run(trace(1000.0, windows=20), policy, 12)
    labels = [t for t, _, _ in policy.calls]
    # No reports from 100 s to 120 s: no window labelled 110 or 120; the restart ended before the next.
    assert 100.0 in labels and 110.0 not in labels and 120.0 not in labels and 130.0 in labels
    assert not any(rescaling for _, rescaling, _ in policy.calls) and result.ignored_decisions == 0
    # Once the restart completed, an answer is a rescale again.
    assert (result.scale_ups, result.scale_downs) == (2, 0)
    assert [(a, b) for a, b, _, _ in policy.completed] == [(12, 15), (15, 20)]


def test_windows_are_analyzed_as_the_pipeline_does() -> None:
    policy = Script()
    run(trace(1000.0, windows=10), policy, 10)
    steady = next(a for t, _, a in policy.calls if t == 50.0)
    assert steady.valid and steady.parallelism == 10
    assert math.isclose(steady.true_processing_rate, 100.0) and math.isclose(steady.utilization, 1.0)
    assert steady.arrival_rate == 1000 and steady.backlog == 0  # fully busy, but keeping up


@settings(max_examples=40, deadline=None)
@given(
    rates=st.lists(st.floats(0, 3000, allow_nan=False), min_size=2, max_size=40),
    per_slot=st.floats(20, 500),
    noise=st.floats(0, 0.5),
    p0=st.integers(1, 20),
    downtime=st.sampled_from([0.0, 3.0, 7.5, 20.0, 45.0]),
    plan=st.dictionaries(st.integers(1, 40).map(lambda k: 10.0 * k), st.integers(1, 30), max_size=6),
)
def test_records_are_conserved(
    rates: list[float], per_slot: float, noise: float, p0: int, downtime: float, plan: dict[float, int]
) -> None:
    result = run(trace(*rates), Script(plan), p0, model(per_slot, downtime), noise)
    assert math.isclose(result.records_arrived, sum(rates) * W, rel_tol=1e-9)
    assert min(result.timeline.backlog) >= 0  # round-off never leaves a negative backlog
    assert 0 <= result.mean_utilization <= 1 + 1e-9
    paid = sum(p * W for p in result.timeline.parallelism)
    assert result.slot_seconds == pytest.approx(paid)


# ---------------------------------------------------------------- registry policies through the planner step


def window(utilization: float, parallelism: int, window_end: float = EPOCH + 1000, **extra: object) -> Analysis:
    fields: dict[str, object] = {
        "job_id": "eval", "window_end": window_end, "parallelism": parallelism, "valid": True,
        "true_processing_rate": 100.0, "true_output_rate": 100.0,
        "observed_processing_rate": 100.0 * utilization * parallelism, "utilization": utilization,
        "arrival_rate": 100.0 * utilization * parallelism, "backlog": 0, "closed_at": window_end,
    }
    return Analysis.model_validate(fields | extra)


def verdict(analysis: Analysis) -> int | None:
    """What a fresh job's loop sends it to: the threshold policy's plan, executed."""
    return PolicyRunner(ThresholdPolicy(), CONFIG).decide(analysis, rescaling=False)


def test_threshold_scales_only_outside_its_band_to_the_midpoint() -> None:
    assert verdict(window(0.9, 4)) == 6  # ceil(4 x 0.9 / 0.65)
    assert verdict(window(0.8, 4)) is None
    assert verdict(window(0.5, 10)) is None
    assert verdict(window(0.3, 10)) == 5  # ceil(10 x 0.3 / 0.65)
    assert verdict(window(1.0, 30)) == 32  # bounded
    assert verdict(window(0.95, 4, valid=False, invalid_reason="x")) is None


def test_one_rescale_at_a_time_while_execute_holds_the_lock() -> None:
    policy = PolicyRunner(ThresholdPolicy(), CONFIG)
    assert policy.decide(window(0.9, 4, window_end=EPOCH + 10), rescaling=False) == 6
    assert policy.loop.rescaling
    assert policy.decide(window(0.95, 4, window_end=EPOCH + 20), rescaling=True) is None
    assert policy.reasons["rescale_in_progress"] == 1
    policy.on_rescaled(4, 6, 20.0, completed_at=EPOCH + 30)
    assert not policy.loop.rescaling
    assert [e.type.value for e in policy.loop.events] == ["started", "completed"]


def test_threshold_waits_five_minutes_after_a_completed_rescale() -> None:
    policy = PolicyRunner(ThresholdPolicy(), CONFIG)
    assert policy.decide(window(0.9, 4, window_end=EPOCH + 990), rescaling=False) == 6
    policy.on_rescaled(4, 6, 20.0, completed_at=EPOCH + 1000)
    assert policy.decide(window(0.95, 6, window_end=EPOCH + 1299), rescaling=False) is None
    assert policy.decide(window(0.95, 6, window_end=EPOCH + 1300), rescaling=False) == 9


def test_threshold_in_the_simulator_scales_up_once_then_stabilizes() -> None:
    # 95 % on 10 slots: up to ceil(10 x 0.95 / 0.65) = 15 at the first window.
    result = run(trace(950.0, windows=100), PolicyRunner(ThresholdPolicy(), CONFIG), 10)
    # 950 / 1,500 = 63 %: inside the band, no further action.
    assert (result.scale_ups, result.scale_downs) == (1, 0) and result.timeline.parallelism[-1] == 15


def test_the_default_policy_keeps_up_with_a_step_and_records_what_execute_records() -> None:
    load = trace(*([500.0] * 60 + [1500.0] * 180))
    policy = PolicyRunner(ReactivePolicy(), JobConfig(target_utilization=0.7, max_parallelism=32))
    result = run(load, policy, 8)
    assert result.scale_ups >= 1 and result.ignored_decisions == 0
    assert result.timeline.parallelism[-1] * 100 >= 1500  # keeps up at the end
    assert result.final_backlog < 10 * 1500
    actions = result.scale_ups + result.scale_downs
    assert policy.state.downtimes.up + policy.state.downtimes.down == [20.0] * actions
    assert policy.state.parallelism == result.timeline.parallelism[-1]
    # The windows at the new parallelism arrived: nothing stale is expected any more.
    assert policy.state.expected_parallelism is None and policy.state.last_rescale_at is not None
