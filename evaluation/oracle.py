"""A clairvoyant oracle for trace-driven evaluation: the physical limit an autoscaler is compared against.

Pure: no I/O. Knowing the whole future load, the oracle finds the least task-slot-seconds that keep the
backlog within the catch-up target, paying for every restart the way the job model (`evaluation.jobmodel`) does.

Model (discrete time, steps of `dt` seconds; step i covers [i dt, (i + 1) dt)):

    arrivals  = arrival_rates[i] x dt
    processed = min(backlog + arrivals, capacity[p] x running time)   (running time < dt while restarting)
    backlog   = backlog + arrivals - processed

- The capacity of step i is capacity[p] x rate_factors[i]: the same noise realisation the policies see.
- Parallelism may change only at multiples of `decision_s`. A change is a rescale: processing stops for
  `restart_downtime_s` (a scale-up; `downtime_down_s` for a scale-down) while arrivals keep piling up,
  the new parallelism is paid from the moment of the rescale, `replay_records` are added to the backlog
  (replay since the last checkpoint), and no other rescale may start
  until the restart is over (one rescale at a time, as execute's lock enforces).
- Executors changed in place (`ramp_s` > 0, a scale-up's `restart_downtime_s` 0, a scale-down's hold as
  `downtime_down_s`, no replay): a scale-up runs at the old parallelism's capacity for `ramp_s` (the new slots
  paid from the rescale on) and blocks the next rescale meanwhile.
- The rule: after each step (after every `check_every`-th step: a window of several steps), backlog <=
  backlog_target_s x that step's arrival rate, except for the steps that end within `grace_s` seconds after a
  rescale started (the restart and the recovery right after it).
- Only "useful" parallelisms are rescale targets: p whose capacity is larger than that of every smaller p
  (`useful_parallelisms`). A slot that adds no capacity is never worth paying for, and without this rule the
  oracle could restart to a useless parallelism only to have the grace hide an unavoidable overload.
  Holding a useless `initial_parallelism` is allowed (leaving it costs a restart).

Objective: lexicographic. First the fewest violating steps (0 when a schedule meets the rule), then the least
slot-seconds. So when no schedule meets the rule the oracle returns the cheapest of the schedules with the
fewest violations, not the static-max schedule.

The search (dynamic programming over decision blocks, with its approximation and its bound) is in
`evaluation.oracle_search`.

The oracle exploits the rule as written: e.g. it may time a rescale so that its grace covers a step no
parallelism could keep within the target, and near the end of the trace it may rescale down because the grace
outlasts the trace. Compare autoscalers under the same rule.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from evaluation.oracle_search import EPSILON, OracleModel, Replayed, replay, solve, solve_free

# The longest front of the fewest-violations search, run only when no schedule meets the rule. Overload keeps
# backlogs from draining, so fronts stay long there and the search would be slow; its gap is still reported.
FALLBACK_FRONT = 4


@dataclass(frozen=True, eq=False)
class OracleResult:
    """A schedule and what it costs. Arrays are per step: the parallelism paid and the backlog after the step.

    `feasible`: the schedule meets the rule (`violation_s == 0`). When it is False the schedule is the cheapest
    of those with the fewest violating steps the DP found; `certified_optimal` says whether that was proven.
    With `feasible=False` and `certified_optimal=True` no schedule meets the rule; with both False, one may
    exist that the cut fronts lost (raise `max_front`).
    `lower_bound_slot_seconds`: no schedule with at most `violation_s` of violations costs less (when the
    bound could not be tied to the violations, it falls back to the trivial one slot per step).
    """

    slot_seconds: float
    parallelism: np.ndarray
    backlog: np.ndarray
    rescales: int
    feasible: bool
    violation_s: float
    lower_bound_slot_seconds: float
    certified_optimal: bool

    @property
    def gap_slot_seconds(self) -> float:
        """How much more than the optimum this schedule may cost (0 when certified optimal)."""
        return self.slot_seconds - self.lower_bound_slot_seconds


def useful_parallelisms(capacity: np.ndarray) -> np.ndarray:
    """The parallelisms whose capacity exceeds that of every smaller one: the only ones worth paying for."""
    cap = np.asarray(capacity, dtype=float)
    best_below = np.maximum.accumulate(np.r_[-np.inf, cap[1:-1]])
    return np.flatnonzero(cap[1:] > best_below) + 1


def covering_parallelism(arrival_rates: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Per step, the fewest slots whose capacity covers the arrival rate (the largest useful parallelism when
    none does). This is the classic free-rescale bound with no backlog at all; it is not a lower bound of the
    oracle when backlog_target_s > 0 (a one-step spike can be absorbed by the backlog instead), which is why
    `oracle_without_restarts` keeps the backlog allowance."""
    rates = np.asarray(arrival_rates, dtype=float)
    cap = np.asarray(capacity, dtype=float)
    useful = useful_parallelisms(cap)
    # Useful capacities increase, so the first that covers the rate is the cheapest.
    first = np.searchsorted(cap[useful], rates * (1 - EPSILON) - EPSILON, side="left")
    return useful[np.minimum(first, len(useful) - 1)]


