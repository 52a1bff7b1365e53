"""A stateful query's state and event-time lags, from the query's progress to the analysis.

The progress events below are those of a real run: a 5-s tumbling-window count with a 5-s watermark
over Spark's `rate` source (50 rows/s), RocksDB state store, 4 shuffle partitions, local[2],
2-s trigger (`query.lastProgress`; RocksDB's custom metrics shortened to three)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.listener import StreamingQueryProgress

from analyze.true_rates import analyze_window
from contracts.messages import MetricReport, MetricWindow, StateWindow
from monitor.windows import add_report, close_window
from pipeline.metrics import (
    MAX_LAG_S,
    IntervalAggregator,
    StageTotals,
    parse_spark_timestamp,
    sample_from_progress,
    state_from_progress,
    watermark_from_progress,
)
from pipeline.reporter import OutputCounter

# Batch 0: no data yet, watermark at epoch 0; batches 18 and 19: 100 rows each, windows in state.
BATCH_0 = json.loads(
    '{"id": "4d129e35-ada9-4fdf-a087-a74808cb3248", "runId": "effefece-f29d-413d-8040-79d46457926d", "name": null, '
    '"timestamp": "2026-11-29T08:58:00.806Z", "batchId": 0, "batchDuration": 3202, "numInputRows": 0, '
    '"inputRowsPerSecond": 0.0, "processedRowsPerSecond": 0.0, "durationMs": {"addBatch": 2458, '
    '"commitOffsets": 72, "getBatch": 1, "latestOffset": 0, "queryPlanning": 603, "triggerExecution": 3198, '
    '"walCommit": 50}, "eventTime": {"watermark": "1970-01-01T00:00:00.000Z"}, "stateOperators": '
    '[{"operatorName": "stateStoreSave", "numRowsTotal": 0, "numRowsUpdated": 0, "allUpdatesTimeMs": 22, '
    '"numRowsRemoved": 0, "allRemovalsTimeMs": 145, "commitTimeMs": 1076, "memoryUsedBytes": 8544, '
    '"numRowsDroppedByWatermark": 0, "numShufflePartitions": 4, "numStateStoreInstances": 4, "customMetrics": '
    '{"rocksdbCommitCheckpointLatency": 82, "rocksdbPinnedBlocksMemoryUsage": 352, "rocksdbSstFileSize": 0}}], '
    '"sources": [{"description": "RateStreamV2[rowsPerSecond=50, rampUpTimeSeconds=0, numPartitions=default", '
    '"startOffset": null, "endOffset": 0, "latestOffset": 0, "numInputRows": 0, "inputRowsPerSecond": 0.0, '
    '"processedRowsPerSecond": 0.0}], "sink": {"description": "NoopTable", "numOutputRows": 0}}'
)
BATCH_18 = json.loads(
    '{"id": "4d129e35-ada9-4fdf-a087-a74808cb3248", "runId": "effefece-f29d-413d-8040-79d46457926d", "name": null, '
    '"timestamp": "2026-11-29T08:58:38.001Z", "batchId": 18, "batchDuration": 555, "numInputRows": 100, '
    '"inputRowsPerSecond": 50.0, "processedRowsPerSecond": 180.2, "durationMs": {"addBatch": 421, '
    '"commitOffsets": 57, "getBatch": 0, "latestOffset": 0, "queryPlanning": 36, "triggerExecution": 551, '
    '"walCommit": 35}, "eventTime": {"avg": "2026-11-29T08:58:36.727Z", "max": "2026-11-29T08:58:37.717Z", '
    '"min": "2026-11-29T08:58:35.737Z", "watermark": "2026-11-29T08:58:30.717Z"}, "stateOperators": '
    '[{"operatorName": "stateStoreSave", "numRowsTotal": 20, "numRowsUpdated": 10, "allUpdatesTimeMs": 26, '
    '"numRowsRemoved": 10, "allRemovalsTimeMs": 13, "commitTimeMs": 421, "memoryUsedBytes": 60088, '
    '"numRowsDroppedByWatermark": 0, "numShufflePartitions": 4, "numStateStoreInstances": 4, "customMetrics": '
    '{"rocksdbCommitCheckpointLatency": 44, "rocksdbPinnedBlocksMemoryUsage": 352, "rocksdbSstFileSize": 13286}}], '
    '"sources": [{"description": "RateStreamV2[rowsPerSecond=50, rampUpTimeSeconds=0, numPartitions=default", '
    '"startOffset": 35, "endOffset": 37, "latestOffset": 37, "numInputRows": 100, "inputRowsPerSecond": 50.0, '
    '"processedRowsPerSecond": 180.2}], "sink": {"description": "NoopTable", "numOutputRows": 10}}'
)
BATCH_19 = json.loads(
    '{"id": "4d129e35-ada9-4fdf-a087-a74808cb3248", "runId": "effefece-f29d-413d-8040-79d46457926d", "name": null, '
    '"timestamp": "2026-11-29T08:58:40.000Z", "batchId": 19, "batchDuration": 561, "numInputRows": 100, '
    '"inputRowsPerSecond": 50.0, "processedRowsPerSecond": 178.3, "durationMs": {"addBatch": 411, '
    '"commitOffsets": 79, "getBatch": 0, "latestOffset": 0, "queryPlanning": 36, "triggerExecution": 560, '
    '"walCommit": 33}, "eventTime": {"avg": "2026-11-29T08:58:38.727Z", "max": "2026-11-29T08:58:39.717Z", '
    '"min": "2026-11-29T08:58:37.737Z", "watermark": "2026-11-29T08:58:32.717Z"}, "stateOperators": '
    '[{"operatorName": "stateStoreSave", "numRowsTotal": 20, "numRowsUpdated": 10, "allUpdatesTimeMs": 18, '
    '"numRowsRemoved": 0, "allRemovalsTimeMs": 6, "commitTimeMs": 403, "memoryUsedBytes": 70200, '
    '"numRowsDroppedByWatermark": 0, "numShufflePartitions": 4, "numStateStoreInstances": 4, "customMetrics": '
    '{"rocksdbCommitCheckpointLatency": 38, "rocksdbPinnedBlocksMemoryUsage": 352, "rocksdbSstFileSize": 18417}}], '
    '"sources": [{"description": "RateStreamV2[rowsPerSecond=50, rampUpTimeSeconds=0, numPartitions=default", '
    '"startOffset": 37, "endOffset": 39, "latestOffset": 39, "numInputRows": 100, "inputRowsPerSecond": 50.0, '
    '"processedRowsPerSecond": 178.3}], "sink": {"description": "NoopTable", "numOutputRows": 0}}'
)
WATERMARK_19 = parse_spark_timestamp("2026-11-29T08:58:32.717Z")
END_19 = parse_spark_timestamp("2026-11-29T08:58:40.000Z") + 0.560


def with_state(progress: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return progress | {"stateOperators": [progress["stateOperators"][0] | fields]}


def aggregator(shuffle_partitions: int | None = None) -> IntervalAggregator:
    return IntervalAggregator(job_id="counts", started_at=parse_spark_timestamp(BATCH_18["timestamp"]) - 2.0,
                              shuffle_partitions=shuffle_partitions)


def report_of(*progress: dict[str, Any], shuffle_partitions: int | None = None,
              newest_output: float | None = None) -> MetricReport:
    agg = aggregator(shuffle_partitions)
    for p in progress:
        agg.add(sample_from_progress(p))
    report = agg.report(parallelism=2, stages=StageTotals(run_time_s=0.6), newest_output_event_time=newest_output)
    assert report is not None
    return MetricReport.model_validate_json(report.to_bytes())  # as the monitor reads it


# ---------------------------------------------------------------- the progress


def test_a_stateful_progress_gives_its_operators_and_watermark() -> None:
    sample = sample_from_progress(BATCH_19)
    assert [(s.operator, s.rows, s.memory_bytes, s.partitions) for s in sample.state] == [
        ("stateStoreSave", 20, 70200, 4)]
    assert sample.state[0].commit_time_s == pytest.approx(0.403)
    assert sample.watermark == pytest.approx(WATERMARK_19)


def test_pysparks_progress_object_reads_as_its_json() -> None:
    progress = StreamingQueryProgress.fromJson(BATCH_19)  # what a listener's event carries
    assert sample_from_progress(progress) == sample_from_progress(BATCH_19)


def test_a_watermark_at_epoch_zero_before_any_data_is_no_watermark() -> None:
    assert sample_from_progress(BATCH_0).watermark is None
    assert report_of(BATCH_0).watermark_lag_s is None
    assert watermark_from_progress(None) is None and watermark_from_progress({}) is None
    assert watermark_from_progress({"watermark": "not a time"}) is None


def test_a_stateless_progress_has_no_state_and_no_watermark() -> None:
    stateless = {k: v for k, v in BATCH_19.items() if k not in ("stateOperators", "eventTime")}
    sample = sample_from_progress(stateless)
    assert (sample.state, sample.watermark) == ((), None)
    report = report_of(stateless)
    assert (report.state, report.watermark_lag_s, report.output_lag_s) == ([], None, None)


# ---------------------------------------------------------------- the report


def test_a_report_carries_the_state_at_its_end_and_the_commit_time_of_its_batches() -> None:
    report = report_of(BATCH_18, BATCH_19)
    assert report.timestamp == pytest.approx(END_19)
    [op] = report.state
    assert (op.operator, op.rows, op.memory_bytes, op.partitions) == ("stateStoreSave", 20, 70200, 4)
    assert op.commit_time_s == pytest.approx(0.421 + 0.403)
    assert report.watermark_lag_s == pytest.approx(END_19 - WATERMARK_19)  # 7.84 s: 5-s window + 5-s watermark
    assert report.output_lag_s is None  # the job gave no event time of its output


def test_commit_time_starts_again_with_each_report() -> None:
    agg = aggregator()
    agg.add(sample_from_progress(BATCH_18))
    first = agg.report(parallelism=2, stages=StageTotals())
    agg.add(sample_from_progress(BATCH_19))
    second = agg.report(parallelism=2, stages=StageTotals())
    assert first is not None and second is not None
    assert (first.state[0].commit_time_s, second.state[0].commit_time_s) == (pytest.approx(0.421),
                                                                             pytest.approx(0.403))


def test_the_output_lag_is_the_reports_end_minus_the_newest_event_time_written() -> None:
    newest = parse_spark_timestamp("2026-11-29T08:58:35.000Z")
    assert report_of(BATCH_19, newest_output=newest).output_lag_s == pytest.approx(END_19 - newest)
    assert report_of(BATCH_19, newest_output=END_19 + 30.0).output_lag_s == 0.0  # a clock ahead: clamped
    assert report_of(BATCH_19, newest_output=0.0).output_lag_s == MAX_LAG_S  # the contract's bound


def test_the_output_counter_keeps_the_newest_event_time_the_job_wrote() -> None:
    counter = OutputCounter()
    counter.add(5)
    assert (counter.newest_event_time(), counter.take()) == (None, 5)
    counter.add(3, newest_event_time=120.5)
    counter.add(2, newest_event_time=110.0)  # an older batch finishing late does not move it back
    counter.add(1, newest_event_time=math.nan)
    assert (counter.newest_event_time(), counter.take(), counter.take()) == (120.5, 6, 0)
    assert counter.newest_event_time() == 120.5  # kept across intervals: no output means a growing lag


@pytest.mark.parametrize("partitions", [None, "4", 0, -1, 2.5, True, 10**7, math.inf, [4], {"n": 4}])
def test_state_partitions_that_cannot_be_read_are_none_and_the_report_is_built(partitions: Any) -> None:
    progress = with_state(BATCH_19, numShufflePartitions=partitions)
    if partitions is None:
        del progress["stateOperators"][0]["numShufflePartitions"]
    assert sample_from_progress(progress).state[0].partitions is None
    report = report_of(progress)
    assert report.state[0].partitions is None and report.state[0].rows == 20


@pytest.mark.parametrize("operators", [None, "stateStoreSave", 4, {"operatorName": "x"}, [None], []])
def test_a_state_list_that_cannot_be_read_gives_no_state(operators: Any) -> None:
    assert sample_from_progress(BATCH_19 | {"stateOperators": operators}).state == ()


def test_unreadable_numbers_of_a_state_operator_are_zero() -> None:
    progress = with_state(BATCH_19, numRowsTotal=-1, memoryUsedBytes="lots", commitTimeMs=None, operatorName="")
    [op] = state_from_progress(progress["stateOperators"])
    assert (op.operator, op.rows, op.memory_bytes, op.commit_time_s, op.partitions) == ("state", 0, 0, 0.0, 4)


def test_state_partitions_from_the_checkpoint_above_the_configured_shuffle_partitions_are_reported_as_them() -> None:
    # The query first started with 4 partitions; the runner now sets 2, which Spark ignores for this query.
    report = report_of(BATCH_19, shuffle_partitions=2)
    assert (report.shuffle_partitions, report.state[0].partitions) == (4, 4)
    assert report_of(BATCH_19, shuffle_partitions=8).shuffle_partitions == 8


@given(st.lists(st.none() | st.integers(-5, 10**7) | st.floats(allow_nan=True) | st.text(max_size=3),
                min_size=4, max_size=4))
def test_any_state_operator_numbers_give_a_valid_report(values: list[Any]) -> None:
    rows, memory, commit, partitions = values
    progress = with_state(BATCH_19, numRowsTotal=rows, memoryUsedBytes=memory, commitTimeMs=commit,
                          numShufflePartitions=partitions)
    report = report_of(BATCH_18, progress, shuffle_partitions=8)
    assert len(report.state) == 1 and report.state[0].commit_time_s >= 0.0


# ---------------------------------------------------------------- to the analysis


def window_of(*reports: MetricReport) -> MetricWindow:
    state = None
    for offset, report in enumerate(reports):
        state, _ = add_report(state, report, 10.0, 0, offset)
    assert state is not None
    return close_window(state, "counts", 10.0)


def test_the_state_and_lags_reach_the_analysis() -> None:
    newest = END_19 - 9.0
    report = report_of(BATCH_18, BATCH_19, newest_output=newest)
    window = window_of(report)
    assert window.state is not None and window.state.commit_time_s == pytest.approx(0.824)
    assert window.state == StateWindow(operators=1, rows=20, memory_bytes=70200,
                                       commit_time_s=window.state.commit_time_s, partitions=4)
    analysis = analyze_window(window)
    assert analysis.state == window.state
    assert analysis.watermark_lag_s == pytest.approx(END_19 - WATERMARK_19)
    assert analysis.output_lag_s == pytest.approx(9.0)


def test_an_invalid_window_still_carries_its_state_and_lags() -> None:
    report = report_of(BATCH_19)
    idle = report.model_copy(update={"records_in": 0, "records_out": 0})  # no records: no true rates
    analysis = analyze_window(window_of(idle))
    assert not analysis.valid and analysis.state is not None and analysis.state.rows == 20
    assert analysis.watermark_lag_s == pytest.approx(report.watermark_lag_s)


def test_a_stateless_window_analyses_without_state() -> None:
    report = MetricReport(job_id="counts", timestamp=1005.0, interval_s=1.0, parallelism=2, records_in=10,
                          records_out=10, busy_time_s=0.5)
    analysis = analyze_window(window_of(report))
    assert (analysis.state, analysis.watermark_lag_s, analysis.output_lag_s) == (None, None, None)
