"""What analyze learns per job beyond DS2's rates: the capacity model and the recovery detector.

Pure: a `Learned` value goes in with a window and its analysis, an updated one comes out, with the
views published in the analysis. The shell keeps `Learned` in knowledge as JSON between windows,
so any analyze worker can continue any job after a restart. (The arrival-rate forecast is
stepped by `analyze.forecast`; it is kept next to this, with its model's bytes.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from analyze.anomaly import RecoveryDetector
from analyze.arima import ForecastConfig
from analyze.capacity import (
    CapacityEstimate,
    CapacityModel,
    IdleWindow,
    UnknownCapacity,
    choose_capacity,
    fit_scaling_curve,
)
from analyze.forecast import Forecast, ForecastDecision
from contracts.analyses import Analysis, CapacityCurve, CapacityView, ForecastView, RecoveryView
from contracts.messages import MetricWindow


@dataclass
class Learned:
    capacity: CapacityModel = field(default_factory=CapacityModel)
    detector: RecoveryDetector = field(default_factory=RecoveryDetector)
    parallelism: int | None = None  # of the previous window
    windows_at_parallelism: int = 0
    last_window_end: float | None = None
    recovery_from: int | None = None  # the parallelism before the rescale being recovered from
    windows: int = 0
    last_backlog: float | None = None  # of the previous window, when it reported one
    last_report_at: float | None = None  # when the previous window's last report ended

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity.to_dict(), "detector": self.detector.to_dict(),
            "parallelism": self.parallelism, "windows_at_parallelism": self.windows_at_parallelism,
            "last_window_end": self.last_window_end, "recovery_from": self.recovery_from, "windows": self.windows,
            "last_backlog": self.last_backlog, "last_report_at": self.last_report_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Learned:
        return cls(
            capacity=CapacityModel.from_dict(data["capacity"]), detector=RecoveryDetector.from_dict(data["detector"]),
            parallelism=data["parallelism"], windows_at_parallelism=int(data["windows_at_parallelism"]),
            last_window_end=data["last_window_end"], recovery_from=data["recovery_from"], windows=int(data["windows"]),
            last_backlog=data["last_backlog"], last_report_at=data["last_report_at"],
        )


def new_learned(anomaly_k: float = 1.0, backlog_tolerance_s: float = 10.0) -> Learned:
    return Learned(detector=RecoveryDetector(k=anomaly_k, backlog_tolerance_s=backlog_tolerance_s))


def _at(window: MetricWindow) -> float:
    """When the window's backlog was measured: its last report's end (else the window's end)."""
    return _first(window.last_report_at, window.window_end)


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)


def _throughput(window: MetricWindow) -> float:
    return window.records_in / window.observed_s


def learn(
    learned: Learned, window: MetricWindow, analysis: Analysis
) -> tuple[Learned, CapacityView, RecoveryView | None]:
    """Fold one window into the capacity model and the recovery detector (in place on a copy)."""
    learned = Learned.from_dict(learned.to_dict())
    p = window.parallelism
    rescaled = learned.parallelism is not None and p != learned.parallelism
    first = rescaled or learned.parallelism is None
    learned.windows_at_parallelism = 1 if first else learned.windows_at_parallelism + 1
    if rescaled and learned.last_window_end is not None:
        # The job stopped after the last report at the old parallelism (the reporter publishes one
        # when the query stops); the window grid is the fallback for windows without report times.
        stopped = _first(window.stopped_at, learned.last_report_at, learned.last_window_end)
        learned.detector.start_recovery(stopped)
        learned.recovery_from = learned.parallelism
        # The restarted job's reports begin when it resumed: then the backlog of the stop and what
        # arrived since waited (the recovery detector times a short return from there, not from the
        # window's end).
        resumed = _first(window.first_report_at, window.window_end - window.observed_s)
        if window.source is not None and learned.last_backlog is not None and stopped <= resumed < _at(window):
            arrival = window.source.arrival_rate
            learned.detector.resumed(resumed, arrival, learned.last_backlog + arrival * (resumed - stopped))
    learned.parallelism = p
    learned.last_window_end = window.window_end
    learned.last_report_at = window.last_report_at
    learned.windows += 1
    if window.source is not None and window.source.backlog is not None:
        learned.last_backlog = float(window.source.backlog)

    # Capacity: not from a window that spans a restart or a (re)started job's first window, whose
    # throughput includes starting up.
    if window.worker_loads and not window.parallelism_changed and learned.windows_at_parallelism > 1:
        samples = {w.worker_id: (w.utilization, w.throughput) for w in window.worker_loads}
        with contextlib.suppress(IdleWindow):  # a window without load says nothing about capacity
            learned.capacity.observe(p, samples)
    capacity = capacity_view(learned.capacity, window, analysis)

    recovery = None
    # A window spanning the restart counts when it reports the backlog: by its end the job caught up or not.
    if window.source is not None and (not window.parallelism_changed or window.source.backlog is not None):
        started_at = learned.detector.recovery_start
        observed = learned.detector.observe(_at(window), window.source.arrival_rate, _throughput(window),
                                            window.source.backlog)
        if observed is not None:
            recovery = RecoveryView(
                started_at=_at(window) - observed if started_at is None else started_at,
                observed_s=observed, judge="backlog" if window.source.backlog is not None else learned.detector.judge,
                from_parallelism=learned.recovery_from or p, to_parallelism=p,
            )
            learned.recovery_from = None
    return learned, capacity, recovery


def capacity_view(model: CapacityModel, window: MetricWindow, analysis: Analysis) -> CapacityView:
    p = window.parallelism
    estimate: CapacityEstimate | None
    try:
        estimate = model.estimate(p)
    except UnknownCapacity:
        estimate = None
    busy_reported = window.busy_time_s > 0 and analysis.valid
    rate = analysis.true_processing_rate if busy_reported else None
    samples = sum(m.count for m in model.workers.values()) if model.parallelism == p else 0
    observed = {str(k): v for k, v in sorted(model.observed.items())}
    curve = scaling_curve(observed)
    try:
        choice = choose_capacity(rate, estimate, p)
    except UnknownCapacity as exc:
        return CapacityView(observed=observed, why=str(exc), regression_samples=samples, curve=curve)
    return CapacityView(observed=observed, current=choice.value, source=choice.source, why=choice.why,
                        regression_samples=samples, curve=curve)


def scaling_curve(observed: Mapping[str, float]) -> CapacityCurve | None:
    """The scaling curve through the observed capacities (None before any positive one), so that
    plan can predict the capacity of a scale-out not seen yet."""
    try:
        c, k, _ = fit_scaling_curve({int(p): float(c) for p, c in observed.items()})
    except UnknownCapacity:
        return None
    return CapacityCurve(coefficient=c, exponent=k)


def forecast_view(decision: ForecastDecision) -> ForecastView | None:
    forecast: Forecast | None = decision.forecast
    if forecast is None:
        return None
    return ForecastView(values=forecast.values, upper=forecast.upper, start=forecast.start, step_s=forecast.step_s,
                        method=forecast.method, wape=decision.wape, reason=decision.reason)


def forecast_config(
    step_s: float, horizon_s: float, wape_threshold: float, retrain_after: int, min_fit_points: int
) -> ForecastConfig:
    return ForecastConfig(step_s=step_s, horizon_s=horizon_s, wape_threshold=wape_threshold,
                          poor_loops_before_retrain=retrain_after, min_fit_points=min_fit_points)
