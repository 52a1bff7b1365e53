"""Daedalus's capacity model: the records per second a job can process at a scale-out.

Per worker, throughput (records/s) is linear in CPU utilization (or busy fraction), so a
least-squares line of throughput on utilization, kept with exact Welford moments, predicts a
worker's throughput at any utilization. Data skew caps what a worker can receive: when the
busiest worker reaches 100%, worker i (now at u_i, busiest at u_max) runs at u_i / u_max, so its
capacity is its line there (Daedalus, Fig. 3). The job's capacity at the current scale-out is the
sum over its workers.

Per scale-out seen, the model keeps a decaying average of the capacities measured there. An
unseen scale-out is estimated from the scaling curve of the seen ones: proportional to the
per-worker capacity with one seen scale-out (the paper's heuristic), a power law c * p^k fitted in
log space with two or more. Unlike Daedalus's public implementation, an unknown capacity is an
error that says why, never None, and all state is a plain JSON-able dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from analyze.welford import CoMoments

Basis = Literal["observed", "scaling_curve", "proportional"]
Method = Literal["regression", "ratio", "idle"]

# Bounds of the fitted scaling exponent k in capacity = c * p^k. Above 1.2 the curve promises more
# than linear speed-up from a few points; at or below 0 every larger scale-out would look useless.
MIN_EXPONENT = 0.05
MAX_EXPONENT = 1.2


class UnknownCapacity(ValueError):
    """No capacity can be estimated yet (nothing measured)."""


class IdleWindow(ValueError):
    """Every worker was idle: a window without load says nothing about capacity."""


@dataclass(frozen=True)
class WorkerCapacity:
    worker: str
    utilization: float
    saturation_utilization: float  # u_i / u_max: where this worker is when the busiest hits 100%
    capacity: float  # records/s at the saturation utilization
    method: Method


@dataclass(frozen=True)
class ScaleOutCapacity:
    capacity: float  # records/s, the sum over the workers
    workers: tuple[WorkerCapacity, ...]


@dataclass(frozen=True)
class CapacityEstimate:
    value: float  # records/s
    basis: Basis
    points: tuple[tuple[int, float], ...]  # the (scale-out, capacity) points the estimate rests on
    exponent: float | None = None  # k of the power law (1.0 for proportional), None when observed


class CapacityChoice(NamedTuple):
    value: float  # records/s
    source: Literal["ds2", "regression"]
    why: str


def _check_sample(worker: str, utilization: float, throughput: float) -> tuple[float, float]:
    u, y = float(utilization), float(throughput)
    if not (math.isfinite(u) and u >= 0):
        raise ValueError(f"worker {worker!r}: utilization must be finite and >= 0, got {utilization!r}")
    if not (math.isfinite(y) and y >= 0):
        raise ValueError(f"worker {worker!r}: throughput must be finite and >= 0, got {throughput!r}")
    return u, y


def worker_capacity(
    regression: CoMoments, at_utilization: float, min_samples: int = 3, min_utilization_std: float = 0.02
) -> tuple[float, Method]:
    """One worker's throughput at `at_utilization` (records/s), and how it was obtained.

    The regression line when it has `min_samples` samples, a utilization spread of at least
    `min_utilization_std` and a positive slope. Otherwise the paper's quick estimate, throughput /
    utilization scaled to `at_utilization` (a line through the origin and the mean point): with
    little spread a fitted slope is noise, and extrapolating it to saturation would amplify it."""
    if at_utilization <= 0:
        return 0.0, "idle"
    if regression.count == 0 or regression.mean_x <= 0:
        raise ValueError("a worker with load needs at least one sample with utilization > 0")
    spread = math.sqrt(regression.m2x / regression.count)
    if regression.count >= min_samples and spread >= min_utilization_std:
        line = regression.line()
        if line.slope > 0:
            return max(0.0, line(at_utilization)), "regression"
    return regression.mean_y / regression.mean_x * at_utilization, "ratio"


def skew_aware_capacity(
    regressions: Mapping[str, CoMoments],
    utilizations: Mapping[str, float],
    min_samples: int = 3,
    min_utilization_std: float = 0.02,
) -> ScaleOutCapacity:
    """The job's capacity at the current scale-out: each worker's line at u_i / u_max, summed.

    `utilizations` are the workers' current utilizations (their skew); a worker at 0 receives no
    data and adds nothing."""
    if not utilizations:
        raise ValueError("no workers")
    busiest = max(utilizations.values())
    if busiest <= 0:
        raise IdleWindow("every worker is idle: no skew, no saturation point")
    workers = []
    for worker, u in sorted(utilizations.items()):
        saturation = u / busiest
        if saturation > 0 and worker not in regressions:
            raise ValueError(f"worker {worker!r} has load but no regression")
        regression = regressions.get(worker, CoMoments())
        value, method = worker_capacity(regression, saturation, min_samples, min_utilization_std)
        workers.append(WorkerCapacity(worker, u, saturation, value, method))
    return ScaleOutCapacity(sum(w.capacity for w in workers), tuple(workers))


def fit_scaling_curve(points: Mapping[int, float]) -> tuple[float, float, Basis]:
    """(c, k, basis) of capacity(p) = c * p^k through the seen scale-outs.

    One point: proportional (k = 1), the paper's per-worker average times the scale-out. Two or
    more: least squares of log capacity on log p, k clamped to [MIN_EXPONENT, MAX_EXPONENT] and c
    refitted for the clamped k."""
    usable = {p: c for p, c in points.items() if p >= 1 and c > 0}  # log needs positive values
    if not usable:
        raise UnknownCapacity("no positive capacity measured at any scale-out yet")
    if len(usable) == 1:
        ((p, c),) = usable.items()
        return c / p, 1.0, "proportional"
    logs = CoMoments()
    for p, c in usable.items():
        logs.add(math.log(p), math.log(c))
    k = min(MAX_EXPONENT, max(MIN_EXPONENT, logs.slope))
    return math.exp(logs.mean_y - k * logs.mean_x), k, "scaling_curve"


@dataclass
class CapacityModel:
    """Per-worker regressions at the current scale-out and a decaying average per scale-out seen.

    The regressions restart when the scale-out changes: the keys (and so the skew) are spread
    anew, and a revisit may spread them differently (Daedalus observed this with WordCount). The
    average across windows and visits is an exponential one: each measurement moves it by
    `alpha` of the difference."""

    alpha: float = 0.3
    min_samples: int = 3
    min_utilization_std: float = 0.02
    parallelism: int | None = None
    workers: dict[str, CoMoments] = field(default_factory=dict)
    observed: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha!r}")
        if self.min_samples < 2:
            raise ValueError("min_samples must be >= 2 (a line needs two points)")
        if self.min_utilization_std < 0:
            raise ValueError("min_utilization_std must be >= 0")

    def record(self, parallelism: int, capacity: float) -> float:
        """Fold one capacity measurement (records/s) at `parallelism` into its decaying average."""
        if parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, got {parallelism}")
        if not (math.isfinite(capacity) and capacity >= 0):
            raise ValueError(f"capacity must be finite and >= 0, got {capacity!r}")
        old = self.observed.get(parallelism)
        new = capacity if old is None else old + self.alpha * (capacity - old)
        self.observed[parallelism] = new
        return new

    def observe(self, parallelism: int, samples: Mapping[str, tuple[float, float]]) -> ScaleOutCapacity:
        """One window: per worker (utilization, throughput in records/s).

        Adds the samples to the workers' regressions, measures the skew-aware capacity and folds it
        into the average of this scale-out. Raises IdleWindow (changing nothing) when every worker
        was idle. Idle workers' (0, 0) points are not added: they say nothing about the slope and
        would pin the line to the origin where a worker has a baseline CPU cost."""
        checked = {w: _check_sample(w, u, y) for w, (u, y) in samples.items()}
        if not checked:
            raise ValueError("no worker samples")
        if max(u for u, _ in checked.values()) <= 0:
            raise IdleWindow("every worker is idle: a window without load says nothing about capacity")
        if parallelism != self.parallelism:
            self.parallelism, self.workers = parallelism, {}
        for worker, (u, y) in checked.items():
            if u > 0:
                self.workers.setdefault(worker, CoMoments()).add(u, y)
        measured = skew_aware_capacity(
            self.workers, {w: u for w, (u, _) in checked.items()}, self.min_samples, self.min_utilization_std
        )
        self.record(parallelism, measured.capacity)
        return measured

    def estimate(self, parallelism: int) -> CapacityEstimate:
        """Capacity (records/s) at `parallelism`: the average observed there, else the scaling curve.

        Raises UnknownCapacity when no scale-out has been measured."""
        if parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, got {parallelism}")
        points = tuple(sorted(self.observed.items()))
        if parallelism in self.observed:
            return CapacityEstimate(self.observed[parallelism], "observed", points)
        c, k, basis = fit_scaling_curve(self.observed)
        return CapacityEstimate(c * parallelism**k, basis, points, exponent=k)

    def capacity_at(self, parallelism: int) -> float:
        return self.estimate(parallelism).value

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "min_samples": self.min_samples,
            "min_utilization_std": self.min_utilization_std,
            "parallelism": self.parallelism,
            "workers": {w: m.to_dict() for w, m in self.workers.items()},
            # JSON object keys are strings.
            "observed": {str(p): c for p, c in self.observed.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityModel:
        model = cls(
            alpha=float(data["alpha"]),
            min_samples=int(data["min_samples"]),
            min_utilization_std=float(data["min_utilization_std"]),
            parallelism=None if data["parallelism"] is None else int(data["parallelism"]),
            workers={str(w): CoMoments.from_dict(m) for w, m in data["workers"].items()},
        )
        for p, c in data["observed"].items():
            model.record(int(p), float(c))  # validates; the first record of a scale-out stores it as is
        return model


def ds2_capacity(parallelism: int, rate_per_slot: float) -> float:
    """DS2's capacity: slots times the true processing rate per slot (records per busy second)."""
    return parallelism * rate_per_slot


