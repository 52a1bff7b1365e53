"""Stateful workloads on demo-like records, each an entry point (`build(spark, ctx)`, pipeline.job).

window_agg  tumbling (or, with slide_s, sliding) event-time windows per key with a watermark: per
            window and key the count and the sum of the ids, written once the watermark passes the window.
            Row: {"window_start", "window_end", "key", "count", "id_sum", "max_ts"} (times in epoch s).
dedup       dropDuplicatesWithinWatermark over the record id: each id once.
            Row: {"id", "key", "ts"}.
join        a stream-stream join with watermarks on both sides: each order with its payment, paid within
            `window_s` of the order. Row: {"order", "key", "order_ts", "payment_ts"}.

All keep their state in the state store the options choose (RocksDB by default) with `statePartitions`
state partitions; the options are those of pipeline.workloads.common.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.job import JobContext
from pipeline.workloads.common import EVENT_TIME, WorkloadOptions, costed_input, newest, row_sink, use_state_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

DEMO_SCHEMA = "id long, key string, ts double"
JOIN_SCHEMA = "id long, key string, ts double, side string, order long"


def window_agg(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    from pyspark.sql import functions as F

    opts = WorkloadOptions.parse(ctx.options, "window-agg.input", "window-agg.output")
    use_state_store(spark, opts)
    records = costed_input(spark, ctx, opts, DEMO_SCHEMA).withWatermark(EVENT_TIME, opts.watermark)
    window = F.window(EVENT_TIME, opts.window, opts.slide) if opts.slide else F.window(EVENT_TIME, opts.window)
    counts = records.groupBy(window.alias("w"), "key").agg(
        F.count("*").alias("count"), F.sum("id").alias("id_sum"), F.max("ts").alias("max_ts"))
    cells = counts.select(F.col("w.start").cast("double").alias("window_start"),
                          F.col("w.end").cast("double").alias("window_end"), "key", "count", "id_sum", "max_ts")
    return row_sink(spark, ctx, opts, cells, _window_rows, "window-agg")


def _window_rows(batch: DataFrame, _batch_id: int) -> tuple[list[dict[str, Any]], float | None]:
    rows = [r.asDict() for r in batch.collect()]
    rows.sort(key=lambda r: (r["window_start"], r["key"] or ""))
    for row in rows:
        row["count"], row["id_sum"] = int(row["count"]), int(row["id_sum"])
    return rows, newest(r["max_ts"] for r in rows)


def dedup(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    opts = WorkloadOptions.parse(ctx.options, "dedup.input", "dedup.output")
    use_state_store(spark, opts)
    records = costed_input(spark, ctx, opts, DEMO_SCHEMA).withWatermark(EVENT_TIME, opts.watermark)
    unique = records.dropDuplicatesWithinWatermark(["id"]).select("id", "key", "ts")
    return row_sink(spark, ctx, opts, unique, _plain_rows, "dedup")


def _plain_rows(batch: DataFrame, _batch_id: int) -> tuple[list[dict[str, Any]], float | None]:
    rows = sorted((r.asDict() for r in batch.collect()), key=lambda r: r["id"])
    return rows, newest(r["ts"] for r in rows)


def join(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    from pyspark.sql import functions as F

    opts = WorkloadOptions.parse(ctx.options, "join.input", "join.output")
    use_state_store(spark, opts)
    records = costed_input(spark, ctx, opts, JOIN_SCHEMA)
    orders = (records.where(F.col("side") == "order")
              .select(F.col("order").alias("o_order"), F.col("key").alias("o_key"), F.col("ts").alias("o_ts"),
                      F.col(EVENT_TIME).alias("o_time"))
              .withWatermark("o_time", opts.watermark))
    payments = (records.where(F.col("side") == "payment")
                .select(F.col("order").alias("p_order"), F.col("ts").alias("p_ts"), F.col(EVENT_TIME).alias("p_time"))
                .withWatermark("p_time", opts.watermark))
    within = F.expr(f"p_time >= o_time AND p_time <= o_time + interval {opts.window_s:g} seconds")
    joined = orders.join(payments, (F.col("o_order") == F.col("p_order")) & within, "inner").select(
        F.col("o_order").alias("order"), F.col("o_key").alias("key"), F.col("o_ts").alias("order_ts"),
        F.col("p_ts").alias("payment_ts"))
    return row_sink(spark, ctx, opts, joined, _join_rows, "join")


def _join_rows(batch: DataFrame, _batch_id: int) -> tuple[list[dict[str, Any]], float | None]:
    rows = sorted((r.asDict() for r in batch.collect()), key=lambda r: r["order"])
    return rows, newest(r["payment_ts"] for r in rows)
