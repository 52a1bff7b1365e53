"""Executor profiles: how one executor's throughput depends on its cores and memory, learned from few
samples, and the cheapest profile for a rate (QEScalor, Mu et al., ICCS 2020).

- **Dynamic sampling** (QEScalor's DSA, its Algorithm 1): along each resource axis (here memory, for
  each core count) the sampler grows its step where the performance changes little and goes back to
  the smallest step where it changes a lot; where the performance falls as resources grow (noise, not
  the job), it measures both points again and keeps the mean (re-sampling where it fluctuates). An
  axis ends when the performance no longer increases with the resource.
- **The model** (QEScalor's OPRPM): a random-forest regression over (cores, memory, memory per core)
  -> one executor's maximum sustainable throughput per core, with QEScalor's settings (100 trees,
  bootstrap, leaves of one). Per core, because a tree averages samples of different core counts, and
  per core they differ far less than per executor. Its interval is the spread of the trees. A forest
  does not extrapolate: beyond the largest memory sampled at a core count (where the sampler found no
  more gain) it is asked at that memory, and the plan only asks about profiles within the sampled
  cores.
- **The plan** (QEScalor's QCESA, reduced to one operator and one profile per job: Spark gives every
  executor of an application the same cores and memory): for each candidate profile, the fewest
  executors whose summed predicted throughput reaches the rate with StreamBed's 110 % headroom
  (QEScalor sums instances' performance), priced per core and per GB; the cheapest wins.

Pure: the sampler asks a `measure(profile)` callable; the evaluation's testbed or a cluster answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.ensemble import RandomForestRegressor

HEADROOM = 1.10  # StreamBed's: plan for 110 % of the requested rate
MAX_EXECUTORS = 4096  # the most executors a plan may name
FLAT = 0.02  # a relative change below this is "little": the step doubles
STEEP = 0.10  # above this the points skipped in between are sampled too
FLUCTUATION = 0.03  # a fall larger than this as memory grows is noise to measure again
MAX_STRIDE = 4  # the largest step, in grid points


@dataclass(frozen=True, order=True)
class Profile:
    """One executor's resources."""

    cores: int
    memory_gb: float

    def __post_init__(self) -> None:
        if self.cores < 1 or not (self.memory_gb > 0 and math.isfinite(self.memory_gb)):
            raise ValueError(f"a profile needs at least one core and a positive memory, got {self}")

    def price(self, core_price: float, gb_price: float) -> float:
        return self.cores * core_price + self.memory_gb * gb_price

    def __str__(self) -> str:
        return f"{self.cores} core{'s' if self.cores > 1 else ''}, {self.memory_gb:g} GB"


@dataclass(frozen=True)
class Sample:
    profile: Profile
    throughput: float  # one executor's MST (rec/s); 0 when unstable
    measurements: int = 1  # more than one where it was measured again (fluctuation)
    stable: bool = True  # False: the testbed sustained nothing, twice; reported, never fitted


# A measure answers one executor's MST at a profile, or None when the run never stabilised (the
# testbed has already repeated it once).
Measure = Callable[[Profile], float | None]


def _sample(profile: Profile, throughput: float | None) -> Sample:
    return Sample(profile, 0.0, stable=False) if throughput is None else Sample(profile, throughput)


def fixed_sampling(measure: Measure, cores: Sequence[int], memory_gb: Sequence[float], stride: int) -> list[Sample]:
    """QEScalor's baseline (FSSA): every `stride`-th memory size for each core count, and the largest."""
    if stride < 1:
        raise ValueError("the stride must be at least 1")
    grid = sorted(memory_gb)
    picks = sorted(set(range(0, len(grid), stride)) | {len(grid) - 1})
    return [_sample(Profile(c, grid[i]), measure(Profile(c, grid[i]))) for c in sorted(cores) for i in picks]


def dynamic_sampling(measure: Measure, cores: Sequence[int], memory_gb: Sequence[float], flat: float = FLAT,
                     steep: float = STEEP, fluctuation: float = FLUCTUATION, max_stride: int = MAX_STRIDE,
                     ) -> list[Sample]:
    """QEScalor's dynamic sampling along memory, for each core count (see the module). A profile whose
    run never stabilised is reported as unstable and stepped over (to the next size)."""
    grid = sorted(memory_gb)
    if len(grid) < 2 or not cores:
        raise ValueError("dynamic sampling needs at least one core count and two memory sizes")
    samples: list[Sample] = []
    for c in sorted(cores):
        samples += _axis(lambda i, c=c: measure(Profile(c, grid[i])), len(grid), flat, steep, fluctuation,
                         max_stride, lambda i, c=c: Profile(c, grid[i]))
    return samples


