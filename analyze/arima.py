"""The arrival-rate model: auto_arima's choice, kept as its specification, parameters and points.

Pure functions over the model's bytes (JSON, about 15 KB for 720 points): fit (seconds, in the
analyze shell's process pool), filter new points through it, forecast, and the fallbacks and the
WAPE score the forecasting state machine (`analyze.forecast`) uses.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class ForecastConfig(BaseModel):
    """Forecasting settings of one job. Times are in seconds of metric time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    horizon_s: float = Field(900.0, gt=0, description="how far ahead each forecast reaches")
    step_s: float = Field(10.0, gt=0, description="spacing of the series' points (the loop interval or an aggregate)")
    wape_threshold: float = Field(0.25, gt=0, description="an ARIMA forecast scoring above this WAPE is poor")
    poor_loops_before_retrain: int = Field(15, ge=1, description="consecutive poor ARIMA loops that request a refit")
    score_loops: int = Field(
        1, ge=1, description="ARIMA's recent WAPE is the mean of its last this many scored loops (1: the previous one)"
    )
    history_points: int = Field(720, ge=10, description="most points a fit uses, and the window the model keeps")
    min_fit_points: int = Field(60, ge=10, description="points needed before the first fit is requested")
    trend_window_s: float = Field(300.0, gt=0, description="the linear-trend fallback fits the points of this span")
    max_gap_s: float = Field(
        300.0, ge=0, description="missing points up to this span are interpolated; a longer gap restarts the series"
    )
    recent_wapes: int = Field(15, ge=1, description="scored WAPEs kept in the state (for inspection)")
    # auto_arima search. Stepwise with these bounds a fit on 600 points takes a few seconds.
    seasonal_period: int = Field(1, ge=1, description="m of auto_arima; 1 = non-seasonal")
    max_p: int = Field(3, ge=0)
    max_q: int = Field(3, ge=0)
    max_d: int = Field(2, ge=0)
    max_seasonal_p: int = Field(1, ge=0)
    max_seasonal_q: int = Field(1, ge=0)
    max_seasonal_d: int = Field(1, ge=0)
    maxiter: int = Field(50, ge=1, description="optimizer iterations per candidate model")
    information_criterion: Literal["aic", "bic", "aicc", "hqic"] = "aic"

    @property
    def horizon_steps(self) -> int:
        return max(1, math.ceil(self.horizon_s / self.step_s - 1e-9))

    @property
    def trend_points(self) -> int:
        return max(2, round(self.trend_window_s / self.step_s))


# ---------------------------------------------------------------------------------------------
# The model: auto_arima's choice, kept as its specification, parameters and points.


