"""The exactly-once sink's batch-id guard, delivery loop and counting, with a producer stand-in."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from pipeline.demo import ExactlyOnceSink, SinkOutput, SinkProgress
from pipeline.reporter import OutputCounter
from pipeline.workloads.common import ROWS_PER_RECORD, RowSink


class FakeProducer:
    """Records what is produced; `fail` makes every delivery report an error."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[tuple[bytes | None, dict[str, Any]]] = []
        self._reports: list[Any] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes = b"", on_delivery: Any = None) -> None:
        self.sent.append((key, json.loads(value)))
        self._reports.append(on_delivery)

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        for report in self._reports:
            report("broker down" if self.fail else None, None)
        self._reports.clear()
        return 0


class ListSink(ExactlyOnceSink):
    """Writes the records it is given per batch id."""

    def __init__(self, tmp_path: Path, batches: dict[int, SinkOutput], counter: OutputCounter) -> None:
        super().__init__("unused:9092", "out", tmp_path / "sink.json", counter)
        self.batches = batches
        self.rendered: list[int] = []

    def output(self, batch: Any, batch_id: int) -> SinkOutput:
        self.rendered.append(batch_id)
        return self.batches[batch_id]


def test_writes_counts_and_skips_a_replayed_batch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    counter = OutputCounter()
    sink = ListSink(tmp_path, {0: SinkOutput([("a", {"n": 1}), (None, {"n": 2})], 5, 100.0)}, counter)
    sink._producer = producer = FakeProducer()
    sink(None, 0)
    assert producer.sent == [(b"a", {"n": 1}), (None, {"n": 2})]
    assert SinkProgress(tmp_path / "sink.json").last_written() == 0
    assert counter.take() == 5 and counter.newest_event_time() == 100.0

    # Spark replays the last batch after a restart: a new sink on the same progress file skips it.
    again = ListSink(tmp_path, {}, counter)
    again._producer = replayed = FakeProducer()
    with caplog.at_level(logging.INFO, logger="tests.unit.test_exactly_once_sink"):
        again(None, 0)
    assert replayed.sent == [] and again.rendered == [] and counter.take() == 0
    assert "batch 0 is already in out; skipped" in caplog.text


def test_an_undelivered_batch_raises_and_is_not_saved(tmp_path: Path) -> None:
    counter = OutputCounter()
    sink = ListSink(tmp_path, {3: SinkOutput([("k", {"n": 1})], 1)}, counter)
    sink._producer = FakeProducer(fail=True)
    with pytest.raises(RuntimeError, match="batch 3: 0 records undelivered, errors: \\['broker down'\\]"):
        sink(None, 3)
    assert SinkProgress(tmp_path / "sink.json").last_written() == -1
    assert counter.take() is None


def test_a_batch_without_records_is_saved_without_a_producer(tmp_path: Path) -> None:
    counter = OutputCounter()
    sink = ListSink(tmp_path, {0: SinkOutput([], 0)}, counter)
    sink(None, 0)  # a producer would need a broker
    assert sink._producer is None
    assert SinkProgress(tmp_path / "sink.json").last_written() == 0
    assert counter.take() == 0


def test_row_sink_chunks_rows_and_counts_rows(tmp_path: Path) -> None:
    rows = [{"i": i} for i in range(ROWS_PER_RECORD + 1)]
    counter = OutputCounter()
    sink = RowSink("unused:9092", "out", tmp_path / "sink.json", lambda _batch, _id: (rows, 42.0), counter)
    sink._producer = producer = FakeProducer()
    sink(None, 2)
    assert [(key, record["part"], len(record["rows"])) for key, record in producer.sent] == [
        (None, 0, ROWS_PER_RECORD), (None, 1, 1)
    ]
    assert counter.take() == ROWS_PER_RECORD + 1 and counter.newest_event_time() == 42.0
