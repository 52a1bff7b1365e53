"""The evaluation suite: every policy on every trace, beside static provisioning and a clairvoyant oracle.

  autoscaler evaluate                                 every policy, every trace, 6 h of load each
  autoscaler evaluate --policy default --policy flink --trace wiki
  autoscaler evaluate --live --trace sine             (see evaluation.live)

Each policy of the registry (`plan.registry`) replays each trace in the one simulator
(`evaluation.simulator`) through our monitor, analyze and plan code, on the job model calibrated
from the live demo job (`evaluation.jobmodel`). The oracle (`evaluation.oracle`) knows the whole
load. Writes a table (stdout), JSON, a markdown table and one PNG per trace (`evaluation.report`).
See docs/results.md for the current numbers and the calibration.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np

from contracts.jobs import JobConfig
from evaluation.forecasts import FORECAST_STEP_S, forecast_stream, one_blas_thread
from evaluation.jobmodel import (
    DEMO_CHECKPOINT_S,
    DEMO_DOWNTIME_DOWN_S,
    DEMO_DOWNTIME_UP_S,
    DEMO_EFFICIENCY_BEYOND_KNEE,
    DEMO_KNEE,
    DEMO_RATE_NOISE,
    DEMO_SLOT_RATE,
    demo_model,
)
from evaluation.oracle import oracle_with_restarts, oracle_without_restarts
from evaluation.simulator import REPORTS_PER_WINDOW, WINDOW_S, PolicyRunner, Timeline, simulate, static_parallelism
from evaluation.traces import load_trace
from plan.registry import POLICIES, make_policy, policy_class

# Every policy of the registry, in the order the tables show them: the baselines, then ours.
EVALUATED = ("static", "threshold", "ds2", "flink", "daedalus", "hybrid", "default")
assert set(EVALUATED) == set(POLICIES), "every registered policy is evaluated"


@dataclass(frozen=True)
class EvalSettings:
    hours: float = 6.0
    peak: float = 1400.0
    max_parallelism: int = 12
    backlog_target_s: float = 60.0
    oracle_decision_s: float = 60.0
    seed: int = 0
    rate_noise: float = DEMO_RATE_NOISE


def eval_config(settings: EvalSettings) -> JobConfig:
    """The default job configuration, with the forecaster's first fit after 30 points (30 minutes at
    one a minute)."""
    return JobConfig(max_parallelism=settings.max_parallelism, forecast_min_points=30)


def evaluate_trace(name: str, policies: Sequence[str], settings: EvalSettings) -> dict[str, Any]:
    started = time.perf_counter()
    forecasting = [name for name in policies if policy_class(name).needs_forecast]
    if forecasting:
        one_blas_thread()
    model = demo_model()
    trace = load_trace(name, settings.hours, settings.peak)
    config = eval_config(settings)
    static_p = static_parallelism(model, float(trace.rates.max()), settings.max_parallelism)
    forecasts = forecast_stream(trace, config) if forecasting else None
    capacities = np.array([0.0, *(model.capacity(p) for p in range(1, settings.max_parallelism + 1))])
    # The oracle keeps the same target at every window (no grace after its rescales: a restart's
    # backlog, about 27 s of arrivals for the demo job, fits the 60 s target), and replays on
    # average half a checkpoint interval of the mean rate per restart.
    oracle_args: dict[str, Any] = {
        "dt": trace.window_s, "restart_downtime_s": max(model.downtime_up_s, model.downtime_down_s),
        "replay_records": float(trace.rates.mean()) * model.checkpoint_interval_s / 2,
        "backlog_target_s": settings.backlog_target_s, "grace_s": 0.0, "decision_s": settings.oracle_decision_s,
        "initial_parallelism": static_p,
    }
    oracle = oracle_with_restarts(trace.rates, capacities, **oracle_args)
    loose = oracle_without_restarts(trace.rates, capacities, **oracle_args)
    runs = []
    for policy_name in policies:
        runner = PolicyRunner(make_policy(policy_name), config.model_copy(update={"policy": policy_name}))
        start_p = static_p if policy_name == "static" else max(1, math.ceil(static_p / 2))
        runs.append(simulate(trace, model, runner, config, start_p, settings.backlog_target_s,
                             forecasts if policy_name in forecasting else None, settings.seed, settings.rate_noise))
    static_cost = static_p * trace.duration_s
    rows = []
    for run in runs:
        rows.append(run.summary() | {
            "vs_static_pct": round(100 * run.slot_seconds / static_cost, 1),
            "vs_oracle_pct": round(100 * run.slot_seconds / oracle.slot_seconds, 1),
        })
    return {
        "trace": name, "description": trace.description, "sha256": trace.sha256, "windows": len(trace.rates),
        "peak_rate": round(float(trace.rates.max()), 1), "mean_rate": round(float(trace.rates.mean()), 1),
        "static_parallelism": static_p, "static_slot_seconds": static_cost,
        "oracle": {"slot_seconds": round(oracle.slot_seconds, 1), "rescales": oracle.rescales,
                   "feasible": oracle.feasible, "violation_s": oracle.violation_s,
                   "certified_optimal": oracle.certified_optimal,
                   "gap_slot_seconds": round(oracle.gap_slot_seconds, 1),
                   "vs_static_pct": round(100 * oracle.slot_seconds / static_cost, 1),
                   "without_restarts_slot_seconds": round(loose.slot_seconds, 1)},
        "forecast": None if forecasts is None else {
            "mean_wape": round(float(np.mean(forecasts.wapes)), 4) if forecasts.wapes else None,
            "refits": forecasts.refits, "seconds": round(forecasts.seconds, 2),
            "arima_share": round(forecasts.methods.count("arima") / max(1, len(forecasts.methods)), 3),
        },
        "runs": rows,
        "timelines": {run.policy: _thin(run.timeline) for run in runs}
        | {"oracle": {"t": list(np.arange(1, len(trace.rates) + 1) * trace.window_s),
                      "parallelism": [int(x) for x in oracle.parallelism]}},
        "seconds": round(time.perf_counter() - started, 2),
    }


def _thin(timeline: Timeline, every: int = 3) -> dict[str, list[float]]:
    """Every `every`-th window, enough for a plot of hours."""
    return {k: [round(float(x), 2) for x in v[::every]] for k, v in timeline.__dict__.items()}


def evaluate_all(traces: Sequence[str], policies: Sequence[str], settings: EvalSettings, workers: int,
                 on_done: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    if workers <= 1 or len(traces) <= 1:
        results = []
        for name in traces:
            results.append(evaluate_trace(name, policies, settings))
            on_done(name)
        return results
    by_name: dict[str, dict[str, Any]] = {}
    # Spawned workers: the parent may hold threads (rich's progress bar), which fork would copy.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(evaluate_trace, name, list(policies), settings): name for name in traces}
        for future in as_completed(futures):
            by_name[futures[future]] = future.result()
            on_done(futures[future])
    return [by_name[name] for name in traces]


def calibration() -> dict[str, Any]:
    """The job model's constants and the replay's granularity, written beside every result."""
    return {"slot_rate": DEMO_SLOT_RATE, "knee": DEMO_KNEE, "efficiency_beyond_knee": DEMO_EFFICIENCY_BEYOND_KNEE,
            "downtime_up_s": DEMO_DOWNTIME_UP_S,
            "downtime_down_s": DEMO_DOWNTIME_DOWN_S, "rate_noise": DEMO_RATE_NOISE,
            "checkpoint_interval_s": DEMO_CHECKPOINT_S, "window_s": WINDOW_S,
            "reports_per_window": REPORTS_PER_WINDOW, "forecast_step_s": FORECAST_STEP_S}
