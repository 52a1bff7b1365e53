"""Exact online moments: Welford's per-sample update and Chan et al.'s merge of two summaries.

Daedalus regresses throughput on CPU utilization with running means, variances and a covariance.
Its public implementation updates them per batch with a formula that is not Welford's, which
biases the slope (about 23% after the first batch). Here every sample goes through Welford's
exact update, and summaries of separate streams (windows, workers) are combined with Chan et
al.'s parallel formula, which gives the same result as feeding one summary all the samples.

The summaries hold no samples, only a count and a few floats, so they serialize to small JSON
dicts (`to_dict`/`from_dict`) that the agents keep in Redis between windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class DegenerateRegression(ValueError):
    """The least-squares line is undefined: fewer than two samples or no spread in x."""


def _finite(name: str, value: float) -> float:
    # One NaN or infinity would poison a summary for good, and summaries live on in Redis.
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def _count(data: Mapping[str, Any]) -> int:
    count = data["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    return count


def _non_negative(name: str, value: Any) -> float:
    value = _finite(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


@dataclass(slots=True)
class Moments:
    """Count, mean and M2 (sum of squared deviations from the mean) of one variable."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        x = _finite("x", x)
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        # Old delta times new delta (Welford's stable form); never negative, barring the last ulp.
        self.m2 += max(0.0, delta * (x - self.mean))

    def extend(self, xs: Iterable[float]) -> None:
        for x in xs:
            self.add(x)

    def merge(self, other: Moments) -> Moments:
        """The summary of both streams (Chan et al.); neither operand changes."""
        if other.count == 0:
            return Moments(self.count, self.mean, self.m2)
        if self.count == 0:
            return Moments(other.count, other.mean, other.m2)
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / n
        m2 = self.m2 + other.m2 + delta * delta * self.count * other.count / n
        return Moments(n, mean, m2)

    def variance(self, sample: bool = False) -> float:
        """Population variance (M2 / n), or the sample variance (M2 / (n - 1)) when `sample`."""
        needed = 2 if sample else 1
        if self.count < needed:
            raise ValueError(f"{'sample' if sample else 'population'} variance needs {needed} samples, "
                             f"have {self.count}")
        return self.m2 / (self.count - 1 if sample else self.count)

    @property
    def sample_variance(self) -> float:
        return self.variance(sample=True)

    def std(self, sample: bool = False) -> float:
        return math.sqrt(self.variance(sample))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Moments:
        return cls(count=_count(data), mean=_finite("mean", data["mean"]), m2=_non_negative("m2", data["m2"]))


@dataclass(frozen=True, slots=True)
class Line:
    """y = intercept + slope * x."""

    intercept: float
    slope: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


@dataclass(slots=True)
class CoMoments:
    """Joint moments of pairs (x, y): means, M2 of each and the co-moment C = sum (x - mx)(y - my).

    Enough for covariance, correlation and the least-squares line of y on x."""

    count: int = 0
    mean_x: float = 0.0
    mean_y: float = 0.0
    m2x: float = 0.0
    m2y: float = 0.0
    cxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        x, y = _finite("x", x), _finite("y", y)
        self.count += 1
        dx = x - self.mean_x
        self.mean_x += dx / self.count
        dy = y - self.mean_y
        self.mean_y += dy / self.count
        self.m2x += max(0.0, dx * (x - self.mean_x))
        self.m2y += max(0.0, dy * (y - self.mean_y))
        # Old x deviation times new y deviation: the exact co-moment update (Welford 1962).
        self.cxy += dx * (y - self.mean_y)

    def extend(self, pairs: Iterable[tuple[float, float]]) -> None:
        for x, y in pairs:
            self.add(x, y)

    def merge(self, other: CoMoments) -> CoMoments:
        """The summary of both streams (Chan et al.); neither operand changes."""
        if other.count == 0:
            return CoMoments(self.count, self.mean_x, self.mean_y, self.m2x, self.m2y, self.cxy)
        if self.count == 0:
            return CoMoments(other.count, other.mean_x, other.mean_y, other.m2x, other.m2y, other.cxy)
        n = self.count + other.count
        dx = other.mean_x - self.mean_x
        dy = other.mean_y - self.mean_y
        weight = self.count * other.count / n
        return CoMoments(
            count=n,
            mean_x=self.mean_x + dx * other.count / n,
            mean_y=self.mean_y + dy * other.count / n,
            m2x=self.m2x + other.m2x + dx * dx * weight,
            m2y=self.m2y + other.m2y + dy * dy * weight,
            cxy=self.cxy + other.cxy + dx * dy * weight,
        )

    @property
    def x(self) -> Moments:
        return Moments(self.count, self.mean_x, self.m2x)

    @property
    def y(self) -> Moments:
        return Moments(self.count, self.mean_y, self.m2y)

    def covariance(self, sample: bool = False) -> float:
        needed = 2 if sample else 1
        if self.count < needed:
            raise ValueError(f"covariance needs {needed} samples, have {self.count}")
        return self.cxy / (self.count - 1 if sample else self.count)

    def correlation(self) -> float:
        """Pearson's r; raises ValueError when either variable has no spread."""
        if self.count < 2 or self.m2x <= 0 or self.m2y <= 0:
            raise ValueError("correlation needs two samples and spread in both x and y")
        return max(-1.0, min(1.0, self.cxy / math.sqrt(self.m2x * self.m2y)))

    @property
    def slope(self) -> float:
        """Least-squares slope cov(x, y) / var(x).

        Raises DegenerateRegression (a ValueError) instead of returning None or dividing by zero:
        a capacity model must decide explicitly what it does without spread in x."""
        if self.count < 2 or self.m2x <= 0:
            raise DegenerateRegression(
                f"no least-squares line: {self.count} samples, x variance {self.m2x / max(self.count, 1):g}"
            )
        return self.cxy / self.m2x  # the n (or n - 1) of covariance and variance cancel

    @property
    def intercept(self) -> float:
        return self.mean_y - self.slope * self.mean_x

    def line(self) -> Line:
        slope = self.slope
        return Line(intercept=self.mean_y - slope * self.mean_x, slope=slope)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean_x": self.mean_x, "mean_y": self.mean_y,
                "m2x": self.m2x, "m2y": self.m2y, "cxy": self.cxy}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoMoments:
        return cls(
            count=_count(data),
            mean_x=_finite("mean_x", data["mean_x"]),
            mean_y=_finite("mean_y", data["mean_y"]),
            m2x=_non_negative("m2x", data["m2x"]),
            m2y=_non_negative("m2y", data["m2y"]),
            cxy=_finite("cxy", data["cxy"]),
        )
