"""Observed recovery time after a rescale, by statistical anomaly detection (Daedalus, 3.5).

In normal operation the throughput follows the arrival rate, so their difference (the lag rate,
arrival - throughput, records/s) stays near its usual mean. While the job is down the lag rate is
the whole arrival rate; while it catches up it is strongly negative. Both are anomalies: beyond
k standard deviations (k = 1, as in the paper) of the normal mean, which Welford's moments learn
from the points outside recoveries only.

A recovery ends at the first sustained return to normal: `sustain` consecutive normal points.
The end is the time of the first of them (when the job was back to normal), so the observed
recovery time is that time minus the rescale's start. With k = 1 about a third of normal points
fall outside the band, so a single normal point would end a recovery too early, and one outside
point within a streak restarts it.

When the backlog is reported, it says directly what the lag rate only hints at: a point is normal
when the backlog is back within `backlog_tolerance_s` seconds of arrivals (Daedalus's "caught up",
with the tolerance the scale-down control and the recovery prediction use). A job that only keeps
pace while a large backlog stays is not back to normal; a job at its capacity whose small backlog
swings (its lag rate outside a band learned at lower load) is. The return is then timed between
points (the caller gives each the time its backlog was measured): the backlog's excess over the
tolerance is interpolated linearly between the last point above it and the first within it, so the
observed time is not rounded to the window grid (when the first point after the start is already
within the tolerance, its time is the end, unless `resumed` gave the moment the job resumed).

Without the backlog, a point is judged by the lag rate: within the band (statistical), or, until
`min_normal_samples` normal points have been seen, keeping up (lag rate <= 0: a fallback that can
end a recovery at the start of the catch-up; report the backlog).

All state is plain data (`to_dict`/`from_dict`), so the detector can live in Redis between windows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from analyze.welford import Moments

Judge = Literal["statistical", "fallback"]


@dataclass
class RecoveryDetector:
    k: float = 1.0
    sustain: int = 3
    min_normal_samples: int = 10
    backlog_tolerance_s: float = 10.0
    min_std: float = 0.0  # floor of the band's width (records/s), for perfectly steady jobs
    normal: Moments = field(default_factory=Moments)
    recovery_start: float | None = None
    streak: int = 0
    streak_start: float | None = None
    last_recovery_s: float | None = None
    last_excess: tuple[float, float] | None = None  # (time, backlog beyond the tolerance) of the last point

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k) and self.k > 0):
            raise ValueError(f"k must be > 0, got {self.k!r}")
        if self.sustain < 1:
            raise ValueError(f"sustain must be >= 1, got {self.sustain!r}")
        if self.min_normal_samples < 2:
            raise ValueError("min_normal_samples must be >= 2 (a standard deviation needs two)")
        if self.backlog_tolerance_s < 0 or self.min_std < 0:
            raise ValueError("backlog_tolerance_s and min_std must be >= 0")

    @property
    def recovering(self) -> bool:
        return self.recovery_start is not None

    @property
    def judge(self) -> Judge:
        return "statistical" if self.normal.count >= self.min_normal_samples else "fallback"

    def start_recovery(self, at: float) -> None:
        """A rescale (or failure) stopped processing at `at`. A recovery still open is dropped:
        the new restart begins a new one."""
        self.recovery_start = float(at)
        self.streak, self.streak_start, self.last_excess = 0, None, None

    def resumed(self, at: float, arrival_rate: float, backlog: float) -> None:
        """Processing resumed at `at` with `backlog` records waiting: the recovery's first point above
        the tolerance, unless a point was observed since its start (then this says nothing new)."""
        if self.recovery_start is not None and self.last_excess is None and self.streak == 0 \
                and at >= self.recovery_start:
            self.last_excess = (float(at), self.excess(arrival_rate, backlog))

    def excess(self, arrival_rate: float, backlog: float) -> float:
        """The backlog beyond the tolerance (records); at most 0 when the job has caught up."""
        return backlog - arrival_rate * self.backlog_tolerance_s

    def is_normal(self, arrival_rate: float, throughput: float, backlog: float | None = None) -> bool:
        if backlog is not None:
            return self.excess(arrival_rate, backlog) <= 0
        lag_rate = arrival_rate - throughput
        if self.judge == "statistical":
            return abs(lag_rate - self.normal.mean) <= self.k * max(self.normal.std(sample=True), self.min_std)
        return lag_rate <= 0

    def _back_to_normal(self, at: float, excess: float | None) -> float:
        """When the job got back to normal, given that the point at `at` (with the backlog's `excess`)
        is normal: where the excess crossed zero since the last point (linear), else `at`."""
        if excess is None or self.last_excess is None:
            return at
        t0, e0 = self.last_excess
        if e0 <= 0:  # only a resumption leaves a normal last point with no streak: normal since then
            return t0
        return t0 + (at - t0) * e0 / (e0 - excess) if e0 > excess else at

    def observe(self, at: float, arrival_rate: float, throughput: float, backlog: float | None = None) -> float | None:
        """One point (rates in records/s, backlog in records). Returns the observed recovery time
        (seconds) when this point completes the sustained return to normal, otherwise None.

        Outside a recovery the point teaches the normal band. Points older than the recovery's
        start (measured before the rescale) are ignored while it is open."""
        for name, value in (("arrival_rate", arrival_rate), ("throughput", throughput)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if backlog is not None and not (math.isfinite(backlog) and backlog >= 0):
            raise ValueError(f"backlog must be finite and >= 0, got {backlog!r}")
        if self.recovery_start is None:
            self.normal.add(arrival_rate - throughput)
            return None
        if at < self.recovery_start:
            return None
        normal = self.is_normal(arrival_rate, throughput, backlog)
        excess = None if backlog is None else self.excess(arrival_rate, backlog)
        if normal and self.streak == 0:
            self.streak_start = self._back_to_normal(at, excess)
        if excess is not None:
            self.last_excess = (at, excess)
        if not normal:
            self.streak, self.streak_start = 0, None
            return None
        self.streak += 1
        if self.streak < self.sustain:
            return None
        back_to_normal = at if self.streak_start is None else self.streak_start
        recovery = back_to_normal - self.recovery_start
        self.last_recovery_s = recovery
        self.recovery_start, self.streak, self.streak_start, self.last_excess = None, 0, None, None
        return recovery

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": self.k, "sustain": self.sustain, "min_normal_samples": self.min_normal_samples,
            "backlog_tolerance_s": self.backlog_tolerance_s, "min_std": self.min_std,
            "normal": self.normal.to_dict(), "recovery_start": self.recovery_start,
            "streak": self.streak, "streak_start": self.streak_start, "last_recovery_s": self.last_recovery_s,
            "last_excess": None if self.last_excess is None else list(self.last_excess),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecoveryDetector:
        def optional(name: str) -> float | None:
            return None if data[name] is None else float(data[name])

        return cls(
            k=float(data["k"]), sustain=int(data["sustain"]), min_normal_samples=int(data["min_normal_samples"]),
            backlog_tolerance_s=float(data["backlog_tolerance_s"]), min_std=float(data["min_std"]),
            normal=Moments.from_dict(data["normal"]), recovery_start=optional("recovery_start"),
            streak=int(data["streak"]), streak_start=optional("streak_start"),
            last_recovery_s=optional("last_recovery_s"),
            last_excess=None if data["last_excess"] is None else (float(data["last_excess"][0]),
                                                                       float(data["last_excess"][1])),
        )
