"""A stateful query in the planner: its state partitions cap every policy's scale-up, its reason says
so and states the state and the event-time lag, and restarts are planned at the state's size."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.jobs import JobConfig
from contracts.plan_state import DOWN_TO_UP, Downtimes, PlanState
from plan.controls import partition_units
from plan.kernel import finish, plan
from plan.policies.threshold import ThresholdPolicy
from plan.registry import make_policy

CONFIG = JobConfig(max_parallelism=32, policy="threshold")


def analysis(utilization: float, parallelism: int, partitions: int | None = 8, rows: int = 50_000,
             **extra: Any) -> Analysis:
    state = {"operators": 1, "rows": rows, "memory_bytes": 3_000_000, "commit_time_s": 0.4,
             "partitions": partitions}
    return Analysis.model_validate({
        "job_id": "k", "window_end": 1_700_001_000.0, "parallelism": parallelism, "valid": True,
        "true_processing_rate": 100.0, "true_output_rate": 100.0,
        "observed_processing_rate": 100.0 * utilization * parallelism, "utilization": utilization,
        "arrival_rate": 100.0 * utilization * parallelism, "backlog": 0, "closed_at": 1_700_001_000.0,
        "state": state, **extra,
    })


def decide(a: Analysis, state: PlanState | None = None, config: JobConfig = CONFIG):  # type: ignore[no-untyped-def]
    planned = plan(state or PlanState(), a, config, rescaling=False, quota=None, policy=ThresholdPolicy())
    return finish(planned, a, config)


# ---------------------------------------------------------------- the cap


def test_a_scale_up_beyond_the_state_partitions_is_trimmed_to_them_and_says_so() -> None:
    decided = decide(analysis(0.95, 6, partitions=8))  # threshold wants ceil(6 x 0.95 / 0.65) = 9
    assert decided.decision.action is Action.SCALE_UP and decided.decision.to_parallelism == 8
    assert "8 state partitions" in decided.decision.reason.message
    assert decided.decision.reason.numbers["state_partitions"] == 8
    assert decided.decision.recommended_parallelism == 9


def test_the_cap_trims_every_operators_target_too() -> None:
    """A job planned per operator: the plan's parallelism is its largest operator's, so the cap that
    trims it caps each operator's target (none planned beyond the state partitions)."""
    from contracts.decisions import DecisionReason
    from plan.gates import apply_gates
    from plan.policy import Plan
    from plan.stateful import StatePartitionCap

    proposal = Plan(Action.SCALE_UP, 12, DecisionReason(code="ds2_optimal", rule="ds2", message="DS2"),
                    operator_targets={"source": 6, "agg": 12, "sink": 9}, recommended=12)
    gated = apply_gates((StatePartitionCap(),), proposal, PlanState(), analysis(0.95, 6, partitions=8), CONFIG)
    assert gated.plan is not None and gated.plan.to_parallelism == 8
    assert gated.plan.operator_targets == {"source": 6, "agg": 8, "sink": 8}


def test_a_job_at_its_state_partitions_is_held_there() -> None:
    decided = decide(analysis(0.95, 8, partitions=8))
    assert decided.decision.action is Action.NONE
    assert decided.decision.reason.code == "state_partitions_cap"
    assert decided.decision.reason.rule == "state_partitions"


def test_a_scale_up_under_the_cap_passes_and_a_scale_down_is_never_capped() -> None:
    assert decide(analysis(0.95, 4, partitions=8)).decision.to_parallelism == 6
    down = decide(analysis(0.2, 12, partitions=8))  # a job beyond its cap may come down
    assert down.decision.action is Action.SCALE_DOWN and down.decision.to_parallelism == 4


def test_unreadable_state_partitions_are_said_in_the_reason_not_a_crash() -> None:
    decided = decide(analysis(0.95, 6, partitions=None))
    assert decided.decision.to_parallelism == 9
    assert "state partitions could not be read" in decided.decision.reason.message


def test_a_stateless_job_is_not_capped() -> None:
    a = analysis(0.95, 6).model_copy(update={"state": None})
    decided = decide(a)
    assert decided.decision.to_parallelism == 9 and "state" not in decided.decision.reason.message


@given(current=st.integers(1, 40), utilization=st.floats(0.0, 1.0), partitions=st.integers(1, 40),
       policy=st.sampled_from(["threshold", "ds2", "reactive", "flink", "static"]))
def test_no_decision_scales_beyond_the_state_partitions(current: int, utilization: float, partitions: int,
                                                        policy: str) -> None:
    config = JobConfig(max_parallelism=64, policy=policy)
    a = analysis(utilization, current, partitions=partitions)
    planned = plan(PlanState(), a, config, rescaling=False, quota=None, policy=make_policy(policy))
    decision = finish(planned, a, config).decision
    if decision.action is Action.SCALE_UP:
        assert decision.to_parallelism <= partitions


