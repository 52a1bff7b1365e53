"""A clairvoyant oracle for trace-driven evaluation: the physical limit an autoscaler is compared against.

Pure: no I/O. Knowing the whole future load, the oracle finds the least task-slot-seconds that keep the
backlog within the catch-up target, paying for every restart the way evaluation/ticks.py does.

Model (discrete time, steps of `dt` seconds; step i covers [i dt, (i + 1) dt)):

    arrivals  = arrival_rates[i] x dt
    processed = min(backlog + arrivals, capacity[p] x running time)   (running time < dt while restarting)
    backlog   = backlog + arrivals - processed

- Parallelism may change only at multiples of `decision_s`. A change is a rescale: processing stops for
  `restart_downtime_s` (arrivals keep piling up), the new parallelism is paid from the moment of the rescale,
  `replay_records` are added to the backlog (replay since the last checkpoint), and no other rescale may start
  until the restart is over (one rescale at a time, as execute's lock enforces).
- The rule: after each step, backlog <= backlog_target_s x that step's arrival rate, except for the steps that
  end within `grace_s` seconds after a rescale started (the restart and the recovery right after it).
- Only "useful" parallelisms are rescale targets: p whose capacity is larger than that of every smaller p
  (`useful_parallelisms`). A slot that adds no capacity is never worth paying for, and without this rule the
  oracle could restart to a useless parallelism only to have the grace hide an unavoidable overload.
  Holding a useless `initial_parallelism` is allowed (leaving it costs a restart).

Objective: lexicographic. First the fewest violating steps (0 when a schedule meets the rule), then the least
slot-seconds. So when no schedule meets the rule the oracle returns the cheapest of the schedules with the
fewest violations, not the static-max schedule.

Algorithm: dynamic programming over decision blocks. The state at a block boundary is (parallelism, blocks
since the last rescale, capped where a rescale no longer matters, backlog). The backlog is continuous, so per
(parallelism, age) the DP keeps a Pareto front of (objective so far, backlog) pairs: a pair with both a lower
objective and a lower backlog dominates, since a smaller backlog never makes any future step worse (the
backlog update is monotone in the backlog). One block is simulated for all candidate states and parallelisms
at once with numpy. A first search keeps only the states that meet the rule, which keeps fronts short; only if
none survives (a proof that no schedule meets the rule, see below) does the fewest-violations search run.

Approximation and its bound: a front longer than `max_front` is cut into `max_front` equal backlog buckets.
Two passes make the cut harmless or measured:
1. An optimistic pass merges each bucket into (its lowest objective, its lowest backlog), a state that may not
   exist but dominates every state of the bucket, so its optimum is a lower bound of the true optimum
   (`lower_bound_slot_seconds`). The cost of a schedule depends on its parallelisms only, so the schedule
   that pass picks is replayed exactly; if it meets the rule as well as the pass believed, it is optimal
   (`certified_optimal`), and that is the usual case: when no front exceeds `max_front` (small instances,
   and typical traces: a front is long only where backlogs of many costs coexist) there is no cut at all.
2. Otherwise a conservative pass keeps the cheapest real state of each bucket, and the better of the two
   replayed schedules is returned. It is a real schedule, so `slot_seconds` is never below the optimum, and
   `slot_seconds - lower_bound_slot_seconds` (`gap_slot_seconds`) bounds how far above it is. There is no
   useful a-priori bound: keeping the cheapest state of a bucket may keep one whose backlog is up to a bucket
   width higher than a dropped one's, and that can make a later step fail. Raise `max_front` to close a gap.
The fewest-violations search cuts its fronts to `FALLBACK_FRONT` (4): under overload backlogs never drain, so
fronts stay long and the search would be slow, and the gap is still reported.

The oracle exploits the rule as written: e.g. it may time a rescale so that its grace covers a step no
parallelism could keep within the target, and near the end of the trace it may rescale down because the grace
outlasts the trace. Compare autoscalers under the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Comparisons ignore floating-point noise: time in seconds, and backlogs relative to the trace's scale.
EPSILON = 1e-9
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


@dataclass(frozen=True, eq=False)
class _Model:
    """A validated problem, in the units the DP works in (records per step, whole steps per block)."""

    arrivals: np.ndarray  # records arriving in each step
    limits: np.ndarray  # the largest backlog the rule allows after each step, plus a float tolerance
    checked: np.ndarray  # whether the rule applies to the step at all (outside grace)
    capacity: np.ndarray  # records/s at parallelism p, index 0 unused
    targets: np.ndarray  # the parallelisms a rescale may go to
    dt: float
    block: int  # steps per decision
    downtime_s: float
    grace_s: float
    replay: float
    initial_parallelism: int
    initial_backlog: float
    free_rescales: bool  # rescales cost nothing and change nothing but the parallelism: p is not state

    @property
    def steps(self) -> int:
        return len(self.arrivals)

    @property
    def age_cap(self) -> int:
        """Blocks after which a rescale neither stops processing nor suspends the rule any more."""
        longest = max(self.downtime_s, self.grace_s) / (self.block * self.dt)
        return max(1, math.ceil(longest - EPSILON))

    def block_profile(self, age: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Running seconds and grace exemption of each step of a block that starts `age` blocks after the last
        rescale started (age_cap: long ago, or never)."""
        since = age * self.block * self.dt + (np.arange(length) + 1) * self.dt
        running = np.clip(since - self.downtime_s, 0.0, self.dt)
        exempt = (since <= self.grace_s + EPSILON) & (age < self.age_cap)
        return running, exempt


