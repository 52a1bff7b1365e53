"""The workload suite: real Spark Structured Streaming jobs the autoscaler scales, by name.

Each workload is an entry point with the signature of pipeline.job (`build(spark, ctx)`), the records its
input needs (a spec of `pipeline.loadgen.record_maker`, e.g. `autoscaler load run --records nexmark`) and a
description. `autoscaler demo --workload NAME` runs one; a benchmark looks one up with `workload(NAME)`
and checks its output with `pipeline.workloads.check.check(NAME, ...)`.

    enrich        the demo job: a per-record wait, keyed counts (stateless)
    window-agg    tumbling event-time windows per key with a watermark, RocksDB state
    dedup         dropDuplicatesWithinWatermark over the record id
    join          orders joined with their payments, watermarks on both sides
    nexmark-q1 .. nexmark-q11   Nexmark queries 1, 2, 5, 8 and 11 over Person, Auction and Bid events

Job options (`--option key=value`) are those of pipeline.demo (enrich) and pipeline.workloads.common.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    entry_point: str  # module:function (pipeline.job)
    records: str  # the input's record maker spec (pipeline.loadgen.record_maker)
    description: str
    stateful: bool = True
    # How many times the query reads, and costs, each input record: a join of two event kinds of one
    # topic reads the topic once per side. A benchmark divides its load by it, so a pattern's peak
    # needs as many slots on every workload.
    reads: int = 1


_ALL = (
    Workload("enrich", "pipeline.demo:build", "demo",
             "the demo job: each record waits cost_ms, then per-key counts and ids (stateless)", stateful=False),
    Workload("window-agg", "pipeline.workloads.stateful:window_agg", "demo",
             "per key counts in tumbling 10-s event-time windows, 5-s watermark, RocksDB state"),
    Workload("dedup", "pipeline.workloads.stateful:dedup", "dedup:0.1",
             "dropDuplicatesWithinWatermark over the id; 10 % of the input resends a recent id"),
    Workload("join", "pipeline.workloads.stateful:join", "join",
             "orders joined with their payments within 10 s, watermarks on both sides", reads=2),
    Workload("nexmark-q1", "pipeline.workloads.nexmark_queries:q1", "nexmark",
             "Nexmark Q1, currency conversion: every bid's price in euros (stateless)", stateful=False),
    Workload("nexmark-q2", "pipeline.workloads.nexmark_queries:q2", "nexmark",
             "Nexmark Q2, selection: bids on every 123rd auction (stateless)", stateful=False),
    Workload("nexmark-q5", "pipeline.workloads.nexmark_queries:q5", "nexmark",
             "Nexmark Q5, hot items: the most-bid auction per 10-s window sliding every 2 s"),
    Workload("nexmark-q8", "pipeline.workloads.nexmark_queries:q8", "nexmark",
             "Nexmark Q8, new users: people who open an auction in the 10-s window they registered in (a join)",
             reads=2),
    Workload("nexmark-q11", "pipeline.workloads.nexmark_queries:q11", "nexmark",
             "Nexmark Q11, user sessions: bids per bidder per session window (10-s gap)"),
)
WORKLOADS: dict[str, Workload] = {w.name: w for w in _ALL}
DEFAULT_WORKLOAD = "enrich"


def workload(name: str) -> Workload:
    """The workload called `name`; KeyError naming the known ones otherwise."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None


def entry_points() -> list[str]:
    """Every workload's entry point, for a job runner's allowlist (AUTOSCALER_JOB_ENTRY_POINTS)."""
    return [w.entry_point for w in _ALL]
