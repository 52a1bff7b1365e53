"""The Flink-Kubernetes-Operator-style baseline (plan/policies/flink.py): each rule, and its bounds."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.jobs import JobConfig
from contracts.plan_state import Direction
from evaluation.jobmodel import EPOCH, JobModel, Operator
from evaluation.loop import JobLoop
from evaluation.simulator import PolicyRunner, simulate
from evaluation.traces import Trace
from knowledge.memory import run_now
from plan.policies.flink import FlinkMemory, FlinkPolicy, align_to_partitions

WINDOW_S = 10.0


def window(
    t: float, *, parallelism: int = 2, utilization: float = 1.0, arrival: float | None = 280.0, backlog: int = 0,
    true_rate: float = 100.0, **extra: object,
) -> Analysis:
    """One closed window ending at simulated second `t`; `true_rate` is records/s per slot at 100 % busy."""
    observed = true_rate * utilization * parallelism
    fields: dict[str, object] = {
        "job_id": "sim", "window_end": EPOCH + t, "parallelism": parallelism, "valid": True,
        "true_processing_rate": true_rate, "true_output_rate": true_rate, "observed_processing_rate": observed,
        "utilization": utilization, "arrival_rate": arrival, "backlog": backlog, "closed_at": EPOCH + t,
    }
    return Analysis.model_validate(fields | extra)


class Flink:
    """The policy through plan's kernel on the job's loop (`evaluation.loop.JobLoop`), with the rescales'
    ends recorded as execute records them; what the loop would then execute is left out."""

    def __init__(self, min_parallelism: int = 1, max_parallelism: int = 200, **parameters: Any) -> None:
        self.policy = FlinkPolicy(**parameters)
        self.loop = JobLoop("sim", JobConfig(min_parallelism=min_parallelism, max_parallelism=max_parallelism),
                            self.policy)
        self.reasons: Counter[str] = Counter()
        self.max_scale_down_factor = self.policy.max_scale_down_factor

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        plan = self.loop.decide(analysis, rescaling=rescaling).plan
        self.reasons[plan.reason.code] += 1
        if plan.action is Action.NONE or plan.to_parallelism == analysis.parallelism:
            return None
        return plan.to_parallelism

    def on_rescaled(self, to_parallelism: int, downtime_s: float, completed_at: float) -> None:
        # What execute records when the runner reports the end (execute.kernel.on_report).
        run_now(self.loop.knowledge.record_rescale_end("sim", to_parallelism, completed_at, downtime_s,
                                                       Direction.of(1, to_parallelism)))

    def expected_restart_time_s(self) -> float:
        return self.policy.expected_restart_time_s(self.loop.state)

    def target_capacity(self, arrival_rate: float, backlog: float, utilization: float, restart_time_s: float) -> float:
        return self.policy.target_capacity(arrival_rate, backlog, utilization, restart_time_s)

    @property
    def scale_down_first_trigger(self) -> float | None:
        return FlinkMemory.model_validate(self.loop.state.policy_state).scale_down_first_trigger


def run(policy: Flink, start: float, end: float, **window_fields: object) -> dict[float, int | None]:
    """Feed one window every WINDOW_S from `start` to `end` (simulated seconds); the answers by time."""
    answers: dict[float, int | None] = {}
    t = start
    while t <= end + 1e-9:
        answers[t] = policy.decide(window(t, **window_fields), rescaling=False)
        t += WINDOW_S
    return answers


def compressed(**overrides: Any) -> Flink:
    """Short durations for unit tests; alignment and the scale-down interval off unless asked."""
    short: dict[str, Any] = {
        "metrics_window_s": 60.0, "stabilization_s": 0.0, "scale_down_interval_s": 0.0, "align_to_partitions": False,
    }
    return Flink(**(short | overrides))


def first_decision(answers: dict[float, int | None]) -> tuple[float, int] | None:
    return next(((t, p) for t, p in answers.items() if p is not None), None)


# ---------------------------------------------------------------- target capacity


def test_saturated_job_with_backlog_scales_to_arrival_plus_restart_and_backlog_catch_up() -> None:
    # 2 slots x 100 rec/s are saturated by 280 rec/s with 60 000 records behind. Target capacity:
    # 60000 / 600 (backlog) + 280 x 120 / 600 (restart) + 280 / 0.7 (arrivals) = 100 + 56 + 400 = 556
    # rec/s -> 6 slots. Without any one of the three terms it would be 5.
    policy = compressed(catch_up_duration_s=600.0, restart_time_s=120.0)
    answers = run(policy, 10, 70, backlog=60_000)
    expected_capacity = 60_000 / 600 + 280 * 120 / 600 + 280 / 0.7
    assert policy.target_capacity(280.0, 60_000, 0.7, 120.0) == round(expected_capacity) == 556
    assert first_decision(answers) == (70, math.ceil(556 / 100)) == (70, 6)
    for missing in (100, 56, 400 - 280):
        assert math.ceil((556 - missing) / 100) == 5
    assert policy.reasons["scale_up"] == 1


def test_restart_time_is_the_fixed_option_unless_tracking_is_on() -> None:
    policy = compressed(restart_time_s=300.0)
    policy.on_rescaled(4, 20.0, EPOCH + 100)
    assert policy.expected_restart_time_s() == 300.0
    tracking = compressed(restart_time_s=300.0, track_restart_time=True, restart_time_limit_s=900.0)
    assert tracking.expected_restart_time_s() == 300.0  # no samples yet
    for i, downtime in enumerate((20.0, 45.0, 30.0)):
        tracking.on_rescaled(4, downtime, EPOCH + 100 + i)  # three rescales, each ended once
    assert tracking.expected_restart_time_s() == 45.0  # the largest recent one
    tracking.on_rescaled(4, 5000.0, EPOCH + 200)
    assert tracking.expected_restart_time_s() == 900.0  # capped


# ---------------------------------------------------------------- the utilization boundary


@pytest.mark.parametrize(
    ("parallelism", "arrival", "moved_to"),
    [
        (5, 200.0, 4),  # 40 % busy: the target says 4 slots, but 40 % is inside 0.7 - 0.3
        (3, 250.0, 4),  # 83 % busy: the target says 4 slots, but 83 % is inside 0.7 + 0.3
    ],
)
def test_holds_while_the_utilization_is_within_the_boundary(parallelism: int, arrival: float, moved_to: int) -> None:
    utilization = arrival / (100.0 * parallelism)
    fields = {"parallelism": parallelism, "utilization": utilization, "arrival": arrival}
    policy = compressed()
    assert first_decision(run(policy, 10, 200, **fields)) is None
    assert policy.reasons["within_utilization_boundary"] > 0 and policy.reasons["no_change"] == 0
    without_boundary = compressed(utilization_boundary=0.0)
    assert first_decision(run(without_boundary, 10, 200, **fields)) == (70, moved_to)


def test_never_scales_down_while_processing_backlog() -> None:
    # 10 slots drain a 400 000-record backlog at 1000 rec/s (400 s of lag > the 300 s threshold)
    # while only 100 rec/s arrive: the target (about 382 rec/s) would scale down to 4, but Flink
    # does not scale down while catching up.
    fields = {"parallelism": 10, "utilization": 1.0, "arrival": 100.0, "backlog": 400_000}
    policy = compressed()
    assert first_decision(run(policy, 10, 200, **fields)) is None
    assert policy.reasons["within_utilization_boundary"] > 0
    not_catching_up = compressed(backlog_lag_threshold_s=500.0)
    assert first_decision(run(not_catching_up, 10, 200, **fields)) == (70, 4)


# ---------------------------------------------------------------- timing: window and stabilization


def test_waits_for_a_full_metrics_window_after_start() -> None:
    policy = compressed(metrics_window_s=60.0)
    answers = run(policy, 10, 70)
    assert [answers[t] for t in range(10, 70, 10)] == [None] * 6
    assert policy.reasons["metrics_window_not_full"] == 6
    assert answers[70] is not None


def test_rates_are_averaged_over_the_metrics_window() -> None:
    # 600 rec/s on 10 slots needs 10 (600 x 300 / 1800 + 600 / 0.7 = 957 rec/s), 450 rec/s needs 8
    # (718 rec/s). A window holding both (mean 550 rec/s) says 9; once the 600s have left it, 8.
    policy = compressed(metrics_window_s=60.0, utilization_boundary=0.0)
    assert first_decision(run(policy, 10, 70, parallelism=10, utilization=0.6, arrival=600.0)) is None
    answers = run(policy, 80, 140, parallelism=10, utilization=0.45, arrival=450.0)
    assert answers[90] == 9  # samples 40 .. 70 at 600, 80 .. 90 at 450
    assert answers[140] == 8  # samples 90 .. 140, all at 450


def test_stabilization_holds_after_a_rescale_then_the_window_refills() -> None:
    policy = compressed(stabilization_s=60.0, metrics_window_s=30.0)
    policy.on_rescaled(2, 20.0, EPOCH + 100)
    answers = run(policy, 110, 200)
    assert policy.reasons["stabilization"] == 5  # 110 .. 150: before 100 + 60
    assert policy.reasons["metrics_window_not_full"] == 3  # 160 .. 180: first sample at 160
    assert first_decision(answers) == (190, 5)
    unstabilized = compressed(stabilization_s=0.0, metrics_window_s=30.0)
    unstabilized.on_rescaled(2, 20.0, EPOCH + 100)
    assert first_decision(run(unstabilized, 110, 200)) == (140, 5)


def test_stabilization_also_applies_after_start() -> None:
    policy = compressed(stabilization_s=30.0, metrics_window_s=60.0)
    answers = run(policy, 10, 120)
    assert policy.reasons["stabilization"] == 3  # 10, 20, 30: the job is taken to start at 10
    assert first_decision(answers) == (100, 5)


def test_a_rescale_clears_the_metrics_history() -> None:
    policy = compressed(metrics_window_s=60.0)
    assert first_decision(run(policy, 10, 70)) == (70, 5)
    policy.on_rescaled(5, 20.0, EPOCH + 90)
    answers = run(policy, 100, 150, parallelism=5, utilization=0.56, arrival=280.0)
    assert all(p is None for p in answers.values())
    assert policy.reasons["metrics_window_not_full"] == 6 + 6


# ---------------------------------------------------------------- scale-down limits


def test_scale_down_is_limited_by_the_max_factor() -> None:
    # 10 rec/s on 10 slots: the target (16 rec/s) is 1.6 % of the capacity, but one step may remove
    # at most 60 % of the slots: 10 -> 4. Without the limit: 10 -> 1.
    fields = {"parallelism": 10, "utilization": 0.01, "arrival": 10.0}
    assert first_decision(run(compressed(), 10, 70, **fields)) == (70, 4)
    assert first_decision(run(compressed(max_scale_down_factor=1.0), 10, 70, **fields)) == (70, 1)


def test_scale_up_is_limited_by_the_max_factor_when_set() -> None:
    assert first_decision(run(compressed(max_scale_up_factor=1.0), 10, 70, backlog=60_000)) == (70, 4)


def test_scale_down_waits_for_the_interval_then_takes_the_largest_recommendation() -> None:
    # Recommendations: 3 slots at 40 s (150 rec/s), then fewer as the load falls to 10 rec/s.
    # After the 60 s interval (at 100 s) the job scales down once, to the largest recent one: 3.
    policy = compressed(metrics_window_s=30.0, scale_down_interval_s=60.0, max_scale_down_factor=1.0)
    answers = run(policy, 10, 40, parallelism=10, utilization=0.15, arrival=150.0)
    answers |= run(policy, 50, 120, parallelism=10, utilization=0.01, arrival=10.0)
    assert first_decision(answers) == (100, 3)
    assert policy.reasons["scale_down_interval"] == 6  # 40 .. 90
    immediate = compressed(metrics_window_s=30.0, max_scale_down_factor=1.0)
    assert first_decision(run(immediate, 10, 40, parallelism=10, utilization=0.15, arrival=150.0)) == (40, 3)


def test_a_no_change_recommendation_cancels_a_pending_scale_down() -> None:
    policy = compressed(metrics_window_s=30.0, scale_down_interval_s=60.0)
    run(policy, 10, 50, parallelism=10, utilization=0.01, arrival=10.0)
    assert policy.scale_down_first_trigger == EPOCH + 40
    run(policy, 60, 100, parallelism=10, utilization=0.6, arrival=600.0)  # needs about 10 slots again
    assert policy.scale_down_first_trigger is None
    answers = run(policy, 110, 160, parallelism=10, utilization=0.01, arrival=10.0)
    assert all(p is None for p in answers.values())  # the interval starts over


# ---------------------------------------------------------------- bounds and alignment


def test_parallelism_aligns_to_divisors_of_the_partitions() -> None:
    # The saturated job of the first test wants 6 slots.
    first_test = {"catch_up_duration_s": 600.0, "restart_time_s": 120.0}
    aligned = run(compressed(align_to_partitions=True, **first_test), 10, 70, backlog=60_000, partitions=64)
    assert first_decision(aligned) == (70, 8)
    capped = run(compressed(**first_test), 10, 70, backlog=60_000, partitions=4, splittable=False)
    assert first_decision(capped) == (70, 4)  # a reader per partition at most
    beyond = run(compressed(align_to_partitions=True, **first_test), 10, 70, backlog=60_000, partitions=5)
    assert first_decision(beyond) == (70, 6)  # splittable partitions: more readers than partitions are useful


def test_alignment_never_reverses_the_direction() -> None:
    assert align_to_partitions(5, 10, 64, 200, 1) == 8
    assert align_to_partitions(5, 7, 64, 200, 1) == 4
    assert align_to_partitions(33, 20, 64, 200, 1) == 64
    assert align_to_partitions(6, 7, 7, 200, 1) == 7  # no divisor below 7: hold


def test_holds_while_rescaling_and_on_invalid_windows() -> None:
    policy = compressed(metrics_window_s=10.0)
    saturated = window(20, backlog=60_000)
    policy.decide(window(10, backlog=60_000), rescaling=False)
    assert policy.decide(saturated, rescaling=True) is None
    assert policy.decide(saturated.model_copy(update={"valid": False}), rescaling=False) is None
    assert policy.reasons["rescale_in_progress"] == 1 and policy.reasons["invalid_window"] == 1
    assert policy.decide(saturated, rescaling=False) == 5


def test_its_memory_lives_in_the_plan_state_so_a_new_worker_continues() -> None:
    policy = compressed(metrics_window_s=60.0)
    run(policy, 10, 40)
    successor = compressed(metrics_window_s=60.0)
    successor.loop.knowledge = policy.loop.knowledge  # a restarted plan agent reads the same knowledge
    assert first_decision(run(successor, 50, 70)) == (70, 5)


def test_in_the_simulator_it_catches_up_then_settles_after_the_scale_down_interval() -> None:
    # 1000 rec/s on 4 slots of 100 rec/s: after stabilization and a full window the target is about
    # 1700 rec/s (backlog, restart and arrivals at 70 %) -> 17 slots, aligned to 32 of the 64
    # partitions; 600 s of scale-down recommendations later it settles at 16 (1000 / 0.7 -> 15 -> 16).
    policy = Flink(metrics_window_s=60.0, stabilization_s=30.0, catch_up_duration_s=300.0, restart_time_s=20.0,
                   scale_down_interval_s=600.0)
    job = JobModel((Operator("job", 100.0),), partitions=64, checkpoint_interval_s=0.0, downtime_up_s=20.0,
                   downtime_down_s=20.0)
    load = Trace("constant", np.full(180, 1000.0), 10.0, "1000 rec/s")
    config = policy.loop.config
    result = simulate(load, job, PolicyRunner(policy.policy, config), config, 4, 60.0, rate_noise=0.0)
    changes = [(t, p) for t, p, before in zip(result.timeline.t[1:], result.timeline.parallelism[1:],
                                               result.timeline.parallelism[:-1], strict=True) if p != before]
    assert [p for _, p in changes] == [32, 16]
    # The scale-down interval, after the restart (20 s), stabilization (30 s) and a full metrics window (60 s).
    assert 600 <= changes[1][0] - changes[0][0] <= 720
    assert result.ignored_decisions == 0 and result.final_backlog == 0


def analyses() -> st.SearchStrategy[tuple[Analysis, bool]]:
    return st.tuples(
        st.integers(1, 40), st.floats(0, 1.2), st.one_of(st.none(), st.floats(0, 5000)), st.integers(0, 10**6),
        st.floats(1, 500), st.one_of(st.none(), st.integers(1, 128)), st.booleans(), st.booleans(), st.booleans(),
    ).map(lambda v: (window(0, parallelism=v[0], utilization=v[1], arrival=v[2], backlog=v[3], true_rate=v[4],
                            partitions=v[5], splittable=v[6], valid=v[7]), v[8]))


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(analyses(), min_size=1, max_size=40),
    min_p=st.integers(1, 4), max_p=st.integers(4, 40), interval=st.sampled_from([0.0, 30.0]),
    stabilization=st.sampled_from([0.0, 20.0]), align=st.booleans(),
)
def test_answers_stay_within_bounds_and_hold_while_rescaling(
    steps: list[tuple[Analysis, bool]], min_p: int, max_p: int, interval: float, stabilization: float, align: bool,
) -> None:
    policy = Flink(
        metrics_window_s=30.0, stabilization_s=stabilization, scale_down_interval_s=interval,
        align_to_partitions=align, min_parallelism=min_p, max_parallelism=max_p,
    )
    for i, (base, rescaling) in enumerate(steps):
        p = min(max(base.parallelism, min_p), max_p)
        analysis = base.model_copy(update={"window_end": EPOCH + 10 * (i + 1), "parallelism": p})
        answer = policy.decide(analysis, rescaling=rescaling)
        if rescaling or not analysis.valid:
            assert answer is None
        if answer is None:
            continue
        assert answer != p and 1 <= answer <= max_p
        partition_cap = analysis.partitions if analysis.partitions and not analysis.splittable else max_p
        assert answer >= min(min_p, partition_cap)
        if not align:  # alignment may round a scale-down below the max factor, as Flink's does
            assert answer >= min(math.ceil(p * (1 - policy.max_scale_down_factor) - 1e-9), partition_cap)
