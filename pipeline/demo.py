"""The demo job (entry point `pipeline.demo:build`): Kafka in, a per-record wait, keyed counts out.

Input records (topic option `input_topic`, default demo.input) are JSON
{"id": <int>, "key": <str>, "ts": <float>}. Each record costs `cost_ms` milliseconds of waiting,
not computing, the way a call to an external service would: a task slot that waits still holds
the slot, so throughput grows with task slots even on a machine with few cores.

Per micro-batch the job groups the records by key and writes, from the driver, one record per key
(topic option `output_topic`, default demo.output):
{"batch_id": <int>, "key": <str>, "count": <int>, "ids": [<int>, ...]}. Keys with more than
MAX_IDS_PER_RECORD ids in one batch get several records (with "part": 0, 1, ...).

Options: input_topic, output_topic, cost_ms (default DEFAULT_COST_MS), batch_seconds (caps a
micro-batch at that much work unless maxRecordsPerTrigger is set).

The sink is idempotent per batch id: after a batch's records are flushed, its id is saved in the
job's directory, and a batch Spark replays after a restart is skipped if already written. So across
graceful restarts (the runner stops between micro-batches) every input id appears exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.job import JobContext
from pipeline.reporter import OutputCounter

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

DEFAULT_INPUT_TOPIC = "demo.input"
DEFAULT_OUTPUT_TOPIC = "demo.output"
# Waiting per record. 4 ms gives a task slot at most 250 records/s: four slots carry ~1,000/s, so a
# load of ~700 records/s keeps a parallelism of 4 about 70 % busy.
DEFAULT_COST_MS = 4.0
MAX_IDS_PER_RECORD = 10_000
# Unless `maxRecordsPerTrigger` is given, a micro-batch holds at most this many seconds of work at
# full speed: an overloaded job then still finishes a batch quickly, so a graceful stop (which waits
# for the batch in flight) stays short exactly when the job most needs rescaling.
DEFAULT_BATCH_SECONDS = 5.0
INPUT_SCHEMA = "id long, key string, ts double"


def wait_per_record(cost_ms: float, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Pass the records through, waiting `cost_ms` per record (one sleep per Arrow batch)."""
    for batch in batches:
        if batch.num_rows and cost_ms > 0:
            time.sleep(batch.num_rows * cost_ms / 1000.0)
        yield batch


def parse_input(raw: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    parsed = raw.select(F.from_json(F.col("value"), INPUT_SCHEMA).alias("r")).select("r.*")
    return parsed.where(F.col("id").isNotNull())  # malformed input is dropped


def build(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    options = ctx.options
    cost_ms = float(options.get("cost_ms", DEFAULT_COST_MS))
    input_topic = options.get("input_topic", DEFAULT_INPUT_TOPIC)
    output_topic = options.get("output_topic", DEFAULT_OUTPUT_TOPIC)

    if cost_ms > 0 and "maxRecordsPerTrigger" not in options:
        batch_s = float(options.get("batch_seconds", DEFAULT_BATCH_SECONDS))
        options["maxRecordsPerTrigger"] = str(batch_limit(cost_ms, ctx.parallelism, batch_s))
    records = parse_input(ctx.read_kafka(spark, input_topic))
    costed = records.mapInArrow(partial(wait_per_record, cost_ms), records.schema)
    sink = KeyedCountSink(ctx.bootstrap, output_topic, ctx.path("demo-sink.json"), ctx.output, ctx.kafka_security)
    ctx.on_stop.append(sink.close)
    return costed.writeStream.foreachBatch(sink)


def batch_limit(cost_ms: float, parallelism: int, batch_seconds: float) -> int:
    """Records that `parallelism` slots wait through in `batch_seconds`."""
    return max(100, int(batch_seconds * parallelism * 1000.0 / cost_ms))


def output_records(batch_id: int, rows: list[tuple[str | None, int, list[int]]]) -> list[dict[str, Any]]:
    """The output records of one batch from (key, count, ids) rows; pure."""
    out: list[dict[str, Any]] = []
    for key, count, ids in sorted(rows, key=lambda r: (r[0] is None, r[0] or "")):
        ordered = sorted(ids)
        if len(ordered) <= MAX_IDS_PER_RECORD:
            out.append({"batch_id": batch_id, "key": key, "count": count, "ids": ordered})
            continue
        for part, first in enumerate(range(0, len(ordered), MAX_IDS_PER_RECORD)):
            chunk = ordered[first : first + MAX_IDS_PER_RECORD]
            out.append({"batch_id": batch_id, "key": key, "count": count, "ids": chunk, "part": part})
    return out


class SinkProgress:
    """The last batch id whose output is fully in Kafka, in a small file (written atomically)."""

    def __init__(self, path: Path):
        self.path = path

    def last_written(self) -> int:
        try:
            return int(json.loads(self.path.read_text())["last_batch_id"])
        except FileNotFoundError:
            return -1

    def mark_written(self, batch_id: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"last_batch_id": batch_id, "written_at": time.time()}))
        os.replace(tmp, self.path)


