"""Predicted recovery time of a rescale and Daedalus's choice of scale-out (Algorithm 1).

Time 0 is when processing stops. The job must then work off what accumulated: the records since
the last checkpoint (replayed, worst case a whole checkpoint interval), the backlog already
waiting, and what arrives while it is down (the forecast integrated over the downtime). After the
restart it drains that with its spare capacity, capacity minus the forecast arrival rate, step by
step over the forecast. The recovery time is the moment the cumulative spare capacity covers the
accumulated records (Daedalus, 3.4 and Fig. 6). Records and records/s are never mixed.

The forecast is a list of arrival rates (records/s), each holding for `step_s` seconds from now.
Beyond its horizon the last rate is assumed to hold, but only for `beyond_horizon_s`: a recovery
not finished by then is `math.inf` (never within what the forecast can tell).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

ChoiceCode = Literal["recent_rescale_holds", "current_sufficient", "smallest_sufficient", "none_sufficient"]


def _check_forecast(forecast: Sequence[float], step_s: float) -> None:
    if not forecast:
        raise ValueError("the forecast needs at least one rate")
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be finite and > 0, got {step_s!r}")
    for rate in forecast:
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"forecast rates must be finite and >= 0, got {rate!r}")


def _non_negative(name: str, value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)


def replay_records(checkpoint_interval_s: float, arrival_rate: float) -> float:
    """Records to reprocess after a restart, worst case: a whole checkpoint interval of arrivals
    (records/s x s). Daedalus assumes the worst case as a buffer for when the restart happens."""
    return _non_negative("checkpoint_interval_s", checkpoint_interval_s) * _non_negative("arrival_rate", arrival_rate)


def integrate_forecast(forecast: Sequence[float], step_s: float, start_s: float, end_s: float) -> float:
    """Records arriving in [start_s, end_s) under the forecast; its last rate holds past the horizon."""
    _check_forecast(forecast, step_s)
    if end_s <= start_s:
        return 0.0
    total, j, last = 0.0, int(start_s // step_s), len(forecast) - 1
    while True:
        seg_start = max(start_s, j * step_s)
        seg_end = end_s if j >= last else min(end_s, (j + 1) * step_s)
        if seg_end > seg_start:
            total += forecast[min(j, last)] * (seg_end - seg_start)
        if seg_end >= end_s:
            return total
        j += 1


def forecast_max(forecast: Sequence[float], step_s: float, until_s: float) -> float:
    """The highest forecast rate in [0, until_s] (at least the first step; all of it for inf)."""
    _check_forecast(forecast, step_s)
    if math.isinf(until_s):
        return max(forecast)
    steps = max(1, math.ceil(until_s / step_s))
    return max(forecast[:steps])


@dataclass(frozen=True)
class RecoveryPrediction:
    seconds: float  # from the stop until caught up, downtime included; inf if never within the search
    accumulated_records: float
    replay_records: float
    downtime_records: float
    backlog_records: float
    downtime_s: float


def predict_recovery(
    capacity: float,
    forecast: Sequence[float],
    step_s: float,
    backlog: float,
    downtime_s: float,
    replay_records: float,
    beyond_horizon_s: float = 0.0,
    caught_up_records: float = 0.0,
) -> RecoveryPrediction:
    """Recovery of a scale-out with `capacity` records/s (see the module docstring). The job counts
    as caught up once at most `caught_up_records` are left: the backlog the recovery detector and
    the scale-down control call normal (their tolerance), so prediction and observation agree on
    what "recovered" means."""
    _check_forecast(forecast, step_s)
    capacity = _non_negative("capacity", capacity)
    backlog = _non_negative("backlog", backlog)
    downtime_s = _non_negative("downtime_s", downtime_s)
    replay = _non_negative("replay_records", replay_records)
    beyond_horizon_s = _non_negative("beyond_horizon_s", beyond_horizon_s)
    caught_up = _non_negative("caught_up_records", caught_up_records)
    during_downtime = integrate_forecast(forecast, step_s, 0.0, downtime_s)
    accumulated = replay + backlog + during_downtime

    def result(seconds: float) -> RecoveryPrediction:
        return RecoveryPrediction(seconds, accumulated, replay, during_downtime, backlog, downtime_s)

    remaining, t = accumulated - caught_up, downtime_s
    if remaining <= 0:
        return result(t)
    limit = len(forecast) * step_s + beyond_horizon_s
    last = len(forecast) - 1
    j = int(t // step_s)
    while t < limit:
        seg_end = limit if j >= last else min(limit, (j + 1) * step_s)
        if seg_end > t:
            # The rate is constant within a step, so the crossing inside it is exact.
            spare = capacity - forecast[min(j, last)]
            if spare > 0 and spare * (seg_end - t) >= remaining:
                return result(t + remaining / spare)
            remaining -= spare * (seg_end - t)  # a negative spare grows what is left
            t = seg_end
        if j >= last:
            break
        j += 1
    return result(math.inf)


def predict_recovery_time(
    capacity: float,
    forecast: Sequence[float],
    step_s: float,
    backlog: float,
    downtime_s: float,
    replay_records: float,
    beyond_horizon_s: float = 0.0,
) -> float:
    """Seconds from the stop until caught up (math.inf if not within the forecast and its extension)."""
    return predict_recovery(capacity, forecast, step_s, backlog, downtime_s, replay_records, beyond_horizon_s).seconds


@dataclass(frozen=True)
class Choice:
    parallelism: int
    predicted_recovery_s: float  # of the chosen scale-out; inf if it does not recover within the search
    reason: ChoiceCode
    numbers: dict[str, float | int | None]  # JSON-able: an infinite recovery time is None here
    message: str = ""
    rejected: dict[int, str] = field(default_factory=dict)  # smaller candidates and why they failed


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def choose_scale_out(
    current: int,
    candidates: Iterable[int],
    capacity_of: Callable[[int], float],
    forecast: Sequence[float],
    step_s: float,
    backlog: float,
    downtime_up: float,
    downtime_down: float,
    target_recovery_s: float,
    checkpoint_replay_records: float,
    *,
    observed_rate: float | None = None,
    since_last_rescale_s: float | None = None,
    recent_rescale_s: float = 600.0,
    loop_s: float = 60.0,
    scale_in_drain_s: float = 60.0,
    recovery_search_s: float | None = None,
    caught_up_records: float = 0.0,
) -> Choice:
    """Daedalus's Algorithm 1: the smallest scale-out that keeps up and recovers in time.

    - Within `recent_rescale_s` of the last rescale, keep the current scale-out if its capacity
      exceeds the observed rate and the forecast until the next loop (`loop_s`): decisions are
      meant to be long-lived.
    - Otherwise, for each candidate from the smallest: its capacity must exceed the observed rate
      (`observed_rate`, the average since the last loop; the first forecast step when None), its
      predicted recovery must be within `target_recovery_s`, and its capacity must stay at or
      above the forecast while it recovers. The current scale-out is kept as soon as it passes
      (its recovery is that of a failure, so with the longer of the two downtimes). A smaller one
      must also drain the current backlog (alone, no restart) within `scale_in_drain_s`, and any
      other must exceed the whole forecast (long-lived). None passing: the largest candidate.

    Deviation from the paper: it skips a scale-in while "capacity < consumer lag", comparing
    records/s with records. Here the backlog is turned into the seconds the candidate's spare
    capacity needs to drain it; the default of one loop means "caught up before the next decision".
    """
    options = sorted(set(candidates))
    if not options or options[0] < 1:
        raise ValueError("candidates must be a non-empty set of parallelisms >= 1")
    if current < 1:
        raise ValueError(f"current must be >= 1, got {current}")
    _check_forecast(forecast, step_s)
    target = _non_negative("target_recovery_s", target_recovery_s)
    workload = forecast[0] if observed_rate is None else _non_negative("observed_rate", observed_rate)
    horizon_s = len(forecast) * step_s
    search_s = max(horizon_s, target) if recovery_search_s is None else max(horizon_s, recovery_search_s)
    beyond = search_s - horizon_s
    peak = max(forecast)
    numbers: dict[str, float | int | None] = {
        "current": current, "observed_rate": workload, "forecast_max": peak, "backlog": backlog,
        "target_recovery_s": target, "replay_records": checkpoint_replay_records,
    }

    def recovery(p: int, capacity: float) -> RecoveryPrediction:
        # The current scale-out recovers from a failure: assume the longer restart.
        downtime = (downtime_up if p > current else downtime_down if p < current
                    else max(downtime_up, downtime_down))
        return predict_recovery(capacity, forecast, step_s, backlog, downtime, checkpoint_replay_records, beyond,
                                caught_up_records)

    def chosen(p: int, capacity: float, code: ChoiceCode, message: str, rejected: dict[int, str]) -> Choice:
        predicted = recovery(p, capacity)
        return Choice(p, predicted.seconds, code, numbers | {
            "chosen": p, "capacity": capacity, "predicted_recovery_s": _finite_or_none(predicted.seconds),
            "accumulated_records": predicted.accumulated_records, "downtime_s": predicted.downtime_s,
        }, message, rejected)

    if since_last_rescale_s is not None and since_last_rescale_s < recent_rescale_s:
        capacity = capacity_of(current)
        next_loop_peak = forecast_max(forecast, step_s, loop_s)
        if capacity > workload and capacity > next_loop_peak:
            return chosen(current, capacity, "recent_rescale_holds",
                          f"rescaled {since_last_rescale_s:.0f} s ago; {current} ({capacity:.1f} rec/s) still "
                          f"carries the observed {workload:.1f} rec/s and the next loop's peak "
                          f"{next_loop_peak:.1f} rec/s", {})

    rejected: dict[int, str] = {}
    for p in options:
        capacity = capacity_of(p)
        if not capacity > workload:
            rejected[p] = f"capacity {capacity:.1f} rec/s <= observed {workload:.1f} rec/s"
            continue
        predicted = recovery(p, capacity)
        if predicted.seconds > target:
            shown = "never within the forecast" if math.isinf(predicted.seconds) else f"{predicted.seconds:.0f} s"
            rejected[p] = f"recovery {shown} > target {target:.0f} s"
            continue
        while_recovering = forecast_max(forecast, step_s, predicted.seconds)
        if capacity < while_recovering:
            rejected[p] = f"capacity {capacity:.1f} rec/s < forecast {while_recovering:.1f} rec/s while recovering"
            continue
        if p == current:
            return chosen(p, capacity, "current_sufficient",
                          f"{p} keeps up and recovers in {predicted.seconds:.0f} s <= {target:.0f} s", rejected)
        if p < current:
            drain = predict_recovery_time(capacity, forecast, step_s, backlog, 0.0, 0.0, beyond)
            if drain > scale_in_drain_s:
                shown = "never within the forecast" if math.isinf(drain) else f"{drain:.0f} s"
                rejected[p] = (f"scale-in waits: the backlog of {backlog:.0f} records takes {shown} to drain "
                               f"at {p} (> {scale_in_drain_s:.0f} s)")
                continue
        if capacity > peak:
            return chosen(p, capacity, "smallest_sufficient",
                          f"{p} ({capacity:.1f} rec/s) carries the forecast peak {peak:.1f} rec/s and recovers in "
                          f"{predicted.seconds:.0f} s <= {target:.0f} s", rejected)
        rejected[p] = f"capacity {capacity:.1f} rec/s <= forecast peak {peak:.1f} rec/s (not long-lived)"
    largest = options[-1]
    return chosen(largest, capacity_of(largest), "none_sufficient",
                  f"no candidate keeps up and recovers within {target:.0f} s; the largest, {largest}", rejected)
