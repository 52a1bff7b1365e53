"""The arrival level (plan.level): a step is detected within a few windows, steady noise seldom fires,
an outlier does not blunt the detector, and the trend finds a rising load where it is now."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plan.level import LevelState, update


def run_level(rates: list[float]) -> tuple[LevelState, list[int]]:
    state, fired = LevelState(), []
    for i, rate in enumerate(rates):
        state, shift = update(state, 10.0 * i, rate)
        if shift:
            fired.append(i)
    return state, fired


def test_a_step_is_detected_within_a_few_windows_and_the_level_restarts_from_it() -> None:
    rng = np.random.default_rng(1)
    rates = list(100 * rng.lognormal(0, 0.05, 60)) + list(400 * rng.lognormal(0, 0.05, 10))
    state, fired = run_level(rates)
    assert len(fired) == 1 and 60 <= fired[0] <= 62
    assert state.level() == pytest.approx(400, rel=0.1)


def test_noisy_steady_load_seldom_fires() -> None:
    alarms = 0
    for seed in range(10):
        rates = list(500 * np.random.default_rng(seed).lognormal(0, 0.1, 500))
        alarms += len(run_level(rates)[1])
    assert alarms <= 10  # 5,000 windows (about 14 hours): at most one false shift in 500 windows


# A live run of wiki (2026-11-27): seconds from the load's start, arrival rate measured. The job's first
# window is partial (126 rec/s against about 220); the load rises to about 290, then falls by two thirds.
WIKI_LIVE = [(16, 126), (26, 224), (36, 246), (46, 274), (56, 273), (66, 296), (76, 285), (96, 274), (106, 263),
             (116, 235), (126, 225), (136, 232), (146, 208), (156, 218), (166, 189), (176, 157), (186, 155),
             (196, 150), (206, 116), (216, 152), (226, 108), (236, 135), (246, 115), (256, 107), (266, 94),
             (276, 92), (286, 83), (296, 90), (306, 100), (316, 88), (326, 108), (336, 100), (346, 115), (356, 98)]


def test_one_outlier_does_not_blunt_the_detector_for_the_rest_of_the_run() -> None:
    """Counted whole, the first window's jump made the noise 0.22 for the run, and the fall was never
    detected (the scale-down waited for the job's delay); counted at most 3 sigmas, it is within a minute."""
    state, fired = LevelState(), []
    for t, rate in WIKI_LIVE:
        state, shift = update(state, float(t), float(rate))
        if shift:
            fired.append(t)
    assert any(150 <= t <= 240 for t in fired), fired
    assert state.sigma < 0.18


@given(outlier=st.floats(0.2, 5.0), seed=st.integers(0, 1000))
@settings(max_examples=30, deadline=None)
def test_the_noise_estimate_is_the_levels_not_an_outliers(outlier: float, seed: int) -> None:
    rates = [300.0, 300.0 * outlier, *(300.0 * np.random.default_rng(seed).lognormal(0, 0.03, 60))]
    state, _ = run_level(rates)
    # 3 % noise. A window off by 2x (or half) that does not fire a shift counts at most 3 sigmas of the prior,
    # and biases the level it is averaged into for a minute: the estimate stays within 3x of the noise
    # (counted whole it reached 4x).
    assert state.sigma < 0.09


def test_the_upper_level_is_above_the_mean_and_narrows_with_windows() -> None:
    state, _ = run_level([200.0, 210.0, 190.0])
    wide = state.upper_level()
    state, _ = run_level([200.0, 210.0, 190.0, 200.0, 205.0, 195.0])
    assert wide is not None and state.upper_level() is not None
    assert wide > state.upper_level() > state.level()  # type: ignore[operator]


def test_the_trend_finds_a_rising_load_where_it_is_now() -> None:
    rng = np.random.default_rng(3)
    rates = [200.0 + 1.5 * 10 * i for i in range(12)]  # 1.5 rec/s per second, 10-s windows
    state, _ = run_level([r * rng.lognormal(0, 0.03) for r in rates])
    trend = state.trend(110.0)
    assert trend is not None and trend.span_s == 50.0
    assert trend.slope == pytest.approx(1.5, rel=0.25)
    assert trend.rate == pytest.approx(rates[-1], rel=0.05)  # where the level (the mean) lags by 37 rec/s


@given(seed=st.integers(0, 10_000))
@settings(max_examples=50, deadline=None)
def test_a_steady_load_has_no_trend_and_its_rate_is_the_mean(seed: int) -> None:
    rates = list(300.0 * np.random.default_rng(seed).lognormal(0, 0.05, 20))
    state, _ = run_level(rates)
    trend = state.trend(190.0)
    assert trend is not None
    # At TREND_T = 2 a steady load shows a slope about 1 time in 10 (6 points); what it shows is small.
    assert abs(trend.slope) * trend.span_s < 0.35 * trend.rate
    if trend.slope == 0:
        assert trend.rate == pytest.approx(float(np.mean(rates[-6:])))


def test_no_trend_from_too_few_windows() -> None:
    state, _ = run_level([100.0, 200.0, 300.0])
    assert state.trend(20.0) is None
