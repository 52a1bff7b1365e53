"""What the workloads share: their options, the state store settings, the per-record wait, and an
exactly-once row sink.

Options (the job's `--option key=value` pairs; `WorkloadOptions.parse`):
  input_topic, output_topic   Kafka topics (defaults per workload);
  cost_ms                     waiting per input record (pipeline.demo.wait_per_record), default 4;
  batch_seconds               caps a micro-batch at that much waiting unless maxRecordsPerTrigger is set;
  window_s, slide_s           event-time window length and slide (slide 0: tumbling), default 10 and 0;
  watermark_s                 the watermark's delay behind the newest event time, default 5;
  gap_s                       a session window's gap, default 10;
  statePartitions             state partitions (spark.sql.shuffle.partitions) at the query's first start,
                              default 8; Spark keeps them in the checkpoint afterwards;
  stateStore                  rocksdb (default) or hdfs (Spark's default provider).

Output: JSON records {"batch_id", "part", "rows": [...]}, at most ROWS_PER_RECORD rows each, written from
the driver once per micro-batch: a batch Spark replays after a restart is skipped when its id is saved
(pipeline.demo.ExactlyOnceSink), so across graceful restarts every output row is written exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.demo import (
    DEFAULT_BATCH_SECONDS,
    DEFAULT_COST_MS,
    ExactlyOnceSink,
    SinkOutput,
    batch_limit,
    wait_per_record,
)
from pipeline.job import JobContext
from pipeline.reporter import OutputCounter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
STATE_STORES = {"rocksdb": ROCKSDB_PROVIDER, "hdfs": HDFS_PROVIDER}
DEFAULT_STATE_PARTITIONS = 8
ROWS_PER_RECORD = 1000
EVENT_TIME = "event_time"


@dataclass(frozen=True)
class WorkloadOptions:
    input_topic: str
    output_topic: str
    cost_ms: float = DEFAULT_COST_MS
    batch_seconds: float = DEFAULT_BATCH_SECONDS
    window_s: float = 10.0
    slide_s: float = 0.0
    watermark_s: float = 5.0
    gap_s: float = 10.0
    state_partitions: int = DEFAULT_STATE_PARTITIONS
    state_store: str = "rocksdb"

    @classmethod
    def parse(cls, options: Mapping[str, str], input_topic: str, output_topic: str) -> WorkloadOptions:
        """The options from a job's pairs, the topics defaulting to the given ones; ValueError when one is
        out of range."""

        def number(name: str, default: float) -> float:
            raw = options.get(name)
            try:
                return default if raw is None or raw == "" else float(raw)
            except ValueError:
                raise ValueError(f"option {name} must be a number, not {raw!r}") from None

        parsed = cls(
            input_topic=options.get("input_topic") or input_topic,
            output_topic=options.get("output_topic") or output_topic,
            cost_ms=number("cost_ms", DEFAULT_COST_MS),
            batch_seconds=number("batch_seconds", DEFAULT_BATCH_SECONDS),
            window_s=number("window_s", 10.0),
            slide_s=number("slide_s", 0.0),
            watermark_s=number("watermark_s", 5.0),
            gap_s=number("gap_s", 10.0),
            state_partitions=int(number("statePartitions", DEFAULT_STATE_PARTITIONS)),
            state_store=(options.get("stateStore") or "rocksdb").lower(),
        )
        parsed.check()
        return parsed

    def check(self) -> None:
        if self.cost_ms < 0 or self.batch_seconds <= 0:
            raise ValueError("cost_ms must be >= 0 and batch_seconds > 0")
        if self.window_s <= 0 or self.gap_s <= 0 or self.watermark_s < 0:
            raise ValueError("window_s and gap_s must be > 0, watermark_s >= 0")
        if self.slide_s < 0 or self.slide_s > self.window_s:
            raise ValueError("slide_s must be in [0, window_s] (0: tumbling windows)")
        if self.state_partitions < 1:
            raise ValueError("statePartitions must be at least 1")
        if self.state_store not in STATE_STORES:
            raise ValueError(f"stateStore must be one of {sorted(STATE_STORES)}, not {self.state_store!r}")

    def state_conf(self) -> dict[str, str]:
        """The SQL settings of a stateful query's first start (later starts take them from the checkpoint)."""
        return {
            "spark.sql.streaming.stateStore.providerClass": STATE_STORES[self.state_store],
            "spark.sql.shuffle.partitions": str(self.state_partitions),
        }

    @property
    def window(self) -> str:
        return f"{self.window_s:g} seconds"

    @property
    def slide(self) -> str | None:
        return f"{self.slide_s:g} seconds" if self.slide_s else None

    @property
    def watermark(self) -> str:
        return f"{self.watermark_s:g} seconds"


