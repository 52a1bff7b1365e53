"""The pure parts of `python -m bench.fleet_live`: the time a job spends beyond its backlog target, counted
by its windows' spans, and the records beyond it at the end."""

from __future__ import annotations

import pytest

from bench.fleet_live import WINDOW_S, beyond_target


def test_a_job_that_reports_seldom_is_not_undercounted() -> None:
    """A job in long micro-batches publishes a window every 20 s: each one beyond target counts 20 s, not one
    window's length (seen live: a starved job with 29,000 records queued counted 100 s against 210 s)."""
    steady = [[t, 100.0, 5_000.0 if 20 <= t <= 40 else 0.0] for t in range(5, 61, 5)]
    seldom = [[t, 100.0, 5_000.0 if 20 <= t <= 40 else 0.0] for t in (5, 20, 40, 60)]
    assert beyond_target(steady, 20.0) == (25.0, 0.0)  # 20, 25, 30, 35, 40: five windows of 5 s
    assert beyond_target(seldom, 20.0) == (35.0, 0.0)  # 20 (15 s since 5) and 40 (20 s since 20)
    assert beyond_target([[10.0, 100.0, 3_000.0]], 20.0) == (WINDOW_S, 1_000.0)  # the first: one window


def test_the_records_beyond_target_at_the_end_are_those_of_the_last_window() -> None:
    windows = [[5.0, 300.0, 9_000.0], [10.0, 50.0, 2_500.0]]
    seconds, left = beyond_target(windows, 20.0)
    assert seconds == pytest.approx(10.0) and left == pytest.approx(1_500.0)
    assert beyond_target([], 20.0) == (0.0, 0.0)
