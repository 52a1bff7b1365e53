"""The `jumpy` traces (issue 41, item 4): 5-minute rows moving 4-5 % a row at the median and 13-15 % at
the 90th percentile around a daily cycle, mean-reverting, fixed, and replayed like the recorded 5-minute
traces; and the default trace set that includes them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from evaluation.cli import evaluate_command
from evaluation.suite import EvalSettings, cases_of
from evaluation.synthetic import (
    FIRST_BURST_ROW,
    JUMPY_NAMES,
    ROWS_PER_DAY,
    jumpy,
    laplace,
    log_moves,
    seasonal,
)
from evaluation.traces import DEFAULT_TRACES, SHARED_TRACES, TRACE_NAMES, builtin_series, load_trace

DAY = ROWS_PER_DAY


def autocorrelation(x: np.ndarray, lag: int) -> float:
    centred = x - x.mean()
    return float(np.dot(centred[:-lag], centred[lag:]) / np.dot(centred, centred))


@pytest.mark.parametrize("name", JUMPY_NAMES)
def test_the_row_to_row_moves_are_those_asked(name: str) -> None:
    series = builtin_series(name)
    assert series.row_s == 300.0 and len(series.values) >= 7 * DAY
    assert np.all(np.isfinite(series.values)) and series.values.min() > 0
    moves = log_moves(series.values)
    assert 0.04 <= np.median(moves) <= 0.05
    assert 0.13 <= np.percentile(moves, 90) <= 0.15


@pytest.mark.parametrize("name", JUMPY_NAMES)
def test_the_load_follows_a_daily_cycle(name: str) -> None:
    logs = np.log(builtin_series(name).values)
    assert autocorrelation(logs, DAY) > 0.6  # a day apart: alike
    assert autocorrelation(logs, DAY // 2) < -0.3  # half a day apart: day against night
    profile = builtin_series(name).values.reshape(-1, DAY).mean(axis=0)  # the mean day
    assert 2.5 <= profile.max() / profile.min() <= 4.0
    assert 2 * 12 <= profile.argmin() <= 7 * 12 and 14 * 12 <= profile.argmax() <= 19 * 12  # night, afternoon


def test_the_level_reverts_to_the_cycle_and_is_no_random_walk() -> None:
    residual = np.log(jumpy()) - seasonal(len(jumpy()))
    assert abs(autocorrelation(residual, DAY)) < 0.1  # a shock is forgotten within the day
    halves = np.array_split(residual, 2)
    assert np.std(halves[1]) == pytest.approx(np.std(halves[0]), rel=0.2)  # its spread does not grow
    assert abs(residual.mean()) < 0.05


def test_the_traces_are_fixed_whatever_the_evaluation_asks() -> None:
    for name in JUMPY_NAMES:
        assert np.array_equal(builtin_series(name, hours=6.0).values, builtin_series(name, hours=48.0).values)
    # The evaluation's seed adds noise in real time only (between rows); the rows are the same.
    a, b = (load_trace("jumpy", hours=6.0, regime="compressed", seed=seed) for seed in (0, 7))
    assert np.array_equal(a.rates, b.rates)
    c, d = (load_trace("jumpy", hours=6.0, regime="real-time", seed=seed) for seed in (0, 7))
    assert not np.array_equal(c.rates, d.rates)


@settings(max_examples=10, deadline=None)
@given(days=st.integers(1, 20), bursty=st.booleans())
def test_a_shorter_trace_is_the_first_rows_of_the_longer(days: int, bursty: bool) -> None:
    assert np.array_equal(jumpy(bursty, days=days), jumpy(bursty)[: days * DAY])


def test_the_bursts_are_level_shifts_of_30_to_90_minutes() -> None:
    ratio = np.round(jumpy(bursty=True) / jumpy(), 9)
    shifted = ratio != 1.0
    assert np.all(ratio[shifted] >= 1.5 - 1e-9) and np.all(ratio[shifted] <= 2.5 + 1e-9)
    edges = np.flatnonzero(np.diff(np.concatenate(([1.0], ratio, [1.0]))))  # a burst: a run of one factor
    runs = [(start, end) for start, end in itertools.pairwise(edges) if shifted[start]]
    assert runs[0][0] == FIRST_BURST_ROW < 6 * 12  # inside the real-time regime's first 6 h
    assert all(6 <= end - start <= 18 for start, end in runs if end < len(ratio))  # 30-90 min
    assert 1.5 <= len(runs) / (len(ratio) / DAY) <= 2.5  # about two a day


@given(u=st.floats(0.0, 1.0, exclude_max=True), scale=st.floats(0.001, 1.0))
def test_laplace_draws_are_its_quantiles(u: float, scale: float) -> None:
    x = float(laplace(np.array([u]), scale)[0])
    assert np.isfinite(x)
    u = max(u, 2.0**-54)  # a uniform of 0 (the CDF's -infinity) is drawn as the least one above it
    cdf = 0.5 * np.exp(x / scale) if x < 0 else 1 - 0.5 * np.exp(-x / scale)
    assert cdf == pytest.approx(u, abs=1e-9)


@pytest.mark.parametrize("name", JUMPY_NAMES)
def test_they_replay_like_the_recorded_5_minute_traces(name: str) -> None:
    compressed = load_trace(name, hours=6.0, peak=1000.0, regime="compressed")
    real_time = load_trace(name, hours=6.0, peak=1000.0, regime="real-time")
    assert compressed.compression == pytest.approx(12.0) and real_time.compression == pytest.approx(1.0)
    assert len(compressed.rates) == len(real_time.rates) == 6 * 360
    assert compressed.rates.max() == pytest.approx(1000.0) and real_time.rates.max() == pytest.approx(1000.0)
    assert "first 72 h" in compressed.description and "synthetic" in compressed.description
    cases = cases_of([name], EvalSettings(seeds=2))
    assert cases == [(name, "compressed", 0), (name, "compressed", 1), (name, "real-time", 0), (name, "real-time", 1)]


def test_the_default_set_is_the_real_traces_the_steps_and_the_jumpy_ones() -> None:
    assert (*SHARED_TRACES, "step-up", "drop", "jumpy", "jumpy-bursty") == DEFAULT_TRACES
    assert set(DEFAULT_TRACES) <= set(TRACE_NAMES)
    app = typer.Typer()
    app.command()(evaluate_command)
    help_text = " ".join(CliRunner().invoke(app, ["--help"], terminal_width=300).output.split())
    assert "jumpy-bursty" in help_text