def _axis(at: Callable[[int], float | None], size: int, flat: float, steep: float, fluctuation: float,
          max_stride: int, profile: Callable[[int], Profile]) -> list[Sample]:
    seen: dict[int, list[float]] = {}
    unstable: set[int] = set()

    def value(i: int) -> float:
        return float(np.mean(seen[i]))

    def sample(i: int) -> float | None:
        measured = at(i)
        if measured is None:
            unstable.add(i)
            return None
        seen.setdefault(i, []).append(measured)
        return value(i)

    last = 0  # the last stable point
    while last < size and sample(last) is None:
        last += 1
    i, stride = last, 1
    while i < size - 1:
        j = min(i + stride, size - 1)
        before, after = value(last), sample(j)
        i = j
        if after is None:
            stride = 1  # step over it, from the last stable point
            continue
        if after < before * (1 - fluctuation) and len(seen[j]) == 1:
            # Less throughput with more memory: measure both again (re-sampling where it fluctuates),
            # each point at most twice.
            before = (sample(last) or before) if len(seen[last]) == 1 else before
            after = sample(j) or after
        change = abs(after - before) / max(before, after, 1e-9)
        if change > steep and j - last > 1:
            for k in range(last + 1, j):  # it changes a lot here: the points skipped are sampled too
                if k not in seen and k not in unstable:
                    sample(k)
            stride = 1
        elif change < flat:
            if after <= before * (1 + flat) and stride >= 2:
                break  # it no longer increases with memory (over a doubled step): the axis ends
            stride = min(2 * stride, max_stride)
        last = j
    return sorted([*(Sample(profile(k), value(k), len(v)) for k, v in seen.items()),
                   *(Sample(profile(k), 0.0, stable=False) for k in unstable - set(seen))],
                  key=lambda s: s.profile)


def features(profiles: Sequence[Profile]) -> np.ndarray:
    """Cores, memory and memory per core: the trees split on what each core's tasks have to hold."""
    return np.array([[p.cores, p.memory_gb, p.memory_gb / p.cores] for p in profiles], dtype=float)


