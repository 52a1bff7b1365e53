"""The oracle's search: dynamic programming over decision blocks (see `evaluation.oracle` for the model).

Algorithm: dynamic programming over decision blocks. The state at a block boundary is (parallelism, blocks
since the last rescale, capped where a rescale no longer matters, the parallelism before it while an in-place
scale-up still runs at its capacity, backlog). The backlog is continuous, so per
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Comparisons ignore floating-point noise: time in seconds, and backlogs relative to the trace's scale.
EPSILON = 1e-9


@dataclass(frozen=True, eq=False)
class OracleModel:
    """A validated problem, in the units the DP works in (records per step, whole steps per block)."""

    arrivals: np.ndarray  # records arriving in each step
    limits: np.ndarray  # the largest backlog the rule allows after each step, plus a float tolerance
    checked: np.ndarray  # whether the rule applies to the step at all (outside grace)
    capacity: np.ndarray  # records/s at parallelism p, index 0 unused
    factors: np.ndarray  # per step, what the capacity is multiplied by (the rate noise the policies see)
    targets: np.ndarray  # the parallelisms a rescale may go to
    dt: float
    block: int  # steps per decision
    downtime_s: float  # a scale-up's restart
    downtime_down_s: float  # a scale-down's restart (in place: its hold)
    grace_s: float
    replay: float
    initial_parallelism: int
    initial_backlog: float
    free_rescales: bool  # rescales cost nothing and change nothing but the parallelism: p is not state
    first_rescale_block: int = 0  # no rescale before this block (a policy first decides after a window)
    ramp_s: float = 0.0  # in place: a scale-up runs at the old parallelism's capacity this long

    @property
    def steps(self) -> int:
        return len(self.arrivals)

    @property
    def age_cap(self) -> int:
        """Blocks after which a rescale neither stops processing nor suspends the rule any more."""
        longest = max(self.downtime_s + self.ramp_s, self.downtime_down_s, self.grace_s) / (self.block * self.dt)
        return max(1, math.ceil(longest - EPSILON))

    def downtime(self, down: int) -> float:
        """The restart of a rescale in that direction (down: 0 up, 1 down)."""
        return self.downtime_down_s if down else self.downtime_s

    def busy_s(self, down: int) -> float:
        """How long a rescale in that direction blocks the next one: its pause, then an in-place ramp."""
        return self.downtime_down_s if down else self.downtime_s + self.ramp_s

    def ramping(self, age: int) -> bool:
        """Whether a block `age` blocks after a scale-up started still runs part of its ramp."""
        return self.ramp_s > 0 and age * self.block * self.dt < self.downtime_s + self.ramp_s - EPSILON

    def block_profile(self, age: int, length: int, down: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Running seconds, of them the seconds at the old capacity (an in-place scale-up's ramp), and grace
        exemption of each step of a block that starts `age` blocks after the last rescale (in direction `down`)
        started (age_cap: long ago, or never)."""
        since = age * self.block * self.dt + (np.arange(length) + 1) * self.dt
        running = np.clip(since - self.downtime(down), 0.0, self.dt)
        ramp_end = 0.0 if down or age >= self.age_cap else self.downtime_s + self.ramp_s
        old = np.clip(np.minimum(since, ramp_end) - np.maximum(since - self.dt, self.downtime_s), 0.0, self.dt)
        exempt = (since <= self.grace_s + EPSILON) & (age < self.age_cap)
        return running, old, exempt


@dataclass(frozen=True, eq=False)
class Replayed:
    parallelism: np.ndarray
    backlog: np.ndarray
    violations: int  # steps
    cost: int  # slot-steps
    rescales: int


