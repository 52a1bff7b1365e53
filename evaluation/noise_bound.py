"""A noise-aware bound beside the oracle: what a schedule costs that knows the load but not the noise.

Pure: no I/O. The oracle (`evaluation.oracle`) knows each window's noise, the factor every instance's rate is
multiplied by (GC pauses, co-located load; `evaluation.simulator.rate_factors`), and times its rescales to
exploit it. No policy can. This bound keeps the oracle's knowledge of the arrivals and of the job model but
not of the noise: its schedule is fixed in advance and must keep the backlog target with the probability the
planner aims for, over noise drawn from the same law (log-normal, mean 1, log-sd `sigma`, one factor per
window). It is a chance-constrained optimum in the sense of Charnes and Cooper ("Chance-constrained
programming", Management Science 1959), solved by its scenario approximation (Calafiore and Campi, "The
scenario approach to robust control design", IEEE TAC 2006): a schedule is accepted when, on at least
`probability` of `scenarios` noise draws, it spends at most `allowed_beyond_share` of the run beyond the target.

The search is over one family, the deterministic equivalents: the oracle's schedule for a constant capacity
factor `margin` (every window's capacity is `margin` times its mean). `margin` = 1 plans on the mean (the
target is kept about half the time); the per-window quantile exp(-sigma^2 / 2 - z sigma) is safe window by
window, and more than the backlog allowance needs, since a backlog averages the noise of several windows.
Bisection finds the largest accepted margin between them; the bound is the cheapest accepted schedule tried.

What it is and is not:
- An achievable open-loop schedule, so it is an upper bound of the open-loop chance-constrained optimum (a
  schedule with a different margin per window could cost less) and it is exact about the arrivals, which a
  policy has to estimate.
- Not a lower bound of every online policy: a policy sees the backlog, so it can react to the noise that has
  happened, which a fixed schedule cannot. Read `policy / bound` as how much of the gap to the oracle is the
  price of not knowing the noise (the bound's own ratio to the oracle) and how much is left (the policy's
  ratio to the bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from evaluation.oracle import oracle_with_restarts, replay_schedule

ALLOWED_BEYOND_SHARE = 0.001  # the floor: at most 0.1 % of a run beyond the backlog target
SCENARIOS = 40  # noise draws a schedule is judged on
BISECTIONS = 5  # margin steps after the two ends: a margin within (1 - quantile) / 32 of the best
NOISE_STREAM = 0x6E6F6973  # keeps the bound's noise draws apart from the evaluation's seeds


@dataclass(frozen=True)
class NoiseAwareBound:
    """The cheapest accepted schedule (see the module docstring) and how it fares.

    `margin`: the constant capacity factor it was planned with. `feasible`: the oracle found a schedule that
    keeps the target at that margin. `accepted`: whether any schedule met the chance constraint (False: the
    schedule tried with the least time beyond the target is returned). `beyond_target_s`: over the
    scenarios, the `probability` quantile of the seconds beyond the target. `solves`: oracle searches run.
    """

    slot_seconds: float
    rescales: int
    margin: float
    feasible: bool
    accepted: bool
    beyond_target_s: float
    probability: float
    scenarios: int
    solves: int
    parallelism: np.ndarray


def noise_draws(windows: int, steps_per_window: int, sigma: float, scenarios: int, seed: int) -> np.ndarray:
    """`scenarios` rows of per-step factors: one log-normal factor (mean 1, log-sd `sigma`) per window, held
    for its steps, drawn from a stream of `seed` kept apart from the evaluation's own draws."""
    rng = np.random.default_rng([NOISE_STREAM, seed])
    if sigma <= 0:
        return np.ones((scenarios, windows * steps_per_window))
    factors = rng.lognormal(-sigma**2 / 2, sigma, (scenarios, windows))
    return np.repeat(factors, steps_per_window, axis=1)


def noise_aware_bound(arrival_rates: np.ndarray, capacity: np.ndarray, dt: float, *, sigma: float,
                      probability: float = 0.9, allowed_beyond_share: float = ALLOWED_BEYOND_SHARE,
                      scenarios: int = SCENARIOS, seed: int = 0, **oracle_args: Any) -> NoiseAwareBound:
    """The bound for a load (`arrival_rates` per step of `dt` seconds) on a job (`capacity` per parallelism),
    with the oracle's arguments (`oracle_with_restarts`; `rate_factors` is the bound's to choose and must not be
    passed). Windows are `check_every` steps (the rule is checked once per window, as the oracle's is); time
    beyond the target is counted in whole windows, as the simulator counts it."""
    if "rate_factors" in oracle_args:
        raise ValueError("the bound does not know the noise: pass sigma, not rate_factors")
    if not 0 < probability < 1:
        raise ValueError("probability must be in (0, 1)")
    if sigma < 0 or scenarios < 1 or not 0 <= allowed_beyond_share < 1:
        raise ValueError("sigma must be >= 0, scenarios >= 1 and allowed_beyond_share in [0, 1)")
    rates = np.asarray(arrival_rates, dtype=float)
    per_window = int(oracle_args.get("check_every", 1))
    window_s = per_window * dt
    windows = math.ceil(len(rates) / per_window)
    draws = noise_draws(windows, per_window, sigma, scenarios, seed)[:, : len(rates)]
    allowed_s = allowed_beyond_share * len(rates) * dt
    z = NormalDist().inv_cdf(probability)
    tried: list[NoiseAwareBound] = []

    def attempt(margin: float) -> NoiseAwareBound:
        result = oracle_with_restarts(rates, capacity, dt, rate_factors=np.full(len(rates), margin), **oracle_args)
        beyond = np.array([replay_schedule(result.parallelism, rates, capacity, dt, rate_factors=draw,
                                           **oracle_args).violations for draw in draws]) * window_s
        quantile = float(np.quantile(beyond, probability, method="higher"))
        bound = NoiseAwareBound(
            slot_seconds=result.slot_seconds, rescales=result.rescales, margin=margin, feasible=result.feasible,
            accepted=bool(result.feasible and quantile <= allowed_s + 1e-9), beyond_target_s=quantile,
            probability=probability, scenarios=scenarios, solves=len(tried) + 1, parallelism=result.parallelism)
        tried.append(bound)
        return bound

    safe = math.exp(-(sigma**2) / 2 - z * sigma)
    low = attempt(safe)
    while not low.accepted and low.feasible and low.margin > 0.5:  # the per-window quantile misses: more caution
        low = attempt(low.margin * 0.9)
    if low.accepted and not (high := attempt(1.0)).accepted:
        lo, hi = low.margin, high.margin
        for _ in range(BISECTIONS):
            middle = attempt((lo + hi) / 2)
            lo, hi = (middle.margin, hi) if middle.accepted else (lo, middle.margin)
    accepted = [b for b in tried if b.accepted]
    best = (min(accepted, key=lambda b: (b.slot_seconds, -b.margin)) if accepted
            else min(tried, key=lambda b: (b.beyond_target_s, b.slot_seconds)))
    return NoiseAwareBound(**{**best.__dict__, "solves": len(tried)})
