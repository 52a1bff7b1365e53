"""Scaling models: how a job's maximum sustainable throughput (MST) grows with its slots.

StreamBed (capacity planning for stream processing from small-scale runs, its section VI) fits
candidate surrogate models to MSTs measured on a small testbed, scores them by leave-one-out error
and extrapolates the chosen one to budgets the testbed cannot run (it chooses by how well the lower
half of the measurements predicts the upper half; here the leave-one-out error chooses, a near tie
going to the model with fewer parameters). StreamBed's candidates are linear, logarithmic and square-root regressions;
ours are the curves the scaling literature names for parallel systems, each monotone or with a
single peak:

- `linear`: r(n) = a n + b (stateless work: every slot adds the same);
- `amdahl`: r(n) = r1 n / (1 + s (n - 1)), a serial share s (Amdahl's law);
- `usl`: r(n) = r1 n / (1 + s (n - 1) + k n (n - 1)), contention s and coherency k (Gunther's
  Universal Scalability Law; with k > 0 the curve peaks and then falls);
- `power`: r(n) = a n^b (sub-linear growth without a ceiling);
- `knee`: r(n) = a n up to a knee k, then each further slot adds a share e of one (a shared resource
  runs out at k slots: the shape the evaluation's job model has).

Pure: numpy and scipy only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

Curve = Callable[..., np.ndarray]


def _linear(n: np.ndarray, a: float, b: float) -> np.ndarray:
    return a * n + b


def _amdahl(n: np.ndarray, r1: float, s: float) -> np.ndarray:
    return r1 * n / (1 + s * (n - 1))


def _usl(n: np.ndarray, r1: float, s: float, k: float) -> np.ndarray:
    return r1 * n / (1 + s * (n - 1) + k * n * (n - 1))


def _power(n: np.ndarray, a: float, b: float) -> np.ndarray:
    return a * np.power(n, b)


def _knee(n: np.ndarray, a: float, knee: float, e: float) -> np.ndarray:
    return a * (np.minimum(n, knee) + e * np.maximum(0.0, n - knee))


@dataclass(frozen=True)
class Candidate:
    """A curve, its parameters' starting point and bounds (scaled by the first slot's rate `r1`)."""

    name: str
    curve: Curve
    start: Callable[[float, float], list[float]]  # (r1, largest n) -> p0
    bounds: Callable[[float, float], tuple[list[float], list[float]]]
    min_points: int


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("linear", _linear, lambda r1, _: [r1, 0.0], lambda r1, _: ([0.0, -10 * r1], [10 * r1, 10 * r1]), 2),
    Candidate("amdahl", _amdahl, lambda r1, _: [r1, 0.01], lambda r1, _: ([0.0, 0.0], [10 * r1, 1.0]), 2),
    Candidate("usl", _usl, lambda r1, _: [r1, 0.01, 1e-4], lambda r1, _: ([0.0, 0.0, 0.0], [10 * r1, 1.0, 1.0]), 3),
    Candidate("power", _power, lambda r1, _: [r1, 0.9], lambda r1, _: ([0.0, 0.0], [10 * r1, 1.5]), 2),
    Candidate("knee", _knee, lambda r1, top: [r1, max(1.0, top / 2), 0.5],
              lambda r1, top: ([0.0, 1.0, 0.0], [10 * r1, max(1.0 + 1e-9, top), 1.0]), 4),
)
BY_NAME = {c.name: c for c in CANDIDATES}


@dataclass(frozen=True)
class Fit:
    """One candidate fitted to (slots, MST) points; `loo_error` is its leave-one-out relative RMSE,
    `loo_se` that error's standard error."""

    name: str
    params: tuple[float, ...]
    loo_error: float
    loo_se: float = 0.0

    def predict(self, n: float | Sequence[float] | np.ndarray) -> np.ndarray:
        x = np.asarray(n, dtype=float)
        return np.asarray(BY_NAME[self.name].curve(x, *self.params), dtype=float)

    def at(self, n: float) -> float:
        return float(self.predict([n])[0])


