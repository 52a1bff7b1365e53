"""The proactive policies: Daedalus's scale-out choice over analyze's capacity model and forecast.

`daedalus` takes capacities from the CPU-throughput regression (observed per scale-out, the
scaling curve elsewhere); `hybrid` takes DS2's true rate times the slots when the job reports
busy time, the regression otherwise. Both choose with `plan.recovery.choose_scale_out`. Without a
forecast or a capacity yet they return None and plan falls back to DS2, saying so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from analyze.capacity import UnknownCapacity, ds2_capacity, fit_scaling_curve
from contracts.jobs import JobConfig, Policy
from contracts.messages import Analysis, DecisionReason, RecoveryView
from contracts.plan_state import Downtimes
from plan.ds2 import Plan, direction
from plan.recovery import choose_scale_out, predict_recovery, replay_records


def regression_capacity(observed: Mapping[str, float]) -> Callable[[int], float] | None:
    """Capacity (records/s) per scale-out from the model's observed points; None if there are none."""
    points = {int(p): float(c) for p, c in observed.items()}
    try:
        c, k, _ = fit_scaling_curve(points)
    except UnknownCapacity:
        return None
    return lambda p: points[p] if p in points else c * p**k


def capacity_function(analysis: Analysis, policy: Policy) -> tuple[Callable[[int], float] | None, str]:
    """The capacity per scale-out the policy plans with, and where it comes from."""
    view = analysis.capacity
    if policy is Policy.HYBRID and view is not None and view.source == "ds2":
        rate = analysis.true_processing_rate
        return (lambda p: ds2_capacity(p, rate)), "ds2"
    regression = regression_capacity(view.observed) if view is not None else None
    return regression, "regression"


def downtimes_expected(downtimes: Mapping[str, Sequence[float]], config: JobConfig) -> tuple[float, float]:
    measured = Downtimes(up=list(downtimes.get("up", ())), down=list(downtimes.get("down", ())))
    up = measured.expected("up", config.restart_time_s, cap_s=config.restart_time_cap_s)
    down = measured.expected("down", config.restart_time_s, cap_s=config.restart_time_cap_s)
    return up, down


def plan_proactive(
    analysis: Analysis,
    config: JobConfig,
    downtimes: Mapping[str, Sequence[float]],
    since_last_rescale_s: float | None,
) -> tuple[Plan | None, str]:
    """The policy's plan, or (None, why not) when it cannot decide yet."""
    forecast = analysis.forecast
    if forecast is None or not forecast.values:
        return None, "no arrival-rate forecast yet"
    if analysis.arrival_rate is None:
        return None, "the job reports no arrival rate"
    capacity_of, source = capacity_function(analysis, config.policy)
    if capacity_of is None:
        return None, "no capacity measured yet"
    current = analysis.parallelism
    up, down = downtimes_expected(downtimes, config)
    replay = replay_records(config.checkpoint_interval_s, analysis.arrival_rate)
    values = [max(0.0, v) for v in forecast.values if math.isfinite(v)] or [analysis.arrival_rate]
    choice = choose_scale_out(
        current, range(config.min_parallelism, config.max_parallelism + 1), capacity_of, values, forecast.step_s,
        float(analysis.backlog or 0), up, down, config.target_recovery_s, replay,
        observed_rate=analysis.arrival_rate, since_last_rescale_s=since_last_rescale_s,
        recent_rescale_s=config.target_recovery_s, loop_s=forecast.step_s,
        scale_in_drain_s=max(forecast.step_s, config.backlog_tolerance_s),
    )
    numbers: dict[str, float | int | None] = {**choice.numbers, "forecast_wape": forecast.wape}
    message = f"{choice.message} (capacity from {source}, forecast by {forecast.method})"
    to = choice.parallelism
    reason = DecisionReason(code=f"daedalus_{choice.reason}", rule=config.policy.value, message=message,
                            numbers=numbers)
    return Plan(direction(current, to), to, reason, recommended=to), ""


def caught_up_records(analysis: Analysis, config: JobConfig) -> float:
    """The backlog at which a recovery is over: the tolerance the recovery detector judges by."""
    return config.backlog_tolerance_s * (analysis.arrival_rate or 0.0)


def predicted_recovery_s(
    analysis: Analysis, config: JobConfig, to: int, downtimes: Mapping[str, Sequence[float]]
) -> float | None:
    """The recovery time Daedalus predicts for a rescale to `to`, whichever policy chose it: with the
    forecast when there is one (a flat arrival rate otherwise) and the policy's capacity (DS2's for
    `ds2`). None when the job reports no arrival rate or no capacity is known."""
    if analysis.arrival_rate is None:
        return None
    if config.policy is Policy.DS2 or analysis.capacity is None:
        rate = analysis.true_processing_rate
        capacity_of: Callable[[int], float] | None = (lambda p: ds2_capacity(p, rate)) if rate > 0 else None
    else:
        capacity_of, _ = capacity_function(analysis, config.policy)
    if capacity_of is None:
        return None
    if analysis.forecast is not None and analysis.forecast.values:
        values, step_s = analysis.forecast.values, analysis.forecast.step_s
    else:
        values, step_s = [analysis.arrival_rate], config.target_recovery_s
    up, down = downtimes_expected(downtimes, config)
    downtime = up if to > analysis.parallelism else down
    prediction = predict_recovery(capacity_of(to), values, step_s, float(analysis.backlog or 0), downtime,
                                  replay_records(config.checkpoint_interval_s, analysis.arrival_rate),
                                  beyond_horizon_s=max(0.0, 10 * config.target_recovery_s - len(values) * step_s),
                                  caught_up_records=caught_up_records(analysis, config))
    return prediction.seconds if math.isfinite(prediction.seconds) else None


def recovery_notice(recovery: RecoveryView, pending: Mapping[str, Any] | None) -> DecisionReason:
    """The `recovered` finding: the observed recovery beside the prediction of the rescale behind it."""
    predicted = None
    if pending and pending.get("to") == recovery.to_parallelism:
        predicted = pending.get("predicted_s")
    error = None if predicted is None else recovery.observed_s - predicted
    shown = "no prediction" if predicted is None else f"predicted {predicted:.0f} s"
    return DecisionReason(
        code="recovered", rule="recovery_detection",
        message=f"back to normal {recovery.observed_s:.0f} s after the rescale {recovery.from_parallelism} -> "
                f"{recovery.to_parallelism} stopped the job ({shown}; judged {recovery.judge})",
        numbers={"observed_s": round(recovery.observed_s, 3), "predicted_s": predicted,
                 "error_s": None if error is None else round(error, 3),
                 "from_parallelism": recovery.from_parallelism, "to_parallelism": recovery.to_parallelism},
    )
