"""Which configurations to measure, and what to answer (StreamBed's Resource Explorer,
its section VI).

- Bootstrap with the corners of the testbed (its fewest and most slots).
- Then Bayesian optimization: a Gaussian process over the candidates' cost (the lowest leave-one-out
  error among the scaling models once the candidate is measured) and expected improvement choose the
  next configuration to measure. At least three measurements beyond the corners; stop when the error
  rises by more than 10 % between two measurements, when every candidate is measured, or when the
  testbed budget (slot-seconds) is spent.
- The answer asks the chosen model for 110 % of the requested rate and takes the fewest slots whose
  predicted MST reaches it; a rate the model never reaches gets the best reachable rate instead.

A measurement that never sustains any rate is repeated once and then reported as unstable, never
fitted. The testbed is a protocol: the evaluation's job model (whose truth is known) or a live job.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

from capacity.mst import SENSIBILITY, Dichotomy, Step
from capacity.scaling import BY_NAME, Fit, fit_all, fit_curve

HEADROOM = 1.10  # StreamBed's over-provisioning: plan for 110 % of the requested rate
MIN_AFTER_CORNERS = 3
MAX_MEASUREMENTS = 20
ERROR_RISE = 0.10
LARGEST_ANSWER = 4096  # slots the answer may name


class Testbed(Protocol):
    """Runs the job at `slots` and a fixed injected rate (settling, then measuring)."""

    def run(self, slots: int, rate: float) -> Step: ...


@dataclass(frozen=True)
class Measurement:
    slots: int
    mst: float  # 0 when unstable
    steps: int
    slot_seconds: float
    stable: bool = True
    trace: tuple[Step, ...] = ()  # every step of the search(es), in order


@dataclass
class Exploration:
    """What was measured and the models fitted to it, best first."""

    measurements: list[Measurement] = field(default_factory=list)
    fits: list[Fit] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)  # the best model's LOO error after each measurement
    stopped: str = ""

    @property
    def stable(self) -> list[Measurement]:
        return [m for m in self.measurements if m.stable]

    @property
    def model(self) -> Fit:
        if not self.fits:
            raise ValueError("nothing could be fitted: too few stable measurements")
        return self.fits[0]

    @property
    def slot_seconds(self) -> float:
        return sum(m.slot_seconds for m in self.measurements)


def measure_mst(testbed: Testbed, slots: int, start: float, sensibility: float = SENSIBILITY,
                growth: float = 2.0) -> Measurement:
    """One configuration's MST by dichotomy (`Dichotomy`, its `growth` from `start`); repeated once
    if nothing was sustained."""
    spent, trace = 0.0, []
    for _ in range(2):
        search = Dichotomy(start=start, sensibility=sensibility, growth=growth)
        while not search.done:
            step = testbed.run(slots, search.target())
            search.update(step)
            spent += slots * step.measured_s
        trace += search.steps
        if search.mst > 0:
            return Measurement(slots, search.mst, len(trace), spent, trace=tuple(trace))
        start /= 4  # maybe the guess was far too high: try again from lower
    return Measurement(slots, 0.0, len(trace), spent, stable=False, trace=tuple(trace))


def from_smallest(measurements: Sequence[Measurement], seen: int = 2) -> list[dict[str, float]]:
    """What the `seen` smallest stable configurations predict for the other measured ones, against
    their measured MST: a power law through them (as the live planner extrapolates), pure."""
    stable = sorted((m for m in measurements if m.stable), key=lambda m: m.slots)
    learned = [m for m in stable if m.slots in sorted({m.slots for m in stable})[:seen]]
    beyond = [m for m in stable if m not in learned]
    if len({m.slots for m in learned}) < seen or not beyond:
        return []
    power = BY_NAME["power"]
    params = fit_curve(power, np.array([m.slots for m in learned], dtype=float), np.array([m.mst for m in learned]))
    if params is None:
        return []
    rows = []
    for m in beyond:
        predicted = float(power.curve(np.array([float(m.slots)]), *params)[0])
        rows.append({"slots": m.slots, "predicted": round(predicted, 1), "measured": round(m.mst, 1),
                     "error": round(predicted / m.mst - 1, 4)})
    return rows


def _fit(measurements: list[Measurement]) -> list[Fit]:
    stable = [m for m in measurements if m.stable]
    if len({m.slots for m in stable}) < 2:
        return []
    return fit_all([m.slots for m in stable], [m.mst for m in stable])


def _expected_improvement(gp: GaussianProcessRegressor, x: np.ndarray, best: float) -> np.ndarray:
    mean, sd = gp.predict(x, return_std=True)
    sd = np.maximum(sd, 1e-9)
    z = (best - mean) / sd
    return np.asarray((best - mean) * norm.cdf(z) + sd * norm.pdf(z))


def explore(testbed: Testbed, candidates: list[int], first_guess: float, budget_slot_s: float = math.inf,
            on_measured: Callable[[Measurement], None] | None = None, seed: int = 0,
            sensibility: float = SENSIBILITY, growth: float = 2.0,
            min_after_corners: int = MIN_AFTER_CORNERS) -> Exploration:
    """Measure the corners of `candidates` (slot counts), then the candidates Bayesian optimization
    picks, until a stop rule holds (the error rule only after `min_after_corners` more). `first_guess`
    is where the first dichotomy starts (records/s); later ones start from what was measured,
    extrapolated; each grows by `growth` (`Dichotomy`)."""
    todo = sorted(set(candidates))
    if not todo or todo[0] < 1:
        raise ValueError("candidates must be slot counts >= 1")
    result = Exploration()
    costs: dict[int, float] = {}

    def measure(slots: int) -> None:
        stable = result.stable
        # Start where a linear extrapolation of what is known puts it: few doubling steps.
        start = first_guess if not stable else max(m.mst / m.slots for m in stable) * slots
        measurement = measure_mst(testbed, slots, start, sensibility, growth)
        result.measurements.append(measurement)
        result.fits = _fit(result.measurements)
        error = result.fits[0].loo_error if result.fits else math.inf
        result.errors.append(error)
        costs[slots] = error
        if on_measured is not None:
            on_measured(measurement)

    for corner in dict.fromkeys((todo[0], todo[-1])):
        measure(corner)
    rng = np.random.default_rng(seed)
    while True:
        remaining = [c for c in todo if c not in costs]
        beyond = len(result.measurements) - 2
        if not remaining:
            result.stopped = "every candidate measured"
            break
        if len(result.measurements) >= MAX_MEASUREMENTS:
            result.stopped = f"{MAX_MEASUREMENTS} measurements"
            break
        if result.slot_seconds >= budget_slot_s:
            result.stopped = "budget spent"
            break
        finite = [e for e in result.errors if math.isfinite(e)]
        if beyond >= min_after_corners and len(finite) >= 2 and finite[-1] > finite[-2] * (1 + ERROR_RISE) \
                and finite[-2] > 0:
            result.stopped = "the models' error rose by more than 10 %"
            break
        measure(_next_candidate(costs, remaining, rng))
    return result


def _next_candidate(costs: dict[int, float], remaining: list[int], rng: np.random.Generator) -> int:
    """Expected improvement of a Gaussian process over the measured candidates' cost."""
    known = [(s, c) for s, c in costs.items() if math.isfinite(c)]
    if len(known) < 2:
        return remaining[len(remaining) // 2]
    x = np.log([[s] for s, _ in known])
    y = np.array([c for _, c in known])
    kernel = ConstantKernel(1.0) * Matern(length_scale=1.0, nu=2.5) + WhiteKernel(1e-4)
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, random_state=int(rng.integers(1 << 31)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x, y)
    ei = _expected_improvement(gp, np.log([[s] for s in remaining]), float(y.min()))
    return remaining[int(np.argmax(ei))]


@dataclass(frozen=True)
class Answer:
    """The recommendation for a requested rate."""

    rate: float
    reachable: bool
    slots: int | None  # fewest slots whose predicted MST covers 110 % of the rate (None if none does)
    predicted_mst: float  # at `slots`, or the best reachable MST
    low: float  # the interval on predicted_mst (see `recommend`)
    high: float
    best_slots: int  # where the model's MST peaks (its largest within LARGEST_ANSWER slots)
    model: str
    message: str
    models_disagree: bool = False  # plausible models differ by more than DISAGREEMENT at `slots`


DISAGREEMENT = 0.10


def plausible(fits: Sequence[Fit]) -> list[Fit]:
    """The models the measurements cannot tell apart from the best: leave-one-out error within two
    standard errors of the lowest."""
    if not fits:
        return []
    best = min(fits, key=lambda f: f.loo_error)
    return [f for f in fits if f.loo_error <= best.loo_error + 2 * best.loo_se]


def recommend(fits: Sequence[Fit], rate: float, headroom: float = HEADROOM, largest: int = LARGEST_ANSWER) -> Answer:
    """The fewest slots for `rate` x `headroom` by the chosen model (`fits[0]`); a rate beyond its
    reach gets the best reachable rate and what it takes, never a made-up configuration.

    Far beyond the testbed, curves that fit its measurements equally well (`plausible`) can part. When
    they differ by more than 10 % there, the answer provisions for the most pessimistic of them that
    reaches the rate, and says so: a plan must sustain the rate whichever of them is right. The
    interval is what the chosen model (+- 2 leave-one-out errors) and the plausible ones predict at
    the answer's slots."""
    if rate <= 0:
        raise ValueError("the requested rate must be > 0")
    if not fits:
        raise ValueError("no fitted model to answer with")
    model = fits[0]
    n = np.arange(1, largest + 1)
    predicted = model.predict(n)
    peak = int(n[int(np.argmax(predicted))])
    target = rate * headroom
    enough = np.flatnonzero(predicted >= target)
    if not enough.size:
        mst = float(predicted[peak - 1])
        low, high, disagree, caution = _spread(fits, model, peak, mst)
        return Answer(rate, False, None, mst, low, high, peak, model.name,
                      f"{rate:,.0f} rec/s is out of reach: the {model.name} model peaks at {mst:,.0f} rec/s with "
                      f"{peak} slots, {mst / headroom:,.0f} rec/s with the {headroom:.0%} headroom{caution}", disagree)
    at = int(n[enough[0]])
    low, high, disagree, caution = _spread(fits, model, at, float(predicted[at - 1]))
    basis = model
    if disagree:
        for other in plausible(fits):
            reach = np.flatnonzero(other.predict(n) >= target)
            if reach.size and int(n[reach[0]]) > at:
                at, basis = int(n[reach[0]]), other
        low, high, _, caution = _spread(fits, model, at, float(predicted[at - 1]))
    mst = min(float(predicted[at - 1]), basis.at(at))
    pessimistic = f" (for the {basis.name} model, the most pessimistic that fits)" if basis is not model else ""
    return Answer(rate, True, at, mst, low, high, peak, model.name,
                  f"{at} slots{pessimistic}: predicted MST {mst:,.0f} rec/s (plans for {headroom:.0%} of "
                  f"{rate:,.0f}){caution}", disagree)


def _spread(fits: Sequence[Fit], model: Fit, at: int, mst: float) -> tuple[float, float, bool, str]:
    others = [f.at(at) for f in plausible(fits)]
    low = min([mst * (1 - 2 * model.loo_error), *others])
    high = max([mst * (1 + 2 * model.loo_error), *others])
    disagree = max(others, default=mst) - min(others, default=mst) > DISAGREEMENT * mst
    caution = (f"; caution: models that fit the testbed as well predict {low:,.0f}-{high:,.0f} rec/s at {at} "
               "slots (measure on more slots to tell them apart)") if disagree else ""
    return low, high, disagree, caution