@dataclass(frozen=True)
class SinkOutput:
    """What one micro-batch becomes in a sink: `records` as (key or None, JSON value) in the order to produce,
    `count` the output to count on the job's OutputCounter, `newest_event_time` (epoch s) the newest event
    time in it or None."""

    records: list[tuple[str | None, dict[str, Any]]]
    count: int
    newest_event_time: float | None = None


class ExactlyOnceSink:
    """foreachBatch function: each micro-batch's records produced to Kafka from the driver, exactly once
    across graceful restarts.

    Spark replays the last batch after a restart (its offsets were logged, its commit was not). The sink
    saves a batch's id (SinkProgress) only after every record of it is delivered, and skips a batch whose id
    is saved, so a replayed batch is written once. A batch that is not fully delivered raises: Spark stops
    the query and redoes the batch on restart. The producer is idempotent, so Kafka's own retries add no
    duplicates either. After a batch is saved, its output is counted on `counter`.

    Subclasses say how a batch becomes records (`output`); a batch with no records creates no producer.
    Log messages go to the subclass's module logger.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        progress_path: Path,
        counter: OutputCounter | None = None,
        security: Mapping[str, str] | None = None,
    ):
        self.bootstrap = bootstrap
        self.security = dict(security or {})
        self.topic = topic
        self.progress = SinkProgress(progress_path)
        self.counter = counter
        self._producer: Any = None
        self._log = logging.getLogger(type(self).__module__)

    def output(self, batch: DataFrame, batch_id: int) -> SinkOutput:
        """The records of one micro-batch; runs on the driver, once per batch not yet written."""
        raise NotImplementedError

    def _get_producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            from infra.kafka import ensure_topic

            ensure_topic(self.bootstrap, self.topic, security=self.security)
            self._producer = Producer({
                "bootstrap.servers": self.bootstrap,
                **self.security,
                "enable.idempotence": True,
                "linger.ms": 5,
            })
        return self._producer

    def close(self) -> None:
        """Deliver what is pending and release the producer (the query has stopped)."""
        if self._producer is not None:
            self._producer.flush(10)  # serves the delivery reports, so closing leaves none unserved
            self._producer.close()
            self._producer = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # Spark replays the last batch after a restart; it was written if its id is saved.
        if batch_id <= self.progress.last_written():
            self._log.info("batch %d is already in %s; skipped", batch_id, self.topic)
            return
        out = self.output(batch, batch_id)
        if out.records:
            self._deliver(batch_id, out.records)
        self.progress.mark_written(batch_id)
        if self.counter is not None:
            self.counter.add(out.count, newest_event_time=out.newest_event_time)

    def _deliver(self, batch_id: int, records: list[tuple[str | None, dict[str, Any]]]) -> None:
        """Produce `records` and wait for every delivery; RuntimeError if one is not delivered."""
        producer = self._get_producer()
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for key, value in records:
            producer.produce(
                self.topic,
                key=None if key is None else str(key).encode(),
                value=json.dumps(value, separators=(",", ":")).encode(),
                on_delivery=delivered,
            )
            producer.poll(0)
        remaining = producer.flush(60)
        if remaining or errors:
            # Failing the batch makes Spark stop the query; the batch is redone on restart.
            raise RuntimeError(f"batch {batch_id}: {remaining} records undelivered, errors: {errors[:3]}")


class KeyedCountSink(ExactlyOnceSink):
    """foreachBatch function: per key count and ids, produced to Kafka from the driver, each batch once
    (ExactlyOnceSink). Counts the records written."""

    def output(self, batch: DataFrame, batch_id: int) -> SinkOutput:
        from pyspark.sql import functions as F

        # One action over the batch, so the per-record wait is paid once.
        rows = batch.groupBy("key").agg(F.count("*").alias("count"), F.collect_list("id").alias("ids")).collect()
        records = output_records(batch_id, [(r["key"], int(r["count"]), list(r["ids"])) for r in rows])
        return SinkOutput([(record["key"], record) for record in records], len(records))
