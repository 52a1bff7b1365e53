"""The pure parts of bench.state_restarts: state load, the planner's prediction before each restart, recovery."""

from __future__ import annotations

import math

import pytest

from bench.state_restarts import (
    Batch,
    Restart,
    capacity_at,
    caught_up_at,
    judge,
    relative_error,
    rocksdb_metric,
    steady,
    summarize,
    targets,
)
from contracts.plan_state import Direction, Downtimes


def restart(index: int, from_p: int, to_p: int, rows: int, seconds: float, baseline: bool = False,
            recovered: float | None = None, rate: float = 100.0, backlog: int = 0) -> Restart:
    return Restart(index, baseline, from_p, to_p, rows, rows * 100, 1000.0 * index, seconds, None, None, backlog,
                   recovered, rate)


def test_targets_alternate_and_each_is_a_change() -> None:
    assert targets(5, 1, 2, start=1) == [2, 1, 2, 1, 2]
    assert targets(3, 1, 3, start=3) == [1, 3, 1]


def test_relative_error() -> None:
    assert relative_error(12.0, 10.0) == pytest.approx(0.2)
    assert relative_error(8.0, 10.0) == pytest.approx(0.2)
    assert relative_error(None, 10.0) is None
    assert relative_error(5.0, 0.0) is None
    assert relative_error(math.inf, 10.0) is None


def test_state_load_is_the_restart_less_the_baseline_in_its_direction() -> None:
    runs = [restart(1, 1, 2, 0, 4.0, baseline=True), restart(2, 2, 1, 0, 6.0, baseline=True),
            restart(3, 1, 2, 1000, 10.0), restart(4, 2, 1, 2000, 5.0)]
    judged = judge(runs, default_s=8.0, capacity=[None] * 4)
    assert [r.state_load_s for r in judged] == [0.0, 0.0, 6.0, 0.0]  # never below 0
    assert judged[2].share == pytest.approx(0.6)


def test_the_prediction_uses_only_the_restarts_before_it() -> None:
    runs = [restart(1, 1, 2, 0, 4.0, baseline=True), restart(2, 2, 1, 0, 4.0, baseline=True),
            restart(3, 1, 2, 1000, 6.0), restart(4, 2, 1, 2000, 8.0), restart(5, 1, 2, 3000, 10.0)]
    judged = judge(runs, default_s=9.0, capacity=[None] * 5)
    assert judged[0].predicted_s == 9.0  # nothing measured: the first start's time
    measured = Downtimes()
    for before, r in zip(runs, judged[1:], strict=False):
        measured = measured.add(before.direction, before.restart_s, before.rows_before)
        assert r.predicted_s == pytest.approx(measured.at_state(r.rows_before).typical(r.direction, 9.0))
    # Changing a later restart changes no earlier prediction.
    changed = judge([*runs[:4], restart(5, 1, 2, 3000, 99.0)], default_s=9.0, capacity=[None] * 5)
    assert [r.predicted_s for r in changed] == [r.predicted_s for r in judged]


def test_recovery_is_predicted_with_the_predicted_restart_and_the_capacity() -> None:
    # Before the second restart one scale-up of 4 s was measured at no state: it predicts 4 s; 100/s arrive
    # for 4 s, and 300/s drain them at 200/s spare past the 100 records tolerated (1 s of arrivals): 1.5 s.
    runs = [restart(1, 1, 2, 0, 4.0, baseline=True), restart(2, 1, 2, 0, 5.0)]
    judged = judge(runs, default_s=4.0, capacity=[None, 300.0], tolerance_s=1.0)
    assert judged[0].predicted_recovery_s is None
    assert judged[1].predicted_recovery_s == pytest.approx(4.0 + 300 / 200)