def choose_capacity(
    ds2_rate_per_slot: float | None, model_estimate: CapacityEstimate | None, parallelism: int
) -> CapacityChoice:
    """The hybrid capacity at `parallelism`: DS2's true rate when the job reports busy time, the
    regression model otherwise.

    Busy time measures the useful work directly, so DS2's rate needs no extrapolation to 100% CPU
    and is not disturbed by CPU spent outside the job (GC, co-located work); CPU utilization is
    what every engine reports, so the regression covers jobs without busy time. Pass
    `ds2_rate_per_slot=None` when busy time is not reported. Raises UnknownCapacity when neither
    is available."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, got {parallelism}")
    if ds2_rate_per_slot is not None and math.isfinite(ds2_rate_per_slot) and ds2_rate_per_slot > 0:
        return CapacityChoice(
            ds2_capacity(parallelism, ds2_rate_per_slot), "ds2",
            f"busy time is reported: DS2 true rate {ds2_rate_per_slot:.1f} rec/s per slot x {parallelism} slots",
        )
    lacking = "busy time is not reported" if ds2_rate_per_slot is None else "the DS2 true rate is zero"
    if model_estimate is None:
        raise UnknownCapacity(f"{lacking} and the regression model has no estimate yet")
    how = {
        "observed": "the average measured at this scale-out",
        "proportional": "the per-worker capacity of the one scale-out seen, times the scale-out",
        "scaling_curve": f"the power law fitted to {len(model_estimate.points)} seen scale-outs "
                         f"(k = {model_estimate.exponent or 0:.2f})",
    }[model_estimate.basis]
    return CapacityChoice(model_estimate.value, "regression",
                          f"{lacking}: CPU-throughput regression, {how}")
