"""The arrival-rate forecasts analyze would publish for a trace, made once per trace.

The arrival rate is the load's, whatever the policy does, so every policy that plans with a
forecast sees the same forecasts. The forecaster (`analyze.forecast`) sees one point a minute.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from dataclasses import dataclass

from analyze.arima import ForecastConfig, fit_model
from analyze.forecast import ForecastDecision, ForecastState, install_model, step
from analyze.learning import forecast_config, forecast_view
from contracts.analyses import ForecastView
from contracts.jobs import JobConfig
from contracts.messages import MetricWindow
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


class Forecaster:
    """One job's forecaster in one process: analyze's forecast step (`analyze.forecast.step`) on its
    state, with a refit it asks for made at once. Live, the refit runs in a process pool and is
    installed a few seconds later (`analyze.forecast_pool`): before the next point, when points come
    a minute apart; with points a window apart, possibly a window or two later."""

    def __init__(self) -> None:
        self.state = ForecastState()
        self.model: bytes | None = None
        self.refits = 0

    def step(self, value: float, now: float, settings: ForecastConfig) -> ForecastDecision:
        self.state, decision = step(self.state, [value], now, settings, self.model)
        self.model = decision.model
        if decision.retrain is not None:
            self.refits += 1
            fitted = None
            with contextlib.suppress(Exception):
                fitted = fit_model(decision.retrain.history, settings)
            self.state, self.model = install_model(self.state, fitted, decision.retrain.request_id, settings,
                                                   self.model)
        return decision

    def view(self, window: MetricWindow, settings: ForecastConfig) -> ForecastView | None:
        """The forecast analyze publishes for the window, stepped with its arrival rate (a forecaster of
        `evaluation.loop.JobLoop`: one point a window, as analyze steps it live)."""
        if window.source is None:
            return None
        return forecast_view(self.step(window.source.arrival_rate, window.window_end, settings))


def forecast_stream(trace: Trace, config: JobConfig, step_s: float = FORECAST_STEP_S) -> ForecastStream:
    started = time.perf_counter()
    settings = forecast_config(step_s, config.forecast_horizon_s, config.forecast_wape_threshold,
                               config.forecast_retrain_after, config.forecast_min_points)
    per = max(1, round(step_s / trace.window_s))
    points = trace.rates[: (len(trace.rates) // per) * per].reshape(-1, per).mean(axis=1)
    forecaster = Forecaster()
    made_at: list[float] = []
    views: list[ForecastView | None] = []
    wapes: list[float] = []
    methods: list[str] = []
    for k, value in enumerate(points):
        now = EPOCH + (k + 1) * per * trace.window_s
        decision = forecaster.step(float(value), now, settings)
        made_at.append(now)
        views.append(forecast_view(decision))
        methods.append(decision.method or "none")
        if decision.wape is not None:
            wapes.append(decision.wape)
    refits = forecaster.refits
    return ForecastStream(made_at, views, wapes, methods, refits, time.perf_counter() - started)


def one_blas_thread() -> None:
    """Small linear algebra in two processes on two cores: BLAS threads would only contend. The
    limit covers loaded libraries only, so scipy's and pmdarima's are loaded first."""
    import pmdarima  # noqa: F401
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
