from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.demo import MAX_IDS_PER_RECORD, SinkProgress, batch_limit, output_records, wait_per_record
from pipeline.job import load_entry_point
from pipeline.kafka_source import SourceOptions
from pipeline.source_control import pause_ack_path


def test_output_records_one_per_key_sorted() -> None:
    records = output_records(7, [("b", 2, [5, 3]), ("a", 1, [9]), (None, 1, [1])])
    assert records == [
        {"batch_id": 7, "key": "a", "count": 1, "ids": [9]},
        {"batch_id": 7, "key": "b", "count": 2, "ids": [3, 5]},
        {"batch_id": 7, "key": None, "count": 1, "ids": [1]},
    ]


def test_output_records_splits_huge_keys() -> None:
    ids = list(range(MAX_IDS_PER_RECORD + 5))
    records = output_records(1, [("k", len(ids), ids)])
    assert [len(r["ids"]) for r in records] == [MAX_IDS_PER_RECORD, 5]
    assert [r["part"] for r in records] == [0, 1]


def test_batch_limit() -> None:
    assert batch_limit(4.0, 3, 5.0) == 3750
    assert batch_limit(1000.0, 1, 1.0) == 100


def test_sink_progress(tmp_path) -> None:
    progress = SinkProgress(tmp_path / "job" / "sink.json")
    assert progress.last_written() == -1
    progress.mark_written(4)
    assert SinkProgress(tmp_path / "job" / "sink.json").last_written() == 4


def test_wait_per_record_passes_batches_through() -> None:
    batch = pa.RecordBatch.from_pydict({"id": [1, 2, 3]})
    assert list(wait_per_record(0.0, iter([batch]))) == [batch]
    assert list(wait_per_record(1.0, iter([]))) == []


def test_source_options() -> None:
    opts = SourceOptions.parse({
        "bootstrap": "b:9092", "topic": "t", "maxrecordspertrigger": "500", "MINPARTITIONS": "4",
        "pauseFile": "/x/pause", "startingOffsets": "Latest",
    })
    assert opts == SourceOptions("b:9092", "t", "latest", 500, 4, "/x/pause")
    assert SourceOptions.parse({"bootstrap": "b", "topic": "t"}).min_partitions is None
    for bad in ({"topic": "t"}, {"bootstrap": "b", "topic": "t", "minPartitions": "0"},
                {"bootstrap": "b", "topic": "t", "startingOffsets": "middle"}):
        with pytest.raises(ValueError):
            SourceOptions.parse(bad)
    assert str(pause_ack_path("/x/pause")) == "/x/pause.ack"


def test_load_entry_point() -> None:
    assert load_entry_point("pipeline.demo:build").__name__ == "build"
    with pytest.raises(ValueError):
        load_entry_point("pipeline.demo")
    with pytest.raises(AttributeError):
        load_entry_point("pipeline.demo:nothing")


def test_the_demo_summary_counts_actions_slot_seconds_and_exactly_once() -> None:
    from agent.demo import demo_summary
    from contracts.analyses import Analysis
    from contracts.decisions import EventType, ScalingEvent
    from stack.live import LiveRun

    run = LiveRun(started=1000.0)
    for i in range(1, 31):  # 300 s of 10-s windows: 1 slot, 4 from 100 s, 1 from 200 s
        p = 4 if 100 < i * 10 <= 200 else 1
        run.analyses.append(Analysis(job_id="demo", window_end=1000.0 + 10 * i, parallelism=p, valid=True,
                                     true_processing_rate=200.0, true_output_rate=200.0,
                                     observed_processing_rate=100.0, utilization=0.5, arrival_rate=100.0,
                                     backlog=5000 if i == 10 else 0, closed_at=0.0))
    for at, frm, to in ((1100.0, 1, 4), (1200.0, 4, 1)):
        run.events.append(ScalingEvent(decision_id="d", job_id="demo", type=EventType.COMPLETED, timestamp=at,
                                       from_parallelism=frm, to_parallelism=to, downtime_s=0.0))
    run.events.append(ScalingEvent(decision_id="d", job_id="demo", type=EventType.RECOVERED, timestamp=1130.0,
                                   from_parallelism=1, to_parallelism=4,
                                   numbers={"predicted_s": 25.0, "observed_s": 30.0, "error_s": -5.0}))
    summary = demo_summary(run, 5, [0, 1, 2, 3, 4], 60)
    assert summary["recoveries"] == [{"at_s": 130.0, "from": 1, "to": 4, "predicted_s": 25.0, "observed_s": 30.0,
                                      "error_s": -5.0}]
    assert (summary["scale_ups"], summary["scale_downs"], summary["path"]) == (1, 1, "1 -> 4 -> 1")
    assert summary["span_s"] == 300 and summary["slot_seconds"] == 200 * 1 + 100 * 4
    assert summary["peak_slot_seconds"] == 4 * 300 and summary["peak_backlog"] == 5000
    assert (summary["records_in"], summary["records_out"], summary["missing"], summary["duplicates"]) == (5, 5, 0, 0)
    lossy = demo_summary(run, 5, [0, 1, 1, 3], 60)
    assert (lossy["missing"], lossy["duplicates"]) == (2, 1)


def test_a_recovery_is_open_from_a_completed_rescale_until_it_is_timed() -> None:
    from contracts.decisions import EventType, ScalingEvent
    from stack.live import LiveRun

    def event(kind: EventType, at: float) -> ScalingEvent:
        return ScalingEvent(decision_id="d", job_id="demo", type=kind, timestamp=at, from_parallelism=1,
                            to_parallelism=3)

    run = LiveRun(started=0.0)
    assert not run.recovery_open()  # nothing rescaled
    run.events += [event(EventType.STARTED, 10.0), event(EventType.COMPLETED, 30.0)]
    assert run.recovery_open()
    run.events.append(event(EventType.RECOVERED, 60.0))
    assert not run.recovery_open()
    run.events.append(event(EventType.COMPLETED, 90.0))  # a second rescale: its recovery is not the first's
    assert run.recovery_open()
