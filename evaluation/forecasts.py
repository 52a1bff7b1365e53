"""The arrival-rate forecasts analyze would publish for a trace, made once per trace.

The arrival rate is the load's, whatever the policy does, so every policy that plans with a
forecast sees the same forecasts. The forecaster (`analyze.forecast`) sees one point a minute.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from dataclasses import dataclass

from analyze.arima import fit_model
from analyze.forecast import ForecastState, install_model, step
from analyze.learning import forecast_config, forecast_view
from contracts.analyses import ForecastView
from contracts.jobs import JobConfig
from evaluation.jobmodel import EPOCH
from evaluation.traces import Trace

FORECAST_STEP_S = 60.0  # the proactive policies' forecaster sees one point a minute (see docs/results.md)
EPSILON = 1e-9


@dataclass(frozen=True)
class ForecastStream:
    """The arrival-rate forecasts analyze would publish, made once per trace: the arrival rate is
    the load's, whatever the policy does, so every proactive policy sees the same forecasts."""

    made_at: list[float]
    views: list[ForecastView | None]
    wapes: list[float]
    methods: list[str]
    refits: int
    seconds: float

    def at(self, t: float) -> ForecastView | None:
        i = bisect.bisect_right(self.made_at, t + EPSILON) - 1
        return self.views[i] if i >= 0 else None


def forecast_stream(trace: Trace, config: JobConfig, step_s: float = FORECAST_STEP_S) -> ForecastStream:
    started = time.perf_counter()
    settings = forecast_config(step_s, config.forecast_horizon_s, config.forecast_wape_threshold,
                               config.forecast_retrain_after, config.forecast_min_points)
    per = max(1, round(step_s / trace.window_s))
    points = trace.rates[: (len(trace.rates) // per) * per].reshape(-1, per).mean(axis=1)
    state, model = ForecastState(), None
    made_at: list[float] = []
    views: list[ForecastView | None] = []
    wapes: list[float] = []
    methods: list[str] = []
    refits = 0
    for k, value in enumerate(points):
        now = EPOCH + (k + 1) * per * trace.window_s
        state, decision = step(state, [float(value)], now, settings, model)
        model = decision.model
        made_at.append(now)
        views.append(forecast_view(decision))
        methods.append(decision.method or "none")
        if decision.wape is not None:
            wapes.append(decision.wape)
        if decision.retrain is not None:
            # Live, the refit runs in a process pool and is installed a few seconds later: before
            # the next point a minute later, as here.
            refits += 1
            fitted = None
            with contextlib.suppress(Exception):
                fitted = fit_model(decision.retrain.history, settings)
            state, model = install_model(state, fitted, decision.retrain.request_id, settings, model)
    return ForecastStream(made_at, views, wapes, methods, refits, time.perf_counter() - started)


def one_blas_thread() -> None:
    """Small linear algebra in two processes on two cores: BLAS threads would only contend. The
    limit covers loaded libraries only, so scipy's and pmdarima's are loaded first."""
    import pmdarima  # noqa: F401
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
