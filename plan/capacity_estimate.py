"""The capacity model of the default planner: what a job processes at each parallelism, from what it
measured and, before it ran, from its planned capacity.

DS2's true rates (Kalavri et al., OSDI 2018) measured at each parallelism the job ran at, averaged per
parallelism (`Measured`), extrapolated to the others along a power law fitted through them (slots never
add more than linearly; Daedalus, Pfister et al. 2024, regresses capacity on parallelism the same way),
taken at a lower quantile so that a plan errs on the safe side. A StreamBed plan (`capacity`) is
one more estimate, weighted by its error. Welford statistics of the per-slot rate (`SlotStats`) give
the noise the quantile uses.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict

from contracts.jobs import parse_planned_capacity
from plan.batching import KNOWN_WINDOWS, running_weight

EXPONENT_PRIOR = 0.95  # capacity ~ p^0.95 beyond what was measured, until two parallelisms were
EXPONENT_RANGE = (0.5, 1.0)
FIT_MIN_WINDOWS = 3  # a parallelism's capacity shapes the curve once measured over this many windows
EXTRAPOLATION_ERROR = 0.05  # relative error of a capacity extrapolated by a factor of 2 in parallelism


class Measured(BaseModel):
    """The capacity measured at one parallelism (records/s): a running mean of its windows, then an
    exponentially weighted one (weight 1 / KNOWN_WINDOWS), and how many windows are behind it.

    `provisional`: only from windows whose DS2 rate could not be raised to a full batch's yet (small
    batches, before the per-task fit and a full batch were measured): an underestimate, replaced by the
    first window that can be (`learned`), not averaged with it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity: float
    n: int = 1
    provisional: bool = False

    def add(self, value: float) -> Measured:
        n = self.n + 1
        weight = running_weight(n, KNOWN_WINDOWS)
        return self.model_copy(update={"capacity": (1 - weight) * self.capacity + weight * value, "n": n})

    def learned(self, value: float, provisional: bool) -> Measured:
        """With one more window's capacity: a provisional window does not move a corrected estimate,
        and the first corrected window replaces a provisional one."""
        if provisional and not self.provisional:
            return self
        if self.provisional and not provisional:
            return Measured(capacity=value)
        return self.add(value)

    @property
    def effective(self) -> int:
        """The windows the mean is worth: n, at most 2 KNOWN_WINDOWS - 1 (an exponential mean's worth)."""
        return min(self.n, 2 * KNOWN_WINDOWS - 1)