@dataclass(frozen=True, eq=False)
class _Replay:
    parallelism: np.ndarray
    backlog: np.ndarray
    violations: int  # steps
    cost: int  # slot-steps
    rescales: int


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
    replay_records: float = 0.0,
    backlog_target_s: float = 10.0,
    grace_s: float | None = None,
    decision_s: float = 60.0,
    initial_parallelism: int = 1,
    initial_backlog: float = 0.0,
    max_front: int = 128,
) -> OracleResult:
    """The cheapest schedule that keeps the backlog within target, restarts included (see the module docstring).

    `grace_s` defaults to restart_downtime_s + backlog_target_s: during the restart the lag grows past any
    target, and the job then gets one target's worth of time to catch up. That is demanding: by the first check
    the new parallelism must have drained the downtime's arrivals and the replay, which takes a capacity of at
    least downtime / target times the load (twice the load with the defaults) plus replay / target. Pass a
    longer `grace_s` for a more lenient recovery. `decision_s` must be a multiple of `dt`.
    """
    model = _build(
        arrival_rates, capacity, dt, restart_downtime_s=restart_downtime_s, replay_records=replay_records,
        backlog_target_s=backlog_target_s, grace_s=grace_s, decision_s=decision_s,
        initial_parallelism=initial_parallelism, initial_backlog=initial_backlog, max_front=max_front,
        free_rescales=False,
    )
    return _optimize(model, max_front)


def oracle_without_restarts(
    arrival_rates: np.ndarray,
    capacity: np.ndarray,
    dt: float,
    *,
    restart_downtime_s: float = 20.0,
    replay_records: float = 0.0,
    backlog_target_s: float = 10.0,
    grace_s: float | None = None,
    decision_s: float = 60.0,
    initial_parallelism: int = 1,
    initial_backlog: float = 0.0,
    max_front: int = 128,
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
        arrival_rates, capacity, dt, restart_downtime_s=restart_downtime_s, replay_records=replay_records,
        backlog_target_s=backlog_target_s, grace_s=grace_s, decision_s=decision_s,
        initial_parallelism=initial_parallelism, initial_backlog=initial_backlog, max_front=max_front,
        free_rescales=True,
    )
    return _optimize(model, max_front)


def _build(
    arrival_rates: np.ndarray,
    capacity: np.ndarray,
    dt: float,
    *,
    restart_downtime_s: float,
    replay_records: float,
    backlog_target_s: float,
    grace_s: float | None,
    decision_s: float,
    initial_parallelism: int,
    initial_backlog: float,
    max_front: int,
    free_rescales: bool,
) -> _Model:
    """Validate the arguments and turn them into a _Model (a free-rescale model for the relaxation)."""
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
    if restart_downtime_s < 0 or replay_records < 0 or backlog_target_s < 0 or initial_backlog < 0:
        raise ValueError("restart_downtime_s, replay_records, backlog_target_s and initial_backlog must be >= 0")
    grace = restart_downtime_s + backlog_target_s if grace_s is None else grace_s
    if grace < 0:
        raise ValueError("grace_s must be >= 0")
    if not 1 <= initial_parallelism < len(cap):
        raise ValueError(f"initial_parallelism must be in 1..{len(cap) - 1}")
    if max_front < 1:
        raise ValueError("max_front must be >= 1")

    arrivals = rates * dt
    scale = max(1.0, float(arrivals.max(initial=0.0)), float(cap[1:].max()) * dt, initial_backlog, replay_records)
    limits = backlog_target_s * rates + EPSILON * scale
    checked = np.ones(len(rates), dtype=bool)
    if free_rescales:
        # Skip the rule wherever some rescale's grace could: the steps ending within grace of a decision time.
        since_boundary = (np.arange(len(rates)) % block + 1) * dt
        checked = since_boundary > grace + EPSILON
        restart_downtime_s, grace, replay_records, block = 0.0, 0.0, 0.0, 1
    return _Model(
        arrivals=arrivals, limits=limits, checked=checked, capacity=cap, targets=useful_parallelisms(cap), dt=dt,
        block=block, downtime_s=restart_downtime_s, grace_s=grace, replay=float(replay_records),
        initial_parallelism=int(initial_parallelism), initial_backlog=float(initial_backlog),
        free_rescales=free_rescales,
    )


