from __future__ import annotations

import pytest

from contracts.messages import MetricReport
from pipeline.metrics import (
    IntervalAggregator,
    ProgressSample,
    StageTotals,
    StageTracker,
    build_metric_report,
    parse_spark_timestamp,
    sample_from_progress,
)


def stage(stage_id: int, attempt: int = 0, status: str = "COMPLETE", run_ms: int = 1000, cpu_ns: int = 10**8) -> dict:
    return {
        "stageId": stage_id,
        "attemptId": attempt,
        "status": status,
        "executorRunTime": run_ms,
        "executorCpuTime": cpu_ns,
        "numCompleteTasks": 2,
    }


def test_stage_tracker_counts_each_completed_attempt_once() -> None:
    tracker = StageTracker()
    first = tracker.new_completed([stage(1), stage(2, status="ACTIVE"), stage(3, status="FAILED")])
    assert (first.run_time_s, first.stages, first.tasks) == (1.0, 1, 2)
    assert first.cpu_time_s == pytest.approx(0.1)
    second = tracker.new_completed([stage(1), stage(2), stage(2, attempt=1, run_ms=500)])
    assert second.run_time_s == pytest.approx(1.5)
    assert tracker.new_completed([stage(1), stage(2), stage(2, attempt=1)]).stages == 0


def test_stage_tracker_primes_and_forgets_what_spark_no_longer_lists() -> None:
    tracker = StageTracker()
    tracker.prime([stage(i) for i in range(5)])
    assert tracker.new_completed([stage(i) for i in range(6)]).stages == 1
    # Spark retains only the newest stages; older keys are dropped from memory.
    assert tracker.new_completed([stage(i) for i in range(4, 9)]).stages == 3
    assert len(tracker) == 5


def sample(t: float, rows: int, log_end: dict[int, int], processed: dict[int, int], sink: int | None = None):
    return ProgressSample(
        trigger_start=t, duration_s=0.5, input_rows=rows, sink_rows=sink, processed=processed, log_end=log_end
    )


def test_aggregator_builds_a_report_per_interval() -> None:
    agg = IntervalAggregator(job_id="orders", started_at=1000.0)
    agg.add(sample(1000.0, 100, {0: 1000, 1: 1000}, {0: 950, 1: 1000}))
    assert not agg.due(now=1010.0, min_interval_s=5.0)  # one sample cannot show an arrival rate
    agg.add(sample(1002.0, 150, {0: 1100, 1: 1100}, {0: 1100, 1: 1080}))
    assert not agg.due(now=1003.0, min_interval_s=5.0)
    assert agg.due(now=1005.0, min_interval_s=5.0)
    report = agg.report(parallelism=2, stages=StageTotals(run_time_s=3.0, cpu_time_s=1.0, stages=2))
    assert isinstance(report, MetricReport)
    assert report.timestamp == pytest.approx(1002.5)
    assert report.interval_s == pytest.approx(2.5)
    assert (report.records_in, report.records_out, report.busy_time_s) == (250, 250, 3.0)
    assert report.cpu_utilization == pytest.approx(1.0 / (2.5 * 2))
    assert report.source is not None
    assert report.source.arrival_rate == pytest.approx(100.0)  # 200 records in 2 s
    assert report.source.backlog == 20 + 50  # left behind, plus 0.5 s of arrivals during the batch
    assert report.source.partitions == 2

    # The next interval measures arrival from the last sample of this one.
    agg.add(sample(1004.0, 80, {0: 1150, 1: 1150}, {0: 1150, 1: 1150}, sink=8))
    report = agg.report(parallelism=2, stages=StageTotals(), job_output=None)
    assert report is not None
    assert report.interval_s == pytest.approx(2.0)
    assert report.records_out == 8  # the sink counted its rows
    assert report.source is not None and report.source.arrival_rate == pytest.approx(50.0)
    assert report.source.backlog == 25
    assert agg.report(parallelism=2, stages=StageTotals()) is None


def test_aggregator_prefers_the_jobs_own_output_count() -> None:
    agg = IntervalAggregator(job_id="j", started_at=0.5)
    agg.add(sample(1.0, 10, {0: 10}, {0: 10}, sink=3))
    agg.add(sample(2.0, 10, {0: 20}, {0: 20}, sink=None))
    report = agg.report(parallelism=1, stages=StageTotals(available=False), job_output=4)
    assert report is not None
    assert report.records_out == 4
    assert report.cpu_utilization is None
    assert report.shuffle_partitions is None  # a task count that follows the parallelism is not reported