class SlotStats(BaseModel):
    """Welford statistics of the per-slot true rate at one parallelism, since the job runs at it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parallelism: int
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, value: float) -> SlotStats:
        n = self.n + 1
        delta = value - self.mean
        mean = self.mean + delta / n
        return self.model_copy(update={"n": n, "mean": mean, "m2": self.m2 + delta * (value - mean)})

    @property
    def cv(self) -> float | None:
        """The per-window coefficient of variation, once three windows were seen."""
        if self.n < 3 or self.mean <= 0:
            return None
        return math.sqrt(self.m2 / (self.n - 1)) / self.mean


def capacities(known: dict[str, Measured], max_parallelism: int, noise_cv: float, z: float,
               planned: dict[int, float] | None = None, planned_error: float = 0.1) -> np.ndarray:
    """A lower quantile of the capacity at p = 0..max (index 0 is 0).

    Every measured parallelism q gives an estimate at p: its measured capacity scaled by (p / q)^k,
    with k fitted through the points measured over FIT_MIN_WINDOWS windows or more (a power law, k in
    EXPONENT_RANGE; EXPONENT_PRIOR until two such points) above q, and k = 1 below it (no better than
    linear there: the safe side).
    Each estimate's relative variance is the measurement's (cv^2 / the windows it is worth) plus
    EXTRAPOLATION_ERROR per doubling of p / q, squared; the estimates are pooled by inverse variance,
    so one noisy window at a new parallelism does not outweigh what the others imply. The quantile is
    the pooled estimate less z times its error. The window-to-window noise itself is left out: the backlog sums it over
    the many windows it takes to fill the target, where it averages away; the error of the mean
    does not.
    A `planned` capacity (StreamBed's plan, made before the job ran: `capacity`) is one more
    estimate at each p it names, of relative error `planned_error`: alone it sizes a new job's first
    decision; measured windows outweigh it as they accumulate."""
    points = sorted((int(p), m) for p, m in known.items() if m.capacity > 0)
    planned = {p: c for p, c in (planned or {}).items() if 1 <= p <= max_parallelism and c > 0}
    out = np.zeros(max_parallelism + 1)
    if not points and not planned:
        return out
    settled = [(p, m) for p, m in points if m.n >= FIT_MIN_WINDOWS]
    if len(settled) >= 2:
        x = np.log([p for p, _ in settled])
        y = np.log([m.capacity for _, m in settled])
        exponent = float(np.clip(np.polyfit(x, y, 1)[0], *EXPONENT_RANGE))
    else:
        exponent = EXPONENT_PRIOR
    # Every p at once: a row per p, a column per measured parallelism and a last one for the plan (weight 0
    # where none is planned at p, which adds exactly nothing to the sums).
    q = np.array([p for p, _ in points], dtype=float)
    c = np.array([m.capacity for _, m in points])
    n = np.array([m.effective for _, m in points], dtype=float)
    ps = np.arange(1, max_parallelism + 1, dtype=float)[:, None]
    ratio = ps / q
    estimates = np.empty((max_parallelism, q.size + 1))
    weights = np.zeros_like(estimates)
    estimates[:, :-1] = c * ratio ** np.where(ps > q, exponent, 1.0)
    weights[:, :-1] = 1 / np.maximum(noise_cv**2 / n + (np.log2(ratio) * EXTRAPOLATION_ERROR) ** 2, 1e-12)
    estimates[:, -1] = [planned.get(p, 0.0) for p in range(1, max_parallelism + 1)]
    weights[:, -1] = [1 / max(planned_error**2, 1e-12) if p in planned else 0.0 for p in range(1, max_parallelism + 1)]
    total = weights.sum(axis=1)
    known_at = total > 0  # nothing measured and nothing planned at p: 0
    estimate = (weights * estimates).sum(axis=1)[known_at] / total[known_at]
    relative = np.sqrt(1 / total[known_at])
    out[1:][known_at] = estimate * np.maximum(0.5, 1 - z * relative)
    return np.maximum.accumulate(out)


@lru_cache(maxsize=1024)
def planned_capacity(value: str) -> tuple[tuple[int, float], ...]:
    """A job's planned capacity, parsed once per distinct setting (a plan holds up to 4,096 pairs and
    every window of the job would parse it again)."""
    return tuple(parse_planned_capacity(value).items())


def in_waves(capacity: np.ndarray, tasks: list[int]) -> np.ndarray:
    """The capacity at p = 0..max of a job whose stages run a fixed number of tasks each (`tasks`: one
    count per stage that cannot split further, e.g. the shuffle partitions of a job rescaled in place).

    A stage of T tasks on p slots runs in ceil(T / p) waves, so it works as fast as T / ceil(T / p)
    fully busy slots: 4 tasks on 3 slots take two waves, as on 2 slots. `capacity` counts busy slots (DS2's
    true rates are per busy second), so the capacity at p is the one at that many busy slots,
    interpolated between integers, and the slowest stage bounds the job. (Partition alignment in
    `plan.controls` rounds a chosen parallelism; this lets the search see the waste before it chooses.)"""
    out = capacity.copy()
    slots = np.arange(len(capacity))
    for count in tasks:
        if count < 1:
            continue
        busy = count / np.ceil(count / np.maximum(slots[1:], 1))
        out[1:] = np.minimum(out[1:], np.interp(busy, slots, capacity))
    return out
