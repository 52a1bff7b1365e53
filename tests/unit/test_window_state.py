"""The monitor's typed open window (contracts.window_state): folding is pure, every record counts
once, the stored form round-trips (directly, as JSON and through the knowledge base), windows
stored by earlier versions load, and redelivered records are skipped."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.messages import MetricReport, MetricWindow
from contracts.settings import Settings
from contracts.window_state import SeenReports, WindowState
from knowledge import MemoryKnowledge
from monitor.windows import RefusedReport, add_report, already_applied, close_window, window_start_for

INTERVAL = 10.0
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# A window as the previous (dict-based) version stored it: two workers, a rescale from 2 to 3 slots,
# micro-batches, a source, two operators, offsets of two partitions.
STORED = (
    '{"start": 1000.0, "reports": 3, "workers": {"a": {"records_in": 200, "records_out": 100, "busy": 3.0, '
    '"observed": 4.0, "first_begin": 1002.0, "last_end": 1006.0, "parallelism_first": 2, "cpu_weighted": 2.0, '
    '"cpu_time": 4.0, "operators": {"read": {"records_in": 200, "records_out": 200, "busy": 1.0, '
    '"arrivals": 160.0, "upstream": [], "parallelism": 2}, "sum": {"records_in": 200, "records_out": 100, '
    '"busy": 2.0, "arrivals": null, "upstream": ["read"], "parallelism": 2}}, "batches": 4, "batch_time": 0.5, '
    '"spans": {"2": [1002.0, 1004.0], "3": [1004.0, 1006.0]}, "parallelism_last": 3, "shuffle_partitions": 8, '
    '"parallelism_changed": true, "source": {"arrivals": 160.0, "observed": 4.0, "backlog_first": 30, '
    '"first_at": 1004.0, "splittable": true, "backlog_last": 10, "last_at": 1006.0, "partitions": 2}}, '
    '"b": {"records_in": 7, "records_out": 7, "busy": 0.0, "observed": 1.0, "first_begin": 1004.0, '
    '"last_end": 1005.0, "parallelism_first": 3, "cpu_weighted": 0.25, "cpu_time": 1.0, "operators": {}, '
    '"spans": {"3": [1004.0, 1005.0]}, "parallelism_last": 3, "parallelism_changed": false}}, '
    '"offsets": {"0": 42, "1": 9}, "seen": {"a": {"1004.0": 1, "1006.0": 1}, "b": {"1005.0": 1}}}'
)


def without_closed_at(window: MetricWindow | None) -> MetricWindow | None:
    return None if window is None else window.model_copy(update={"closed_at": 0.0})


def through_knowledge(state: WindowState) -> WindowState:
    knowledge = MemoryKnowledge(Settings())

    async def go() -> WindowState:
        await knowledge.save_windows({"job": state})
        return (await knowledge.load_windows(["job"]))["job"]

    return asyncio.run(go())


# ---------------------------------------------------------------- strategies

OPERATORS = [("read", []), ("map", ["read"]), ("sum", ["map"])]


@st.composite
def reports(draw: st.DrawFn) -> MetricReport:
    """A valid report of one of three workers, its end on a coarse grid over four windows (so that
    duplicates, late reports and several windows all come up), every optional part or not."""
    n_ops = draw(st.integers(0, 3))
    operators = [{"operator_id": op_id, "upstream": upstream, "parallelism": draw(st.integers(1, 8)),
                  "records_in": draw(st.integers(0, 1000)), "records_out": draw(st.integers(0, 1000)),
                  "busy_time_s": draw(st.floats(0, 5)),
                  "arrival_rate": draw(st.none() | st.floats(0, 500))} for op_id, upstream in OPERATORS[:n_ops]]
    batches = draw(st.none() | st.integers(0, 20))
    shuffle = draw(st.none() | st.integers(1, 200))
    state = [{"operator": name, "rows": draw(st.integers(0, 10**6)), "memory_bytes": draw(st.integers(0, 10**9)),
              "commit_time_s": draw(st.floats(0, 5)),
              "partitions": draw(st.none() | st.integers(1, shuffle or 200))}
             for name in draw(st.lists(st.sampled_from(["stateStoreSave", "dedupeWithinWatermark"]), max_size=2))]
    return MetricReport.model_validate({
        "job_id": "job", "timestamp": 1000.0 + draw(st.integers(1, 79)) * 0.5,
        "interval_s": draw(st.sampled_from([0.5, 1.0, 2.5])), "worker_id": draw(st.sampled_from("abc")),
        "parallelism": draw(st.integers(1, 4)), "records_in": draw(st.integers(0, 10**6)),
        "records_out": draw(st.integers(0, 10**6)), "busy_time_s": draw(st.floats(0, 10)),
        "cpu_utilization": draw(st.none() | st.floats(0, 1)), "batches": batches,
        "batch_time_s": None if batches is None else draw(st.floats(0, 5)),
        "shuffle_partitions": shuffle, "state": state,
        "watermark_lag_s": draw(st.none() | st.floats(0, 600)), "output_lag_s": draw(st.none() | st.floats(0, 600)),
        "source": draw(st.none() | st.fixed_dictionaries({
            "arrival_rate": st.floats(0, 1000), "backlog": st.integers(0, 10**6), "partitions": st.integers(1, 8),
            "splittable": st.booleans()})),
        "operators": operators,
    })


# A record: (partition, report); offsets are numbered per partition in the order records arrive.
records = st.lists(st.tuples(st.integers(0, 1), reports()), min_size=1, max_size=40)


def numbered(items: list[tuple[int, MetricReport]]) -> list[tuple[int, int, MetricReport]]:
    next_offset = [0, 0]
    out = []
    for partition, report in items:
        out.append((partition, next_offset[partition], report))
        next_offset[partition] += 1
    return out


def fold(log: list[tuple[int, int, MetricReport]], state: WindowState | None = None,
         keep: Any = None) -> tuple[WindowState | None, list[MetricWindow], list[MetricReport]]:
    """Fold as the monitor does: skip what was applied, drop what is refused. `keep` (if given)
    stands for where the state lives between records."""
    closed, accepted = [], []
    for partition, offset, report in log:
        if already_applied(state, partition, offset, report):
            continue
        try:
            state, window = add_report(state, report, INTERVAL, partition, offset)
        except RefusedReport:
            continue
        accepted.append(report)
        if window is not None:
            closed.append(window)
        if keep is not None:
            state = keep(state)
    return state, closed, accepted


# ---------------------------------------------------------------- properties


@FAST
@given(records)
def test_each_record_counts_once_and_add_report_leaves_its_input_as_it_was(items: list[Any]) -> None:
    state: WindowState | None = None
    closed: list[MetricWindow] = []
    accepted: list[MetricReport] = []
    for partition, offset, report in numbered(items):
        before = None if state is None else state.to_dict()
        try:
            new, window = add_report(state, report, INTERVAL, partition, offset)
        except RefusedReport:
            assert (None if state is None else state.to_dict()) == before
            continue
        assert (None if state is None else state.to_dict()) == before, "add_report changed its input"
        state = new
        accepted.append(report)
        closed += [window] if window is not None else []
    assert state is not None
    assert sum(w.report_count for w in closed) + state.reports == len(accepted)
    assert len({(r.worker_id, r.timestamp) for r in accepted}) == len(accepted), "an interval counted twice"
    for field in ("records_in", "records_out"):
        open_sum = sum(getattr(w, field) for w in state.workers.values())
        assert sum(getattr(w, field) for w in closed) + open_sum == sum(getattr(r, field) for r in accepted)
    operator_records = sum(op.records_in for w in closed for op in w.operators)
    open_operator_records = sum(op.records_in for w in state.workers.values() for op in w.operators.values())
    assert operator_records + open_operator_records == sum(op.records_in for r in accepted for op in r.operators)


@FAST
@given(records)
def test_the_stored_form_round_trips_at_every_step(items: list[Any]) -> None:
    def check(state: WindowState) -> WindowState:
        stored = state.to_dict()
        assert WindowState.from_dict(stored) == state
        assert WindowState.from_dict(json.loads(json.dumps(stored))).to_dict() == stored
        return state

    fold(numbered(items), keep=check)


@FAST
@given(records, st.data())
def test_a_state_kept_in_knowledge_folds_as_one_kept_in_memory(items: list[Any], data: st.DataObject) -> None:
    log = numbered(items)
    in_memory, closed, _ = fold(log)
    saved = data.draw(st.lists(st.booleans(), min_size=len(log), max_size=len(log)))
    flags = iter(saved)
    stored, closed_stored, _ = fold(log, keep=lambda s: through_knowledge(s) if next(flags, False) else s)
    assert stored == in_memory
    assert [without_closed_at(w) for w in closed_stored] == [without_closed_at(w) for w in closed]
    assert in_memory is not None and through_knowledge(in_memory) == in_memory


@FAST
@given(records, st.data())
def test_redelivered_records_are_skipped(items: list[Any], data: st.DataObject) -> None:
    log = numbered(items)
    state, _, _ = fold(log)
    assert state is not None
    # A restart replays each partition from an earlier offset: everything up to the last offset
    # applied on it is skipped, and folding the replay changes nothing.
    replay_from = data.draw(st.integers(0, len(log)))
    replay = [(p, o, r) for p, o, r in log[replay_from:] if o <= state.offsets.get(p, -1)]
    for partition, offset, report in replay:
        assert already_applied(state, partition, offset, report), (partition, offset, report)
    again, closed, accepted = fold(replay, state)
    assert again == state and closed == [] and accepted == []


def carries_state(report: MetricReport) -> bool:
    return bool(report.state) or report.watermark_lag_s is not None or report.output_lag_s is not None


@FAST
@given(records)
def test_a_windows_state_sums_each_workers_latest_state_and_takes_the_fewest_partitions(items: list[Any]) -> None:
    state, closed, accepted = fold(numbered(items))
    assert state is not None
    for window in [*closed, close_window(state, "job", INTERVAL)]:
        mine = [r for r in accepted if window_start_for(r.timestamp, INTERVAL) == window.window_start
                and carries_state(r)]
        latest: dict[str, MetricReport] = {}
        for report in mine:
            if report.worker_id not in latest or report.timestamp > latest[report.worker_id].timestamp:
                latest[report.worker_id] = report
        operators = [op for report in latest.values() for op in report.state]
        if not operators:
            assert window.state is None
        else:
            assert window.state is not None
            assert window.state.rows == sum(op.rows for op in operators)
            assert window.state.memory_bytes == sum(op.memory_bytes for op in operators)
            assert window.state.operators == max(len(report.state) for report in latest.values())
            commit = sum(op.commit_time_s for report in mine for op in report.state)
            assert window.state.commit_time_s == pytest.approx(commit)
            known = [op.partitions for op in operators if op.partitions is not None]
            assert window.state.partitions == (min(known) if len(known) == len(operators) else None)
        if not latest:
            assert window.watermark_lag_s is None and window.output_lag_s is None
            continue
        last_at = max(report.timestamp for report in latest.values())
        lags = {(r.watermark_lag_s, r.output_lag_s) for r in latest.values() if r.timestamp == last_at}
        assert (window.watermark_lag_s, window.output_lag_s) in lags


# ---------------------------------------------------------------- the stored form, by example


def stateful(timestamp: float, worker: str, rows: int, partitions: int | None, commit: float,
             watermark_lag: float | None = 4.0) -> MetricReport:
    return MetricReport.model_validate({
        "job_id": "job", "timestamp": timestamp, "interval_s": 1.0, "worker_id": worker, "parallelism": 2,
        "records_in": 10, "records_out": 10, "busy_time_s": 0.5, "shuffle_partitions": 8,
        "state": [{"operator": "stateStoreSave", "rows": rows, "memory_bytes": rows * 100, "commit_time_s": commit,
                   "partitions": partitions}],
        "watermark_lag_s": watermark_lag, "output_lag_s": None if watermark_lag is None else watermark_lag + 1.0,
    })


def test_a_window_with_state_is_stored_with_it_and_one_without_state_without_it() -> None:
    state, _ = add_report(None, stateful(1001.0, "a", 20, 8, 0.25), INTERVAL, 0, 0)
    state, _ = add_report(state, stateful(1003.0, "a", 30, 8, 0.5, watermark_lag=6.0), INTERVAL, 0, 1)
    state, _ = add_report(state, stateful(1002.0, "b", 5, 4, 0.125), INTERVAL, 0, 2)
    stored = json.loads(json.dumps(state.to_dict()))
    assert stored["workers"]["a"]["state"] == {"at": 1003.0, "operators": [["stateStoreSave", 30, 3000, 8]],
                                               "commit_time": 0.75, "watermark_lag": 6.0, "output_lag": 7.0}
    assert WindowState.from_dict(stored) == state and through_knowledge(state) == state
    window = close_window(WindowState.from_dict(stored), "job", INTERVAL)
    assert window.state is not None
    assert (window.state.operators, window.state.rows, window.state.memory_bytes) == (1, 35, 3500)
    assert (window.state.commit_time_s, window.state.partitions) == (0.875, 4)
    assert (window.watermark_lag_s, window.output_lag_s) == (6.0, 7.0)  # worker a's report at 1003 is the latest
    plain = WindowState.from_dict(json.loads(STORED))
    assert all("state" not in worker for worker in plain.to_dict()["workers"].values())
    window = close_window(plain, "job", INTERVAL)
    assert (window.state, window.watermark_lag_s, window.output_lag_s) == (None, None, None)


def test_an_earlier_report_folded_later_adds_its_commit_time_but_not_its_state() -> None:
    state, _ = add_report(None, stateful(1005.0, "a", 50, None, 0.5, watermark_lag=3.0), INTERVAL, 0, 0)
    state, _ = add_report(state, stateful(1004.0, "a", 40, 8, 0.25, watermark_lag=9.0), INTERVAL, 0, 1)
    window = close_window(state, "job", INTERVAL)
    assert window.state is not None and (window.state.rows, window.state.commit_time_s) == (50, 0.75)
    assert window.state.partitions is None and window.watermark_lag_s == 3.0  # unreadable partitions stay unknown



def test_a_window_stored_by_the_previous_version_loads_and_is_stored_the_same() -> None:
    stored = json.loads(STORED)
    state = WindowState.from_dict(stored)
    assert state.to_dict() == stored and json.dumps(state.to_dict()) == STORED
    assert state.offsets == {0: 42, 1: 9} and state.workers["a"].spans == {2: (1002.0, 1004.0), 3: (1004.0, 1006.0)}
    window = close_window(state, "job", INTERVAL)
    assert (window.report_count, window.workers, window.parallelism, window.parallelism_changed) == (3, 2, 3, True)
    assert (window.records_in, window.records_out, window.batches, window.batch_time_s) == (207, 107, 4, 0.5)
    assert window.cpu_utilization == pytest.approx(0.45) and window.shuffle_partitions == 8
    assert window.source is not None and (window.source.arrival_rate, window.source.backlog) == (40.0, 10)
    assert window.source.backlog_growth_rate == -10.0
    assert [(op.operator_id, op.arrival_rate) for op in window.operators] == [("read", 40.0), ("sum", None)]
    assert [(w.worker_id, w.utilization_source) for w in window.worker_loads] == [("a", "busy"), ("b", "cpu")]
    assert (window.first_report_at, window.last_report_at, window.stopped_at) == (1004.0, 1006.0, 1004.0)


def test_older_forms_load_through_the_knowledge_base_and_fold_on() -> None:
    # Before duplicate detection: no "seen"; before report spans: no "spans" per worker.
    old = json.loads(STORED)
    del old["seen"]
    for worker in old["workers"].values():
        del worker["spans"]
    knowledge = MemoryKnowledge(Settings())
    knowledge._windows["job"] = json.dumps(old)  # as an older version left it in the store
    state = asyncio.run(knowledge.load_windows(["job"]))["job"]
    assert len(state.seen) == 0 and state.workers["a"].spans == {}
    window = close_window(state, "job", INTERVAL)
    assert (window.first_report_at, window.last_report_at, window.stopped_at) == (None, 1006.0, None)
    # Nothing to compare the earlier reports with: the same interval again is folded, then remembered.
    again = MetricReport(job_id="job", timestamp=1005.0, interval_s=1.0, worker_id="b", parallelism=3,
                         records_in=7, records_out=7, busy_time_s=0.0)
    state, closed = add_report(state, again, INTERVAL, 1, 10)
    assert closed is None and state.reports == 4 and (("b", "1005.0") in state.seen)
    assert state.workers["b"].spans == {3: (1004.0, 1005.0)}
    with pytest.raises(RefusedReport):
        add_report(state, again, INTERVAL, 1, 11)


def test_values_are_frozen_and_branches_keep_their_own_reports() -> None:
    state = WindowState.from_dict(json.loads(STORED))
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.reports = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.workers["a"].busy = 0.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        state.seen._len = 0  # type: ignore[misc]
    # Two reports folded into the same state: each result holds its own, the state neither.
    one = MetricReport(job_id="job", timestamp=1007.0, interval_s=1.0, worker_id="a", parallelism=3,
                       records_in=1, records_out=1, busy_time_s=0.1)
    other = one.model_copy(update={"timestamp": 1008.0})
    first, _ = add_report(state, one, INTERVAL, 0, 43)
    second, _ = add_report(state, other, INTERVAL, 0, 43)
    assert ("a", "1007.0") in first.seen and ("a", "1007.0") not in second.seen
    assert ("a", "1008.0") in second.seen and ("a", "1008.0") not in first.seen
    assert ("a", "1007.0") not in state.seen and ("a", "1008.0") not in state.seen and len(state.seen) == 3
    assert first.to_dict()["seen"]["a"] == {"1004.0": 1, "1006.0": 1, "1007.0": 1}
    assert second.to_dict()["seen"]["a"] == {"1004.0": 1, "1006.0": 1, "1008.0": 1}
    assert SeenReports([("a", "1"), ("b", "2")]) == SeenReports([("b", "2"), ("a", "1")]) != SeenReports()