@dataclass(frozen=True)
class ArimaModel:
    """A fitted ARIMA as what it is: the statsmodels SARIMAX specification auto_arima chose, its
    fitted parameters and the window of points it filters. Kept as JSON (a few KB), not a pickle of
    the fitted object: rebuilding the state-space model and filtering the points is cheaper than
    unpickling, updating and pickling it (docs/results.md, "Measurements moved from docstrings"),
    and nothing stored is ever unpickled."""

    spec: dict[str, Any]  # SARIMAX keyword arguments (order, seasonal_order, trend, ...)
    params: tuple[float, ...]
    endog: tuple[float, ...]

    @property
    def order(self) -> tuple[int, ...]:
        return tuple(self.spec["order"])

    def results(self) -> Any:
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        spec = {**self.spec, "order": tuple(self.spec["order"]),
                "seasonal_order": tuple(self.spec["seasonal_order"])}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return SARIMAX(np.asarray(self.endog, dtype=float), **spec).filter(np.asarray(self.params, dtype=float))

    def predict(self, n_periods: int) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(self.results().forecast(n_periods), dtype=float)

    def predict_interval(self, n_periods: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """The next points and the upper end of their (1 - alpha) two-sided prediction interval."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            forecast = self.results().get_forecast(n_periods)
            return (np.asarray(forecast.predicted_mean, dtype=float),
                    np.asarray(forecast.conf_int(alpha=alpha), dtype=float)[:, 1])

    def to_bytes(self) -> bytes:
        return json.dumps({"spec": self.spec, "params": list(self.params), "endog": list(self.endog)}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ArimaModel:
        raw = json.loads(data)
        return cls(dict(raw["spec"]), tuple(float(x) for x in raw["params"]), tuple(float(x) for x in raw["endog"]))


def dump_model(model: Any) -> bytes:
    """The bytes of a pmdarima ARIMA (as fitted by auto_arima) or of an ArimaModel."""
    if isinstance(model, ArimaModel):
        return model.to_bytes()
    results = model.arima_res_
    spec = {k: v for k, v in results.model._get_init_kwds().items() if k not in ("endog", "exog")}
    endog = np.asarray(results.data.endog, dtype=float).ravel()
    return ArimaModel(spec, tuple(float(x) for x in results.params), tuple(float(x) for x in endog)).to_bytes()


def load_model(model_bytes: bytes) -> ArimaModel:
    return ArimaModel.from_bytes(model_bytes)


def _series(points: Sequence[float] | np.ndarray, name: str = "points") -> np.ndarray:
    values = np.asarray(points, dtype=float).ravel()
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must be finite numbers")
    return values


def fit_model(history: Sequence[float] | np.ndarray, config: ForecastConfig | None = None) -> bytes:
    """Fit auto_arima (stepwise) on the last `history_points` of `history`; the model's bytes.

    CPU-bound for seconds: what the shell's process pool runs. Raises ValueError on too few points."""
    import pmdarima as pm  # imported here: a few hundred ms, only where a model is fitted

    config = config or ForecastConfig()
    y = _series(history, "history")[-config.history_points:]
    if y.size < 10:
        raise ValueError(f"a fit needs at least 10 points, got {y.size}")
    if np.ptp(y) <= 1e-9 * max(1.0, abs(float(y[0]))):
        return _constant_model(y).to_bytes()
    seasonal = config.seasonal_period > 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = pm.auto_arima(
            y,
            stepwise=True,
            seasonal=seasonal,
            m=config.seasonal_period if seasonal else 1,
            max_p=config.max_p,
            max_q=config.max_q,
            max_d=config.max_d,
            max_P=config.max_seasonal_p,
            max_Q=config.max_seasonal_q,
            max_D=config.max_seasonal_d,
            start_p=min(2, config.max_p),
            start_q=min(2, config.max_q),
            information_criterion=config.information_criterion,
            maxiter=config.maxiter,
            suppress_warnings=True,
            error_action="ignore",
            n_jobs=1,
        )
    return dump_model(model)


def _constant_model(y: np.ndarray) -> ArimaModel:
    """A constant series as a model: its value as the mean and a negligible variance. (auto_arima returns
    an ARIMA(0,0,0) for it whose statsmodels results lose the intercept, so it would forecast zeros.)"""
    value = float(y[-1])
    spec = {"order": [0, 0, 0], "seasonal_order": [0, 0, 0, 0], "trend": "c"}
    return ArimaModel(spec, (value, max((1e-3 * abs(value)) ** 2, 1e-12)), tuple(float(x) for x in y))


def model_points(model_bytes: bytes) -> np.ndarray:
    """The series the model was fitted and updated on."""
    return np.asarray(load_model(model_bytes).endog, dtype=float)


def update_model(
    model_bytes: bytes, new_points: Sequence[float] | np.ndarray, max_points: int | None = None
) -> bytes:
    """The model with `new_points` appended to the points it filters; with `max_points`, only the
    last `max_points` are kept, so its size and cost stay bounded however long the job runs.

    The parameters stay those of the last fit: every forecast filters the latest points through
    them (the state follows the data), and a refit re-estimates them when the forecasts turn poor,
    not every window (pmdarima's `update`, too dear per job and window: docs/results.md)."""
    new = _series(new_points, "new_points")
    if new.size == 0:
        return model_bytes
    model = load_model(model_bytes)
    endog = np.concatenate([np.asarray(model.endog, dtype=float), new])
    if max_points is not None:
        endog = endog[-max_points:]
    return ArimaModel(model.spec, model.params, tuple(float(x) for x in endog)).to_bytes()


def arima_forecast(model_bytes: bytes, steps: int) -> np.ndarray:
    """The next `steps` points, clamped at 0 (an arrival rate). Raises ValueError if not finite."""
    values = load_model(model_bytes).predict(n_periods=steps)
    if not np.all(np.isfinite(values)):
        raise ValueError("the model forecast non-finite values")
    return np.maximum(values, 0.0)


UPPER_ALPHA = 0.2  # the upper end of an 80 % two-sided interval: a 90 % upper quantile


def arima_forecast_upper(model_bytes: bytes, steps: int, alpha: float = UPPER_ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """The next `steps` points and an upper quantile of each (pmdarima's prediction interval, from the
    statsmodels state space it wraps), clamped at 0. Raises ValueError if not finite."""
    values, upper = load_model(model_bytes).predict_interval(steps, alpha)
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(upper))):
        raise ValueError("the model forecast non-finite values")
    return np.maximum(values, 0.0), np.maximum(upper, values)


def linear_trend_forecast(history: Sequence[float] | np.ndarray, steps: int, window: int = 30) -> np.ndarray:
    """Least-squares line through the last `window` points, extended `steps` points; clamped at 0."""
    y = _series(history, "history")[-max(2, window):]
    if y.size == 0:
        raise ValueError("no history to forecast from")
    if y.size == 1:
        return last_value_forecast(y, steps)
    # The least-squares line in closed form (what np.polyfit(x, y, 1) solves, without its general
    # machinery: this runs every window of every job with a forecast).
    x = np.arange(y.size, dtype=float) - (y.size - 1) / 2
    slope = float(x @ (y - y.mean())) / float(x @ x)
    ahead = np.arange(y.size, y.size + steps, dtype=float) - (y.size - 1) / 2
    return np.maximum(y.mean() + slope * ahead, 0.0)


def last_value_forecast(history: Sequence[float] | np.ndarray, steps: int) -> np.ndarray:
    y = _series(history, "history")
    if y.size == 0:
        raise ValueError("no history to forecast from")
    return np.full(steps, max(float(y[-1]), 0.0))


def wape(actual: Sequence[float] | np.ndarray, predicted: Sequence[float] | np.ndarray) -> float:
    """Weighted absolute percentage error: sum|a - p| / sum|a|.

    When every actual is 0 it is 0.0 if every prediction is 0 too, otherwise infinity (any error
    is infinitely large against no load, and counts as poor). Raises ValueError on empty or
    mismatched inputs."""
    a = np.asarray(actual, dtype=float).ravel()
    p = np.asarray(predicted, dtype=float).ravel()
    if a.size == 0 or a.shape != p.shape:
        raise ValueError(f"wape needs two non-empty series of the same length, got {a.size} and {p.size}")
    error = float(np.abs(a - p).sum())
    scale = float(np.abs(a).sum())
    if scale == 0.0:
        return 0.0 if error == 0.0 else math.inf
    return error / scale