class ProfileModel:
    """A random forest over (cores, memory) -> one executor's throughput (QEScalor's OPRPM)."""

    def __init__(self, trees: int = 100, seed: int = 0) -> None:
        self.forest = RandomForestRegressor(n_estimators=trees, bootstrap=True, min_samples_leaf=1,
                                            random_state=seed)
        self.samples: list[Sample] = []

    def update(self, samples: Sequence[Sample]) -> ProfileModel:
        """Fit to every stable sample so far (unstable ones are never fitted)."""
        self.samples = [*self.samples, *(s for s in samples if s.stable)]
        if len(self.samples) < 2:
            raise ValueError("the model needs at least two samples")
        x = features([s.profile for s in self.samples])
        # The trees learn each core's share: core counts then differ far less than executors do, and
        # what a tree averages across them biases its answer less.
        self.forest.fit(x, np.array([s.throughput / s.profile.cores for s in self.samples]))
        return self

    def within(self, profile: Profile) -> bool:
        """Whether the profile lies inside the sampled range (a forest does not extrapolate): its cores
        between the sampled core counts, its memory at least the smallest sampled."""
        cores = [s.profile.cores for s in self.samples]
        memory = [s.profile.memory_gb for s in self.samples]
        return min(cores) <= profile.cores <= max(cores) and profile.memory_gb >= min(memory)

    def _asked(self, profile: Profile) -> Profile:
        """Beyond the largest memory sampled at a core count, the sampler found no more gain: the model
        is asked at that memory (else the forest would answer with other core counts' larger memories)."""
        top = max((s.profile.memory_gb for s in self.samples if s.profile.cores == profile.cores), default=None)
        return Profile(profile.cores, top) if top is not None and profile.memory_gb > top else profile

    def predict(self, profiles: Sequence[Profile]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mean, and the 10th and 90th percentiles over the trees, per profile."""
        if not self.samples:
            raise ValueError("the model has no samples yet")
        asked = [self._asked(q) for q in profiles]
        cores = np.array([q.cores for q in asked], dtype=float)
        per_tree = np.array([tree.predict(features(asked)) for tree in self.forest.estimators_]) * cores
        return per_tree.mean(axis=0), np.percentile(per_tree, 10, axis=0), np.percentile(per_tree, 90, axis=0)


@dataclass(frozen=True)
class ProfilePlan:
    profile: Profile
    executors: int
    throughput: float  # predicted for the plan (executors x one executor's)
    low: float
    high: float
    cost: float  # per hour, at the prices given

    @property
    def message(self) -> str:
        return (f"{self.executors} executors of {self.profile}: {self.throughput:,.0f} rec/s predicted "
                f"({self.low:,.0f}-{self.high:,.0f}), {self.cost:.3f} per hour")

    def row(self) -> dict[str, Any]:
        """The plan as a report's JSON holds it."""
        return {"profile": str(self.profile), "cores": self.profile.cores, "memory_gb": self.profile.memory_gb,
                "executors": self.executors, "predicted": self.throughput, "low": self.low, "high": self.high,
                "cost_per_hour": self.cost}


def cheapest_plan(predicted: dict[Profile, tuple[float, float, float]], rate: float, core_price: float,
                  gb_price: float, headroom: float = HEADROOM, max_executors: int = MAX_EXECUTORS,
                  ) -> ProfilePlan | None:
    """The cheapest (profile, executors) whose predicted throughput reaches headroom x rate; None if no
    candidate does within `max_executors`. `predicted` maps a profile to (mean, low, high) per executor."""
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError("the rate must be a positive number")
    best: ProfilePlan | None = None
    for profile, (mean, low, high) in sorted(predicted.items()):
        if mean <= 0:
            continue
        n = math.ceil(headroom * rate / mean - 1e-9)
        if n > max_executors:
            continue
        plan = ProfilePlan(profile, n, n * mean, n * low, n * high, n * profile.price(core_price, gb_price))
        if best is None or (plan.cost, plan.executors) < (best.cost - 1e-12, best.executors):
            best = plan
    return best


@dataclass(frozen=True)
class ForestPlan:
    """The forest fitted to the samples, its prediction (mean, low, high) for every profile of the grid,
    those of them within the sampled range (the candidates), and the cheapest plan among them."""

    model: ProfileModel
    predicted: dict[Profile, tuple[float, float, float]]
    candidates: dict[Profile, tuple[float, float, float]]
    plan: ProfilePlan | None


def plan_from_samples(samples: Sequence[Sample], grid: Sequence[Profile], rate: float, core_price: float,
                      gb_price: float, seed: int = 0) -> ForestPlan:
    """Fit the forest to the stable samples, predict the grid and plan `rate` (QEScalor's OPRPM, then QCESA)."""
    model = ProfileModel(seed=seed).update([s for s in samples if s.stable])
    mean, low, high = model.predict(grid)
    predicted = {p: (float(a), float(b), float(c)) for p, a, b, c in zip(grid, mean, low, high, strict=True)}
    candidates = {p: v for p, v in predicted.items() if model.within(p)}
    return ForestPlan(model, predicted, candidates, cheapest_plan(candidates, rate, core_price, gb_price))


def best_reachable(predicted: dict[Profile, tuple[float, float, float]], max_executors: int = MAX_EXECUTORS,
                   ) -> tuple[Profile, float]:
    """What a rate no plan reaches is told instead: the profile with the most predicted throughput per
    executor and what `max_executors` of them would carry."""
    profile = max(predicted, key=lambda p: predicted[p][0])
    return profile, max_executors * predicted[profile][0]


MIN_PLANNED_ERROR = 0.05  # a planned capacity is never trusted more than this (its weight against measurements)


def slot_curve(plan: ProfilePlan, max_slots: int) -> tuple[dict[int, float], float]:
    """The planned capacity per task-slot count for a job whose executors all have the plan's profile,
    and its relative error: what seeds the job's planner (`JobConfig.planned_capacity`).

    A job of `cores`-core executors runs k executors at k x cores slots, so the curve names only those
    counts (up to `max_slots`): k times one executor's predicted throughput, executors adding up as
    QEScalor sums instances. The error is the forest's band at the profile (half its 10-90th
    percentile width over the mean), at least `MIN_PLANNED_ERROR`."""
    if max_slots < 1:
        raise ValueError("max_slots must be >= 1")
    mean, low, high = (v / plan.executors for v in (plan.throughput, plan.low, plan.high))
    cores = plan.profile.cores
    curve = {k * cores: round(k * mean, 1) for k in range(1, max_slots // cores + 1)}
    error = max(MIN_PLANNED_ERROR, (high - low) / (2 * mean)) if mean > 0 else 1.0
    return curve, error
