"""The workload suite's pure parts: the registry, options, input records, output chunks and the checkers."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.settings import DEFAULT_JOB_ENTRY_POINTS
from pipeline import nexmark as nx
from pipeline.job import load_entry_point
from pipeline.loadgen import RECORD_KINDS, dedup_source_id, demo_record, join_record, record_maker
from pipeline.reporter import OutputCounter
from pipeline.workloads import DEFAULT_WORKLOAD, WORKLOADS, entry_points, workload
from pipeline.workloads.check import (
    check,
    check_window_agg,
    compare,
    sessions,
    windows_of,
)
from pipeline.workloads.common import (
    HDFS_PROVIDER,
    ROCKSDB_PROVIDER,
    WorkloadOptions,
    chunks,
    output_rows,
)
from pipeline.workloads.nexmark_queries import hot_items


def test_registry_names_every_workload_of_the_suite() -> None:
    assert list(WORKLOADS) == ["enrich", "window-agg", "dedup", "join", "nexmark-q1", "nexmark-q2", "nexmark-q5",
                               "nexmark-q8", "nexmark-q11"]
    assert DEFAULT_WORKLOAD == "enrich" and workload("enrich").entry_point == "pipeline.demo:build"
    assert not workload("enrich").stateful and workload("window-agg").stateful
    assert entry_points()[0] == "pipeline.demo:build" and len(set(entry_points())) == len(WORKLOADS)
    for w in WORKLOADS.values():
        assert callable(load_entry_point(w.entry_point))
        record_maker(w.records)  # the input each one needs can be generated
        assert w.records.partition(":")[0] in RECORD_KINDS
    # `autoscaler job run` starts every workload of the suite without an allowlist of the user's own.
    assert list(DEFAULT_JOB_ENTRY_POINTS) == entry_points()
    with pytest.raises(KeyError, match="window-agg"):
        workload("nope")


def test_options_parse_with_defaults_and_refuse_bad_values() -> None:
    opts = WorkloadOptions.parse({}, "in", "out")
    assert (opts.input_topic, opts.output_topic, opts.window_s, opts.slide_s, opts.watermark_s) == (
        "in", "out", 10.0, 0.0, 5.0)
    assert opts.state_conf() == {"spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
                                 "spark.sql.shuffle.partitions": "8"}
    assert (opts.window, opts.slide, opts.watermark) == ("10 seconds", None, "5 seconds")
    opts = WorkloadOptions.parse({"input_topic": "a", "statePartitions": "12", "stateStore": "HDFS", "slide_s": "2.5",
                                  "cost_ms": "0"}, "in", "out")
    assert opts.input_topic == "a" and opts.cost_ms == 0 and opts.slide == "2.5 seconds"
    assert opts.state_conf()["spark.sql.shuffle.partitions"] == "12"
    assert opts.state_conf()["spark.sql.streaming.stateStore.providerClass"] == HDFS_PROVIDER
    for bad in ({"statePartitions": "0"}, {"window_s": "0"}, {"slide_s": "11"}, {"stateStore": "redis"},
                {"cost_ms": "fast"}, {"watermark_s": "-1"}):
        with pytest.raises(ValueError):
            WorkloadOptions.parse(bad, "in", "out")


def test_the_demo_records_stay_as_they_were() -> None:
    assert record_maker("demo") is demo_record
    assert demo_record(17, 16, 2.0) == (b"k1", b'{"id":17,"key":"k1","ts":2.0}')
    for bad in ("demo:1", "dedup:1.5", "dedup:x", "nexmark:x", "csv"):
        with pytest.raises(ValueError):
            record_maker(bad)


@given(st.integers(min_value=0, max_value=10**9), st.floats(min_value=0.0, max_value=0.9))
def test_a_resent_id_is_an_earlier_original(record_id: int, fraction: float) -> None:
    source = dedup_source_id(record_id, fraction)
    assert record_id - 8 * 64 <= source <= record_id
    assert dedup_source_id(source, fraction) == source, "the id resent is one sent as itself"


def test_dedup_load_resends_about_the_fraction() -> None:
    sources = [dedup_source_id(n, 0.1) for n in range(20_000)]
    assert 0.08 < 1 - len(set(sources)) / len(sources) < 0.12
    assert dedup_source_id(0, 0.99) == 0
    key, value = record_maker("dedup:0.5")(1234, 8, 3.0)
    record = json.loads(value)
    assert record["key"] == key.decode() == f"k{record['id'] % 8}"


def test_join_records_pair_orders_with_payments() -> None:
    order = json.loads(join_record(10, 4, 1.0)[1])
    payment = json.loads(join_record(11, 4, 1.5)[1])
    assert (order["side"], payment["side"], order["order"], payment["order"]) == ("order", "payment", 5, 5)
    assert order["key"] == payment["key"] == "k1"


def test_output_is_chunked_and_read_back_in_order() -> None:
    rows = [{"i": i} for i in range(2500)]
    records = chunks(7, rows)
    assert [(r["batch_id"], r["part"], len(r["rows"])) for r in records] == [(7, 0, 1000), (7, 1, 1000), (7, 2, 500)]
    assert output_rows(records) == rows
    assert chunks(1, []) == []


def test_output_is_counted_with_its_event_time_when_the_counter_takes_it() -> None:
    counter = OutputCounter()
    counter.add(3, newest_event_time=100.0)
    counter.add(2, newest_event_time=None)
    assert counter.take() == 5 and counter.newest_event_time() == 100.0


@given(st.floats(min_value=0, max_value=2e9, allow_nan=False), st.sampled_from([(10.0, 0.0), (10.0, 2.0), (6.0, 4.0)]))
def test_windows_hold_their_time(ts: float, shape: tuple[float, float]) -> None:
    window_s, slide_s = shape
    windows = windows_of(ts, window_s, slide_s)
    step = slide_s or window_s
    assert len(windows) in (int(window_s // step), int(window_s // step) + 1)
    for start, end in windows:
        assert start <= ts + 1e-6 and ts < end + 1e-6 and end - start == pytest.approx(window_s)


def test_windows_align_to_the_epoch() -> None:
    assert windows_of(25.0, 10.0) == [(20.0, 30.0)]
    assert windows_of(25.0, 10.0, 5.0) == [(20.0, 30.0), (25.0, 35.0)]


def test_compare_counts_lost_duplicated_mismatched_and_unexpected() -> None:
    expected = {"a": (3, 10), "b": (2, 5), "c": (1, 1)}
    assert compare(expected, [("a", 3, 10), ("b", 2, 5), ("c", 1, 1)]).ok
    result = compare(expected, [("a", 3, 10), ("a", 3, 10), ("b", 1, 2), ("x", 4, 0)])
    assert (result.lost, result.duplicated, result.mismatched, result.unexpected) == (1 + 1, 3, 1, 1)
    assert result.expected == 6 and result.written == 11 and not result.ok


def window_input(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "key": f"k{i % 3}", "ts": 1000.0 + i * 0.5} for i in range(n)]


def test_window_agg_check_finds_a_lost_record_and_a_replayed_cell() -> None:
    inputs = window_input(60)  # 30 s of event time: windows 1000, 1010, 1020
    cells: dict[tuple[float, str], dict[str, Any]] = {}
    for r in inputs:
        start = windows_of(r["ts"], 10.0)[0][0]
        cell = cells.setdefault((start, r["key"]), {"window_start": start, "window_end": start + 10, "key": r["key"],
                                                    "count": 0, "id_sum": 0})
        cell["count"] += 1
        cell["id_sum"] += r["id"]
    rows = list(cells.values())
    assert check_window_agg(inputs, rows, 10.0).ok
    assert check("window-agg", inputs, [{"batch_id": 0, "part": 0, "rows": rows}]).ok
    assert check_window_agg(inputs, rows[1:], 10.0).lost == rows[0]["count"]
    assert check_window_agg(inputs, [*rows, rows[0]], 10.0).duplicated == rows[0]["count"]
    # A window the watermark has not passed is not expected yet.
    assert check_window_agg(inputs, [r for r in rows if r["window_start"] < 1020], 10.0, closed_before=1020.0).ok


def test_id_checks_of_stateless_and_dedup_workloads() -> None:
    inputs = [{"id": i % 7, "key": "k", "ts": 0.0} for i in range(20)]  # ids resent
    assert check("dedup", inputs, [{"rows": [{"id": i} for i in range(7)]}]).ok
    result = check("dedup", inputs, [{"rows": [{"id": i} for i in (0, 1, 1, 2, 3, 4, 5)]}])
    assert (result.lost, result.duplicated) == (1, 1)
    assert check("enrich", inputs, [{"ids": [0, 1, 2]}, {"ids": [3, 4, 5, 6]}]).ok


def test_join_check_expects_orders_paid_within_the_window() -> None:
    inputs = [json.loads(join_record(i, 4, 100.0 + i)[1]) for i in range(12)]  # orders 0-5
    inputs.append({"id": 99, "key": "k0", "ts": 500.0, "side": "payment", "order": 5})  # pays order 5 late...
    inputs = [r for r in inputs if not (r["side"] == "payment" and r["order"] == 5 and r["id"] != 99)]
    result = check("join", inputs, [{"rows": [{"order": o} for o in range(5)]}], {"window_s": "10"})
    assert result.ok and result.expected == 10  # ...so only orders 0-4 join
    assert check("join", inputs, [{"rows": [{"order": o} for o in range(6)]}], {"window_s": "10"}).unexpected == 1


def test_sessions_split_on_gaps() -> None:
    events = [("a", 0.0, 1), ("a", 5.0, 2), ("a", 14.9, 3), ("a", 30.0, 4), ("b", 1.0, 5)]
    assert sorted(sessions(events, 10.0)) == [("a", 0.0, 24.9, 3, 6), ("a", 30.0, 40.0, 1, 4),
                                              ("b", 1.0, 11.0, 1, 5)]


def test_hot_items_pick_the_most_bid_auction_per_window() -> None:
    cells = [{"window_start": 0, "window_end": 10, "auction": a, "count": c} for a, c in ((5, 3), (4, 3), (9, 1))]
    cells.append({"window_start": 2, "window_end": 12, "auction": 9, "count": 2})
    assert hot_items(cells) == [
        {"window_start": 0.0, "window_end": 10.0, "auction": 4, "count": 3, "bids": 7, "auctions": 3},
        {"window_start": 2.0, "window_end": 12.0, "auction": 9, "count": 2, "bids": 2, "auctions": 1},
    ]


def nexmark_input(n: int) -> list[dict[str, Any]]:
    return [nx.event(i, 1000.0 + i * 0.01) for i in range(n)]


def test_nexmark_checks_accept_the_reference_output_and_catch_a_loss() -> None:
    inputs = nexmark_input(5000)  # 50 s of event time
    bids = [r for r in inputs if r["type"] == "bid"]
    q1 = [{"id": r["id"], "price_eur": r["bid"]["price"] * 0.908} for r in bids]
    assert check("nexmark-q1", inputs, [{"rows": q1}]).ok
    assert check("nexmark-q1", inputs, [{"rows": q1[1:]}]).lost == 1
    q2 = [{"id": r["id"]} for r in bids if r["bid"]["auction"] % 123 == 0]
    assert check("nexmark-q2", inputs, [{"rows": q2}]).ok
    found = sessions(((r["bid"]["bidder"], r["ts"], r["id"]) for r in bids), 10.0)
    def spark_s(ts: float) -> float:  # an event time as Spark holds it (whole microseconds), cast to seconds
        return math.floor(ts * 1e6) / 1e6

    q11 = [{"bidder": b, "session_start": spark_s(s), "session_end": spark_s(e), "count": c, "id_sum": i}
           for b, s, e, c, i in found]
    assert check("nexmark-q11", inputs, [{"rows": q11}]).ok
    result = check("nexmark-q11", inputs, [{"rows": q11[1:]}])
    assert result.lost == q11[0]["count"] and result.expected == len(bids)
    # Spark's session start: the first bid's seconds truncated to microseconds, cast back to seconds. A start
    # of ...61.6855009 s rounds to .686 s, and Spark's .685500 to .685 (live: 2 records "lost", 1 "unexpected").
    edge = {"type": "bid", "id": 10**9, "ts": 1796107061.6855009,
            "bid": {**bids[0]["bid"], "bidder": 10**6, "auction": 7}}
    spark = {"bidder": 10**6, "session_start": spark_s(edge["ts"]), "session_end": spark_s(edge["ts"] + 10.0),
             "count": 1, "id_sum": 10**9}
    assert round(edge["ts"], 3) != round(spark["session_start"], 3)
    assert check("nexmark-q11", [*inputs, edge], [{"rows": [*q11, spark]}]).ok


def test_nexmark_q5_and_q8_checks() -> None:
    inputs = nexmark_input(3000)  # 30 s of event time
    cells: dict[tuple[float, float, int], int] = {}
    for r in inputs:
        if r["type"] == "bid":
            for start, end in windows_of(r["ts"], 10.0, 2.0):
                cells[(start, end, r["bid"]["auction"])] = cells.get((start, end, r["bid"]["auction"]), 0) + 1
    rows = hot_items({"window_start": s, "window_end": e, "auction": a, "count": c} for (s, e, a), c in cells.items())
    assert check("nexmark-q5", inputs, [{"rows": rows}]).ok
    assert not check("nexmark-q5", inputs, [{"rows": [{**rows[0], "count": rows[0]["count"] + 1}, *rows[1:]]}]).ok
    assert check("nexmark-q8", inputs, [], {"window_s": "10"}, closed_before=900.0).ok  # nothing closed yet
    with pytest.raises(KeyError):
        check("nexmark-q3", inputs, [])


def test_the_demo_launches_a_workload_with_its_entry_point_allowed() -> None:
    from agent.demo import job_launch
    from contracts.settings import Settings

    settings = Settings()
    assert job_launch(settings, workload("enrich"), 8) == ({}, [], settings)
    options, args, runner_settings = job_launch(settings, workload("window-agg"), 6)
    assert options == {"statePartitions": "6"} and args == ["--entry", "pipeline.workloads.stateful:window_agg"]
    assert runner_settings.job_entry_points == entry_points()
    options, args, _ = job_launch(settings, workload("nexmark-q1"), 6)
    assert options == {} and args == ["--entry", "pipeline.workloads.nexmark_queries:q1"]
