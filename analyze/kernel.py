"""Analyze's loop kernel: a closed window in, one analysis out, with what the job taught. Pure.

Per window, in order:

1. DS2's true rates (`analyze.true_rates.analyze_window`; Kalavri et al., OSDI '18). A window
   without input reuses the job's last valid analysis (`fallback`, a read the shell makes only when
   `needs_fallback` says so).
2. The capacity model and the recovery detector (`analyze.learning.learn`; Daedalus, ICPE '24), on
   the `Learned` value the shell loads and saves.
3. The arrival-rate forecast: `forecast_settings` says whether one is made and with what settings
   (only for a job whose policy plans with one: plan records that in its plan state, a declared
   cross-stage read, see docs/architecture.md); the shell steps the forecaster
   (`analyze.forecast`, in a process pool) and hands the view to `analyze`.

`Analyzed` declares what the shell commits, at once, with the message it publishes: the analysis
(analyze's history and outbox) and the learned state. The simulator (`evaluation.loop`) calls the
same functions, with the forecasts it made for the trace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from analyze.arima import ForecastConfig
from analyze.learning import Learned, forecast_config, learn, new_learned
from analyze.true_rates import analyze_window
from contracts.analyses import Analysis, ForecastView
from contracts.jobs import JobConfig
from contracts.messages import MetricWindow

STAGE = "analyze"


@dataclass(frozen=True)
class Analyzed:
    """The window's analysis and the learned state to keep with it."""

    learned: Learned
    analysis: Analysis

    def message(self) -> str:
        """The analysis as published (and committed as analyze's message for the window)."""
        return self.analysis.model_dump_json()

    def values(self) -> dict[str, str]:
        """The knowledge values committed with the message."""
        return {"learned": json.dumps(self.learned.to_dict())}


def needs_fallback(window: MetricWindow) -> bool:
    """Whether `analyze` needs the job's last valid analysis: a window in which nothing came in."""
    return window.records_in == 0


def forecast_settings(window: MetricWindow, config: JobConfig, needs_forecast: bool | None) -> ForecastConfig | None:
    """The forecaster's settings for this window, or None when no forecast is made: the job reports no
    source, or its policy plans without one (`needs_forecast` False in plan's state; None before
    plan's first window: then the forecast starts, as it may be needed)."""
    if window.source is None or needs_forecast is False:
        return None
    return forecast_config(window.window_end - window.window_start, config.forecast_horizon_s,
                           config.forecast_wape_threshold, config.forecast_retrain_after, config.forecast_min_points)


def start_learned(config: JobConfig) -> Learned:
    """What a job's first window learns from."""
    return new_learned(config.anomaly_k, config.backlog_tolerance_s)


def load_learned(stored: dict[str, Any] | None, config: JobConfig) -> Learned:
    """The learned state as stored in knowledge (None before the job's first window)."""
    return Learned.from_dict(stored) if stored else start_learned(config)


def analyze(
    window: MetricWindow,
    config: JobConfig,
    learned: Learned,
    fallback: dict[str, Any] | None,
    forecast: ForecastView | None,
) -> Analyzed:
    """The analysis of `window` and the learned state after it (`learned` is not changed)."""
    analysis = analyze_window(window, fallback if needs_fallback(window) else None)
    learned, capacity, recovery = learn(learned, window, analysis)
    analysis = analysis.model_copy(update={"capacity": capacity, "forecast": forecast, "recovery": recovery})
    return Analyzed(learned, analysis)
