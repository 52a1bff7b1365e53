"""A receding-horizon, cost-based parallelism schedule: dynamic programming over time x parallelism.

In the spirit of QEScalor's cost-based elastic scaling (QCESA: choose the configuration that meets
the performance goal at the least resource cost) and Daedalus's long-lived decisions (plan for the
load of the next minutes, not the last window). Pure: numpy arrays in, a schedule out.

Model, per step k of `step_s` seconds (a rescale starts at the step's start):

    downtime  = 0, or the expected pause of that direction (a scale-up's or a scale-down's restart)
    ramp      = 0, or (in place) a scale-up's time until the new executors run: the old capacity meanwhile
    peak      = backlog + rate_k x downtime + replay         (the backlog when the restart ends)
    backlog'  = max(0, peak + rate_k x (step_s - downtime) - capacity[q] x ramp
                       - capacity[p] x (step_s - downtime - ramp))

- Cost: slot-seconds paid (p x step_s, the new slots paid from the rescale on), plus
  `action_penalty_s` per rescale, plus the work the backlog left at the horizon's end still needs
  (backlog x slot-seconds per record), plus `violation_weight` slot-seconds per second of arrivals
  (at least 1 record/s) by which the backlog exceeds its target (`backlog_target_s` x rate_k,
  checked at a restart's end and at the step's end). The weight is large: the target is a constraint
  that is broken only when no schedule keeps it.
- The backlog is carried as state: per (step, parallelism, backlog bucket) the DP keeps the path
  with the least cost plus the work its backlog still needs (see `solve`).
- Rates are upper quantiles and capacities lower quantiles (the caller's), so the schedule keeps
  the target when the load runs high and the job runs slow.

Only the first step is applied; the next window plans again with what it learned (receding horizon).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPSILON = 1e-9
VIOLATION_WEIGHT = 1e4  # slot-seconds per second of arrivals beyond the target
BUCKETS = 6  # backlog buckets per (step, parallelism): the paths the DP keeps apart


@dataclass(frozen=True)
class PlanProblem:
    """One planning problem. `capacity[p]` is records/s at parallelism p (index 0 unused)."""

    parallelism: int
    backlog: float
    rates: np.ndarray  # arrival rate per step (records/s), an upper quantile
    step_s: float
    capacity: np.ndarray  # records/s at p = 0..max_parallelism, a lower quantile
    min_parallelism: int
    downtime_up_s: float
    downtime_down_s: float
    replay_records: float
    backlog_target_s: float
    action_penalty_s: float = 0.0
    violation_weight: float = VIOLATION_WEIGHT
    ramp_up_s: float = 0.0  # in place: a scale-up runs at the old capacity this long (no pause, no replay)

    @property
    def max_parallelism(self) -> int:
        return len(self.capacity) - 1

    def check(self) -> None:
        if self.rates.ndim != 1 or len(self.rates) == 0 or (self.rates < 0).any():
            raise ValueError("rates: one rate >= 0 per step")
        if not 1 <= self.min_parallelism <= self.max_parallelism:
            raise ValueError("min_parallelism must be in 1..max_parallelism")
        if self.parallelism < 1:
            raise ValueError("parallelism must be >= 1")
        if self.step_s <= 0 or min(self.downtime_up_s, self.downtime_down_s, self.replay_records,
                                   self.backlog_target_s, self.backlog, self.action_penalty_s, self.ramp_up_s) < 0:
            raise ValueError("step_s must be > 0; downtimes, ramp, replay, target, backlog and penalty >= 0")


@dataclass(frozen=True)
class Schedule:
    """The chosen parallelism per step, what it costs (slot-seconds, penalties included) and the
    backlog after each step; `violation_s` is the seconds of arrivals beyond the target it expects."""

    parallelism: np.ndarray
    backlog: np.ndarray
    cost: float
    slot_seconds: float
    violation_s: float
    rescales: int

    @property
    def first(self) -> int:
        return int(self.parallelism[0])


def _transitions(problem: PlanProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (from q, to p): downtime, running seconds, the running seconds at q's capacity (an in-place
    scale-up's ramp) and whether it is a rescale, q and p in 1..max."""
    n = problem.max_parallelism
    q = np.arange(1, n + 1)[:, None]
    p = np.arange(1, n + 1)[None, :]
    down = np.where(p > q, problem.downtime_up_s, np.where(p < q, problem.downtime_down_s, 0.0))
    down = np.minimum(down, problem.step_s)
    ramp = np.minimum(np.where(p > q, problem.ramp_up_s, 0.0), problem.step_s - down)
    return down, problem.step_s - down, ramp, p != q