def test_the_reason_states_the_state_and_the_event_time_lag() -> None:
    decided = decide(analysis(0.95, 4, watermark_lag_s=12.3, output_lag_s=15.0))
    message, numbers = decided.decision.reason.message, decided.decision.reason.numbers
    assert "state 50,000 rows, 3.0 MB in 8 partitions" in message
    assert "watermark 12 s behind" in message and "output event time 15 s behind" in message
    assert numbers["state_rows"] == 50_000 and numbers["watermark_lag_s"] == 12.3


def test_state_partitions_count_as_waves_when_the_shuffle_does_not_report_them() -> None:
    assert ("state partitions", 8) in partition_units(analysis(0.5, 4, partitions=8))
    same = analysis(0.5, 4, partitions=8, shuffle_partitions=8)
    assert partition_units(same) == [("shuffle partitions", 8)]


# ---------------------------------------------------------------- restart time against state size


def test_the_plan_state_keeps_the_state_size_and_pairs_it_with_each_restart() -> None:
    decided = decide(analysis(0.5, 4, rows=70_000))
    assert decided.state.state_rows == 70_000 and "state_rows" in decided.state_fields
    ended = decided.state.after_rescale(6, 1_700_001_100.0, 21.0, "up")
    assert ended.downtimes.up == [21.0] and ended.downtimes.up_state == [70_000]


def test_older_stored_downtimes_without_sizes_stay_readable() -> None:
    old = Downtimes.model_validate({"up": [10.0, 12.0], "down": [5.0]})
    assert old.state_rows("up") == [None, None]
    added = old.add("up", 14.0, 1000)
    assert added.up == [10.0, 12.0, 14.0] and added.state_rows("up") == [None, None, 1000]
    assert old.at_state(10**6) == old  # no sizes, no slope: as measured


def test_the_restart_slope_is_fitted_robustly_and_moves_restarts_to_the_state_size() -> None:
    d = Downtimes()
    for rows, seconds in [(0, 10.0), (1_000_000, 20.0), (2_000_000, 30.0), (3_000_000, 80.0)]:
        d = d.add("up", seconds, rows)
    d = d.add("down", 5.0, 0).add("down", 35.0, 1_000_000)  # its own base, a steeper slope
    # Theil-Sen over the pairs within each direction: up 1e-5 (x3), 2.33e-5, 3e-5, 5e-5; down 3e-5.
    slope = d.state_slope()
    assert slope == pytest.approx(70.0 / 3e6)  # the median: the 80-s outlier's pairs do not pull it far
    at = d.at_state(4_000_000)
    measured = [(10.0, 0), (20.0, 1e6), (30.0, 2e6), (80.0, 3e6)]
    assert at.up == pytest.approx([s + slope * (4e6 - r) for s, r in measured])
    assert at.down == pytest.approx([5.0 + slope * 4e6, 35.0 + slope * 3e6])
    assert at.typical("up", 30.0) > d.typical("up", 30.0)
    assert d.at_state(None) == d


def test_a_scale_in_estimated_from_scale_outs_halves_only_what_is_not_the_states_reload() -> None:
    """A stateful query reloads its state in either direction: a scale-in measured from scale-outs alone is
    half their start-up (DOWN_TO_UP), plus the whole reload at the state's size now."""
    d = Downtimes()
    for rows, seconds in [(0, 10.0), (1_000_000, 20.0), (2_000_000, 30.0)]:
        d = d.add("up", seconds, rows)  # 10 s to start, 10 s per million rows
    at = d.at_state(3_000_000)
    assert at.reload_s == pytest.approx(30.0) and at.typical("up", 99.0) == pytest.approx(40.0)
    assert at.typical("down", 99.0) == pytest.approx(10.0 * DOWN_TO_UP + 30.0)  # not 40 x DOWN_TO_UP
    stateless = Downtimes(up=[10.0, 12.0, 14.0])
    assert stateless.at_state(3_000_000).typical("down", 99.0) == pytest.approx(12.0 * DOWN_TO_UP)
    assert "reload_s" not in at.model_dump()  # derived, never stored


def test_no_slope_from_too_few_restarts_or_one_size() -> None:
    assert Downtimes(up=[10.0, 20.0], up_state=[0, 1000]).state_slope() == 0.0
    assert Downtimes(up=[10.0, 20.0, 30.0], up_state=[5, 5, 5]).state_slope() == 0.0
    assert Downtimes(up=[30.0, 20.0, 10.0], up_state=[0, 1000, 2000]).state_slope() == 0.0  # never negative


@given(st.lists(st.tuples(st.integers(0, 10**7), st.floats(0.0, 600.0)), min_size=0, max_size=12),
       st.integers(0, 10**7))
def test_restarts_at_a_state_size_are_never_negative_and_grow_with_the_size(points: list[tuple[int, float]],
                                                                             rows: int) -> None:
    d = Downtimes()
    for size, seconds in points:
        d = d.add("up", seconds, size)
    small, large = d.at_state(rows), d.at_state(rows + 1_000_000)
    assert all(x >= 0 for x in small.up)
    assert all(b >= a - 1e-9 for a, b in zip(small.up, large.up, strict=True))
    assert len(d.up) == len(d.up_state) <= 10
