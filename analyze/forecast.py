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

A fit takes seconds and a `step` milliseconds (docs/results.md, "Measurements moved from
docstrings"), so the shell runs `step` in a thread and a fit in the process pool.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from analyze.arima import (
    ForecastConfig,
    _series,
    arima_forecast_upper,
    last_value_forecast,
    linear_trend_forecast,
    update_model,
    wape,
)

Method = Literal["arima", "linear_trend", "last_value"]
RetrainReason = Literal["initial", "poor_forecasts", "model_error"]


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
    upper: list[float] | None = None  # a 90 % upper quantile of each value

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
    # A shallow copy: below, every change rebinds an attribute to a new value and never changes a list or
    # a forecast in place, so the caller's state stays as it was (a deep copy cost a fifth of the step).
    state = state.model_copy()
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
    arima_upper: np.ndarray | None = None
    if model is not None:
        try:
            model = update_model(model, new, max_points=config.history_points)
            arima_values, arima_upper = arima_forecast_upper(model, config.horizon_steps)
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
                                        made_at=now, upper=None if arima_upper is None else arima_upper.tolist())
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
    upper = state.arima_forecast.upper if method == "arima" and state.arima_forecast is not None else \
        _empirical_upper(values, state.wapes[-config.score_loops:])
    state.forecast = Forecast(values=[float(v) for v in values], start=start, step_s=step_s, method=method,
                              made_at=now, upper=upper)

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


def _empirical_upper(values: Sequence[float] | np.ndarray, recent_wapes: list[float]) -> list[float] | None:
    """A fallback forecast's 90 % upper quantile from its recent errors: the values plus 1.6 typical
    absolute errors (1.28 standard deviations of a normal error, whose sd is 1.25 mean absolute
    errors), the typical error being the median recent WAPE (one wild loop does not widen it), at
    most +50 %; None until an error has been measured."""
    finite = [w for w in recent_wapes if math.isfinite(w)]
    if not finite:
        return None
    margin = min(0.5, 1.6 * statistics.median(finite))  # the same median as numpy's, without its overhead
    return [float(v) * (1 + margin) for v in values]


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