def test_summary_judges_only_restarts_whose_state_load_is_a_third() -> None:
    runs = [restart(1, 1, 2, 0, 4.0, baseline=True), restart(2, 2, 1, 0, 4.0, baseline=True),
            restart(3, 1, 2, 10, 5.0, recovered=6.0),  # load 1 s of 5: not judged
            restart(4, 2, 1, 1000, 8.0, recovered=9.0), restart(5, 1, 2, 2000, 12.0, recovered=13.0)]
    judged = judge(runs, default_s=4.0, capacity=[None] * 5)
    summary = summarize(judged)
    assert (summary["restarts"], summary["judged"]) == (3, 2)
    errors = [relative_error(r.predicted_s, r.restart_s) for r in judged[3:]]
    assert summary["restart"]["n"] == 2
    assert summary["restart"]["median"] == pytest.approx(sum(errors) / 2)
    assert summary["restart"]["worst"] == pytest.approx(max(errors))
    assert summary["recovery"] == {"n": 0, "median": None, "worst": None}  # no capacity: no prediction


def batch(run: int, batch_id: int, end: float, backlog: int, rows: int = 100, duration: float = 1.0) -> Batch:
    return Batch(run, batch_id, end, duration, rows, backlog, 0, 0)


def test_caught_up_at_is_the_first_batch_of_the_run_within_the_tolerance() -> None:
    batches = [batch(1, 7, 12.0, 50), batch(1, 5, 10.0, 900), batch(1, 6, 11.0, 400), batch(0, 4, 5.0, 0)]
    assert caught_up_at(batches, 1, 500) == 11.0
    assert caught_up_at(batches, 1, 10) is None


def test_capacity_is_the_rate_of_the_last_full_batches_at_that_parallelism() -> None:
    batches = [batch(0, 0, 1.0, 0, rows=900), batch(0, 1, 2.0, 0, rows=300), batch(0, 2, 3.0, 0, rows=500),
               batch(0, 3, 4.0, 0, rows=700, duration=2.0), batch(1, 4, 5.0, 0, rows=5000),
               batch(1, 5, 6.0, 0, rows=400), batch(0, 6, 9.0, 0, rows=800)]
    parallelism_of = {0: 1, 1: 2}
    # Run 0 before t=8: batch 0 is its first (start-up), batch 1 did not fill; 500/s and 350/s remain.
    assert capacity_at(batches, parallelism_of, 1, before=8.0, full=400) == pytest.approx(425.0)
    assert capacity_at(batches, parallelism_of, 1, before=8.0, full=400, last=1) == pytest.approx(350.0)
    assert capacity_at(batches, parallelism_of, 2, before=8.0, full=400) == 400.0
    assert capacity_at(batches, parallelism_of, 3, before=8.0, full=400) is None


def test_steady_is_the_median_of_the_last_batches_that_read_records() -> None:
    batches = [batch(0, 1, 1.0, 0, duration=9.0), batch(0, 2, 2.0, 0, duration=1.0),
               batch(0, 3, 3.0, 0, duration=2.0), batch(0, 4, 4.0, 0, rows=0, duration=0.1),
               batch(0, 5, 5.0, 0, duration=3.0), batch(1, 6, 6.0, 0, duration=7.0)]
    assert steady(batches, 0) == 2.0
    assert steady(batches, 2) is None


def test_first_batch_excess() -> None:
    r = Restart(1, False, 1, 2, 0, 0, 0.0, 9.0, 5.0, 1.5, 0, None, 1.0)
    assert r.first_batch_excess_s == pytest.approx(3.5)
    assert restart(1, 1, 2, 0, 1.0).first_batch_excess_s is None


def test_direction_of_a_restart() -> None:
    assert restart(1, 1, 2, 0, 1.0).direction is Direction.UP
    assert restart(1, 2, 1, 0, 1.0).direction is Direction.DOWN


def test_rocksdb_metric_sums_the_state_operators_and_is_none_when_unreported() -> None:
    progress = {"stateOperators": [{"customMetrics": {"rocksdbLoadLatencyMs": 120}},
                                   {"customMetrics": {"rocksdbLoadLatencyMs": 30, "other": 1}}]}
    assert rocksdb_metric(progress, "rocksdbLoadLatencyMs") == 150.0
    hdfs = {"stateOperators": [{"customMetrics": {"loadedMapCacheMissCount": 8}}]}
    assert rocksdb_metric(hdfs, "rocksdbLoadLatencyMs") is None
    assert rocksdb_metric({"stateOperators": []}, "rocksdbLoadLatencyMs") is None
