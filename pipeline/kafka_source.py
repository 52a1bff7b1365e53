"""A Kafka source for Spark Structured Streaming, built on Spark's Python Data Source API.

Spark's own `kafka` format needs the spark-sql-kafka connector jar; where that jar is missing, this
source (format "autoscaler-kafka") reads the topic with confluent-kafka instead.

Options:
  bootstrap            Kafka bootstrap servers (required).
  topic                the topic to read (required).
  startingOffsets      "earliest" (default) or "latest"; used only when the query has no checkpoint.
  maxRecordsPerTrigger at most this many records per micro-batch (shared across partitions by lag).
  minPartitions        split each micro-batch into exactly this many equal read tasks, so that the
                       job's parallelism can exceed the topic's partition count.
  pauseFile            while this file exists, no new data is admitted; a runner uses it to stop the
                       query between micro-batches. Each paused trigger touches `<pauseFile>.ack`.
  shareFile            while this file holds a number s in (0, 1], a micro-batch admits at most
                       s x maxRecordsPerTrigger records: an in-place backend writes the share of the
                       query's task slots that have executors now, so batches keep their length.

Offsets are JSON objects partition -> next offset ({"0": 120}), kept in Spark's checkpoint.
`reportLatestOffset` gives the log-end offsets, so StreamingQueryProgress shows the backlog.
A runner drives the pause and share files through `pipeline.source_control`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from pipeline import offsets as off
from pipeline.source_control import pause_ack_path, read_share

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from infra.kafka import LogEndProbe

log = logging.getLogger(__name__)

SOURCE_NAME = "autoscaler-kafka"
SCHEMA = "key string, value string, partition int, offset long, timestamp timestamp"
# Rows per Arrow batch handed to Spark; large enough to amortise the per-batch cost.
ARROW_BATCH_ROWS = 4096
# A read task gives up when the broker sends nothing for this long inside a range it reported.
READ_STALL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topic: str
    starting: str = "earliest"
    max_records_per_trigger: int | None = None
    min_partitions: int | None = None
    pause_file: str | None = None
    share_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        for required in ("bootstrap", "topic"):
            if not opts.get(required):
                raise ValueError(f"the {SOURCE_NAME} source needs the option {required!r}")
        starting = opts.get("startingoffsets", "earliest").strip().lower()
        if starting not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be earliest or latest, not {starting!r}")
        return cls(
            bootstrap=opts["bootstrap"],
            topic=opts["topic"],
            starting=starting,
            max_records_per_trigger=_positive_int(opts.get("maxrecordspertrigger"), "maxRecordsPerTrigger"),
            min_partitions=_positive_int(opts.get("minpartitions"), "minPartitions"),
            pause_file=opts.get("pausefile") or None,
            share_file=opts.get("sharefile") or None,
        )


def _positive_int(value: str | None, name: str) -> int | None:
    if value is None or str(value).strip() == "":
        return None
    number = int(value)
    if number < 1:
        raise ValueError(f"{name} must be at least 1, not {number}")
    return number


class KafkaSplit(InputPartition):
    """One read task: offset ranges of one or more partitions (picklable)."""

    def __init__(self, segments: list[tuple[int, int, int]]):
        super().__init__(segments)
        self.segments = segments


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


class KafkaStreamReader(DataSourceStreamReader):
    """Planning runs in one long-lived Python process on the driver; `read` runs in the tasks."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._probe: LogEndProbe | None = None
        self._last_log_end: dict[int, int] | None = None

    # The reader is pickled to ship `read` to the tasks; the Kafka clients stay behind.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_probe"] = None
        state["_last_log_end"] = None
        return state

    def _log_end(self) -> dict[int, int]:
        if self._probe is None:
            from infra.kafka import LogEndProbe

            self._probe = LogEndProbe(self.options.bootstrap, self.options.topic)
        latest = self._probe.latest()
        self._last_log_end = latest
        return latest

    def initialOffset(self) -> dict[str, int]:
        latest = self._log_end()
        if self.options.starting == "latest":
            return off.to_json_offsets(latest)
        assert self._probe is not None
        return off.to_json_offsets(self._probe.earliest(latest))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = off.from_json_offsets(start)
        latest = self._log_end()  # refreshed even while paused, so progress keeps showing the backlog
        if self._paused():
            return off.to_json_offsets(begin)
        end = off.available_end(begin, latest)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if max_rows is not None and self.options.share_file:
            max_rows = max(1, round(max_rows * read_share(self.options.share_file)))
        return off.to_json_offsets(off.cap_end_offsets(begin, end, max_rows))

    def _paused(self) -> bool:
        pause = self.options.pause_file
        if not pause or not os.path.exists(pause):
            return False
        # The runner waits for this: it proves a trigger has seen the pause, so no batch follows.
        try:
            pause_ack_path(pause).write_text(f"{time.time()}\n")
        except OSError as exc:
            log.warning("cannot write the pause acknowledgement: %s", exc)
        return True

    def reportLatestOffset(self) -> dict[str, int] | None:
        latest = self._last_log_end if self._last_log_end is not None else self._log_end()
        return off.to_json_offsets(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaSplit]:
        plans = off.plan_splits(
            off.from_json_offsets(start), off.from_json_offsets(end), self.options.min_partitions
        )
        return [KafkaSplit([(s.partition, s.start, s.end) for s in plan]) for plan in plans]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaSplit)
        return read_segments(self.options.bootstrap, self.options.topic, partition.segments)

    def commit(self, end: dict[str, Any]) -> None:
        # Kafka keeps nothing for us: progress lives in Spark's checkpoint.
        pass

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ])


