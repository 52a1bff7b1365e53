"""The capacity-model benchmark's pure pieces: which windows are learned, which reports measure the drain."""

from __future__ import annotations

import pytest

from analyze.true_rates import analyze_window
from contracts.messages import MetricReport, SourceMetrics
from tests.support.capacity_windows import (
    Batch,
    batch_capacity,
    batch_of,
    drain_reports,
    error_pct,
    leave_one_out,
    load_rates,
    skip_reason,
    windows_of,
)

T0 = 1_795_000_000.0


def report(t: float, records: int, busy: float, backlog: int, arrival: float, p: int = 2) -> MetricReport:
    return MetricReport(job_id="bench", timestamp=t, interval_s=5.0, parallelism=p, records_in=records,
                        records_out=records, busy_time_s=busy,
                        source=SourceMetrics(arrival_rate=arrival, backlog=backlog, partitions=4))


def test_load_rates_and_signed_error() -> None:
    assert load_rates(2, 212.5, [0.3, 0.5, 0.7]) == [127.5, 212.5, 297.5]
    assert error_pct(105.0, 100.0) == pytest.approx(5.0)
    assert error_pct(95.0, 100.0) == pytest.approx(-5.0)
    assert error_pct(None, 100.0) is None
    assert error_pct(1.0, 0.0) is None


def test_windows_close_on_the_next_windows_report_and_carry_worker_loads() -> None:
    reports = [report(T0 + 5 * i, 500, 2.5, 100, 100.0) for i in range(1, 6)]  # ends at +5 .. +25
    windows = windows_of(reports, 10.0)
    assert [w.window_start for w in windows] == [T0, T0 + 10]  # the window of +20, +25 is still open
    (load,) = windows[1].worker_loads
    assert load.utilization == pytest.approx(5.0 / (10.0 * 2))
    assert load.throughput == pytest.approx(100.0)


def test_only_steady_unsaturated_windows_are_learned() -> None:
    def reason(backlog: int, busy: float, start: float = T0 + 100) -> str | None:
        reports = [report(start + 5, 500, busy, backlog, 100.0), report(start + 10, 500, busy, backlog, 100.0),
                   report(start + 15, 500, busy, backlog, 100.0)]
        (window,) = windows_of(reports, 10.0)
        return skip_reason(window, analyze_window(window, None), learn_from=T0 + 50, backlog_tolerance_s=3.0,
                           max_utilization=0.9)

    assert reason(backlog=100, busy=5.0) is None  # 50 % busy, one second of arrivals waiting
    assert reason(backlog=100, busy=5.0, start=T0) == "warm-up"
    assert reason(backlog=301, busy=5.0).startswith("saturated: backlog")
    assert reason(backlog=100, busy=9.5).startswith("saturated: utilization")


def test_drain_reports_are_those_wholly_inside_the_drain() -> None:
    written = T0 + 100
    reports = [
        report(written + 3, 1000, 9.0, 5000, 0.0),  # began before the backlog was written
        report(written + 8, 1000, 9.0, 4000, 0.0),
        report(written + 13, 1000, 9.0, 1000, 0.0),
        report(written + 18, 800, 8.0, 0, 0.0),  # drained within it: idle at its end
    ]
    assert [r.timestamp for r in drain_reports(reports, written)] == [written + 8, written + 13]


def test_batch_capacity_extrapolates_duration_to_full_batches() -> None:
    batches = [Batch(i, T0 + i, 0.4 + 0.004 * rows, rows) for i, rows in enumerate([60, 90, 120, 150, 200])]
    fit = batch_capacity(batches, 1250)
    assert fit is not None
    assert fit["overhead_s"] == pytest.approx(0.4)
    assert fit["per_row_ms"] == pytest.approx(4.0)
    assert fit["capacity"] == pytest.approx(1250 / (0.4 + 5.0))
    assert batch_capacity(batches[:2], 1250) is None  # too few batches for a line


def test_batch_of_reads_progress_dicts_and_skips_empty_batches() -> None:
    progress = {"batchId": 7, "timestamp": "2026-11-21T22:15:26.500Z", "numInputRows": 120,
                "durationMs": {"triggerExecution": 1450}}
    batch = batch_of(progress)
    assert batch is not None and batch.batch_id == 7 and batch.rows == 120
    assert batch.duration_s == pytest.approx(1.45)
    assert batch_of(progress | {"numInputRows": 0}) is None


def test_leave_one_out_uses_only_the_other_scale_outs() -> None:
    observed = {1: 230.0, 2: 460.0, 4: 920.0}
    estimate = leave_one_out(observed, 4)
    assert estimate is not None
    assert estimate["from"] == [1, 2]
    assert estimate["basis"] == "scaling_curve"
    assert estimate["value"] == pytest.approx(920.0)
    only = leave_one_out({2: 460.0}, 4)
    assert only is not None and only["basis"] == "proportional" and only["value"] == pytest.approx(920.0)
    assert leave_one_out({4: 920.0}, 4) is None
