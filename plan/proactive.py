"""Daedalus's scale-out choice over analyze's capacity model and forecast, and recovery predictions.

The `daedalus` and `hybrid` policies (plan/policies/) plan with `plan_proactive`: each gives the
capacity per scale-out it trusts. Without a forecast or a capacity yet `plan_proactive` returns
None and the policy falls back to DS2, saying so. Every guarded policy predicts the recovery of its
rescales with `predicted_recovery_s`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from contracts.analyses import Analysis, CapacityView, RecoveryView
from contracts.decisions import DecisionReason
from contracts.jobs import JobConfig
from contracts.plan_state import Direction, Downtimes, PendingRecovery, PlanState
from plan.policy import Plan, direction
from plan.recovery import choose_scale_out, predict_recovery, replay_records

Capacity = Callable[[int], float]


def regression_capacity(view: CapacityView) -> Capacity | None:
    """Capacity (records/s) per scale-out from analyze's capacity model: measured where a scale-out
    was seen, on its scaling curve elsewhere; None before anything was measured."""
    curve = view.curve
    if curve is None:
        return None
    points = {int(p): float(c) for p, c in view.observed.items()}
    c, k = curve.coefficient, curve.exponent
    return lambda p: points[p] if p in points else c * p**k


def ds2_capacity(parallelism: int, rate_per_slot: float) -> float:
    """DS2's capacity: slots times the true processing rate per slot (records per busy second)."""
    return parallelism * rate_per_slot


def downtimes_expected(downtimes: Downtimes, config: JobConfig) -> tuple[float, float]:
    """The restart to expect to scale up and to scale down, from the measured ones."""
    up = downtimes.expected(Direction.UP, config.restart_time_s, cap_s=config.restart_time_cap_s)
    down = downtimes.expected(Direction.DOWN, config.restart_time_s, cap_s=config.restart_time_cap_s)
    return up, down


def plan_proactive(
    analysis: Analysis,
    config: JobConfig,
    downtimes: Downtimes,
    since_last_rescale_s: float | None,
    capacity: tuple[Capacity | None, str],
    rule: str,
) -> tuple[Plan | None, str]:
    """Daedalus's choice with `capacity` (the function and where it comes from), or (None, why
    not) when it cannot decide yet; `rule` names the policy in the reason."""
    forecast = analysis.forecast
    if forecast is None or not forecast.values:
        return None, "no arrival-rate forecast yet"
    if analysis.arrival_rate is None:
        return None, "the job reports no arrival rate"
    capacity_of, source = capacity
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
    reason = DecisionReason(code=f"daedalus_{choice.reason}", rule=rule, message=message,
                            numbers=numbers)
    return Plan(direction(current, to), to, reason, recommended=to), ""


def caught_up_records(analysis: Analysis, config: JobConfig) -> float:
    """The backlog at which a recovery is over: the tolerance the recovery detector judges by."""
    return config.backlog_tolerance_s * (analysis.arrival_rate or 0.0)


def predicted_recovery_s(
    analysis: Analysis, config: JobConfig, to: int, downtimes: Downtimes, capacity_of: Capacity | None,
    rates: tuple[Sequence[float], float] | None = None,
) -> float | None:
    """The recovery time Daedalus predicts for a rescale to `to`, whichever policy chose it, as the
    recovery detector will observe it (the expected restart, nothing replayed; not the worst case): with
    `rates` (values, step) when given, else the forecast when there is one (a flat arrival rate
    otherwise), and the capacity the policy plans with. None when the job reports no arrival rate or
    no capacity is known."""
    if analysis.arrival_rate is None or capacity_of is None:
        return None
    if rates is not None and len(rates[0]):
        values, step_s = list(rates[0]), rates[1]
    elif analysis.forecast is not None and analysis.forecast.values:
        values, step_s = analysis.forecast.values, analysis.forecast.step_s
    else:
        values, step_s = [analysis.arrival_rate], config.target_recovery_s
    # A prediction of what will be observed: the typical restart, not the planner's slowest recent one,
    # and nothing replayed. The job stops between micro-batches (`pipeline.source_control.stop_between_batches`:
    # the batch in flight completes and commits, none starts), so the restarted query resumes at the first
    # record not yet processed. The replay of a stop that interrupts a batch (`checkpoint_interval_s`, the
    # worst case) stays in the planner's choice, where it is a safety margin, not an expectation.
    downtime = min(downtimes.typical(Direction.of(analysis.parallelism, to), config.restart_time_s),
                   config.restart_time_cap_s)
    prediction = predict_recovery(capacity_of(to), values, step_s, float(analysis.backlog or 0), downtime, 0.0,
                                  beyond_horizon_s=max(0.0, 10 * config.target_recovery_s - len(values) * step_s),
                                  caught_up_records=caught_up_records(analysis, config))
    return prediction.seconds if math.isfinite(prediction.seconds) else None


def after_executed_rescale(recovery: RecoveryView, state: PlanState) -> bool:
    """Whether a recovery follows a rescale this autoscaler executed: execute recorded the end of a
    rescale at or after the job stopped (`started_at`; the runner runs in the job's process, so both
    are on the job's clock) that left the job at the parallelism it recovered at. A parallelism change
    the autoscaler did not make (in recommend mode, where nothing is executed; an operator's restart)
    is none: analyze still times it, but no `recovered` event reports it."""
    return (state.last_rescale_at is not None and state.last_rescale_at >= recovery.started_at
            and state.parallelism == recovery.to_parallelism)


def predicts(pending: PendingRecovery, recovery: RecoveryView) -> bool:
    """Whether `pending` is the prediction of `recovery`'s rescale: the rescale to the parallelism it
    recovered at. A recovery from the rescale before (seen in a window that closed after the next one
    was decided) recovered at that rescale's starting point, never at its target."""
    return pending.to == recovery.to_parallelism


def recovery_notice(recovery: RecoveryView, pending: PendingRecovery | None, state: PlanState | None = None
                    ) -> DecisionReason:
    """The `recovered` finding: the observed recovery beside the prediction of the rescale behind it.

    A prediction counts from the stop; the detector counts from the last window before it, up to a
    window away. When the plan state holds the rescale's end and downtime (execute recorded them), the
    observed time counts from the stop too (`stopped_at` = end - downtime), and the return to normal is
    never before the restart ended; `detected_s` keeps the detector's own figure."""
    predicted, observed, stopped = None, recovery.observed_s, None
    if pending is not None and predicts(pending, recovery):
        predicted = pending.predicted_s
        direction = Direction.of(pending.from_parallelism, pending.to)
        measured = getattr(state.downtimes, direction) if state is not None else []
        if state is not None and state.last_rescale_at is not None and measured \
                and state.last_rescale_at >= pending.window_end:
            resumed = state.last_rescale_at
            stopped = resumed - measured[-1]
            observed = max(recovery.started_at + recovery.observed_s, resumed) - stopped
    error = None if predicted is None else observed - predicted
    shown = "no prediction" if predicted is None else f"predicted {predicted:.0f} s"
    return DecisionReason(
        code="recovered", rule="recovery_detection",
        message=f"back to normal {observed:.0f} s after the rescale {recovery.from_parallelism} -> "
                f"{recovery.to_parallelism} began ({shown}; judged {recovery.judge})",
        numbers={"observed_s": round(observed, 3), "predicted_s": predicted,
                 "error_s": None if error is None else round(error, 3),
                 "detected_s": round(recovery.observed_s, 3),
                 "stopped_at": None if stopped is None else round(stopped, 3),
                 "from_parallelism": recovery.from_parallelism, "to_parallelism": recovery.to_parallelism},
    )
