"""Arrival-rate forecasting per job (proactive scaling): auto-ARIMA with a linear-trend fallback.

Pure: no Redis or Kafka. What the agent shell keeps per job is a JSON-able `ForecastState` and the
model's bytes; it calls `step` once per loop with the points that arrived and runs the expensive
`fit_model` in a process pool when `step` asks for a (re)fit, then hands the result to
`install_model`. The policy follows Daedalus (ICPE '24, section 3.3):

- every loop the new points are filtered through the model, which forecasts the next `horizon_s`;
- the previous forecast is scored against what arrived (WAPE over the overlap);
- when ARIMA's recent WAPE is above `wape_threshold`, the published forecast is a least-squares
  line over the recent points instead (ARIMA keeps being updated and scored, so it can win back);
- after `poor_loops_before_retrain` consecutive poor ARIMA loops a refit is requested, at most one
  outstanding per job; the first fit is requested the same way once `min_fit_points` have arrived.

Costs measured on 2 busy cores (pmdarima 2.1.1): `fit_model` on 150-720 points 0.3-7 s (the order
found and the load decide); a `step` (filter and forecast) under 10 ms on an idle core; the
model's bytes (JSON: specification, parameters, points) about 15 KB for 720 points. The shell runs
`step` in a thread and a fit in the process pool.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Method = Literal["arima", "linear_trend", "last_value"]
RetrainReason = Literal["initial", "poor_forecasts", "model_error"]


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
    the fitted object (0.3-2.3 MB): rebuilding the state-space model and filtering 720 points takes
    a few milliseconds, where unpickling, updating and pickling the object took 50-250 ms, and
    nothing stored is ever unpickled."""

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


def model_points(model_bytes: bytes) -> np.ndarray:
    """The series the model was fitted and updated on."""
    return np.asarray(load_model(model_bytes).endog, dtype=float)


def update_model(
    model_bytes: bytes, new_points: Sequence[float] | np.ndarray, max_points: int | None = None
) -> bytes:
    """The model with `new_points` appended to the points it filters; with `max_points`, only the
    last `max_points` are kept, so its size and cost stay bounded however long the job runs.

    The parameters stay those of the last fit: every forecast filters the latest points through
    them (the state follows the data), and a refit re-estimates them when the forecasts turn poor.
    Re-estimating every window (pmdarima's `update`) cost 50-250 ms per job and window."""
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


