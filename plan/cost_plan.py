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
  with the least cost plus the work its backlog still needs (see `solve`), and beside it a runner-up
  that starts elsewhere: the plan's next best is the cheapest runner-up (`solve_with_next`).
- Rates are upper quantiles and capacities lower quantiles (the caller's), so the schedule keeps
  the target when the load runs high and the job runs slow.
- A schedule moves now only to a parallelism that carries the planned rate now (capacity at least
  the first step's rate), unless the problem allows a planned shortfall (`allow_planned_shortfall`)
  or none within bounds carries it (`first_steps`): moving to run short, letting the backlog grow
  toward its target and scaling up later, is the job's choice, not the search's. Holding the current
  parallelism stays allowed.

Only the first step is applied; the next window plans again with what it learned (receding horizon).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

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
    allow_planned_shortfall: bool = True  # a schedule may move now to run short of the rate now (`first_steps`)

    @property
    def max_parallelism(self) -> int:
        return len(self.capacity) - 1

    def within_bounds(self) -> np.ndarray:
        """Per parallelism 1..max, whether it is at least `min_parallelism`."""
        return np.arange(1, self.max_parallelism + 1) >= self.min_parallelism

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


def carrying(problem: PlanProblem) -> np.ndarray:
    """Per parallelism 1..max, whether it is within bounds and carries the planned rate now (its
    capacity at least the first step's rate)."""
    capacity = np.asarray(problem.capacity[1:], dtype=float)
    return problem.within_bounds() & (capacity >= float(problem.rates[0]) - EPSILON)


def first_steps(problem: PlanProblem) -> np.ndarray:
    """Per parallelism 1..max, whether a schedule may start there: within bounds and, unless the problem
    allows a planned shortfall, holding the current parallelism or carrying the planned rate now, where
    some parallelism within bounds carries it."""
    allowed = problem.within_bounds()
    carries = carrying(problem)
    if problem.allow_planned_shortfall or not carries.any():
        return allowed
    if problem.parallelism <= problem.max_parallelism:
        carries[problem.parallelism - 1] = allowed[problem.parallelism - 1]
    return carries


def solve(problem: PlanProblem, forbid_first: int | None = None, force_first: int | None = None) -> Schedule:
    """The least-cost schedule over the horizon (see the module docstring), starting where `first_steps`
    allows. `forbid_first` excludes one parallelism from the first step; `force_first` allows only that
    one, whether or not it carries the rate now (what keeping an earlier choice, or holding, would cost).

    Per (step, parallelism) the DP keeps one path per backlog bucket (the backlog as a fraction of the
    step's target, in `BUCKETS` equal parts, the last holding everything beyond): the cheapest by cost
    plus the work its backlog needs. A cheap path with a high backlog and a dearer one with a low backlog
    both survive, so a path that must later drain is not lost to one that only looks cheaper."""
    return _searched(problem, forbid_first, force_first, runner_ups=False)[0]


def solve_with_next(problem: PlanProblem) -> tuple[Schedule, Schedule | None]:
    """The plan (`solve`'s) and the next best: the plan's runner-up, the cheapest schedule starting
    elsewhere among the paths its search kept beside the best ones (None when only one first step is
    allowed). A runner-up ranks below the best path of its bucket, so the next best never costs less than
    the plan, and it is found in the same search, on the same rates and costs.

    The search is a heuristic: barred from the plan's first step (`solve(problem, forbid_first=...)`),
    its buckets hold other paths, and it sometimes finds a schedule cheaper than the plan (a path the
    plan's search dropped). That search is used only where no runner-up survived (14 of 5,000 small
    random problems); where it is the cheaper, it is the plan."""
    chosen, runner_up, choices = _searched(problem, None, None, runner_ups=True)
    if runner_up is not None or choices < 2:
        return chosen, runner_up
    barred = solve(problem, forbid_first=chosen.first)
    return (barred, chosen) if barred.cost < chosen.cost else (chosen, barred)


def _searched(problem: PlanProblem, forbid_first: int | None, force_first: int | None, runner_ups: bool
              ) -> tuple[Schedule, Schedule | None, int]:
    """The plan, its runner-up (None where none was kept or searched) and how many first steps were allowed."""
    problem.check()
    n = problem.max_parallelism
    cap = np.asarray(problem.capacity[1:], dtype=float)
    per_record = 1.0 / max(float(cap.max()) / n, EPSILON)  # slot-seconds one record of backlog needs
    down, running, ramp, moved = _transitions(problem)
    allowed = problem.within_bounds()
    first_allowed = first_steps(problem) if force_first is None else allowed.copy()
    if forbid_first is not None and 1 <= forbid_first <= n:
        first_allowed[forbid_first - 1] = False
    if force_first is not None and 1 <= force_first <= n:
        first_allowed[np.arange(n) != force_first - 1] = False
    start = min(problem.parallelism, n)  # a job above the maximum plans from the maximum's capacity
    found = _search(
        np.asarray(problem.rates, dtype=float), float(problem.step_s), float(problem.backlog_target_s), cap,
        down, running, ramp, moved, np.where(moved, problem.replay_records, 0.0),
        np.where(moved, problem.action_penalty_s, 0.0), allowed, first_allowed, float(problem.violation_weight),
        per_record, start, float(problem.backlog), runner_ups)
    if found is None:
        raise ValueError("no schedule: every parallelism is excluded")
    cost, backlog, _, first, _, _ = found
    final_choice = cost + per_record * backlog
    last = int(np.argmin(final_choice[0]))
    if not np.isfinite(final_choice[0, last]):
        raise ValueError("no schedule: every parallelism is excluded")
    chosen = _schedule(problem, found, final_choice, 0, last, start)
    choices = int(np.count_nonzero(first_allowed))
    if not runner_ups:
        return chosen, None, choices
    other = np.where(first != chosen.first - 1, final_choice, np.inf)
    label, state = np.unravel_index(int(np.argmin(other)), other.shape)
    if not np.isfinite(other[label, state]):
        return chosen, None, choices
    return chosen, _schedule(problem, found, final_choice, int(label), int(state), start), choices


def _schedule(problem: PlanProblem, found: Found, final_choice: np.ndarray, label: int, state: int, start: int
              ) -> Schedule:
    """The path that ends in `state` (its best path, label 0, or its runner-up, label 1), walked back."""
    _, _, violation, _, parents, backlogs = found
    steps = len(problem.rates)
    path = np.empty(steps, dtype=np.int64)
    levels = np.empty(steps)
    at, kind = state, label
    for k in range(steps - 1, -1, -1):
        path[k] = at // BUCKETS + 1
        levels[k] = backlogs[k, kind, at]
        code = int(parents[k, kind, at])
        at, kind = code // 2, code % 2
    rescales = int(np.count_nonzero(np.diff(np.concatenate(([start], path)))))
    return Schedule(parallelism=path, backlog=levels, cost=float(final_choice[label, state]),
                    slot_seconds=float(path.sum() * problem.step_s), violation_s=float(violation[label, state]),
                    rescales=rescales)


# Per label (0: a state's best path, 1: its runner-up) and state: cost, backlog, violation and first step
# (an index); per step, label and state: the parent (state x 2 + label) and the backlog.
Found = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@njit(cache=True)
def _search(rates: np.ndarray, dt: float, target_s: float, cap: np.ndarray, down: np.ndarray, running: np.ndarray,
            ramp: np.ndarray, moved: np.ndarray, replay: np.ndarray, penalty: np.ndarray, allowed: np.ndarray,
            first_allowed: np.ndarray, weight: float, per_record: float, start: int, backlog0: float,
            runner_ups: bool) -> Found | None:
    """The DP of `solve`, compiled: per step, every reachable state (parallelism q, backlog bucket) to
    every parallelism p; per (p, bucket) the path with the least cost plus its backlog's work is kept
    (label 0; the first such source on ties), then states with more backlog and no less cost than another
    at the same p are dropped. State s = (q - 1) * BUCKETS + bucket. None when no state is reachable.

    With `runner_ups`, beside it a runner-up (label 1): the least, by the same measure, of the paths into
    the bucket that start elsewhere than its best path and rank no better, from both paths of every
    source. Runner-ups never displace a best path, so the best paths are the one-path search's, to the
    last bit. A runner-up is dropped where kept paths at the same p with less backlog and no more cost
    start as it does, or start in two different ways (one of them starts elsewhere than any plan).

    Compiled with numba: its small array operations per step cost more in numpy's per-call overhead than
    in arithmetic. The arithmetic is numpy's, term for term and in its order."""
    n = cap.shape[0]
    states = n * BUCKETS
    cost = np.full((2, states), np.inf)
    cost[0, (start - 1) * BUCKETS] = 0.0
    backlog = np.zeros((2, states))
    backlog[0, (start - 1) * BUCKETS] = backlog0
    violation = np.zeros((2, states))
    first = np.zeros((2, states), dtype=np.int64)
    steps = rates.shape[0]
    parents = np.zeros((steps, 2, states), dtype=np.int64)
    backlogs = np.zeros((steps, 2, states))
    # Per (bucket, p): the best path into it (a, of the best paths' continuations) and the best starting
    # elsewhere than a (b, of both): value (cost plus backlog's work), first step, source (state x 2 +
    # label), and `rest`.
    value = np.empty((2, BUCKETS, n))
    head = np.zeros((2, BUCKETS, n), dtype=np.int64)
    code = np.zeros((2, BUCKETS, n), dtype=np.int64)
    rest = np.zeros((3, 2, BUCKETS, n))  # [cost, backlog, seconds beyond target] per path
    lowest = np.empty(n)  # per first step: the least cost kept at lower backlog, at one p
    for k in range(steps):
        rate = rates[k]
        limit = target_s * rate
        scale = max(limit, EPSILON)
        per_rate = max(rate, 1.0)
        usable = allowed if k > 0 else first_allowed
        value[:] = np.inf
        reachable = False
        for label in range(2 if runner_ups else 1):
            for s in np.flatnonzero(np.isfinite(cost[label])):
                reachable = True
                q = s // BUCKETS
                for p in range(n):
                    if not usable[p]:
                        continue
                    d, run, ramped = down[q, p], running[q, p], ramp[q, p]
                    peak = backlog[label, s] + rate * d + replay[q, p]
                    after = max(peak + rate * run - cap[p] * (run - ramped) - cap[q] * ramped, 0.0)
                    over = (max(peak - limit, 0.0) if moved[q, p] else 0.0) + max(after - limit, 0.0)
                    excess = over / per_rate if over != 0.0 else 0.0  # most paths keep the target
                    total = cost[label, s] + (p + 1.0) * dt + penalty[q, p] + weight * excess
                    fill = min(np.int64(after / scale * (BUCKETS - 1)), BUCKETS - 1) if after != 0.0 else 0
                    # Ranked into (fill, p): the best (a, at 0), and the best starting elsewhere than a (b, at 1);
                    # a runner-up's continuation (label 1) only as b, below a.
                    candidate, its_head = total + per_record * after, p if k == 0 else first[label, s]
                    ranked = np.isfinite(value[0, fill, p])
                    if label == 1:
                        if not ranked or its_head == head[0, fill, p] or candidate < value[0, fill, p] \
                                or candidate >= value[1, fill, p]:
                            continue
                        at = 1
                    elif ranked and its_head == head[0, fill, p]:
                        if candidate >= value[0, fill, p]:
                            continue
                        at = 0
                    elif candidate < value[0, fill, p]:
                        value[1, fill, p], head[1, fill, p], code[1, fill, p] = \
                            value[0, fill, p], head[0, fill, p], code[0, fill, p]
                        for j in range(3):
                            rest[j, 1, fill, p] = rest[j, 0, fill, p]
                        at = 0
                    elif candidate < value[1, fill, p]:
                        at = 1
                    else:
                        continue
                    value[at, fill, p], head[at, fill, p], code[at, fill, p] = candidate, its_head, s * 2 + label
                    rest[0, at, fill, p], rest[1, at, fill, p], rest[2, at, fill, p] = total, after, excess
        if not reachable:
            return None
        new_cost = np.full((2, states), np.inf)
        new_violation = np.zeros((2, states))
        new_first = np.zeros((2, states), dtype=np.int64)
        for p in range(n):
            cheapest = np.inf
            lowest[:] = np.inf
            two = np.inf  # the least cost at which kept paths at lower backlog start in two ways
            one, its = np.inf, -1  # the least such cost, and its first step
            for b in range(BUCKETS):
                state = p * BUCKETS + b
                own = -1
                if np.isfinite(value[0, b, p]):
                    total = rest[0, 0, b, p]
                    if b == 0 or cheapest > total:
                        own = head[0, b, p]
                        _keep(new_cost, new_violation, new_first, parents, backlogs, violation, rest, k, 0, state, 0,
                              b, p, code[0, b, p], own)
                    cheapest = min(cheapest, total)
                if not runner_ups:
                    continue
                # The runner-up: of a and b, the first that starts elsewhere than the kept best path and that
                # no kept paths with less backlog and no more cost dominate (see above).
                for i in range(2):
                    other = head[i, b, p]
                    total = rest[0, i, b, p]
                    if np.isfinite(value[i, b, p]) and other != own and total < lowest[other] and total < two:
                        _keep(new_cost, new_violation, new_first, parents, backlogs, violation, rest, k, 1, state, i,
                              b, p, code[i, b, p], other)
                        lowest[other] = min(lowest[other], total)
                        one, its, two = _covered(one, its, two, total, other)
                        break
                if own >= 0:
                    lowest[own] = min(lowest[own], new_cost[0, state])
                    one, its, two = _covered(one, its, two, new_cost[0, state], own)
        cost = new_cost
        violation = new_violation
        first = new_first
        backlog = backlogs[k].copy()
    return cost, backlog, violation, first, parents, backlogs


@njit(cache=True, inline='always')
def _covered(one: float, its: int, two: float, cost: float, head: int) -> tuple[float, int, float]:
    """With one more kept path (its cost, first step): the least cost and its first step, and the least
    cost at which kept paths start in two ways."""
    if head == its:
        return min(one, cost), its, two
    if cost < one:
        return cost, head, min(two, one)
    return one, its, min(two, cost)


@njit(cache=True, inline='always')
def _keep(cost: np.ndarray, violation_out: np.ndarray, first: np.ndarray, parents: np.ndarray, backlogs: np.ndarray,
          violation: np.ndarray, rest: np.ndarray, k: int, label: int, state: int, ranked: int, b: int, p: int,
          source: int, head: int) -> None:
    """The path ranked `ranked` (a or b) into (b, p), kept as `label` of `state` after step k."""
    cost[label, state] = rest[0, ranked, b, p]
    backlogs[k, label, state] = rest[1, ranked, b, p]
    violation_out[label, state] = violation[source % 2, source // 2] + rest[2, ranked, b, p]
    first[label, state] = head
    parents[k, label, state] = source


def describe(schedule: Schedule, step_s: float, limit: int = 4) -> str:
    """`4 now, 5 from +3 min, ...`: the schedule's changes, for a decision's reason."""
    parts, previous = [], None
    for k, p in enumerate(schedule.parallelism.tolist()):
        if p != previous:
            parts.append(f"{p} now" if k == 0 else f"{p} from +{k * step_s / 60:g} min")
            previous = p
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f" (+{more} more)" if more > 0 else "")


def warm_up() -> None:
    """Solve one small problem, so that the process's first decision does not pay for loading the
    compiled search (most of a second, even from numba's on-disk cache: docs/results.md). The plan agent
    runs it in a thread as it starts, while its worker joins the consumer group."""
    solve_with_next(PlanProblem(
        parallelism=1, backlog=0.0, rates=np.full(3, 100.0), step_s=60.0,
        capacity=np.array([0.0, 150.0, 300.0]), min_parallelism=1, downtime_up_s=10.0, downtime_down_s=5.0,
        replay_records=0.0, backlog_target_s=60.0))