def _optimize(model: _Model, max_front: int) -> OracleResult:
    """Feasible schedules first (an optimistic pass, replayed exactly, then a conservative pass only if the replay
    falls short); the fewest violations only when the optimistic pass proves that no schedule meets the rule."""
    dt, n = model.dt, model.steps
    if n == 0:
        return OracleResult(0.0, np.zeros(0, dtype=np.int64), np.zeros(0), 0, True, 0.0, 0.0, True)
    solve = _solve_free if model.free_rescales else _solve
    front, feasible_only = max_front, True
    low = solve(model, front, optimistic=True, feasible_only=True)
    if low is None:
        front, feasible_only = min(max_front, FALLBACK_FRONT), False
        low = solve(model, front, optimistic=True, feasible_only=False)
    assert low is not None
    low_blocks, low_violations, low_cost = low
    best = _replay(model, low_blocks)
    if best.violations != low_violations:
        other = solve(model, front, optimistic=False, feasible_only=feasible_only)
        if other is None:  # the cut lost every feasible state: settle for the fewest violations
            other = solve(model, front, optimistic=False, feasible_only=False)
        assert other is not None
        fallback = _replay(model, other[0])
        if (fallback.violations, fallback.cost) < (best.violations, best.cost):
            best = fallback
    certified = (best.violations, best.cost) == (low_violations, low_cost)
    lower = low_cost if best.violations == low_violations else n  # else: one slot per step
    return OracleResult(
        slot_seconds=best.cost * dt, parallelism=best.parallelism, backlog=best.backlog, rescales=best.rescales,
        feasible=best.violations == 0, violation_s=best.violations * dt, lower_bound_slot_seconds=lower * dt,
        certified_optimal=certified,
    )


