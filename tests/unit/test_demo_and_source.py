from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.demo import MAX_IDS_PER_RECORD, SinkProgress, batch_limit, output_records, wait_per_record
from pipeline.job import load_entry_point
from pipeline.kafka_source import SourceOptions, pause_ack_path


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
