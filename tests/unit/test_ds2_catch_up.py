"""DS2's catch-up per operator, and the utilization band on both of its sides (plan/ds2.py, docs/policies.md)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.analyses import Analysis, OperatorAnalysis
from contracts.decisions import Action
from contracts.jobs import JobConfig
from evaluation.jobmodel import JobModel, JobState, Operator, advance
from plan.ds2 import operator_targets, plan_ds2
from plan.kernel import to_decision


def op(op_id: str, upstream: list[str], tpr: float, selectivity: float, p: int = 1,
       arrival_rate: float | None = None) -> OperatorAnalysis:
    return OperatorAnalysis(
        operator_id=op_id, upstream=upstream, parallelism=p, true_processing_rate=tpr,
        true_output_rate=tpr * selectivity, observed_processing_rate=tpr * p, utilization=1.0,
        arrival_rate=arrival_rate,
    )


def analysis(operators: list[OperatorAnalysis], **overrides: object) -> Analysis:
    base: dict[str, object] = {
        "job_id": "job", "window_end": 100.0, "parallelism": max(o.parallelism for o in operators),
        "valid": True, "true_processing_rate": 100.0, "true_output_rate": 100.0,
        "observed_processing_rate": 100.0, "utilization": 1.0, "arrival_rate": 100.0, "backlog": 0,
        "backlog_growth_rate": 0.0, "partitions": 10_000, "splittable": True, "closed_at": 0.0,
        "operators": operators,
    }
    return Analysis.model_validate(base | overrides)


def config(**overrides: object) -> JobConfig:
    return JobConfig.model_validate(
        {"per_operator": True, "target_utilization": 0.7, "utilization_band": 0.0, "max_parallelism": 1000} | overrides)


# source -> flat_map (x3 records) -> count (x0.1), as the job model runs it.
MODEL = JobModel(operators=(Operator("source", 1000.0), Operator("flat_map", 500.0, selectivity=3.0),
                            Operator("count", 2000.0, selectivity=0.1)), fused=False, partitions=10_000)


def pipeline(p: tuple[int, int, int] = (1, 1, 1)) -> list[OperatorAnalysis]:
    return [op("source", [], 1000.0, 1.0, p[0]), op("flat_map", ["source"], 500.0, 3.0, p[1]),
            op("count", ["flat_map"], 2000.0, 0.1, p[2])]


def test_per_operator_targets_drain_ten_minutes_of_backlog_within_the_catch_up_duration() -> None:
    arrival, backlog = 100.0, 60_000  # 10 minutes of input waiting at the source
    plan = plan_ds2(analysis(pipeline(), arrival_rate=arrival, backlog=backlog), config(catch_up_duration_s=20))
    # Each operator's target: what reaches it of the arrivals and of the backlog drained in 20 s.
    drain = arrival + backlog / 20  # 3,100 source records/s
    assert plan.reason.numbers["source.target_rate"] == pytest.approx(drain)
    assert plan.reason.numbers["flat_map.target_rate"] == pytest.approx(drain)
    assert plan.reason.numbers["count.target_rate"] == pytest.approx(3 * drain)
    # 3,100 / (1,000 x 0.7) -> 5; 3,100 / (500 x 0.7) -> 9; 9,300 / (2,000 x 0.7) -> 7.
    assert plan.operator_targets == {"source": 5, "flat_map": 9, "count": 7}
    assert (plan.action, plan.to_parallelism) == (Action.SCALE_UP, 9)
    # At those targets the job model drains the backlog within the catch-up duration.
    state = JobState([plan.operator_targets[o.name] for o in MODEL.operators], backlog=backlog)
    advance(MODEL, state, 0.0, 20.0, arrival)
    assert state.backlog == 0.0


def test_a_rescale_is_sized_with_the_restart_and_staying_put_is_judged_without_it() -> None:
    arrival, backlog = 100.0, 60_000
    restart = 30.0
    plan = plan_ds2(analysis(pipeline(), arrival_rate=arrival, backlog=backlog),
                    config(catch_up_duration_s=20), restart_time_s=restart)
    # (60,000 + 100 x 30) / 20 + 100 = 3,250 records/s: 5, 10 (3,250 / 350 = 9.3), 7 (9,750 / 1,400 = 6.96).
    assert plan.reason.numbers["source.target_rate"] == pytest.approx(3250)
    assert plan.reason.numbers["source.steady_target_rate"] == pytest.approx(3100)
    assert plan.operator_targets == {"source": 5, "flat_map": 10, "count": 7}
    # At the steady targets (5, 9, 7) the job stays: growing flat_map to 10 would need a restart.
    held = plan_ds2(analysis(pipeline((5, 9, 7)), arrival_rate=arrival, backlog=backlog),
                    config(catch_up_duration_s=20), restart_time_s=restart)
    assert (held.action, held.reason.code) == (Action.NONE, "at_optimal")
    assert held.operator_targets == {"source": 5, "flat_map": 9, "count": 7}
    # Over-provisioned by one flat_map instance, which the restart's arrivals would need: a scale-down
    # to 9 would not pay for its restart.
    stays = plan_ds2(analysis(pipeline((5, 10, 7)), arrival_rate=arrival, backlog=backlog),
                     config(catch_up_duration_s=20), restart_time_s=restart)
    assert (stays.action, stays.reason.code) == (Action.NONE, "at_optimal")
    assert "would not pay for its restart" in stays.reason.message


def test_the_backlog_reaches_each_operator_times_the_records_that_reach_it() -> None:
    ops = [op("sink", ["left", "right"], 1000, 0), op("left", ["src"], 100, 2), op("right", ["src"], 50, 0.5),
           op("src", [], 400, 1)]
    _, target_in = operator_targets(ops, 800.0, 1.0, backlog=4_000, catch_up_duration_s=10.0)
    # 400 records/s of backlog to drain at the source; the sink gets 2 + 0.5 = 2.5 of each source record.
    assert target_in == pytest.approx({"src": 1200, "left": 1200, "right": 1200, "sink": 2.5 * 1200})


def test_the_backlog_is_shared_by_the_sources_in_proportion_to_their_arrivals() -> None:
    ops = [op("a", [], 1000, 1, arrival_rate=300.0), op("b", [], 1000, 1, arrival_rate=100.0),
           op("join", ["a", "b"], 1000, 1)]
    _, target_in = operator_targets(ops, 400.0, 1.0, backlog=4_000, catch_up_duration_s=10.0, restart_time_s=5.0)
    # a: 300 + (3,000 + 300 x 5) / 10 = 750; b: 100 + (1,000 + 100 x 5) / 10 = 250.
    assert target_in == pytest.approx({"a": 750, "b": 250, "join": 1000})


@given(
    rates=st.lists(st.floats(1, 1e4), min_size=1, max_size=6),
    selectivities=st.lists(st.floats(0.1, 10), min_size=6, max_size=6),
    arrival=st.floats(0, 1e5),
    backlog=st.integers(0, 10**9),
    catch_up=st.floats(1, 3600),
    restart=st.floats(0, 600),
)
def test_each_operator_target_is_its_arrivals_plus_its_share_of_the_catch_up(
    rates: list[float], selectivities: list[float], arrival: float, backlog: int, catch_up: float, restart: float
) -> None:
    chain = [op(f"o{i}", [f"o{i-1}"] if i else [], r, selectivities[i]) for i, r in enumerate(rates)]
    parallelism, target_in = operator_targets(chain, arrival, 0.7, backlog, catch_up, restart)
    reaching = 1.0  # the fraction of source records that reach the operator
    for i, r in enumerate(rates):
        expected = reaching * (arrival + (backlog + arrival * restart) / catch_up)
        assert target_in[f"o{i}"] == pytest.approx(expected)
        assert parallelism[f"o{i}"] == max(1, math.ceil(target_in[f"o{i}"] / (r * 0.7) - 1e-9))
        reaching *= selectivities[i]


# The utilization band, 70 % +- 10 %: whether to stay is judged on the steady target (arrivals and the
# backlog drained in catch_up_duration_s), without the restart's arrivals, which staying does not cause.

def job(parallelism: int, arrival: float, backlog: int) -> Analysis:
    return Analysis.model_validate({
        "job_id": "job", "window_end": 100.0, "parallelism": parallelism, "valid": True,
        "true_processing_rate": 100.0, "true_output_rate": 100.0, "observed_processing_rate": 100.0,
        "utilization": 1.0, "arrival_rate": arrival, "backlog": backlog, "partitions": 1000, "closed_at": 0.0,
    })


def test_job_level_band_upper_edge_is_judged_on_the_steady_target() -> None:
    band = config(per_operator=False, utilization_band=0.1, catch_up_duration_s=300)
    # Steady target 385 + 3,000 / 300 = 395 records/s on 5 slots of 100: 79 %, inside. With the restart's
    # arrivals (30 s) it would be 433.5 records/s, 87 %: the band does not count them.
    inside = plan_ds2(job(5, 385.0, 3_000), band, restart_time_s=30.0)
    assert (inside.action, inside.reason.code) == (Action.NONE, "within_utilization_band")
    assert inside.reason.numbers["implied_utilization"] == pytest.approx(0.79)
    assert inside.recommended == 7  # ceil(433.5 / 70)
    # 395 + 3,000 / 300 = 405 records/s: 81 %, outside; the rescale is sized with the restart (444.5 / 70).
    outside = plan_ds2(job(5, 395.0, 3_000), band, restart_time_s=30.0)
    assert outside.reason.numbers["implied_utilization"] == pytest.approx(0.81)
    assert (outside.action, outside.to_parallelism, outside.reason.code) == (Action.SCALE_UP, 7, "ds2_optimal")


def test_job_level_band_lower_edge_is_judged_on_the_steady_target() -> None:
    band = config(per_operator=False, utilization_band=0.1, catch_up_duration_s=300)
    # 600 + 3,000 / 300 = 610 records/s on 10 slots: 61 %, inside; 580 + 10 = 590: 59 %, outside -> 9 slots.
    inside = plan_ds2(job(10, 600.0, 3_000), band)
    assert (inside.action, inside.reason.code) == (Action.NONE, "within_utilization_band")
    outside = plan_ds2(job(10, 580.0, 3_000), band)
    assert (outside.action, outside.to_parallelism) == (Action.SCALE_DOWN, 9)


def test_per_operator_band_counts_the_backlog_and_not_the_restart() -> None:
    band = config(utilization_band=0.1, catch_up_duration_s=300)

    def two(arrival: float, backlog: int) -> Analysis:
        ops = [op("src", [], 100.0, 1.0, 5), op("sink", ["src"], 100.0, 1.0, 5)]
        return analysis(ops, arrival_rate=arrival, backlog=backlog)

    # 300 + 28,500 / 300 = 395 records/s on 5 instances of 100: 79 %, inside (the restart's 30 s would
    # make it 425 records/s, 85 %).
    inside = plan_ds2(two(300.0, 28_500), band, restart_time_s=30.0)
    assert (inside.action, inside.reason.code) == (Action.NONE, "within_utilization_band")
    assert inside.reason.numbers["sink.implied_utilization"] == pytest.approx(0.79)
    assert inside.operator_targets == {"src": 5, "sink": 5}
    # 300 + 31,500 / 300 = 405 records/s: 81 %, outside; sized with the restart: 435 / 70 -> 7 each.
    outside = plan_ds2(two(300.0, 31_500), band, restart_time_s=30.0)
    assert (outside.action, outside.to_parallelism) == (Action.SCALE_UP, 7)
    assert outside.operator_targets == {"src": 7, "sink": 7}


def test_a_per_operator_decision_runs_from_and_to_the_largest_operator_parallelism() -> None:
    rates = analysis(pipeline((2, 3, 1)), arrival_rate=100.0, backlog=60_000)
    plan = plan_ds2(rates, config(catch_up_duration_s=20))
    decision = to_decision(plan, rates, config(catch_up_duration_s=20))
    assert decision.from_parallelism == 3 == max(o.parallelism for o in rates.operators)
    assert decision.to_parallelism == 9 == max(decision.operator_targets.values())