def fit_curve(candidate: Candidate, n: np.ndarray, mst: np.ndarray) -> tuple[float, ...] | None:
    """Least squares on relative errors (every point counts alike, small and large); None if it fails."""
    r1 = float(mst[np.argmin(n)] / max(1.0, float(np.min(n))))
    top = float(np.max(n))
    starts = [candidate.start(r1, top)]
    if candidate.name == "knee":  # the knee's position is a step: start from each measured slot count
        starts = [[r1, float(k), 0.5] for k in np.unique(n)[1:-1]] or starts
    best: tuple[float, tuple[float, ...]] | None = None
    low, high = candidate.bounds(r1, top)
    for p0 in starts:
        p0 = [min(max(v, lo), hi) for v, lo, hi in zip(p0, low, high, strict=True)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)  # the covariance is not used
                params, _ = curve_fit(candidate.curve, n, mst, p0=p0, bounds=(low, high), sigma=mst, maxfev=20_000)
        except (RuntimeError, ValueError):
            continue
        residual = float(np.sum(((candidate.curve(n, *params) - mst) / mst) ** 2))
        if best is None or residual < best[0]:
            best = (residual, tuple(float(p) for p in params))
    return None if best is None else best[1]


def loo_errors(candidate: Candidate, n: np.ndarray, mst: np.ndarray) -> np.ndarray | None:
    """Leave-one-out cross-validation (StreamBed): refit without each point and predict it; the
    relative errors, one per point (None when a fold cannot be fitted)."""
    errors = []
    for i in range(len(n)):
        keep = np.arange(len(n)) != i
        params = fit_curve(candidate, n[keep], mst[keep])
        if params is None:
            return None
        errors.append((float(candidate.curve(np.array([n[i]]), *params)[0]) - mst[i]) / mst[i])
    return np.array(errors)


def rmse_and_se(errors: np.ndarray) -> tuple[float, float]:
    """The RMSE of `errors` and its standard error (delta method on the mean squared error)."""
    squared = np.square(errors)
    rmse = float(np.sqrt(squared.mean()))
    if len(errors) < 2 or rmse == 0:
        return rmse, 0.0
    return rmse, float(squared.std(ddof=1) / math.sqrt(len(errors)) / (2 * rmse))


def fit_all(slots: Sequence[float], mst: Sequence[float]) -> list[Fit]:
    """Every candidate with enough points (one more than its parameters, for leave-one-out), best first
    (none: too few points).

    The one-standard-error rule (Breiman et al.; Hastie, Tibshirani and Friedman, 7.10): the model
    with the fewest parameters whose leave-one-out error is within one standard error of the lowest
    comes first. On few, noisy points a flexible curve fits the noise and extrapolates it."""
    n, r = np.asarray(slots, dtype=float), np.asarray(mst, dtype=float)
    if len(n) < 2 or np.any(r <= 0) or np.any(n < 1):
        raise ValueError("need at least two measurements with slots >= 1 and a positive MST")
    fits = []
    for candidate in CANDIDATES:
        if len(np.unique(n)) < candidate.min_points + 1:
            continue
        params = fit_curve(candidate, n, r)
        errors = loo_errors(candidate, n, r) if params is not None else None
        if params is not None and errors is not None:
            fits.append(Fit(candidate.name, params, *rmse_and_se(errors)))
    if not fits:
        return []
    best = min(fits, key=lambda f: f.loo_error)
    within = best.loo_error + best.loo_se
    return sorted(fits, key=lambda f: (f.loo_error > within, len(f.params), f.loo_error))


def select(slots: Sequence[float], mst: Sequence[float]) -> Fit:
    """The model to extrapolate with (the one-standard-error rule on the leave-one-out error)."""
    fits = fit_all(slots, mst)
    if not fits:
        raise ValueError(f"too few measurements to fit a scaling model: {len(set(slots))} slot counts")
    return fits[0]
