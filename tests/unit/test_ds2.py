"""DS2 policy: one-step optimality, bounds, the utilization band and the per-operator model."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from contracts.analyses import Analysis, OperatorAnalysis
from contracts.decisions import Action
from contracts.jobs import JobConfig
from plan.ds2 import operator_targets, plan_ds2, slots_for, target_rate


def analysis(**overrides: object) -> Analysis:
    base: dict[str, object] = {
        "job_id": "job", "window_end": 100.0, "parallelism": 1, "valid": True,
        "true_processing_rate": 100.0, "true_output_rate": 100.0, "observed_processing_rate": 100.0,
        "utilization": 1.0, "arrival_rate": 350.0, "backlog": 0, "backlog_growth_rate": 0.0,
        "partitions": 8, "splittable": True, "closed_at": 0.0,
    }
    return Analysis.model_validate(base | overrides)


def config(**overrides: object) -> JobConfig:
    return JobConfig.model_validate({"target_utilization": 0.7, "utilization_band": 0.0} | overrides)


def test_job_level_slots_carry_the_target_rate_at_the_target_utilization() -> None:
    plan = plan_ds2(analysis(), config())
    # 350 rec/s / (100 rec/s per slot x 0.7) = 5 slots.
    assert plan.action is Action.SCALE_UP
    assert plan.to_parallelism == 5
    assert plan.reason.code == "ds2_optimal"
    assert plan.reason.numbers["target_rate"] == pytest.approx(350.0)


def test_backlog_is_drained_within_the_catch_up_duration() -> None:
    plan = plan_ds2(analysis(backlog=42_000), config(catch_up_duration_s=600))
    # (350 + 42,000 / 600) / 70 = 420 / 70 = 6 slots.
    assert plan.to_parallelism == 6


def test_scale_down_when_over_provisioned() -> None:
    plan = plan_ds2(analysis(parallelism=10, arrival_rate=140.0, utilization=0.2), config())
    assert (plan.action, plan.to_parallelism) == (Action.SCALE_DOWN, 2)


def test_bounds_min_max_and_unsplittable_source() -> None:
    assert plan_ds2(analysis(arrival_rate=10_000.0), config(max_parallelism=12)).to_parallelism == 12
    assert plan_ds2(analysis(arrival_rate=1.0, parallelism=4), config(min_parallelism=2)).to_parallelism == 2
    capped = plan_ds2(analysis(arrival_rate=10_000.0, splittable=False, partitions=6), config())
    assert capped.to_parallelism == 6
    assert "partitions" in capped.reason.message


def test_no_action_inside_the_utilization_band() -> None:
    # At 5 slots the target rate would need 360 / 500 = 72% utilization: inside 70% +- 10%.
    plan = plan_ds2(analysis(parallelism=5, arrival_rate=360.0), config(utilization_band=0.1))
    assert plan.action is Action.NONE
    assert plan.reason.code == "within_utilization_band"
    # Without the band, DS2 alone would add a sixth slot.
    assert plan_ds2(analysis(parallelism=5, arrival_rate=360.0), config()).to_parallelism == 6


def test_invalid_window_holds() -> None:
    plan = plan_ds2(analysis(valid=False, invalid_reason="no records", true_processing_rate=0.0), config())
    assert (plan.action, plan.reason.code) == (Action.NONE, "invalid_window")


def test_without_source_metrics_the_observed_rate_is_the_target() -> None:
    plan = plan_ds2(analysis(arrival_rate=None, backlog=None, observed_processing_rate=210.0), config())
    assert plan.to_parallelism == 3


@settings(max_examples=300)
@given(
    per_slot=st.floats(1, 1e5),
    arrival=st.floats(0, 1e7),
    utilization=st.floats(0.05, 1.0),
    current=st.integers(1, 500),
)
def test_one_step_optimal_under_linear_scaling(
    per_slot: float, arrival: float, utilization: float, current: int
) -> None:
    """DS2's claim: from any start, the chosen parallelism is the least that carries the target."""
    assume(arrival / (per_slot * utilization) < 90_000)  # within the contract's parallelism bound
    plan = plan_ds2(
        analysis(parallelism=current, true_processing_rate=per_slot, arrival_rate=arrival),
        config(target_utilization=utilization, max_parallelism=100_000),
    )
    p = plan.to_parallelism
    capacity = per_slot * utilization
    assert p * capacity >= arrival * (1 - 1e-9)
    if p > 1:
        assert (p - 1) * capacity < arrival * (1 + 1e-9)
    # The decision does not depend on where the job started (no oscillation).
    again = plan_ds2(
        analysis(parallelism=p, true_processing_rate=per_slot, arrival_rate=arrival),
        config(target_utilization=utilization, max_parallelism=100_000),
    )
    assert again.to_parallelism == p and again.action is Action.NONE


def op(op_id: str, upstream: list[str], tpr: float, selectivity: float, p: int = 1) -> OperatorAnalysis:
    return OperatorAnalysis(
        operator_id=op_id, upstream=upstream, parallelism=p, true_processing_rate=tpr,
        true_output_rate=tpr * selectivity, observed_processing_rate=tpr * p, utilization=1.0,
    )


def test_per_operator_targets_follow_selectivity_through_a_diamond() -> None:
    ops = [
        op("sink", ["left", "right"], 1000, 0),
        op("left", ["src"], 100, 2),
        op("right", ["src"], 50, 0.5),
        op("src", [], 400, 1),
    ]
    parallelism, target_in = operator_targets(ops, 800.0, 1.0)
    assert target_in == {"src": 800, "left": 800, "right": 800, "sink": 1600 + 400}
    assert parallelism == {"src": 2, "left": 8, "right": 16, "sink": 2}


def test_per_operator_cycle_is_refused() -> None:
    with pytest.raises(ValueError, match="cycle"):
        operator_targets([op("a", ["b"], 1, 1), op("b", ["a"], 1, 1)], 1.0, 1.0)


@given(
    rates=st.lists(st.floats(1, 1e4), min_size=1, max_size=6),
    selectivities=st.lists(st.floats(0.1, 10), min_size=6, max_size=6),
    arrival=st.floats(1, 1e5),
    start=st.integers(1, 64),
)
def test_per_operator_chain_is_optimal_from_any_start(
    rates: list[float], selectivities: list[float], arrival: float, start: int
) -> None:
    chain = [op(f"o{i}", [f"o{i-1}"] if i else [], r, selectivities[i], start) for i, r in enumerate(rates)]
    parallelism, target_in = operator_targets(chain, arrival, 1.0)
    flow = arrival
    for i, r in enumerate(rates):
        assert target_in[f"o{i}"] == pytest.approx(flow)
        assert parallelism[f"o{i}"] == max(1, math.ceil(flow / r - 1e-9))
        flow *= selectivities[i]


def test_helpers() -> None:
    assert slots_for(400.0, 100.0, 1.0) == 4
    assert slots_for(400.0000001, 100.0, 1.0) == 4  # floating noise is not a fifth slot
    assert slots_for(0.0, 100.0, 0.5) == 1
    assert target_rate(100.0, 3000, 30.0) == 200.0
