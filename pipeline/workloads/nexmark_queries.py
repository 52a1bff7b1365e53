"""Nexmark queries on Spark, each an entry point (`build(spark, ctx)`, pipeline.job), reading one topic of
mixed Nexmark events (pipeline.nexmark) and splitting it by type.

q1   currency conversion: every bid with its price in euros (x EUR_PER_USD).
     Row: {"id", "auction", "bidder", "price_eur", "ts"}.
q2   selection: the bids on auctions whose id is a multiple of Q2_AUCTION_SKIP. Row: {"id", "auction", "price", "ts"}.
q5   hot items: per sliding window (window_s, slide_s; default 10 s every 2 s) the auction with the most
     bids. Row: {"window_start", "window_end", "auction", "count", "bids", "auctions"} (bids: all bids
     in the window; auctions: how many auctions had one; ties go to the smallest auction id).
q8   new users: people who opened an auction in the tumbling window (window_s) they registered in; a
     stream-stream join of persons and auctions on the seller and the window.
     Row: {"person", "name", "auction", "window_start", "window_end"}.
q11  user sessions: per bidder and session window (gap_s, default 10 s) the number of bids.
     Row: {"bidder", "session_start", "session_end", "count", "id_sum"}.

q5, q8 and q11 keep their state in the state store (RocksDB by default) with `statePartitions` partitions;
options as in pipeline.workloads.common.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pipeline.job import JobContext
from pipeline.workloads.common import (
    EVENT_TIME,
    WorkloadOptions,
    costed_input,
    newest,
    row_sink,
    use_state_store,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

EUR_PER_USD = 0.908
Q2_AUCTION_SKIP = 123
Q5_DEFAULTS = {"window_s": "10", "slide_s": "2"}
INPUT, OUTPUT = "nexmark.input", "nexmark.{query}.output"

PERSON = ("struct<id:long, name:string, emailAddress:string, creditCard:string, city:string, state:string, "
          "dateTime:long, extra:string>")
AUCTION = ("struct<id:long, itemName:string, description:string, initialBid:long, reserve:long, dateTime:long, "
           "expires:long, seller:long, category:long, extra:string>")
BID = "struct<auction:long, bidder:long, price:long, channel:string, url:string, dateTime:long, extra:string>"
EVENT_SCHEMA = f"id long, type string, ts double, person {PERSON}, auction {AUCTION}, bid {BID}"


def _options(ctx: JobContext, query: str, defaults: Mapping[str, str] | None = None) -> WorkloadOptions:
    return WorkloadOptions.parse({**(defaults or {}), **ctx.options}, INPUT, OUTPUT.format(query=query))


def _bids(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return events.where(F.col("type") == "bid").select("id", "ts", EVENT_TIME, "bid.*")


def q1(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    from pyspark.sql import functions as F

    opts = _options(ctx, "q1")
    bids = _bids(costed_input(spark, ctx, opts, EVENT_SCHEMA))
    out = bids.select("id", "auction", "bidder", (F.col("price") * EUR_PER_USD).alias("price_eur"), "ts")
    return row_sink(spark, ctx, opts, out, _by_id, "q1")


def q2(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    from pyspark.sql import functions as F

    opts = _options(ctx, "q2")
    bids = _bids(costed_input(spark, ctx, opts, EVENT_SCHEMA))
    out = bids.where(F.col("auction") % Q2_AUCTION_SKIP == 0).select("id", "auction", "price", "ts")
    return row_sink(spark, ctx, opts, out, _by_id, "q2")


def _by_id(batch: DataFrame, _batch_id: int) -> tuple[list[dict[str, Any]], float | None]:
    rows = sorted((r.asDict() for r in batch.collect()), key=lambda r: r["id"])
    return rows, newest(r["ts"] for r in rows)


def q5(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    from pyspark.sql import functions as F

    opts = _options(ctx, "q5", Q5_DEFAULTS)
    use_state_store(spark, opts)
    bids = _bids(costed_input(spark, ctx, opts, EVENT_SCHEMA)).withWatermark(EVENT_TIME, opts.watermark)
    window = F.window(EVENT_TIME, opts.window, opts.slide) if opts.slide else F.window(EVENT_TIME, opts.window)
    cells = bids.groupBy(window.alias("w"), "auction").agg(F.count("*").alias("count"), F.max("ts").alias("max_ts"))
    out = cells.select(F.col("w.start").cast("double").alias("window_start"),
                       F.col("w.end").cast("double").alias("window_end"), "auction", "count", "max_ts")
    return row_sink(spark, ctx, opts, out, _hot_rows, "q5")


def hot_items(cells: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per window, from its (window_start, window_end, auction, count) cells, the auction with the most
    bids (the smallest id among ties), its count, the window's bids and auctions; pure."""
    windows: dict[tuple[float, float], list[tuple[int, int]]] = defaultdict(list)
    for cell in cells:
        windows[(float(cell["window_start"]), float(cell["window_end"]))].append(
            (int(cell["count"]), int(cell["auction"])))
    rows = []
    for (start, end), counts in sorted(windows.items()):
        top_count, top_auction = max(counts, key=lambda c: (c[0], -c[1]))
        rows.append({"window_start": start, "window_end": end, "auction": top_auction, "count": top_count,
                     "bids": sum(c for c, _ in counts), "auctions": len(counts)})
    return rows


