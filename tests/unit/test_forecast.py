"""analyze.forecast: the forecasters, WAPE and the per-job state machine (pure; no services).

One real auto_arima fit on 300 points is shared by the module (about 1-5 s on 2 busy cores); the
state-machine tests replace the model with a fake whose forecast is the number in its bytes."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyze import forecast as fc
from analyze.arima import (
    ForecastConfig,
    arima_forecast,
    fit_model,
    last_value_forecast,
    linear_trend_forecast,
    load_model,
    model_points,
    update_model,
    wape,
)
from analyze.forecast import ForecastState, install_model, step

PERIOD = 40  # points per cycle of the synthetic series
HORIZON = 10  # a quarter of a cycle


def sine(n: int, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 1000 + 400 * np.sin(2 * np.pi * t / PERIOD) + rng.normal(0, 20, n)


@pytest.fixture(scope="module")
def series() -> np.ndarray:
    return sine(360)


@pytest.fixture(scope="module")
def model(series: np.ndarray) -> bytes:
    return fit_model(series[:300], ForecastConfig(history_points=300))


# --- WAPE and the simple forecasters ---------------------------------------------------------


def test_wape_is_total_absolute_error_over_total_actual() -> None:
    assert wape([100, 200, 100], [110, 170, 100]) == pytest.approx(40 / 400)
    assert wape([100, 200], [100, 200]) == 0.0
    # A symmetric error counts the same above and below; negative actuals count by magnitude.
    assert wape([100], [150]) == wape([100], [50]) == pytest.approx(0.5)
    assert wape([-100, 100], [0, 100]) == pytest.approx(0.5)


def test_wape_with_no_load() -> None:
    assert wape([0, 0], [0, 0]) == 0.0
    assert wape([0, 0], [1, 0]) == math.inf
    with pytest.raises(ValueError):
        wape([], [])
    with pytest.raises(ValueError):
        wape([1, 2], [1])


def test_linear_trend_extends_a_line_exactly() -> None:
    history = 5.0 + 2.0 * np.arange(50)
    np.testing.assert_allclose(linear_trend_forecast(history, 4, window=10), [105, 107, 109, 111])
    # Only the recent window counts: an old level does not bend the line.
    bent = np.concatenate([np.full(40, 1e6), 3.0 * np.arange(10)])
    np.testing.assert_allclose(linear_trend_forecast(bent, 2, window=10), [30, 33])
    # A falling line stops at zero (a rate).
    np.testing.assert_allclose(linear_trend_forecast([30, 20, 10], 3, window=3), [0, 0, 0], atol=1e-9)
    np.testing.assert_allclose(linear_trend_forecast([7.0], 2), [7, 7])


@given(st.lists(st.floats(0, 1e6), min_size=2, max_size=60), st.integers(1, 30), st.integers(2, 40))
def test_linear_trend_is_the_least_squares_line(history: list[float], steps: int, window: int) -> None:
    # The closed form is the line np.polyfit fits, extended and clamped at zero.
    y = np.asarray(history)[-window:]
    slope, intercept = np.polyfit(np.arange(y.size, dtype=float), y, 1)
    expected = np.maximum(intercept + slope * np.arange(y.size, y.size + steps), 0.0)
    np.testing.assert_allclose(linear_trend_forecast(history, steps, window), expected, rtol=1e-9, atol=1e-6)


def test_last_value_repeats_the_newest_point() -> None:
    np.testing.assert_array_equal(last_value_forecast([3, 9, 4], 3), [4, 4, 4])
    np.testing.assert_array_equal(last_value_forecast([-2.0], 2), [0, 0])
    with pytest.raises(ValueError):
        last_value_forecast([], 1)
    with pytest.raises(ValueError):
        linear_trend_forecast([1.0, float("nan")], 1)


# --- The ARIMA model --------------------------------------------------------------------------


def test_arima_beats_last_value_on_a_noisy_sine(series: np.ndarray, model: bytes) -> None:
    arima_errors, last_errors = [], []
    current = model
    for origin in range(300, 350, 10):  # five origins; the model learns the actuals between them
        if origin > 300:
            current = update_model(current, series[origin - 10:origin])
        actual = series[origin:origin + HORIZON]
        predicted = arima_forecast(current, HORIZON)
        assert predicted.shape == (HORIZON,) and np.all(predicted >= 0)
        arima_errors.append(wape(actual, predicted))
        last_errors.append(wape(actual, last_value_forecast(series[:origin], HORIZON)))
    # A quarter cycle ahead the last value is off by about a third of the swing; ARIMA by little.
    assert np.mean(arima_errors) < 0.5 * np.mean(last_errors), (arima_errors, last_errors)
    assert np.mean(arima_errors) < 0.1


def test_update_model_moves_the_forecast(series: np.ndarray, model: bytes) -> None:
    before = arima_forecast(model, HORIZON)
    updated = update_model(model, series[300:320])
    assert model_points(updated).size == 320
    after = arima_forecast(updated, HORIZON)
    assert not np.allclose(before, after)
    # It forecasts from the new end: closer to what follows point 320 than the old forecast is.
    actual = series[320:320 + HORIZON]
    assert wape(actual, after) < wape(actual, before)
    # With max_points the model keeps a bounded window (size and update cost stay flat).
    windowed = update_model(model, series[300:320], max_points=250)
    np.testing.assert_allclose(model_points(windowed), series[70:320])
    assert update_model(model, []) is model


def test_a_constant_series_forecasts_its_value_with_a_narrow_interval() -> None:
    model = load_model(fit_model(np.full(60, 1400.0)))
    values, upper = model.predict_interval(5, 0.2)
    assert np.allclose(values, 1400.0) and (upper >= values).all() and (upper < 1410.0).all()


def test_model_and_state_survive_pickle_and_json(model: bytes) -> None:
    # The bytes are what a process pool returns and Redis stores.
    restored = load_model(pickle.loads(pickle.dumps(model)))
    np.testing.assert_allclose(restored.predict(n_periods=5), load_model(model).predict(n_periods=5))
    config = ForecastConfig(step_s=60, horizon_s=900)
    assert pickle.loads(pickle.dumps(config)) == config and config.horizon_steps == 15
    assert pickle.loads(pickle.dumps(fit_model)) is fit_model  # a process pool can send it
    state = ForecastState(history=[1.0, 2.0], last_time=20.0, wapes=[0.1, math.inf], retrain_outstanding=True)
    text = state.model_dump_json()
    json.loads(text.replace("Infinity", "1e999"))  # plain JSON apart from the infinite WAPE
    assert ForecastState.model_validate_json(text) == state


# --- The state machine (fake model: its forecast is the number in its bytes) -----------------


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fc, "update_model", lambda model, new, max_points=None: model)
    monkeypatch.setattr(fc, "arima_forecast_upper",
                        lambda model, steps: (np.full(steps, float(model.decode())),) * 2)


CONFIG = ForecastConfig(step_s=10, horizon_s=60, min_fit_points=20, poor_loops_before_retrain=3, trend_window_s=50)


def run(state: ForecastState, model: bytes | None, values: list[float], t0: float, config: ForecastConfig = CONFIG):
    """Step once per value, 10 s apart from t0; the decisions and the final state and model."""
    decisions = []
    for i, value in enumerate(values):
        state, decision = step(state, [value], t0 + 10 * i, config, model)
        model = decision.model
        decisions.append(decision)
    return state, model, decisions


@pytest.mark.usefixtures("fake_model")
def test_first_fit_is_requested_once_enough_points_arrived() -> None:
    state, model, decisions = run(ForecastState(), None, [100.0] * 25, 0.0)
    assert decisions[0].method == "last_value" and decisions[1].method == "linear_trend"
    requests = [d.retrain for d in decisions if d.retrain]
    assert len(requests) == 1 and requests[0].reason == "initial"
    assert len(requests[0].history) == 20 and requests[0].through == 190.0
    assert state.retrain_outstanding and model is None
    # The fit comes back after five more points: the model learns them and ARIMA takes over.
    state, model = install_model(state, b"100", requests[0].request_id, CONFIG)
    assert model == b"100" and not state.retrain_outstanding and state.models_installed == 1
    state, decision = step(state, [100.0], 250.0, CONFIG, model)
    assert decision.method == "arima" and decision.forecast.values == [100.0] * 6
    assert decision.forecast.start == 260.0


@pytest.mark.usefixtures("fake_model")
def test_poor_arima_falls_back_to_the_trend_and_recovers() -> None:
    state = ForecastState()
    state, _, _ = run(state, None, [100.0] * 20, 0.0)
    state, model = install_model(state, b"100", state.retrain_id, CONFIG)
    state, model, decisions = run(state, model, [100.0, 100.0], 200.0)
    assert [d.method for d in decisions] == ["arima", "arima"] and decisions[1].arima_wape == 0.0
    # The load doubles: ARIMA (still 100) scores 0.5 > 0.25, so the next forecast is the line.
    state, model, decisions = run(state, model, [200.0, 200.0], 220.0)
    assert decisions[0].arima_wape == pytest.approx(0.5) and decisions[0].method == "linear_trend"
    assert "WAPE 0.500 > 0.25" in decisions[0].reason
    assert decisions[0].forecast.values[0] > 100.0  # the trend follows the jump
    # The published forecast (the trend) is scored too, separately from ARIMA.
    assert decisions[1].wape is not None and decisions[1].wape != decisions[1].arima_wape
    # Back to 100: ARIMA scores well again and is used again.
    state, model, decisions = run(state, model, [100.0], 240.0)
    assert decisions[0].arima_wape == 0.0 and decisions[0].method == "arima" and state.poor_loops == 0


@pytest.mark.usefixtures("fake_model")
def test_refit_after_n_poor_loops_at_most_one_outstanding() -> None:
    state = ForecastState()
    state, _, _ = run(state, None, [100.0] * 20, 0.0)
    state, model = install_model(state, b"100", state.retrain_id, CONFIG)
    state, model, decisions = run(state, model, [100.0] + [300.0] * 8, 200.0)
    assert [d.poor_loops for d in decisions] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    requests = [(i, d.retrain) for i, d in enumerate(decisions) if d.retrain]
    assert len(requests) == 1  # at the third poor loop, then none while it is outstanding
    at, request = requests[0]
    assert at == 3 and request.reason == "poor_forecasts" and state.retrain_outstanding
    assert "outstanding" in decisions[-1].reason
    # A result for another request id is ignored.
    stale, kept = install_model(state, b"999", request.request_id - 1, CONFIG, current=model)
    assert stale == state and kept == model
    # The refit is swapped in: the flag clears, ARIMA's scores restart, ARIMA is used again.
    state, model = install_model(state, b"300", request.request_id, CONFIG, current=model)
    assert not state.retrain_outstanding and state.poor_loops == 0 and state.arima_wapes == []
    state, model, decisions = run(state, model, [300.0, 300.0], 290.0)
    assert [d.method for d in decisions] == ["arima", "arima"] and decisions[1].arima_wape == 0.0
    # Poor again: a new request is allowed once the previous one was swapped in.
    state, model, decisions = run(state, model, [600.0] * 3, 310.0)
    assert decisions[-1].retrain is not None and decisions[-1].retrain.request_id == request.request_id + 1


@pytest.mark.usefixtures("fake_model")
def test_failed_refit_clears_the_flag_and_waits() -> None:
    state = ForecastState()
    state, _, decisions = run(state, None, [100.0] * 20, 0.0)
    state, model = install_model(state, None, state.retrain_id, CONFIG)
    assert not state.retrain_outstanding and model is None
    state, model, decisions = run(state, model, [100.0] * 4, 200.0)
    # The next request waits poor_loops_before_retrain loops (3 x 10 s after the failure at 190 s).
    assert [d.retrain is not None for d in decisions] == [False, False, True, False]


@pytest.mark.usefixtures("fake_model")
def test_gaps_duplicates_and_restarts() -> None:
    state, model, _ = run(ForecastState(), None, [100.0, 110.0], 0.0)
    # A replayed point changes nothing.
    same, decision = step(state, [110.0], 10.0, CONFIG, model)
    assert same == state and decision.reason.startswith("stale")
    # A batch overlapping what arrived adds only its new points.
    state, decision = step(state, [999.0, 120.0], 20.0, CONFIG, model)
    assert decision.filled_points == 0 and state.history == [100.0, 110.0, 120.0]
    # Two missing points are interpolated (and not scored).
    state, decision = step(state, [150.0], 50.0, CONFIG, model)
    assert decision.filled_points == 2 and state.history == [100.0, 110.0, 120.0, 130.0, 140.0, 150.0]
    assert state.last_time == 50.0 and state.wapes[-1] == decision.wape
    # A gap longer than max_gap_s (300 s) restarts the series and drops the model.
    state, decision = step(state, [50.0], 400.0, CONFIG, b"100")
    assert decision.reset and decision.model is None and state.history == [50.0]
    assert decision.method == "last_value"


def test_step_with_a_real_model(series: np.ndarray, model: bytes) -> None:
    config = ForecastConfig(step_s=10, horizon_s=HORIZON * 10, history_points=300)
    state = ForecastState(history=series[:300].tolist(), last_time=2990.0)
    state, decision = step(state, series[300:302], 3010.0, config, model)
    assert decision.method == "arima" and len(decision.forecast.values) == HORIZON
    state, decision = step(state, series[302:303], 3020.0, config, decision.model)
    assert decision.arima_wape is not None and decision.arima_wape < 0.1 and decision.method == "arima"
    assert model_points(decision.model).size == 300  # windowed to history_points