def oracle_with_restarts(
    arrival_rates: np.ndarray,
    capacity: np.ndarray,
    dt: float,
    *,
    restart_downtime_s: float = 20.0,
    downtime_down_s: float | None = None,
    ramp_s: float = 0.0,
    rate_factors: np.ndarray | None = None,
    replay_records: float = 0.0,
    backlog_target_s: float = 10.0,
    grace_s: float | None = None,
    decision_s: float = 60.0,
    initial_parallelism: int = 1,
    initial_backlog: float = 0.0,
    max_front: int = 128,
    check_every: int = 1,
    first_decision_s: float = 0.0,
) -> OracleResult:
    """The cheapest schedule that keeps the backlog within target, restarts included (see the module docstring).

    `grace_s` defaults to restart_downtime_s + backlog_target_s: during the restart the lag grows past any
    target, and the job then gets one target's worth of time to catch up. That is demanding: by the first check
    the new parallelism must have drained the downtime's arrivals and the replay, which takes a capacity of at
    least downtime / target times the load (twice the load with the defaults) plus replay / target. Pass a
    longer `grace_s` for a more lenient recovery. `decision_s` must be a multiple of `dt`.
    """
    model = _build(
        arrival_rates, capacity, dt, restart_downtime_s=restart_downtime_s, downtime_down_s=downtime_down_s,
        ramp_s=ramp_s, rate_factors=rate_factors, replay_records=replay_records,
        backlog_target_s=backlog_target_s, grace_s=grace_s, decision_s=decision_s,
        initial_parallelism=initial_parallelism, initial_backlog=initial_backlog, max_front=max_front,
        check_every=check_every, first_decision_s=first_decision_s, free_rescales=False,
    )
    return _optimize(model, max_front)


def oracle_without_restarts(
    arrival_rates: np.ndarray,
    capacity: np.ndarray,
    dt: float,
    *,
    restart_downtime_s: float = 20.0,
    downtime_down_s: float | None = None,
    ramp_s: float = 0.0,
    rate_factors: np.ndarray | None = None,
    replay_records: float = 0.0,
    backlog_target_s: float = 10.0,
    grace_s: float | None = None,
    decision_s: float = 60.0,
    initial_parallelism: int = 1,
    initial_backlog: float = 0.0,
    max_front: int = 128,
    check_every: int = 1,
    first_decision_s: float = 0.0,
) -> OracleResult:
    """The looser lower bound: free, instant rescales at every step (no downtime, no replay), same backlog rule.

    It takes the same arguments as `oracle_with_restarts` so both can be called alike; the restart arguments
    only shape which steps the rule may skip. To be a true relaxation (never above the oracle with restarts,
    proven: replaying any restart schedule without its downtime and replay leaves every backlog lower or equal)
    it skips the rule at every step that some rescale's grace could cover, i.e. the steps ending within
    `grace_s` after a multiple of `decision_s`. With backlog_target_s = 0 and grace_s = 0 it is exactly the
    per-step covering bound of `covering_parallelism`. `replay_records` is ignored, and `initial_parallelism`
    only decides whether the first step counts as a rescale.
    """
    model = _build(
        arrival_rates, capacity, dt, restart_downtime_s=restart_downtime_s, downtime_down_s=downtime_down_s,
        ramp_s=ramp_s, rate_factors=rate_factors, replay_records=replay_records,
        backlog_target_s=backlog_target_s, grace_s=grace_s, decision_s=decision_s,
        initial_parallelism=initial_parallelism, initial_backlog=initial_backlog, max_front=max_front,
        check_every=check_every, first_decision_s=first_decision_s, free_rescales=True,
    )
    return _optimize(model, max_front)