def _hot_rows(batch: DataFrame, _batch_id: int) -> tuple[list[dict[str, Any]], float | None]:
    cells = [r.asDict() for r in batch.collect()]
    return hot_items(cells), newest(c["max_ts"] for c in cells)


def q8(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    from pyspark.sql import functions as F

    opts = _options(ctx, "q8")
    use_state_store(spark, opts)
    events = costed_input(spark, ctx, opts, EVENT_SCHEMA)
    persons = (events.where(F.col("type") == "person")
               .select(F.col("person.id").alias("p_id"), F.col("person.name").alias("p_name"),
                       F.col(EVENT_TIME).alias("p_time"))
               .withWatermark("p_time", opts.watermark)
               .withColumn("p_window", F.window("p_time", opts.window)))
    auctions = (events.where(F.col("type") == "auction")
                .select(F.col("auction.id").alias("a_id"), F.col("auction.seller").alias("a_seller"),
                        F.col("ts").alias("a_ts"), F.col(EVENT_TIME).alias("a_time"))
                .withWatermark("a_time", opts.watermark)
                .withColumn("a_window", F.window("a_time", opts.window)))
    joined = persons.join(auctions, (F.col("p_id") == F.col("a_seller")) & (F.col("p_window") == F.col("a_window")))
    out = joined.select(F.col("p_id").alias("person"), F.col("p_name").alias("name"), F.col("a_id").alias("auction"),
                        F.col("p_window.start").cast("double").alias("window_start"),
                        F.col("p_window.end").cast("double").alias("window_end"), "a_ts")
    return row_sink(spark, ctx, opts, out, _new_user_rows, "q8")


def _new_user_rows(batch: DataFrame, _batch_id: int) -> tuple[list[dict[str, Any]], float | None]:
    rows = sorted((r.asDict() for r in batch.collect()), key=lambda r: (r["window_start"], r["person"], r["auction"]))
    latest = newest(r.pop("a_ts") for r in rows)
    return rows, latest


def q11(spark: SparkSession, ctx: JobContext) -> DataStreamWriter:
    from pyspark.sql import functions as F

    opts = _options(ctx, "q11")
    use_state_store(spark, opts)
    bids = _bids(costed_input(spark, ctx, opts, EVENT_SCHEMA)).withWatermark(EVENT_TIME, opts.watermark)
    sessions = bids.groupBy(F.session_window(EVENT_TIME, f"{opts.gap_s:g} seconds").alias("s"), "bidder").agg(
        F.count("*").alias("count"), F.sum("id").alias("id_sum"), F.max("ts").alias("max_ts"))
    out = sessions.select("bidder", F.col("s.start").cast("double").alias("session_start"),
                          F.col("s.end").cast("double").alias("session_end"), "count", "id_sum", "max_ts")
    return row_sink(spark, ctx, opts, out, _session_rows, "q11")


def _session_rows(batch: DataFrame, _batch_id: int) -> tuple[list[dict[str, Any]], float | None]:
    rows = sorted((r.asDict() for r in batch.collect()), key=lambda r: (r["session_start"], r["bidder"]))
    latest = newest(r.pop("max_ts") for r in rows)
    for row in rows:
        row["count"], row["id_sum"] = int(row["count"]), int(row["id_sum"])
    return rows, latest
