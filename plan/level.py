"""The arrival level: rates averaged since the last level shift, with a two-sided CUSUM detector.

Page's CUSUM (E. S. Page, "Continuous inspection schemes", Biometrika 1954), on the log of the
arrival rate so that a shift is judged relative to the level: per window the standardized
deviation z = (log rate - level) / sigma adds to an upper and a lower sum, each less a slack `k`
and floored at 0; a sum above `h` is a level shift. Then the averaging restarts from the new level
(the windows since the shift only), so a step change is seen at its new level at once, not mixed
with the old one over a long window. A bounded window (`window_s`) keeps a slow drift from being
averaged away too. Sigma is the within-level noise, estimated from the deviations winsorized at
`NOISE_CLIP` sigmas (Huber's robust scale, in its simplest form): a deviation that heralds a shift
before the sum fires, or one outlier, adds at most that much.

The trend: the arrival rates of the last TREND_WINDOW_S, shift or not, with an ordinary
least-squares line through them (`LevelState.trend`): on a load that keeps rising or falling the
level lags (by half its span) and restarts at each shift, while the line says where the rate is now.
A slope within TREND_T standard errors of 0 is no trend.

Pure: `update(state, ...)` returns the new state; the state is a small pydantic model kept in the
plan state.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

SLACK = 0.5  # k, in standard deviations: half the smallest shift worth detecting (1 sigma)
THRESHOLD = 8.0  # h, in standard deviations: false alarms rare even with the noise estimated from few windows
SIGMA_FLOOR = 0.03  # the log-rate noise assumed at least (3 %): a perfectly steady rate is not a hair trigger
SIGMA_PRIOR = 0.1  # until a few windows have been seen
WINDOW_S = 60.0  # the longest averaging, shift or not
NOISE_CLIP = 3.0  # a deviation counts at most this many sigmas in the noise estimate
TREND_WINDOW_S = 60.0  # the arrival rates a trend is fitted through
TREND_MIN_POINTS = 4
TREND_T = 2.0  # a slope within this many standard errors of 0 is no trend


class Trend(BaseModel):
    """A line through the recent arrival rates: the rate at `now` (records/s), its slope (records/s
    per second; 0 when not significant) and the span of time it was fitted over (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate: float
    slope: float
    span_s: float


class LevelState(BaseModel):
    """Log-rates since the last shift (time, value), the CUSUM sums and the within-level noise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: list[tuple[float, float]] = []
    upper: float = 0.0
    lower: float = 0.0
    noise_n: int = 0
    noise_mean: float = 0.0  # Welford over deviations from the level, within levels
    noise_m2: float = 0.0
    shifts: int = 0
    shifted_at: float | None = None
    recent: list[tuple[float, float]] = []  # (time, rate) over the last TREND_WINDOW_S, shift or not

    @property
    def sigma(self) -> float:
        if self.noise_n < 5:
            return SIGMA_PRIOR
        return max(math.sqrt(self.noise_m2 / (self.noise_n - 1)), SIGMA_FLOOR)

    def level(self) -> float | None:
        """The mean arrival rate since the shift (records/s), None before the first window."""
        if not self.points:
            return None
        return sum(math.exp(v) for _, v in self.points) / len(self.points)

    def upper_level(self, z: float = 1.28) -> float | None:
        """An upper quantile of the level: the mean plus z standard errors of it."""
        level = self.level()
        if level is None:
            return None
        return level * math.exp(z * self.sigma / math.sqrt(len(self.points)))

    def trend(self, now: float) -> Trend | None:
        """The least-squares line through the recent rates, at `now`; None with fewer than
        TREND_MIN_POINTS. A slope not TREND_T standard errors from 0 is 0, and the rate is then the mean."""
        if len(self.recent) < TREND_MIN_POINTS:
            return None
        t = [p[0] for p in self.recent]
        r = [p[1] for p in self.recent]
        n = len(t)
        t_mean, r_mean = sum(t) / n, sum(r) / n
        sxx = sum((x - t_mean) ** 2 for x in t)
        span = max(t) - min(t)
        if sxx <= 0:
            return Trend(rate=r_mean, slope=0.0, span_s=span)
        slope = sum((x - t_mean) * (y - r_mean) for x, y in zip(t, r, strict=True)) / sxx
        residual = sum((y - r_mean - slope * (x - t_mean)) ** 2 for x, y in zip(t, r, strict=True))
        error = math.sqrt(residual / (n - 2) / sxx)
        if abs(slope) <= TREND_T * error:
            return Trend(rate=r_mean, slope=0.0, span_s=span)
        return Trend(rate=max(0.0, r_mean + slope * (now - t_mean)), slope=slope, span_s=span)


def update(state: LevelState, now: float, rate: float, window_s: float = WINDOW_S) -> tuple[LevelState, bool]:
    """The state after one window's arrival rate, and whether a level shift fired."""
    if not math.isfinite(rate) or rate <= 0:
        return state, False
    value = math.log(rate)
    state = state.model_copy(update={"recent": [*(p for p in state.recent if p[0] > now - TREND_WINDOW_S),
                                                (now, rate)]})
    points = [(t, v) for t, v in state.points if t > now - window_s]
    if not points:
        return state.model_copy(update={"points": [(now, value)], "upper": 0.0, "lower": 0.0}), False
    mean = sum(v for _, v in points) / len(points)
    z = (value - mean) / state.sigma
    upper = max(0.0, state.upper + z - SLACK)
    lower = max(0.0, state.lower - z - SLACK)
    if upper > THRESHOLD or lower > THRESHOLD:
        return state.model_copy(update={"points": [(now, value)], "upper": 0.0, "lower": 0.0,
                                        "shifts": state.shifts + 1, "shifted_at": now}), True
    # The noise is what a level holds, not a shift the detector has not fired on yet: a deviation counts
    # at most NOISE_CLIP sigmas (a winsorized estimate), so one outlier (a job's first, partial window) does
    # not blunt the detector for the rest of the run.
    limit = NOISE_CLIP * state.sigma
    deviation = min(max(value - mean, -limit), limit)
    n = state.noise_n + 1
    delta = deviation - state.noise_mean
    noise_mean = state.noise_mean + delta / n
    noise_m2 = state.noise_m2 + delta * (deviation - noise_mean)
    return state.model_copy(update={"points": [*points, (now, value)], "upper": upper, "lower": lower,
                                    "noise_n": n, "noise_mean": noise_mean, "noise_m2": noise_m2}), False