def replay_schedule(parallelism: np.ndarray, arrival_rates: np.ndarray, capacity: np.ndarray, dt: float,
                    **kwargs: Any) -> Replayed:
    """Replay a schedule (one parallelism per step, changing only at decision times, as an `OracleResult`'s)
    under the model of `oracle_with_restarts` with the same arguments, e.g. under another noise realisation
    (`rate_factors`): its backlog per step, violating steps and rescales. Raises AssertionError for a schedule
    the model does not allow (a rescale off a decision time or during a restart)."""
    model = _build(arrival_rates, capacity, dt, **(_WITH_RESTARTS_DEFAULTS | kwargs), free_rescales=False)
    steps = np.asarray(parallelism, dtype=np.int64)
    if steps.shape != (model.steps,):
        raise ValueError("parallelism must give one parallelism per step")
    blocks = steps[:: model.block]
    if not np.array_equal(np.repeat(blocks, model.block)[: model.steps], steps):
        raise ValueError("parallelism may change only at decision times")
    return replay(model, blocks)


def _build(
    arrival_rates: np.ndarray,
    capacity: np.ndarray,
    dt: float,
    *,
    restart_downtime_s: float,
    downtime_down_s: float | None,
    ramp_s: float,
    rate_factors: np.ndarray | None,
    replay_records: float,
    backlog_target_s: float,
    grace_s: float | None,
    decision_s: float,
    initial_parallelism: int,
    initial_backlog: float,
    max_front: int,
    check_every: int,
    first_decision_s: float,
    free_rescales: bool,
) -> OracleModel:
    """Validate the arguments and turn them into a OracleModel (a free-rescale model for the relaxation)."""
    rates = np.asarray(arrival_rates, dtype=float)
    cap = np.asarray(capacity, dtype=float)
    if rates.ndim != 1 or not np.isfinite(rates).all() or (rates < 0).any():
        raise ValueError("arrival_rates must be a 1-D array of finite rates >= 0")
    if cap.ndim != 1 or len(cap) < 2 or not np.isfinite(cap[1:]).all() or (cap[1:] < 0).any():
        raise ValueError("capacity must be a 1-D array of finite rates >= 0 for parallelisms 1..max")
    if not dt > 0 or not decision_s > 0:
        raise ValueError("dt and decision_s must be positive")
    block = round(decision_s / dt)
    if block < 1 or abs(block * dt - decision_s) > EPSILON * max(1.0, decision_s):
        raise ValueError("decision_s must be a multiple of dt")
    down_s = restart_downtime_s if downtime_down_s is None else downtime_down_s
    if min(restart_downtime_s, down_s, ramp_s, replay_records, backlog_target_s, initial_backlog) < 0:
        raise ValueError("downtimes, ramp_s, replay_records, backlog_target_s and initial_backlog must be >= 0")
    factors = np.ones(len(rates)) if rate_factors is None else np.asarray(rate_factors, dtype=float)
    if factors.shape != rates.shape or not np.isfinite(factors).all() or (factors <= 0).any():
        raise ValueError("rate_factors must be one positive factor per step")
    grace = max(restart_downtime_s + ramp_s, down_s) + backlog_target_s if grace_s is None else grace_s
    if grace < 0:
        raise ValueError("grace_s must be >= 0")
    if not 1 <= initial_parallelism < len(cap):
        raise ValueError(f"initial_parallelism must be in 1..{len(cap) - 1}")
    if max_front < 1:
        raise ValueError("max_front must be >= 1")

    arrivals = rates * dt
    scale = max(1.0, float(arrivals.max(initial=0.0)), float(cap[1:].max()) * dt, initial_backlog, replay_records)
    limits = backlog_target_s * rates + EPSILON * scale
    if check_every < 1:
        raise ValueError("check_every must be >= 1")
    checked = (np.arange(len(rates)) + 1) % check_every == 0  # the rule is checked at the end of each window
    if free_rescales:
        # Skip the rule wherever some rescale's grace could: the steps ending within grace of a decision time.
        since_boundary = (np.arange(len(rates)) % block + 1) * dt
        checked &= since_boundary > grace + EPSILON
        restart_downtime_s, down_s, ramp_s, grace, replay_records, block = 0.0, 0.0, 0.0, 0.0, 0.0, 1
    return OracleModel(
        arrivals=arrivals, limits=limits, checked=checked, capacity=cap, factors=factors,
        targets=useful_parallelisms(cap), dt=dt, block=block, downtime_s=restart_downtime_s,
        downtime_down_s=down_s, grace_s=grace, replay=float(replay_records), ramp_s=float(ramp_s),
        first_rescale_block=0 if free_rescales else max(0, math.ceil(first_decision_s / decision_s - EPSILON)),
        initial_parallelism=int(initial_parallelism), initial_backlog=float(initial_backlog),
        free_rescales=free_rescales,
    )


