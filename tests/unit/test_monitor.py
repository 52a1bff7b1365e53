"""Monitor: windows in metric time, redelivery, late reports, validation and dead letters."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.dead_letters import Rejection, dead_letter
from contracts.messages import MetricReport, OperatorMetrics
from monitor.validation import parse_report
from monitor.windows import LateReport, add_report, already_applied, window_start_for

INTERVAL = 10.0


def report(ts: float, **overrides: object) -> MetricReport:
    base: dict[str, object] = {
        "job_id": "job", "timestamp": ts, "interval_s": 1.0, "parallelism": 2, "records_in": 100,
        "records_out": 50, "busy_time_s": 0.5,
        "source": {"arrival_rate": 120.0, "backlog": 10, "partitions": 4},
    }
    return MetricReport.model_validate(base | overrides)


def fold(reports: list[MetricReport]):  # type: ignore[no-untyped-def]
    state, closed = None, []
    for offset, r in enumerate(reports):
        state, window = add_report(state, r, INTERVAL, partition=0, offset=offset)
        if window:
            closed.append(window)
    return state, closed


def test_a_window_closes_when_a_report_of_the_next_window_arrives() -> None:
    reports = [report(1000 + i) for i in range(1, 10)] + [report(1010.5)]
    state, closed = fold(reports)
    assert len(closed) == 1
    w = closed[0]
    assert (w.window_start, w.window_end, w.report_count) == (1000.0, 1010.0, 9)
    assert w.records_in == 900 and w.records_out == 450 and w.busy_time_s == pytest.approx(4.5)
    assert w.observed_s == pytest.approx(9.0)
    assert w.source is not None and w.source.arrival_rate == pytest.approx(120.0)
    assert state.start == 1010.0 and state.reports == 1


def test_workers_add_up_and_backlog_growth_is_measured() -> None:
    reports = []
    for i in range(1, 10):
        for worker in ("a", "b"):
            reports.append(report(1000 + i, worker_id=worker,
                                  source={"arrival_rate": 60.0, "backlog": 10 * i, "partitions": 4}))
    _, closed = fold([*reports, report(1011)])
    w = closed[0]
    assert w.workers == 2 and w.records_in == 1800
    assert w.observed_s == pytest.approx(9.0)  # workers report the same time span side by side
    assert w.source is not None
    assert w.source.arrival_rate == pytest.approx(120.0)
    assert w.source.backlog == 180
    assert w.source.backlog_growth_rate == pytest.approx(20.0)


def test_parallelism_change_inside_a_window_is_flagged() -> None:
    _, closed = fold([report(1001), report(1002, parallelism=4), report(1011)])
    assert closed[0].parallelism_changed and closed[0].parallelism == 4


def test_late_report_is_refused() -> None:
    state, _ = fold([report(1001), report(1011)])
    with pytest.raises(LateReport):
        add_report(state, report(1005), INTERVAL)


def test_redelivered_offsets_are_recognised() -> None:
    state, _ = fold([report(1001), report(1002)])
    assert already_applied(state, 0, 1) and not already_applied(state, 0, 2) and not already_applied(state, 1, 0)


def test_a_new_report_at_an_old_offset_is_not_a_redelivery() -> None:
    # A broker that lost its data numbers its records from 0 again: a report that is not yet in
    # the window must be folded in, whatever its offset; one that is (or is older) is skipped.
    state, _ = fold([report(1001), report(1002)])
    assert already_applied(state, 0, 0, report(1001)) and already_applied(state, 0, 1, report(1002))
    assert already_applied(state, 0, 0, report(995))
    assert not already_applied(state, 0, 0, report(1003)) and not already_applied(state, 0, 1, report(1012))
    state, _ = add_report(state, report(1003), INTERVAL, 0, 0)
    assert state.offsets[0] == 0 and not already_applied(state, 0, 1, report(1004))


def test_operators_are_merged_across_workers() -> None:
    ops = [OperatorMetrics(operator_id="map", parallelism=4, records_in=10, records_out=20, busy_time_s=0.1)]
    _, closed = fold([report(1001, operators=ops, worker_id="a"), report(1001, operators=ops, worker_id="b"),
                      report(1012)])
    (merged,) = closed[0].operators
    assert (merged.records_in, merged.records_out, merged.busy_time_s) == (20, 40, pytest.approx(0.2))


@given(st.lists(st.floats(0, 10_000, allow_nan=False), min_size=1, max_size=50))
def test_every_in_order_report_lands_in_exactly_one_window(offsets: list[float]) -> None:
    # One report per interval end: a repeated (worker, timestamp) is a duplicate_report (test_bad_input).
    timestamps = sorted({1_000_000 + t for t in offsets})
    state, closed = fold([report(t) for t in timestamps])
    counted = sum(w.report_count for w in closed) + state.reports
    assert counted == len(timestamps)
    for w in closed:
        assert w.window_end - w.window_start == INTERVAL
        assert w.window_start == window_start_for(w.window_start, INTERVAL)


NOW = 2_000_000_000.0


def parse(value: bytes | None, key: bytes | None = b"job") -> MetricReport | Rejection:
    return parse_report(value, key, 64 * 1024, NOW, 300.0)


def test_validation_reasons() -> None:
    good = json.loads(report(NOW).to_bytes())
    assert isinstance(parse(report(NOW).to_bytes()), MetricReport)
    cases = {
        b"not json": "malformed_json",
        json.dumps(good | {"busy_time_s": "x"}).encode(): "invalid_report",
        json.dumps(good | {"records_out": -1}).encode(): "invalid_report",
        json.dumps(good | {"schema_version": 2}).encode(): "unknown_schema_version",
        json.dumps(good | {"timestamp": NOW + 3600}).encode(): "from_the_future",
        json.dumps(good | {"surprise": 1}).encode(): "invalid_report",
        b"x" * (64 * 1024 + 1): "oversize",
    }
    for value, reason in cases.items():
        result = parse(value)
        assert isinstance(result, Rejection) and result.reason == reason, (value[:60], result)
    mismatch = parse(report(NOW).to_bytes(), key=b"other")
    assert isinstance(mismatch, Rejection) and mismatch.reason == "key_mismatch"
    assert isinstance(parse(None), Rejection)


def test_operator_graph_must_name_known_upstreams() -> None:
    good = json.loads(report(NOW).to_bytes())
    ops = [{"operator_id": "b", "upstream": ["a"], "parallelism": 1, "records_in": 1, "records_out": 1,
            "busy_time_s": 0.1}]
    result = parse(json.dumps(good | {"operators": ops}).encode())
    assert isinstance(result, Rejection) and "unknown upstream" in result.detail


@given(st.binary(max_size=2048))
def test_any_bytes_are_accepted_or_rejected_never_raised(value: bytes) -> None:
    result = parse(value)
    assert isinstance(result, MetricReport | Rejection)
    if isinstance(result, Rejection):
        letter = dead_letter("metrics", value, b"k", result, "monitor", 0, 1)
        assert base64.b64decode(letter.payload_base64) == value  # kept whole: nothing is lost


def test_micro_batches_and_their_time_add_up_in_a_window_and_stay_unknown_when_unreported() -> None:
    reports = [report(1000 + i, batches=2, batch_time_s=1.5) for i in range(1, 10)]
    _, closed = fold([*reports, report(1010.5)])
    assert closed[0].batches == 18 and closed[0].batch_time_s == pytest.approx(13.5)
    _, closed = fold([*(report(1000 + i) for i in range(1, 10)), report(1010.5)])
    assert closed[0].batches is None and closed[0].batch_time_s is None