def read_segments(
    bootstrap: str, topic: str, segments: list[tuple[int, int, int]]
) -> Iterator[pa.RecordBatch]:
    """Read the records [start, end) of each (partition, start, end), in Arrow batches."""
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition

    schema = _arrow_schema()
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "autoscaler-kafka-source",  # never joins: we only assign()
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 50,
        # Records deleted by retention before we read them are skipped to the oldest one left.
        "auto.offset.reset": "earliest",
    })
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(columns, schema=schema)
        for values in columns.values():
            values.clear()
        return batch

    try:
        for partition, start, end in segments:
            if end <= start:
                continue
            consumer.assign([TopicPartition(topic, partition, start)])
            position = start
            last_data = time.monotonic()
            while position < end:
                msgs = consumer.consume(num_messages=min(10_000, end - position), timeout=0.5)
                if not msgs and time.monotonic() - last_data > READ_STALL_TIMEOUT_S:
                    raise TimeoutError(
                        f"{topic}[{partition}]: no records at offset {position} (range ends at {end}) "
                        f"for {READ_STALL_TIMEOUT_S:.0f} s"
                    )
                for msg in msgs:
                    if msg.error() is not None:
                        continue  # partition EOF and transient errors; the loop retries
                    offset = msg.offset()
                    if offset < position:
                        continue
                    if offset >= end:
                        position = end
                        break
                    last_data = time.monotonic()
                    key, value = msg.key(), msg.value()
                    ts_type, ts_ms = msg.timestamp()
                    columns["key"].append(None if key is None else key.decode("utf-8", "replace"))
                    columns["value"].append(None if value is None else value.decode("utf-8", "replace"))
                    columns["partition"].append(partition)
                    columns["offset"].append(offset)
                    columns["timestamp"].append(
                        datetime.fromtimestamp(ts_ms / 1000, tz=UTC) if ts_type and ts_ms >= 0 else None
                    )
                    # Offsets can have gaps (transaction markers, compaction), so the next offset
                    # to read is one past the last record, not a count.
                    position = offset + 1
                    if len(columns["offset"]) >= ARROW_BATCH_ROWS:
                        yield flush()
            consumer.unassign()
        if columns["offset"]:
            yield flush()
    finally:
        consumer.close()


# ---------------------------------------------------------------- reading a topic as a stream

_registered: set[str] = set()


def register(spark: SparkSession) -> None:
    """Make format("autoscaler-kafka") known to this session (once per Spark application)."""
    key = spark.sparkContext.applicationId
    if key not in _registered:
        spark.dataSource.register(KafkaDataSource)
        _registered.add(key)


def native_kafka_available(spark: SparkSession) -> bool:
    """Whether Spark's own kafka connector is on the classpath."""
    try:
        jvm = spark.sparkContext._jvm
        jvm.java.lang.Class.forName("org.apache.spark.sql.kafka010.KafkaSourceProvider")  # type: ignore[union-attr]
    except Exception:  # no class, or no JVM at hand (Spark Connect)
        return False
    return True


def read_kafka_stream(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    *,
    starting_offsets: str = "earliest",
    max_records_per_trigger: int | None = None,
    min_partitions: int | None = None,
    pause_file: str | os.PathLike[str] | None = None,
    prefer_native: bool = True,
    **options: str | int,
) -> DataFrame:
    """A streaming DataFrame (key, value, partition, offset, timestamp) over a Kafka topic.

    Uses Spark's native kafka format when its connector is on the classpath (it has no pause file:
    a runner then stops it with the query idle instead), else the autoscaler-kafka source.
    Extra `options` go to the reader as they are (option names of the format in use).
    """
    if prefer_native and native_kafka_available(spark):
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", starting_offsets)
        )
        if max_records_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(max_records_per_trigger))
        if min_partitions:
            reader = reader.option("minPartitions", str(min_partitions))
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return reader.load().selectExpr(
            "CAST(key AS STRING) AS key",
            "CAST(value AS STRING) AS value",
            "partition",
            "offset",
            "timestamp",
        )
    ensure_python_workers()
    register(spark)
    reader = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(max_records_per_trigger))
    if min_partitions:
        reader = reader.option("minPartitions", str(min_partitions))
    if pause_file:
        reader = reader.option("pauseFile", os.fspath(pause_file))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def ensure_python_workers() -> None:
    """Python workers must run this interpreter, or they cannot import pyarrow and this package."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