def linear_trend_forecast(history: Sequence[float] | np.ndarray, steps: int, window: int = 30) -> np.ndarray:
    """Least-squares line through the last `window` points, extended `steps` points; clamped at 0."""
    y = _series(history, "history")[-max(2, window):]
    if y.size == 0:
        raise ValueError("no history to forecast from")
    if y.size == 1:
        return last_value_forecast(y, steps)
    x = np.arange(y.size, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    ahead = np.arange(y.size, y.size + steps, dtype=float)
    return np.maximum(intercept + slope * ahead, 0.0)


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


# ---------------------------------------------------------------------------------------------
# The per-job state machine.


class Forecast(BaseModel):
    """Values at start, start + step_s, ... (metric time, seconds)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    values: list[float]
    start: float
    step_s: float
    method: Method
    made_at: float

    def overlap(self, times: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(actual, predicted) of the points at `times` that this forecast covers."""
        index = np.rint((times - self.start) / self.step_s).astype(int)
        inside = (index >= 0) & (index < len(self.values))
        return actual[inside], np.asarray(self.values, dtype=float)[index[inside]]


class ForecastState(BaseModel):
    """What the shell keeps per job between loops (JSON: `model_dump_json` / `model_validate_json`).
    The model's bytes are kept next to it, not in it."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    last_time: float | None = None  # metric time of the newest point in `history`
    history: list[float] = []  # the last `history_points` points, step_s apart, ending at last_time
    forecast: Forecast | None = None  # the published forecast (ARIMA or the fallback)
    arima_forecast: Forecast | None = None  # ARIMA's forecast of the same loop, scored even when not used
    wapes: list[float] = []  # the published forecasts' scores, oldest first
    arima_wapes: list[float] = []  # ARIMA's scores since the model was installed
    poor_loops: int = 0  # consecutive loops with ARIMA's WAPE above the threshold
    retrain_outstanding: bool = False
    retrain_id: int = 0  # of the latest request; a result for another id is stale
    retrain_through: float | None = None  # the request's history ends here
    retrain_reason: RetrainReason | None = None
    retrain_not_before: float | None = None  # after a failed fit, the next request waits until then
    retrains_requested: int = 0
    models_installed: int = 0


@dataclass(frozen=True)
class RetrainRequest:
    """Run `fit_model(history, config)` off the loop, then `install_model(state, model, request_id, config)`."""

    request_id: int
    reason: RetrainReason
    history: list[float]
    through: float


@dataclass(frozen=True)
class ForecastDecision:
    method: Method | None  # of `forecast`; None before any point arrived
    reason: str
    forecast: Forecast | None
    wape: float | None  # the previous published forecast against the points that arrived
    arima_wape: float | None  # the previous ARIMA forecast against them
    poor_loops: int
    retrain: RetrainRequest | None  # a new request (at most one outstanding per job)
    model: bytes | None = field(repr=False)  # the updated model: store it with the state
    filled_points: int = 0  # missing points interpolated before the new ones
    reset: bool = False  # a gap longer than max_gap_s: history and model were dropped


def _recent(values: list[float], value: float, keep: int) -> list[float]:
    return [*values, value][-keep:]


def _new_times(now: float, count: int, step_s: float) -> np.ndarray:
    return now - step_s * np.arange(count - 1, -1, -1, dtype=float)


def step(
    state: ForecastState,
    new_points: Sequence[float] | np.ndarray,
    now: float,
    config: ForecastConfig,
    model: bytes | None = None,
) -> tuple[ForecastState, ForecastDecision]:
    """One loop: `new_points` are the points since the last call, `config.step_s` apart, the last
    at metric time `now`. Scores the previous forecasts on them, updates the model, publishes the
    next forecast (starting at now + step_s) and requests a refit when one is due."""
    new = _series(new_points, "new_points")
    step_s = config.step_s
    filled = 0
    reset = False
    state = state.model_copy(deep=True)
    if state.last_time is not None and new.size:
        # Keep only points after last_time (a replayed or overlapping batch), and bridge a gap.
        due = round((now - state.last_time) / step_s)
        if due <= 0:
            return state, _unchanged(state, "stale: no point after the last one", model)
        new = new[-due:]
        missing = due - new.size
        if missing * step_s > config.max_gap_s:
            reset = True
            state = ForecastState(retrain_id=state.retrain_id, retrains_requested=state.retrains_requested,
                                  models_installed=state.models_installed)
            model = None
        elif missing > 0:
            start = state.history[-1]
            ramp = np.interp(np.arange(1, missing + 1), [0, missing + 1], [start, float(new[0])])
            new = np.concatenate([ramp, new])
            filled = missing
    if new.size == 0:
        return state, _unchanged(state, "no new points", model)

    # 1. Score the previous forecasts on the points that arrived (not the interpolated ones).
    actual = new[filled:]
    times = _new_times(now, actual.size, step_s)
    score = arima_score = None
    keep = max(config.recent_wapes, config.score_loops)
    if state.forecast is not None:
        a, p = state.forecast.overlap(times, actual)
        if a.size:
            score = wape(a, p)
            state.wapes = _recent(state.wapes, score, keep)
    if state.arima_forecast is not None:
        a, p = state.arima_forecast.overlap(times, actual)
        if a.size:
            arima_score = wape(a, p)
            state.arima_wapes = _recent(state.arima_wapes, arima_score, keep)
            state.poor_loops = state.poor_loops + 1 if arima_score > config.wape_threshold else 0

    # 2. Append the points; update the model with them.
    state.history = [*state.history, *(float(x) for x in new)][-config.history_points:]
    state.last_time = now
    retrain_reason: RetrainReason | None = None
    arima_values: np.ndarray | None = None
    if model is not None:
        try:
            model = update_model(model, new, max_points=config.history_points)
            arima_values = arima_forecast(model, config.horizon_steps)
        except Exception:  # a model that cannot be updated or forecast is dropped and refitted
            model = None
            state.arima_forecast = None
            state.arima_wapes = []
            state.poor_loops = 0
            retrain_reason = "model_error"

    # 3. The next forecast: ARIMA unless its recent WAPE is poor, else the linear trend.
    start = now + step_s
    steps = config.horizon_steps
    state.arima_forecast = None
    if arima_values is not None:
        state.arima_forecast = Forecast(values=arima_values.tolist(), start=start, step_s=step_s, method="arima",
                                        made_at=now)
    recent = state.arima_wapes[-config.score_loops:]
    arima_poor = bool(recent) and float(np.mean(recent)) > config.wape_threshold
    if state.arima_forecast is not None and not arima_poor:
        method: Method = "arima"
        values = arima_values
        reason = "arima" if not recent else f"arima: recent WAPE {np.mean(recent):.3f} <= {config.wape_threshold:g}"
    elif len(state.history) >= 2:
        method = "linear_trend"
        values = linear_trend_forecast(state.history, steps, config.trend_points)
        reason = (f"fallback: ARIMA's recent WAPE {np.mean(recent):.3f} > {config.wape_threshold:g}" if arima_poor
                  else "fallback: no ARIMA model yet")
    else:
        method = "last_value"
        values = last_value_forecast(state.history, steps)
        reason = "fallback: a single point"
    state.forecast = Forecast(values=[float(v) for v in values], start=start, step_s=step_s, method=method,
                              made_at=now)

    # 4. A refit when due: the first fit, a dropped model, or consecutive poor ARIMA loops.
    if retrain_reason is None:
        if model is None and len(state.history) >= config.min_fit_points:
            retrain_reason = "initial"
        elif model is not None and state.poor_loops >= config.poor_loops_before_retrain:
            retrain_reason = "poor_forecasts"
    request = None
    waiting = state.retrain_not_before is not None and now < state.retrain_not_before
    if retrain_reason is not None and not state.retrain_outstanding and not waiting:
        state.retrain_id += 1
        state.retrain_outstanding = True
        state.retrain_through = now
        state.retrain_reason = retrain_reason
        state.retrain_not_before = None
        state.retrains_requested += 1
        request = RetrainRequest(state.retrain_id, retrain_reason, list(state.history), now)
        reason += f"; refit requested ({retrain_reason})"
    elif state.retrain_outstanding:
        reason += f"; refit {state.retrain_id} outstanding ({state.retrain_reason})"
    return state, ForecastDecision(method=method, reason=reason, forecast=state.forecast, wape=score,
                                   arima_wape=arima_score, poor_loops=state.poor_loops, retrain=request, model=model,
                                   filled_points=filled, reset=reset)


def _unchanged(state: ForecastState, reason: str, model: bytes | None) -> ForecastDecision:
    return ForecastDecision(method=state.forecast.method if state.forecast else None, reason=reason,
                            forecast=state.forecast, wape=None, arima_wape=None, poor_loops=state.poor_loops,
                            retrain=None, model=model)


def install_model(
    state: ForecastState, model: bytes | None, request_id: int, config: ForecastConfig, current: bytes | None = None
) -> tuple[ForecastState, bytes | None]:
    """Swap in the result of refit `request_id` (None: the fit failed) and clear the outstanding flag.

    The new model is updated with the points that arrived since its history was taken; ARIMA's
    scores restart. A result for another request (the series restarted meanwhile) is ignored and
    `current` kept. After a failure the next request waits `poor_loops_before_retrain` loops."""
    if request_id != state.retrain_id or not state.retrain_outstanding:
        return state, current
    state = state.model_copy(deep=True)
    state.retrain_outstanding = False
    if model is None:
        state.retrain_not_before = (state.last_time or 0.0) + config.poor_loops_before_retrain * config.step_s
        state.poor_loops = 0
        return state, current
    if state.last_time is not None and state.retrain_through is not None:
        since = round((state.last_time - state.retrain_through) / config.step_s)
        if since > 0:
            model = update_model(model, state.history[-since:], max_points=config.history_points)
    state.arima_forecast = None
    state.arima_wapes = []
    state.poor_loops = 0
    state.retrain_not_before = None
    state.models_installed += 1
    return state, model


def abandon_retrain(state: ForecastState) -> ForecastState:
    """Forget an outstanding refit whose worker is gone, so that the next `step` requests it anew
    (its id is not reused: a late result of the old request is ignored by `install_model`)."""
    if not state.retrain_outstanding:
        return state
    return state.model_copy(update={"retrain_outstanding": False, "retrain_not_before": None})