def solve(
    model: OracleModel, max_front: int, *, optimistic: bool, feasible_only: bool, all_pairs: bool = False
) -> tuple[np.ndarray, int, int] | None:
    """The DP. Returns the parallelism of each block, and the violating steps and slot-steps it believes; None
    when `feasible_only` (states that break the rule are dropped) and no state survives.

    `all_pairs`: simulate every (ready state, other parallelism) rescale instead of `rescale_candidates`' pruned
    pairs. Slower, the same optimum (the reference the pruning is tested against).

    A state's key is (parallelism, blocks since the last rescale, that rescale's direction, and the parallelism
    before it while an in-place scale-up still runs at its capacity): the direction sets how long the restart
    stops processing and blocks the next rescale."""
    n, k, cap = model.steps, model.block, model.capacity
    targets = model.targets
    blocks = -(-n // k)
    age_cap = model.age_cap
    weight = (len(cap) - 1) * n + 1  # one violating step outweighs any cost: objective = violations x weight + cost
    decision_s = k * model.dt
    profiles = {(age, length, down): model.block_profile(age, length, down)
                for age in range(age_cap + 1) for length in {k, n % k} if length for down in (0, 1)}
    ready_age = [math.ceil(model.busy_s(down) / decision_s - EPSILON) for down in (0, 1)]
    slots = len(cap)  # key digit of the parallelism before an in-place scale-up (0: none, or no longer matters)

    # The states at the current block boundary, and per block the kept candidates' parent and parallelism.
    obj = np.zeros(1, dtype=np.int64)
    backlog = np.array([model.initial_backlog])
    par = np.array([model.initial_parallelism])
    age = np.array([age_cap])
    down = np.zeros(1, dtype=np.int64)
    before = np.zeros(1, dtype=np.int64)
    parents: list[np.ndarray] = []
    chosen: list[np.ndarray] = []

    for b in range(blocks):
        i0 = b * k
        length = min(k, n - i0)
        factors = model.factors[i0: i0 + length]
        # Candidates: (source state, parallelism for the block, age and direction, backlog at the start).
        hold = np.arange(len(obj))
        groups = []
        for a, d in {(int(a), int(d)) for a, d in zip(age.tolist(), down.tolist(), strict=True)}:
            mask = (age == a) & (down == d)
            groups.append((a, d, hold[mask], par[mask], backlog[mask], before[mask]))
        ready = np.flatnonzero(age >= np.where(down == 1, ready_age[1], ready_age[0]))
        if b < model.first_rescale_block:
            ready = ready[:0]
        if model.ramp_s > 0 or all_pairs:
            # An in-place scale-up runs at its source's capacity while it ramps: the source's parallelism
            # matters, so no source dominates another by objective and backlog alone. Every pair is tried.
            src, q = np.repeat(ready, len(targets)), np.tile(targets, len(ready))
            src, q = src[q != par[src]], q[q != par[src]]
        else:
            src, q = rescale_candidates(ready, obj, backlog, par, targets, up_s=model.busy_s(0),
                                        down_s=model.busy_s(1))
        if len(src):
            is_down = q < par[src]
            for d in (0, 1):
                pick = is_down == bool(d)
                if pick.any():
                    came_from = par[src[pick]] if d == 0 and model.ramp_s > 0 else np.zeros(int(pick.sum()), np.int64)
                    groups.append((0, d, src[pick], q[pick], backlog[src[pick]] + model.replay, came_from))

        keys, objs, backs, srcs, qs = [], [], [], [], []
        for a, d, g_src, g_q, start, g_before in groups:
            running, old, exempt = profiles[(a, length, d)]
            cq = cap[g_q]
            c_old = np.where(g_before > 0, cap[g_before], cq)  # the old capacity while the ramp runs
            level = start.copy()
            violations = np.zeros(len(g_src), dtype=np.int64)
            for j in range(length):
                i = i0 + j
                level += model.arrivals[i]
                level -= (cq * (running[j] - old[j]) + c_old * old[j]) * factors[j]
                np.maximum(level, 0.0, out=level)
                if model.checked[i] and not exempt[j]:
                    violations += level > model.limits[i]
            new_age = min(a + 1, age_cap)
            new_down = d if new_age < age_cap else 0
            kept_before = g_before if d == 0 and model.ramping(new_age) else np.zeros_like(g_before)
            keys.append(((g_q.astype(np.int64) * (age_cap + 1) + new_age) * 2 + new_down) * slots + kept_before)
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

        keep, backlog = prune(key, cand_obj, cand_back, max_front, optimistic)
        obj, par = cand_obj[keep], cand_q[keep]
        before = key[keep] % slots
        down = (key[keep] // slots) % 2
        age = (key[keep] // slots // 2) % (age_cap + 1)
        parents.append(cand_src[keep])
        chosen.append(par)

    return backtrack(obj, backlog, parents, chosen, weight)


def rescale_candidates(
    can: np.ndarray, obj: np.ndarray, backlog: np.ndarray, par: np.ndarray, targets: np.ndarray, *,
    up_s: float, down_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The (source state, new parallelism) pairs worth simulating for a rescale, among the states in `can`, when
    a rescale up pauses `up_s` and one down `down_s` (processing stopped, and the next rescale blocked, that long).

    After a rescale to q only the source's objective and backlog, and the direction (up from below q, down from
    above), matter. A shorter pause processes at least as much in every step and frees the next rescale no later,
    so a successor with a shorter or equal pause and a lower or equal backlog and objective is at least as good
    in every later block. Hence, for a target q, a source is useless if another source not at q has both a lower
    objective and a lower backlog (ties: the first in (objective, backlog) order is kept) and reaches q with a
    pause no longer than its own. With equal pauses that is any other source not at q; with unequal ones, a
    source in the slower direction is dominated by any, one in the quicker direction only by one in the quicker
    direction too. That cuts sources x targets down to about a front x targets. Pairs come source by source in
    (objective, backlog) order, targets ascending."""
    if len(can) == 0:
        return can, can
    order = can[np.lexsort((backlog[can], obj[can]))]
    level, at = backlog[order], par[order]
    q = targets[:, None]
    eligible = at[None, :] != q  # (target, source): a rescale at all
    quick = eligible if up_s == down_s else eligible & ((at[None, :] > q) == (down_s < up_s))

    def lowest_before(mask: np.ndarray) -> np.ndarray:
        """Per target, the lowest backlog among the earlier sources (objective <=) that `mask` keeps."""
        running = np.minimum.accumulate(np.where(mask, level[None, :], np.inf), axis=1)
        return np.concatenate((np.full((len(targets), 1), np.inf), running[:, :-1]), axis=1)

    bound = lowest_before(eligible) if up_s == down_s else np.where(quick, lowest_before(quick),
                                                                     lowest_before(eligible))
    source, target = np.nonzero((eligible & (bound > level[None, :])).T)
    return order[source], targets[target]


def solve_free(
    model: OracleModel, max_front: int, *, optimistic: bool, feasible_only: bool
) -> tuple[np.ndarray, int, int] | None:
    """The DP of the relaxation: a decision every step, and the parallelism is not state (one front).

    From each state, only the parallelisms that matter are tried: none above the first that empties the backlog
    (same backlog, more cost), and none that breaks the rule when another does not (one violation outweighs
    any cost, and a lower parallelism leaves a higher backlog)."""
    n, targets = model.steps, model.targets
    base_dt = model.capacity[targets] * model.dt
    cost = targets.astype(np.int64)
    weight = (len(model.capacity) - 1) * n + 1
    obj = np.zeros(1, dtype=np.int64)
    backlog = np.array([model.initial_backlog])
    parents: list[np.ndarray] = []
    chosen: list[np.ndarray] = []
    for i in range(n):
        level = backlog[:, None] + model.arrivals[i]
        level = np.maximum(level - base_dt * model.factors[i], 0.0)  # (state, parallelism)
        empty = level == 0.0
        useful = np.arange(len(targets)) <= np.where(empty.any(axis=1), empty.argmax(axis=1), len(targets))[:, None]
        violates = level > model.limits[i] if model.checked[i] else np.zeros_like(empty)
        useful &= ~violates if feasible_only else ~violates | violates.all(axis=1)[:, None]
        rows, cols = np.nonzero(useful)
        if len(rows) == 0:
            return None
        cand_obj = obj[rows] + violates[rows, cols] * weight + cost[cols]
        keep, backlog = prune(np.zeros(len(rows), dtype=np.int64), cand_obj, level[rows, cols], max_front,
                               optimistic)
        obj = cand_obj[keep]
        parents.append(rows[keep])
        chosen.append(targets[cols[keep]])
    return backtrack(obj, backlog, parents, chosen, weight)


def backtrack(
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


def prune(
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


def replay(model: OracleModel, schedule: np.ndarray) -> Replayed:
    """Run a per-block schedule through the model exactly, step by step (the same arithmetic as the DP)."""
    n, k, cap = model.steps, model.block, model.capacity
    age_cap = model.age_cap
    parallelism = np.empty(n, dtype=np.int64)
    backlog = np.empty(n)
    p, level, age, down = model.initial_parallelism, model.initial_backlog, age_cap, 0
    before = p  # the parallelism an in-place scale-up ramps from
    violations = cost = rescales = 0
    profiles: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for b, q in enumerate(schedule.tolist()):
        i0 = b * k
        length = min(k, n - i0)
        if q != p:
            if b < model.first_rescale_block:
                raise AssertionError("schedule rescales before its first decision")
            if age < age_cap and age * k * model.dt < model.busy_s(down) - EPSILON:
                raise AssertionError("schedule rescales during a restart")
            before, p, age, down, rescales = p, q, 0, int(q < p), rescales + 1
            level += model.replay
        if (age, length, down) not in profiles:
            profiles[(age, length, down)] = model.block_profile(age, length, down)
        running, old, exempt = profiles[(age, length, down)]
        for j in range(length):
            i = i0 + j
            processing = cap[p] * (running[j] - old[j]) + cap[before] * old[j]
            level = max(level + model.arrivals[i] - processing * model.factors[i], 0.0)
            if model.checked[i] and not exempt[j] and level > model.limits[i]:
                violations += 1
            parallelism[i], backlog[i] = p, level
        cost += p * length
        age = min(age + 1, age_cap)
    return Replayed(parallelism, backlog, violations, cost, rescales)