def test_a_task_count_fixed_whatever_the_parallelism_is_reported_as_the_shuffle_partitions() -> None:
    agg = IntervalAggregator(job_id="j", started_at=0.5, shuffle_partitions=4)  # in place, at most 4 executors
    agg.add(sample(1.0, 10, {0: 10}, {0: 10}))
    agg.add(sample(2.0, 10, {0: 20}, {0: 20}))
    report = agg.report(parallelism=3, stages=StageTotals())
    assert report is not None and report.shuffle_partitions == 4 and report.parallelism == 3


def test_aggregator_without_source_offsets_reports_no_source() -> None:
    agg = IntervalAggregator(job_id="j", started_at=0.0)
    agg.add(sample(1.0, 10, {}, {}))
    assert agg.due(now=10.0, min_interval_s=1.0)
    report = agg.report(parallelism=1, stages=StageTotals())
    assert report is not None and report.source is None and report.records_out == 10


def test_build_metric_report_clamps() -> None:
    report = build_metric_report(
        job_id="j", end=10.0, interval_s=0.0, parallelism=1, records_in=-1, records_out=0,
        busy_time_s=-2.0, cpu_time_s=5.0,
    )
    assert report.interval_s > 0 and report.records_in == 0 and report.busy_time_s == 0.0
    assert report.cpu_utilization == 1.0


def test_sample_from_progress_json() -> None:
    progress = {
        "id": "q",
        "timestamp": "2024-05-01T12:00:00.500Z",
        "numInputRows": 42,
        "durationMs": {"triggerExecution": 1500},
        "sources": [{"startOffset": {"0": 1}, "endOffset": {"0": 43}, "latestOffset": {"0": 50}}],
        "sink": {"numOutputRows": -1},
    }
    s = sample_from_progress(progress)
    assert s.trigger_start == parse_spark_timestamp("2024-05-01T12:00:00.500Z")
    assert s.end == pytest.approx(s.trigger_start + 1.5)
    assert (s.input_rows, s.sink_rows, s.processed, s.log_end) == (42, None, {0: 43}, {0: 50})


def test_a_batch_counts_the_records_its_source_read_once_however_often_the_query_scans_it() -> None:
    """A stream-stream self-join scans its one source twice, and Spark's numInputRows counts both scans;
    the records read are the source's offsets apart. Without both offsets, numInputRows stands."""
    progress = {
        "timestamp": "2024-05-01T12:00:00.500Z", "numInputRows": 84, "durationMs": {"triggerExecution": 1500},
        "sources": [{"startOffset": {"0": 1, "1": 10}, "endOffset": {"0": 23, "1": 30},
                     "latestOffset": {"0": 50, "1": 30}, "numInputRows": 84}],
    }
    assert sample_from_progress(progress).input_rows == 42
    # A query's first batch has no start offsets: read from 0 (live, its first batch read 2,000 records
    # as 750, 750 and 500 in three partitions, and numInputRows said 4,000).
    first = {**progress, "numInputRows": 4000,
             "sources": [{**progress["sources"][0], "startOffset": None, "endOffset": {"0": 750, "1": 750, "2": 500}}]}
    assert sample_from_progress(first).input_rows == 2000
    latest = {**first, "numInputRows": 100}  # a first batch from the log's end: fewer rows than offsets
    assert sample_from_progress(latest).input_rows == 100
    two = {**progress, "sources": [progress["sources"][0], {"endOffset": {"0": 5}}]}
    assert sample_from_progress(two).input_rows == 84


def test_aggregator_counts_the_micro_batches_that_read_records_and_their_time() -> None:
    agg = IntervalAggregator(job_id="j", started_at=0.0)
    agg.add(sample(0.0, 100, {0: 100}, {0: 100}))
    agg.add(sample(1.0, 0, {0: 100}, {0: 100}))  # an empty trigger: no batch cost to measure
    agg.add(sample(2.0, 50, {0: 150}, {0: 150}))
    report = agg.report(parallelism=1, stages=StageTotals(run_time_s=0.4))
    assert report is not None
    assert (report.batches, report.batch_time_s) == (2, pytest.approx(1.0))  # two batches of 0.5 s
    agg.add(sample(3.0, 10, {0: 160}, {0: 160}))
    report = agg.report(parallelism=1, stages=StageTotals())
    assert report is not None and (report.batches, report.batch_time_s) == (1, pytest.approx(0.5))


def test_a_report_gives_batches_and_their_time_together() -> None:
    base = {"job_id": "j", "timestamp": 10.0, "interval_s": 5.0, "parallelism": 1, "records_in": 1,
            "records_out": 1, "busy_time_s": 0.1}
    with pytest.raises(ValueError, match="both or neither"):
        MetricReport.model_validate(base | {"batches": 3})
    assert MetricReport.model_validate(base | {"batches": 3, "batch_time_s": 2.0}).batches == 3
