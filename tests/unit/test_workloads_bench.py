"""The pure parts of `python -m bench.workloads`: the arms' setup, the static arm's size, slot-seconds from
a parallelism timeline, event-time latency from a workload's output rows, and the median [worst] summary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.workloads import JOB_TIMES, closed_before, pattern_load
from contracts.analyses import Analysis
from evaluation.live import live_workload
from stack.live import ENRICH, LiveRun, LiveWorkload
from tests.support.backends import (
    WORKLOAD_ARMS,
    changes,
    event_time_latencies,
    executor_seconds,
    latency_summary,
    median_worst,
    parallelism_samples,
    peak_parallelism,
    row_event_time,
    summarize_cells,
    workload_arm_setup,
)

MASTER = "spark://127.0.0.1:7077"


def test_the_four_arms_differ_in_where_the_job_runs_who_sizes_it_and_where_it_starts() -> None:
    setups = {arm: workload_arm_setup(arm, MASTER, 4, 3) for arm in WORKLOAD_ARMS}
    args, config, start = setups["inplace"]
    assert args == ["--master", MASTER, "--backend", "inplace"] and config == {"scaling_backend": "in_place"}
    assert start == 1
    args, config, start = setups["restart"]
    assert "--master" not in args and args == ["--backend", "restart"] and config == {} and start == 1
    args, config, start = setups["dynamic"]
    assert args[:4] == ["--master", MASTER, "--backend", "restart"] and config == {"mode": "recommend"}
    assert "spark.dynamicAllocation.enabled=true" in args and "spark.dynamicAllocation.maxExecutors=4" in args
    assert start == 4
    args, config, start = setups["static"]
    assert args == ["--master", MASTER, "--backend", "restart"] and config == {"mode": "recommend"} and start == 3
    assert not any("dynamicAllocation" in a for a in args)


def test_a_static_arm_outside_the_cluster_and_an_unknown_arm_are_refused() -> None:
    with pytest.raises(ValueError, match="static parallelism"):
        workload_arm_setup("static", MASTER, 4, 5)
    with pytest.raises(ValueError, match="unknown arm"):
        workload_arm_setup("oracle", MASTER, 4, 3)


def test_the_static_arm_carries_the_peak_at_the_target_utilization_within_the_cluster() -> None:
    # 400 records/s at 210 a slot = 1.9 slots busy; at 70 % that is 2.72 slots: 3.
    assert peak_parallelism(400, 210, 0.7, 4) == 3
    assert peak_parallelism(350, 250, 0.7, 4) == 2  # exactly 2.0 slots needs 2, not 3
    assert peak_parallelism(5000, 210, 0.7, 4) == 4
    assert peak_parallelism(0, 210, 0.7, 4) == 1


def test_slot_seconds_of_a_local_run_follow_its_rescales_from_the_load_start() -> None:
    samples = parallelism_samples(100.0, 1, [(90.0, 2), (130.0, 3), (160.0, 1)])
    assert samples == [(100.0, 2), (130.0, 3), (160.0, 1)]
    # 2 x 30 + 3 x 30 + 1 x 40
    assert executor_seconds(samples, 100.0, 200.0) == pytest.approx(190.0)
    assert executor_seconds(parallelism_samples(0.0, 2, []), 0.0, 50.0) == pytest.approx(100.0)


def test_a_rows_event_time_is_its_newest_event_or_its_windows_end_and_latency_is_written_minus_it() -> None:
    assert row_event_time({"window_start": 0.0, "window_end": 10.0, "max_ts": 9.5}) == 9.5
    assert row_event_time({"order": 1, "order_ts": 3.0, "payment_ts": 4.0}) == 4.0
    assert row_event_time({"bidder": 1, "session_start": 2.0, "session_end": 14.0}) == 14.0
    assert row_event_time({"ids": [1, 2], "count": 2}) is None
    records = [(20.0, {"batch_id": 3, "part": 0, "rows": [{"max_ts": 9.5}, {"max_ts": 8.0}, {"key": "k"}]}),
               (31.0, {"id": 7, "ts": 30.0}), (40.0, {"batch_id": 4, "ids": [1]})]
    assert event_time_latencies(records) == [10.5, 12.0, 1.0]


def test_the_latency_summary_uses_nearest_rank_percentiles_and_says_when_there_is_nothing() -> None:
    summary = latency_summary([float(x) for x in range(1, 21)])
    assert summary == {"rows": 20, "mean_s": 10.5, "p95_s": 19.0, "max_s": 20.0}
    assert latency_summary([]) == {"rows": 0, "mean_s": None, "p95_s": None, "max_s": None}


@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=200))
def test_the_p95_is_an_observed_latency_at_most_the_maximum(values: list[float]) -> None:
    summary = latency_summary(values)
    assert summary["p95_s"] in {round(v, 3) for v in values}
    assert summary["p95_s"] <= summary["max_s"]
    assert summary["rows"] == len(values)


def test_executor_changes_count_only_changes_within_the_span() -> None:
    samples = [(0.0, 1), (1.0, 1), (2.0, 3), (3.0, 3), (4.0, 2), (9.0, 4)]
    assert changes(samples, 0.0, 5.0) == 2
    assert changes(samples, 2.0, 9.0) == 2


def test_each_cell_is_summarized_as_median_and_worst_over_its_runs() -> None:
    rows = [{"workload": "window-agg", "pattern": "step", "arm": "inplace", "slot_seconds": s, "lost": 0,
             "latency_p95_s": lat, "actions": a} for s, lat, a in ((300.0, 8.0, 1), (340.0, None, 2), (320.0, 9.0, 1))]
    rows.append({"workload": "window-agg", "pattern": "step", "arm": "static", "slot_seconds": 600.0, "lost": 0,
                 "latency_p95_s": 6.0, "actions": 0})
    cells = summarize_cells(rows, ("workload", "pattern", "arm"), {"slot_seconds": ".0f", "latency_p95_s": ".1f",
                                                                   "lost": ".0f"}, ("actions",))
    assert [c["arm"] for c in cells] == ["inplace", "static"]
    assert cells[0] == {"workload": "window-agg", "pattern": "step", "arm": "inplace", "runs": "3",
                        "slot_seconds": "320 [340]", "latency_p95_s": "8.5 [9.0]", "lost": "0 [0]",
                        "actions": "1, 2, 1"}
    assert median_worst([None, None], ".1f") == "-"


def test_the_patterns_load_arguments_last_their_duration_and_give_the_rates_range() -> None:
    args, duration, low, peak = pattern_load("steps:100:50,400:130")
    assert args == ["--shape", "steps:100:50,400:130"] and duration == 180 and (low, peak) == (100, 400)
    args, duration, low, peak = pattern_load("sine:240:160:180")
    assert args == ["--shape", "sine:240:160:180", "--duration", "180"] and duration == 180
    assert low == pytest.approx(80, abs=1) and peak == pytest.approx(400, abs=1)


def test_windows_count_as_closed_up_to_the_watermark_the_input_and_the_analyses_allow() -> None:
    run = LiveRun(started=0.0)
    inputs = [{"id": 1, "ts": 100.0}, {"id": 2, "ts": 130.0}]
    assert closed_before(run, inputs, 5.0) == 124.0
    run.analyses.append(Analysis.model_construct(window_end=140.0, watermark_lag_s=30.0))
    assert closed_before(run, inputs, 5.0) == 109.0  # the job's watermark was behind: 110
    assert closed_before(run, [], 5.0) is None


def test_the_backlog_after_the_load_is_the_last_window_that_ended_after_it() -> None:
    run = LiveRun(started=0.0)
    assert run.backlog_after(100.0) is None
    # Published out of order; a window without a backlog does not count.
    run.analyses += [Analysis.model_construct(window_end=t, backlog=b)
                     for t, b in ((110.0, 4), (95.0, 0), (105.0, 0), (115.0, None))]
    assert run.backlog_after(100.0) == 4 and run.backlog_after(90.0) == 4  # the last one, not any empty one
    assert run.backlog_after(110.0) is None
    run.analyses.append(Analysis.model_construct(window_end=120.0, backlog=0))
    assert run.backlog_after(100.0) == 0


def test_the_default_live_workload_is_todays_demo_job_and_others_name_their_records() -> None:
    assert ENRICH.entry_point == "pipeline.demo:build" and ENRICH.topic_name == "demo" and ENRICH.load_args() == []
    dedup = LiveWorkload("dedup", "pipeline.workloads.stateful:dedup", "dedup:0.1")
    assert dedup.topic_name == "dedup" and dedup.load_args() == ["--records", "dedup:0.1"]
    assert float(JOB_TIMES["scale_down_delay_s"]) < 300


def test_a_registered_workload_becomes_what_run_live_runs_with_its_options() -> None:
    found = live_workload("window-agg", {"statePartitions": "4", "cost_ms": "2"})
    assert found.entry_point == "pipeline.workloads.stateful:window_agg" and found.records == "demo"
    assert dict(found.options) == {"statePartitions": "4", "cost_ms": "2"}
    with pytest.raises(KeyError, match="unknown workload"):
        live_workload("nope")