def _solve(
    model: _Model, max_front: int, *, optimistic: bool, feasible_only: bool
) -> tuple[np.ndarray, int, int] | None:
    """The DP. Returns the parallelism of each block, and the violating steps and slot-steps it believes; None
    when `feasible_only` (states that break the rule are dropped) and no state survives."""
    n, k, cap = model.steps, model.block, model.capacity
    targets = model.targets
    blocks = -(-n // k)
    age_cap = model.age_cap
    weight = (len(cap) - 1) * n + 1  # one violating step outweighs any cost: objective = violations x weight + cost
    decision_s = k * model.dt
    profiles = {(age, length): model.block_profile(age, length) for age in range(age_cap + 1) for length in {k, n % k}
                if length}

    # The states at the current block boundary, and per block the kept candidates' parent and parallelism.
    obj = np.zeros(1, dtype=np.int64)
    backlog = np.array([model.initial_backlog])
    par = np.array([model.initial_parallelism])
    age = np.array([age_cap])
    parents: list[np.ndarray] = []
    chosen: list[np.ndarray] = []

    for b in range(blocks):
        i0 = b * k
        length = min(k, n - i0)
        # Candidates: (source state, parallelism for the block, age at the block start, backlog at the start).
        hold = np.arange(len(obj))
        groups = [(int(a), hold[age == a], par[age == a], backlog[age == a]) for a in np.unique(age)]
        src, q = _rescale_candidates(np.flatnonzero(age * decision_s >= model.downtime_s - EPSILON), obj, backlog,
                                     par, targets)
        if len(src):
            groups.append((0, src, q, backlog[src] + model.replay))

        keys, objs, backs, srcs, qs = [], [], [], [], []
        for a, g_src, g_q, start in groups:
            running, exempt = profiles[(a, length)]
            cq = cap[g_q]
            level = start.copy()
            violations = np.zeros(len(g_src), dtype=np.int64)
            for j in range(length):
                i = i0 + j
                level += model.arrivals[i]
                level -= cq * running[j]
                np.maximum(level, 0.0, out=level)
                if model.checked[i] and not exempt[j]:
                    violations += level > model.limits[i]
            new_age = min(a + 1, age_cap)
            keys.append(g_q.astype(np.int64) * (age_cap + 1) + new_age)
            objs.append(obj[g_src] + violations * weight + g_q.astype(np.int64) * length)
            backs.append(level)
            srcs.append(g_src)
            qs.append(g_q)
        key, cand_obj, cand_back = np.concatenate(keys), np.concatenate(objs), np.concatenate(backs)
        cand_src, cand_q = np.concatenate(srcs), np.concatenate(qs)
        if feasible_only:
            ok = cand_obj < weight
            if not ok.any():
                return None
            key, cand_obj, cand_back, cand_src, cand_q = key[ok], cand_obj[ok], cand_back[ok], cand_src[ok], cand_q[ok]

        keep, backlog = _prune(key, cand_obj, cand_back, max_front, optimistic)
        obj, par = cand_obj[keep], cand_q[keep]
        age = key[keep] % (age_cap + 1)
        parents.append(cand_src[keep])
        chosen.append(par)

    return _backtrack(obj, backlog, parents, chosen, weight)


def _rescale_candidates(
    can: np.ndarray, obj: np.ndarray, backlog: np.ndarray, par: np.ndarray, targets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The (source state, new parallelism) pairs worth simulating for a rescale, among the states in `can`.

    After a rescale only the objective and backlog of the source matter, so for a target q a source is useless
    if another source not at q has both a lower objective and a lower backlog. A source dominated by sources at
    two parallelisms, or at its own, is useless for every target; dominated only by sources at one other
    parallelism p', it matters for p' alone. That cuts sources x targets down to about a front x targets."""
    if len(can) == 0:
        return can, can
    order = can[np.lexsort((backlog[can], obj[can]))]
    level, at = backlog[order], par[order]
    # lowest[p, i]: the lowest backlog of the sources at p among the first i (so objective <=).
    lowest = np.full((int(par.max()) + 1, len(order) + 1), np.inf)
    lowest[at, np.arange(1, len(order) + 1)] = level
    dominated = np.minimum.accumulate(lowest, axis=1)[:, :-1] <= level
    count = dominated.sum(axis=0)
    free = order[count == 0]
    src = np.repeat(free, len(targets))
    q = np.tile(targets, len(free))
    moved = q != par[src]
    one = np.flatnonzero(count == 1)
    other = dominated[:, one].argmax(axis=0)
    useful = (other != at[one]) & np.isin(other, targets)
    return np.concatenate((src[moved], order[one[useful]])), np.concatenate((q[moved], other[useful]))


def _solve_free(
    model: _Model, max_front: int, *, optimistic: bool, feasible_only: bool
) -> tuple[np.ndarray, int, int] | None:
    """The DP of the relaxation: a decision every step, and the parallelism is not state (one front).

    From each state, only the parallelisms that matter are tried: none above the first that empties the backlog
    (same backlog, more cost), and none that breaks the rule when another does not (one violation outweighs
    any cost, and a lower parallelism leaves a higher backlog)."""
    n, targets = model.steps, model.targets
    rate_dt = model.capacity[targets] * model.dt
    cost = targets.astype(np.int64)
    weight = (len(model.capacity) - 1) * n + 1
    obj = np.zeros(1, dtype=np.int64)
    backlog = np.array([model.initial_backlog])
    parents: list[np.ndarray] = []
    chosen: list[np.ndarray] = []
    for i in range(n):
        level = backlog[:, None] + model.arrivals[i]
        level = np.maximum(level - rate_dt, 0.0)  # (state, parallelism)
        empty = level == 0.0
        useful = np.arange(len(targets)) <= np.where(empty.any(axis=1), empty.argmax(axis=1), len(targets))[:, None]
        violates = level > model.limits[i] if model.checked[i] else np.zeros_like(empty)
        useful &= ~violates if feasible_only else ~violates | violates.all(axis=1)[:, None]
        rows, cols = np.nonzero(useful)
        if len(rows) == 0:
            return None
        cand_obj = obj[rows] + violates[rows, cols] * weight + cost[cols]
        keep, backlog = _prune(np.zeros(len(rows), dtype=np.int64), cand_obj, level[rows, cols], max_front,
                               optimistic)
        obj = cand_obj[keep]
        parents.append(rows[keep])
        chosen.append(targets[cols[keep]])
    return _backtrack(obj, backlog, parents, chosen, weight)


def _backtrack(
    obj: np.ndarray, backlog: np.ndarray, parents: list[np.ndarray], chosen: list[np.ndarray], weight: int
) -> tuple[np.ndarray, int, int]:
    """The best final state's schedule (ties: the lower backlog), its violating steps and its slot-steps."""
    best = int(np.lexsort((backlog, obj))[0])
    final = int(obj[best])
    schedule = np.empty(len(chosen), dtype=np.int64)
    for b in range(len(chosen) - 1, -1, -1):
        schedule[b] = chosen[b][best]
        best = int(parents[b][best])
    return schedule, final // weight, final % weight


def _prune(
    key: np.ndarray, obj: np.ndarray, backlog: np.ndarray, max_front: int, optimistic: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per key, the Pareto front of (objective, backlog), cut to `max_front` backlog buckets if longer.

    Returns the indices kept (each bucket's cheapest) and their backlogs: the cheapest's own (conservative), or
    the bucket's lowest (optimistic: a state that dominates the whole bucket, for the lower bound)."""
    single = bool(key.min() == key.max())
    order = np.lexsort((backlog, obj)) if single else np.lexsort((backlog, obj, key))
    key, backlog = key[order], backlog[order]
    # Dominated: an earlier entry of the same key (objective <=) has a backlog <=.
    keep = np.empty(len(order), dtype=bool)
    keep[0] = True
    if single:
        keep[1:] = backlog[1:] < np.minimum.accumulate(backlog)[:-1]
    else:
        # Integer backlog ranks (ties ranked in sorted order, so a later tie is dropped), offset so that every
        # earlier key ranks above any later one: one running minimum then serves all keys at once.
        rank = np.empty(len(order), dtype=np.int64)
        rank[np.argsort(backlog, kind="stable")] = np.arange(len(order))
        value = rank + (int(key[-1]) - key) * len(order)
        keep[1:] = value[1:] < np.minimum.accumulate(value)[:-1]
    order, key, backlog = order[keep], key[keep], backlog[keep]

    if len(order) <= max_front:
        return order, backlog
    edges = np.flatnonzero(key[1:] != key[:-1]) + 1
    starts = np.concatenate(([0], edges))
    counts = np.diff(np.concatenate((starts, [len(key)])))
    if counts.max() <= max_front:
        return order, backlog
    group = np.repeat(np.arange(len(starts)), counts)
    bucket = np.arange(len(key)) - starts[group]  # small fronts: every entry its own bucket
    big = counts[group] > max_front
    high = backlog[starts][group][big]  # a front's backlogs decrease as its objectives increase
    low = backlog[starts + counts - 1][group][big]
    bucket[big] = np.minimum(((high - backlog[big]) / (high - low) * max_front).astype(np.int64), max_front - 1)
    new = np.empty(len(key), dtype=bool)
    new[0] = True
    new[1:] = (group[1:] != group[:-1]) | (bucket[1:] != bucket[:-1])
    firsts = np.flatnonzero(new)
    if optimistic:
        lasts = np.concatenate((firsts[1:], [len(key)])) - 1
        return order[firsts], backlog[lasts]
    return order[firsts], backlog[firsts]


def _replay(model: _Model, schedule: np.ndarray) -> _Replay:
    """Run a per-block schedule through the model exactly, step by step (the same arithmetic as the DP)."""
    n, k, cap = model.steps, model.block, model.capacity
    age_cap = model.age_cap
    parallelism = np.empty(n, dtype=np.int64)
    backlog = np.empty(n)
    p, level, age = model.initial_parallelism, model.initial_backlog, age_cap
    violations = cost = rescales = 0
    profiles: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for b, q in enumerate(schedule.tolist()):
        i0 = b * k
        length = min(k, n - i0)
        if q != p:
            if age * k * model.dt < model.downtime_s - EPSILON:
                raise AssertionError("schedule rescales during a restart")
            p, age, rescales = q, 0, rescales + 1
            level += model.replay
        if (age, length) not in profiles:
            profiles[(age, length)] = model.block_profile(age, length)
        running, exempt = profiles[(age, length)]
        for j in range(length):
            i = i0 + j
            level = max(level + model.arrivals[i] - cap[p] * running[j], 0.0)
            if model.checked[i] and not exempt[j] and level > model.limits[i]:
                violations += 1
            parallelism[i], backlog[i] = p, level
        cost += p * length
        age = min(age + 1, age_cap)
    return _Replay(parallelism, backlog, violations, cost, rescales)