def _optimize(model: OracleModel, max_front: int) -> OracleResult:
    """Feasible schedules first (an optimistic pass, replayed exactly, then a conservative pass only if the replay
    falls short); the fewest violations only when the optimistic pass proves that no schedule meets the rule."""
    dt, n = model.dt, model.steps
    if n == 0:
        return OracleResult(0.0, np.zeros(0, dtype=np.int64), np.zeros(0), 0, True, 0.0, 0.0, True)
    search = solve_free if model.free_rescales else solve
    front, feasible_only = max_front, True
    low = search(model, front, optimistic=True, feasible_only=True)
    if low is None:
        front, feasible_only = min(max_front, FALLBACK_FRONT), False
        low = search(model, front, optimistic=True, feasible_only=False)
    assert low is not None
    low_blocks, low_violations, low_cost = low
    best = replay(model, low_blocks)
    if best.violations != low_violations:
        other = search(model, front, optimistic=False, feasible_only=feasible_only)
        if other is None:  # the cut lost every feasible state: settle for the fewest violations
            other = search(model, front, optimistic=False, feasible_only=False)
        assert other is not None
        fallback = replay(model, other[0])
        if (fallback.violations, fallback.cost) < (best.violations, best.cost):
            best = fallback
    certified = (best.violations, best.cost) == (low_violations, low_cost)
    lower = low_cost if best.violations == low_violations else n  # else: one slot per step
    return OracleResult(
        slot_seconds=best.cost * dt, parallelism=best.parallelism, backlog=best.backlog, rescales=best.rescales,
        feasible=best.violations == 0, violation_s=best.violations * dt, lower_bound_slot_seconds=lower * dt,
        certified_optimal=certified,
    )


# The keyword defaults of `oracle_with_restarts`, so `replay_schedule` takes its arguments alike.
_WITH_RESTARTS_DEFAULTS: dict[str, Any] = {
    name: parameter.default for name, parameter in inspect.signature(oracle_with_restarts).parameters.items()
    if parameter.default is not inspect.Parameter.empty}
