"""The evaluation suite's job model: capacity, scaling, skew, restarts and the reports it sends."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze.true_rates import analyze_window
from evaluation.jobmodel import JobModel, JobState, Operator, advance, report, rescale
from monitor.windows import add_report, close_window


def test_linear_operator_capacity_grows_with_instances() -> None:
    op = Operator("map", 100.0)
    assert [op.capacity(p) for p in (1, 2, 8)] == [100.0, 200.0, 800.0]
    assert op.instance_rate(8) == 100.0


def test_beyond_the_knee_instances_add_a_fraction_and_the_measured_rate_falls() -> None:
    op = Operator("join", 100.0, knee=4, efficiency_beyond_knee=0.5)
    assert op.capacity(4) == 400.0
    assert op.capacity(8) == pytest.approx(600.0)
    assert op.instance_rate(8) == pytest.approx(75.0)


def test_skew_saturates_the_busiest_instance_first() -> None:
    op = Operator("agg", 100.0, skew=1.0)  # the busiest of p instances gets 2 / p of the input
    assert op.capacity(1) == 100.0
    assert op.capacity(4) == pytest.approx(200.0)


def test_fused_job_pays_each_operator_per_source_record() -> None:
    # 1 source record costs 1/400 + 2/200 (two records reach the second operator) = 0.0125 slot-s.
    model = JobModel((Operator("parse", 400.0, selectivity=2.0), Operator("enrich", 200.0)))
    assert model.slot_seconds_per_record(1) == pytest.approx(0.0125)
    assert model.capacity(4) == pytest.approx(320.0)


def test_per_operator_job_is_bounded_by_its_bottleneck() -> None:
    model = JobModel((Operator("parse", 400.0, selectivity=2.0), Operator("enrich", 200.0)), fused=False)
    assert model.capacity([1, 4]) == pytest.approx(400.0)  # parse: 400/s; enrich: 800/s of 2x records
    assert model.capacity([2, 2]) == pytest.approx(200.0)  # enrich: 400/s of 2x records


def test_unsplittable_source_caps_useful_parallelism_at_its_partitions() -> None:
    model = JobModel((Operator("map", 100.0),), partitions=4, splittable=False)
    assert model.capacity(8) == model.capacity(4) == 400.0


def test_backlog_drains_then_follows_the_arrivals() -> None:
    model = JobModel((Operator("map", 100.0),))
    state = JobState([2], backlog=500.0)
    outcome = advance(model, state, 0.0, 10.0, arrival_rate=150.0)
    assert outcome.processed == pytest.approx(2000.0)  # 500 + 1500 arrived, capacity 2000
    assert state.backlog == pytest.approx(0.0)
    outcome = advance(model, state, 10.0, 10.0, arrival_rate=150.0)
    assert outcome.processed == pytest.approx(1500.0)
    assert outcome.busy_slot_s == pytest.approx(15.0)


def test_a_rescale_stops_processing_for_its_downtime_and_replays_since_the_checkpoint() -> None:
    model = JobModel((Operator("map", 100.0),), checkpoint_interval_s=10.0, downtime_up_s=15.0)
    state = JobState([1])
    advance(model, state, 0.0, 10.0, arrival_rate=80.0)  # 80 rec/s processed
    downtime = rescale(model, state, 2, at=14.0)  # 4 s after the checkpoint at 10 s
    assert downtime == 15.0
    assert state.replayed == pytest.approx(320.0)
    outcome = advance(model, state, 14.0, 10.0, arrival_rate=80.0)
    assert outcome.running_s == 0.0 and outcome.processed == 0.0
    assert report(model, state, "job", 24.0, outcome, 80.0) is None  # no reports while down
    outcome = advance(model, state, 24.0, 10.0, arrival_rate=80.0)
    assert outcome.running_s == pytest.approx(5.0)
    assert state.slot_seconds == pytest.approx(10 + 2 * 20)  # the new slots are paid from the decision


def test_reports_through_monitor_and_analyze_give_the_true_rate() -> None:
    model = JobModel((Operator("map", 120.0, selectivity=0.5),))
    state = JobState([3])
    outcome = advance(model, state, 1000.0, 10.0, arrival_rate=200.0)
    sent = report(model, state, "job", 1010.0, outcome, 200.0)
    assert sent is not None
    window, _ = add_report(None, sent, 10.0)
    analysis = analyze_window(close_window(window, "job", 10.0))
    assert analysis.true_processing_rate == pytest.approx(120.0, rel=1e-3)
    assert analysis.utilization == pytest.approx(200 / 360, rel=1e-3)
    assert analysis.arrival_rate == 200.0


@settings(max_examples=80, deadline=None)
@given(
    rates=st.lists(st.floats(0, 2000), min_size=1, max_size=30),
    p=st.integers(1, 16),
    slot=st.floats(10, 500),
    restart_at=st.integers(0, 29),
)
def test_records_are_conserved(rates: list[float], p: int, slot: float, restart_at: int) -> None:
    model = JobModel((Operator("map", slot),), downtime_up_s=7.0, checkpoint_interval_s=3.0)
    state = JobState([p])
    for i, rate in enumerate(rates):
        if i == restart_at:
            rescale(model, state, p + 1, at=i * 10.0)
        advance(model, state, i * 10.0, 10.0, rate)
        assert state.backlog >= -1e-6
    assert math.isclose(state.arrived + state.replayed, state.processed + state.backlog, rel_tol=1e-9, abs_tol=1e-6)