def use_state_store(spark: SparkSession, opts: WorkloadOptions) -> None:
    """Set the state store provider and the state partitions on the session before the query starts."""
    for key, value in opts.state_conf().items():
        spark.conf.set(key, value)


def costed_input(spark: SparkSession, ctx: JobContext, opts: WorkloadOptions, schema: str) -> DataFrame:
    """The input topic's JSON records parsed with `schema` (malformed ones dropped), each costing
    `cost_ms` of waiting in the read tasks, with an `event_time` timestamp column from `ts`."""
    from pyspark.sql import functions as F

    if opts.cost_ms > 0 and "maxRecordsPerTrigger" not in ctx.options:
        ctx.options["maxRecordsPerTrigger"] = str(batch_limit(opts.cost_ms, ctx.parallelism, opts.batch_seconds))
    raw = ctx.read_kafka(spark, opts.input_topic)
    parsed = raw.select(F.from_json(F.col("value"), schema).alias("r")).select("r.*")
    parsed = parsed.where(F.col("id").isNotNull() & F.col("ts").isNotNull())
    costed = parsed.mapInArrow(partial(wait_per_record, opts.cost_ms), parsed.schema)
    return costed.withColumn(EVENT_TIME, F.timestamp_seconds(F.col("ts")))


def chunks(batch_id: int, rows: list[dict[str, Any]], size: int = ROWS_PER_RECORD) -> list[dict[str, Any]]:
    """One batch's output records: its rows in order, `size` per record; pure."""
    return [{"batch_id": batch_id, "part": part, "rows": rows[first: first + size]}
            for part, first in enumerate(range(0, len(rows), size))]


def output_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every row of a workload's output records, in the order read."""
    return [row for record in records for row in record["rows"]]


# (micro-batch, batch id) -> (output rows, newest event time in them or None); runs on the driver.
Render = Callable[["DataFrame", int], tuple[list[dict[str, Any]], float | None]]


class RowSink(ExactlyOnceSink):
    """foreachBatch function: the rows `render` makes of a micro-batch, produced to Kafka from the driver,
    each batch once (ExactlyOnceSink; see the module doc). Counts the rows written with their newest
    event time."""

    def __init__(self, bootstrap: str, topic: str, progress_path: Path, render: Render,
                 counter: OutputCounter | None = None, security: Mapping[str, str] | None = None):
        super().__init__(bootstrap, topic, progress_path, counter, security)
        self.render = render

    def output(self, batch: DataFrame, batch_id: int) -> SinkOutput:
        rows, newest = self.render(batch, batch_id)
        return SinkOutput([(None, record) for record in chunks(batch_id, rows)], len(rows), newest)


def row_sink(spark: SparkSession, ctx: JobContext, opts: WorkloadOptions, frame: DataFrame, render: Render,
             name: str, output_mode: str = "append") -> DataStreamWriter:
    """The writer of `frame` through a RowSink whose progress file is `<name>-sink.json` in the job's folder."""
    sink = RowSink(ctx.bootstrap, opts.output_topic, ctx.path(f"{name}-sink.json"), render, ctx.output,
                   ctx.kafka_security)
    ctx.on_stop.append(sink.close)
    return frame.writeStream.outputMode(output_mode).foreachBatch(sink)


def epoch_s(value: Any) -> float:
    """A Spark timestamp (a datetime) or a number as epoch seconds."""
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


def newest(values: Iterable[Any]) -> float | None:
    """The largest of some timestamps as epoch seconds, None for none."""
    seconds = [epoch_s(v) for v in values if v is not None]
    return max(seconds) if seconds else None