def solve(problem: PlanProblem, forbid_first: int | None = None, force_first: int | None = None) -> Schedule:
    """The least-cost schedule over the horizon (see the module docstring). `forbid_first` excludes
    one parallelism from the first step (the next-best alternative to a chosen plan); `force_first`
    allows only that one (what keeping an earlier choice would cost).

    Per (step, parallelism) the DP keeps one path per backlog bucket (the backlog as a fraction of the
    step's target, in `BUCKETS` equal parts, the last holding everything beyond): the cheapest by cost
    plus the work its backlog needs. A cheap path with a high backlog and a dearer one with a low backlog
    both survive, so a path that must later drain is not lost to one that only looks cheaper."""
    problem.check()
    n, steps, dt = problem.max_parallelism, len(problem.rates), problem.step_s
    cap = np.asarray(problem.capacity[1:], dtype=float)
    per_record = 1.0 / max(float(cap.max()) / n, EPSILON)  # slot-seconds one record of backlog needs
    down, running, ramp, moved = _transitions(problem)
    slots = np.arange(1, n + 1, dtype=float)
    allowed = slots >= problem.min_parallelism
    replay = np.where(moved, problem.replay_records, 0.0)
    penalty = np.where(moved, problem.action_penalty_s, 0.0)
    states = n * BUCKETS  # state s = (parallelism s // BUCKETS + 1, bucket s % BUCKETS)
    source_p = np.arange(states) // BUCKETS

    start = min(problem.parallelism, n)  # a job above the maximum plans from the maximum's capacity
    cost = np.full(states, np.inf)
    cost[(start - 1) * BUCKETS] = 0.0
    backlog = np.zeros(states)
    backlog[(start - 1) * BUCKETS] = problem.backlog
    violation = np.zeros(states)
    parents = np.zeros((steps, states), dtype=np.int64)
    backlogs = np.zeros((steps, states))
    buckets = np.arange(BUCKETS)
    for k in range(steps):
        rate = float(problem.rates[k])
        limit = problem.backlog_target_s * rate
        live = np.flatnonzero(np.isfinite(cost))  # only reachable states are sources
        src_p = source_p[live]
        d, run, ramped, mv = down[src_p], running[src_p], ramp[src_p], moved[src_p]  # (source, p)
        peak = backlog[live, None] + rate * d + replay[src_p]
        after = np.maximum(peak + rate * run - cap[None, :] * (run - ramped) - cap[src_p, None] * ramped, 0.0)
        # A restart's peak counts (arrivals pile up while it runs); without one the backlog only falls
        # from where the previous step left it.
        over = np.where(mv, np.maximum(peak - limit, 0.0), 0.0) + np.maximum(after - limit, 0.0)
        excess = over / max(rate, 1.0)
        total = cost[live, None] + slots[None, :] * dt + penalty[src_p] + problem.violation_weight * excess
        choose = total + per_record * after
        choose[:, ~allowed] = np.inf
        if k == 0 and forbid_first is not None and 1 <= forbid_first <= n:
            choose[:, forbid_first - 1] = np.inf
        if k == 0 and force_first is not None and 1 <= force_first <= n:
            choose[:, np.arange(n) != force_first - 1] = np.inf
        fill = np.minimum((after / max(limit, EPSILON) * (BUCKETS - 1)).astype(np.int64), BUCKETS - 1)
        ranked = np.where(fill[None, :, :] == buckets[:, None, None], choose[None, :, :], np.inf)  # (bucket, s, p)
        best = np.argmin(ranked, axis=1)  # (bucket, p)
        columns = np.arange(n)[None, :]
        picked = ranked[buckets[:, None], best, columns]
        new_cost = np.where(np.isfinite(picked), total[best, columns], np.inf)
        # A state with more backlog and no less cost than another at the same parallelism can never do
        # better (the future depends only on parallelism and backlog): drop it, exactly.
        cheaper_below = np.minimum.accumulate(new_cost, axis=0)
        new_cost[1:][cheaper_below[:-1] <= new_cost[1:]] = np.inf
        cost = new_cost.T.reshape(-1)
        backlog = after[best, columns].T.reshape(-1)
        violation = (violation[live][best] + excess[best, columns]).T.reshape(-1)
        parents[k] = live[best].T.reshape(-1)
        backlogs[k] = backlog
    final_choice = cost + per_record * backlog
    last = int(np.argmin(final_choice))
    if not np.isfinite(final_choice[last]):
        raise ValueError("no schedule: every parallelism is excluded")
    path = np.empty(steps, dtype=np.int64)
    levels = np.empty(steps)
    at = last
    for k in range(steps - 1, -1, -1):
        path[k] = at // BUCKETS + 1
        levels[k] = backlogs[k, at]
        at = int(parents[k, at])
    rescales = int(np.count_nonzero(np.diff(np.concatenate(([start], path)))))
    return Schedule(parallelism=path, backlog=levels, cost=float(final_choice[last]),
                    slot_seconds=float(path.sum() * dt), violation_s=float(violation[last]), rescales=rescales)


def describe(schedule: Schedule, step_s: float, limit: int = 4) -> str:
    """`4 now, 5 from +3 min, ...`: the schedule's changes, for a decision's reason."""
    parts, previous = [], None
    for k, p in enumerate(schedule.parallelism.tolist()):
        if p != previous:
            parts.append(f"{p} now" if k == 0 else f"{p} from +{k * step_s / 60:g} min")
            previous = p
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f" (+{more} more)" if more > 0 else "")
