"""The monitor's window rules (add_report): shuffled, late, duplicated and replayed reports are each
counted once, in a window that closes once, in metric-time order; what it remembers is bounded."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.messages import MetricReport, MetricWindow
from monitor import windows as windows_module
from monitor.windows import (
    DuplicateReport,
    LateReport,
    RefusedReport,
    WindowState,
    add_report,
    already_applied,
    closed_window_ends,
    window_phase,
    window_start_for,
)

INTERVAL = 10.0

# Enough examples to find the rare shapes, few enough for a 2-core machine.
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def report_bytes(ts: float, worker: str = "driver", records_in: int = 1) -> bytes:
    return json.dumps({"job_id": "job", "timestamp": ts, "interval_s": 1.0, "worker_id": worker,
                       "parallelism": 2, "records_in": records_in, "records_out": 1,
                       "busy_time_s": 0.5}).encode()


def report(ts: float, worker: str = "driver", records_in: int = 1) -> MetricReport:
    return MetricReport.model_validate_json(report_bytes(ts, worker, records_in))


# Few distinct windows, seconds and workers, so shuffles produce late reports and duplicates often.
deliveries = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from([0.5, 1.0, 4.25, 9.75]), st.sampled_from(["a", "b", "driver"]),
              st.integers(0, 1000)),
    min_size=1, max_size=40,
)


@FAST
@given(deliveries, st.data())
def test_window_rules_count_each_interval_exactly_once(items: list[tuple[int, float, str, int]],
                                                       data: st.DataObject) -> None:
    base = 1_000_000.0
    # Duplicates with the same content and with other content, then any order.
    extra = data.draw(st.lists(st.sampled_from(items), max_size=10))
    altered = [(w, s, worker, n + 1) for w, s, worker, n in data.draw(st.lists(st.sampled_from(items), max_size=5))]
    messages = data.draw(st.permutations(items + extra + altered))
    # A restart replays from an earlier committed offset: offsets [replay_from, crash_at) come twice.
    crash_at = data.draw(st.integers(0, len(messages)))
    replay_from = data.draw(st.integers(0, crash_at))
    schedule = list(range(crash_at)) + list(range(replay_from, len(messages)))
    roundtrip = data.draw(st.lists(st.booleans(), min_size=len(schedule), max_size=len(schedule)))

    state: WindowState | None = None
    closed: list[MetricWindow] = []
    accepted: list[tuple[float, str]] = []
    accepted_records = 0
    model_open: float | None = None  # the reference model: the open window and what it has seen
    model_seen: set[tuple[str, float]] = set()
    for offset, through_json in zip(schedule, roundtrip, strict=True):
        w, s, worker, n = messages[offset]
        r = report(base + w * INTERVAL + s, worker, n)
        if through_json and state is not None:  # knowledge keeps state as JSON between batches
            state = WindowState.from_dict(json.loads(json.dumps(state.to_dict())))
        if already_applied(state, 0, offset):
            assert offset < crash_at  # only a replayed offset can have been applied
            continue
        start = window_start_for(r.timestamp, INTERVAL)
        if model_open is not None and start < model_open:
            expected: type[RefusedReport] | None = LateReport
        elif model_open == start and (worker, r.timestamp) in model_seen:
            expected = DuplicateReport
        else:
            expected = None
        try:
            state, window = add_report(state, r, INTERVAL, 0, offset)
        except RefusedReport as exc:
            assert type(exc) is expected, (exc, expected)
            assert exc.reason in ("late_report", "duplicate_report") and str(exc)
            continue
        assert expected is None
        if model_open != start:
            model_open, model_seen = start, set()
        model_seen.add((worker, r.timestamp))
        accepted.append((r.timestamp, worker))
        accepted_records += n
        if window is not None:
            closed.append(window)
        # Bounded: one remembered key per report folded, never more than the cap.
        assert len(state.seen) == state.reports <= windows_module.MAX_SEEN_PER_WINDOW
        assert len(state.workers) <= 3 and len(state.offsets) == 1

    assert state is not None
    assert len(accepted) == len(set(accepted)), "an interval was counted twice"
    assert sum(w.report_count for w in closed) + state.reports == len(accepted)
    open_records = sum(w.records_in for w in state.workers.values())
    assert sum(w.records_in for w in closed) + open_records == accepted_records
    starts = [w.window_start for w in closed]
    assert starts == sorted(set(starts)), "windows close once each, in metric-time order"


def test_duplicate_rules_by_example() -> None:
    state, _ = add_report(None, report(1001.0, "a"), INTERVAL, 0, 0)
    state, _ = add_report(state, report(1001.0, "b"), INTERVAL, 0, 1)  # another worker: not a duplicate
    state, _ = add_report(state, report(1003.0, "a"), INTERVAL, 0, 2)
    state, _ = add_report(state, report(1002.0, "a"), INTERVAL, 0, 3)  # out of order within the window: fine
    for again in (report(1001.0, "a"), report(1001.0, "a", records_in=99)):  # same or other content
        with pytest.raises(DuplicateReport, match="first report counts"):
            add_report(state, again, INTERVAL, 0, 4)
    assert state.reports == 4
    assert already_applied(state, 0, 3)  # a redelivered offset is skipped before any rule
    state, closed = add_report(state, report(1011.0, "a"), INTERVAL, 0, 5)
    assert closed is not None and closed.report_count == 4 and closed.records_in == 4
    assert state.seen.to_dict() == {"a": {"1011.0": 1}}  # forgotten with its window
    with pytest.raises(LateReport):  # a duplicate of a closed window's report is late
        add_report(state, report(1001.0, "a"), INTERVAL, 0, 6)


def test_window_state_saved_before_duplicate_detection_still_folds() -> None:
    state, _ = add_report(None, report(1001.0), INTERVAL, 0, 0)
    state = WindowState.from_dict({k: v for k, v in state.to_dict().items() if k != "seen"})
    state, _ = add_report(state, report(1002.0), INTERVAL, 0, 1)
    assert state.reports == 2 and state.seen.to_dict() == {"driver": {"1002.0": 1}}


def test_remembered_keys_are_capped_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(windows_module, "MAX_SEEN_PER_WINDOW", 3)
    state: WindowState | None = None
    for i in range(10):
        state, _ = add_report(state, report(1000.0 + i * 0.5), INTERVAL, 0, i)
    assert state is not None and state.reports == 10
    assert state.seen.to_dict() == {"driver": {"1000.0": 1, "1000.5": 1, "1001.0": 1}}
    with pytest.raises(DuplicateReport):
        add_report(state, report(1000.5), INTERVAL, 0, 10)
    # Beyond the cap duplicates are no longer recognised: counted, as before this rule existed.
    state, _ = add_report(state, report(1004.5), INTERVAL, 0, 11)
    assert state.reports == 11


@FAST
@given(st.text(min_size=1, max_size=12), st.integers(1, 40))
def test_a_jobs_windows_start_at_its_phase_and_hold_each_report_once(job: str, seconds: int) -> None:
    phase = window_phase(job, INTERVAL)
    assert 0.0 <= phase < INTERVAL and window_phase(job, INTERVAL) == phase  # stable
    state, closed = None, []
    for t in range(seconds):
        state, window = add_report(state, report(1_000_000.0 + t), INTERVAL, phase_s=phase)
        closed += [window] if window else []
    assert state is not None and (state.start - phase) % INTERVAL == 0
    for window in closed:
        assert (window.window_start - phase) % INTERVAL == 0 and window.window_end - window.window_start == INTERVAL
    assert sum(w.report_count for w in closed) + state.reports == seconds
    # What the benches and reliability tests count as closed is what the monitor closed.
    assert [w.window_end for w in closed] == closed_window_ends(1_000_000.0, 1_000_000.0 + seconds - 1, INTERVAL, phase)


def test_the_windows_of_many_jobs_close_spread_over_the_interval() -> None:
    # A thousand jobs reporting in step: their windows close in every second of the interval, none
    # with more than one and a half times its even share.
    per_second = [0] * int(INTERVAL)
    for i in range(1000):
        per_second[int(window_phase(f"load-{i:04d}", INTERVAL))] += 1
    assert min(per_second) > 0 and max(per_second) <= 150


def test_a_window_opened_before_its_phase_changed_keeps_its_span() -> None:
    # A window opened on a multiple of the interval (a monitor before `window_spread`): its reports
    # stay in it, none is late, and the next window starts on the job's phase.
    state, _ = add_report(None, report(1_000_000.5), INTERVAL)
    for t in (1.5, 7.5, 9.5):
        state, window = add_report(state, report(1_000_000.0 + t), INTERVAL, phase_s=3.0)
        assert window is None and state.start == 1_000_000.0
    state, window = add_report(state, report(1_000_010.5), INTERVAL, phase_s=3.0)
    assert window is not None and window.report_count == 4 and state.start == 1_000_003.0
