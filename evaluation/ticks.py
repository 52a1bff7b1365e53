"""A trace-driven, time-stepped simulation of a Spark-like streaming job under an autoscaling policy.

Pure: no I/O, no broker, Redis or Spark. The job has a parallelism p (task slots), a per-slot rate
(records/s one slot processes while 100 % busy, with optional per-tick noise) and a backlog.
Each tick of `dt` seconds:

    arrivals  = arrival rate x dt
    processed = min(backlog + arrivals, p x per-slot rate x running time)   (0 while restarting)
    backlog   = backlog + arrivals - processed

While running, the job sends one metric report per tick, as the Spark reporter does. The reports
are folded into windows by the monitor's own code (`monitor.windows.add_report`: a window closes
when the first report of a later window arrives) and each closed window is analyzed by the
analyze stage's own code (`analyze.true_rates.analyze_window`, with the last valid analysis as
the idle fallback), so the policy sees exactly the `Analysis` our pipeline would produce.

A rescale stops the job for `restart_downtime_s`: no processing and no reports (so no window
closes), arrivals pile up in the backlog, and the slots are paid at the new parallelism. At every
window boundary while the job is stopped the policy is still asked, with `rescaling=True` and an
invalid analysis (nothing was reported); it must hold, and any other answer is ignored and counted.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from analyze.true_rates import analyze_window
from contracts.messages import Analysis, MetricReport, SourceMetrics
from monitor.windows import WindowState, add_report

# Metric time of simulated second 0: window-aligned, so windows start at whole multiples.
EPOCH = 1_700_000_000.0
# knowledge.last_valid_analysis scans this many recent analyses for the idle fallback.
FALLBACK_SCAN = 60
# Ceilings ignore floating-point noise (4.0000000001 slots is 4 slots).
EPSILON = 1e-9


class Policy(Protocol):
    """An autoscaling policy as the simulator drives it."""

    name: str

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        """The new parallelism, or None to hold. Called for every closed window, and at each window
        boundary while a rescale is in progress (`rescaling=True`: the answer must be None)."""
        ...

    def on_rescaled(self, to_parallelism: int, downtime_s: float, completed_at: float) -> None:
        """A rescale completed (what execute learns from the runner): new parallelism, measured
        downtime, and the metric time it completed at."""
        ...


@dataclass(frozen=True)
class Workload:
    """What each tick brings: the arrival rate and the per-slot rate (records/s at 100 % busy).

    Both policies of a comparison run on the same Workload, so they see the same noise."""

    arrival_rates: np.ndarray
    slot_rates: np.ndarray
    dt: float = 1.0

    def __post_init__(self) -> None:
        if self.arrival_rates.shape != self.slot_rates.shape or self.arrival_rates.ndim != 1:
            raise ValueError("arrival_rates and slot_rates must be 1-D arrays of the same length")
        if self.dt <= 0:
            raise ValueError("dt must be positive")
        if (self.arrival_rates < 0).any() or (self.slot_rates <= 0).any():
            raise ValueError("arrival rates must be >= 0 and slot rates > 0")

    @property
    def ticks(self) -> int:
        return len(self.arrival_rates)

    @property
    def duration_s(self) -> float:
        return self.ticks * self.dt


def make_workload(
    arrival_rates: np.ndarray, per_slot_rate: float, rate_noise: float = 0.0, seed: int = 0, dt: float = 1.0
) -> Workload:
    """A workload whose per-slot rate varies tick by tick by a mean-preserving log-normal factor
    with sigma `rate_noise` (GC pauses, skew, co-located load), drawn from a seeded Generator."""
    rates = np.asarray(arrival_rates, dtype=float)
    if rate_noise > 0:
        rng = np.random.default_rng(seed)
        factor = rng.lognormal(mean=-rate_noise**2 / 2, sigma=rate_noise, size=len(rates))
    else:
        factor = np.ones(len(rates))
    return Workload(rates, per_slot_rate * factor, dt)


def interpolate_rows(rows: np.ndarray, row_seconds: float, dt: float = 1.0) -> np.ndarray:
    """Per-tick rates from a trace with one row every `row_seconds` of simulated time: linear
    between rows, sampled at each tick's midpoint (the last row holds to the end)."""
    if row_seconds <= 0 or len(rows) == 0:
        raise ValueError("need at least one row and a positive row length")
    ticks = round(len(rows) * row_seconds / dt)
    midpoints = (np.arange(ticks) + 0.5) * dt
    return np.interp(midpoints, np.arange(len(rows)) * row_seconds, np.asarray(rows, dtype=float))


def slots_needed(rate: float, per_slot_rate: float, utilization: float) -> int:
    return max(1, math.ceil(rate / (per_slot_rate * utilization) - EPSILON))


@dataclass(frozen=True)
class SimConfig:
    initial_parallelism: int
    restart_downtime_s: float = 20.0
    window_s: float = 10.0
    lag_slo_s: float = 10.0
    partitions: int = 64
    splittable: bool = True
    job_id: str = "sim"


@dataclass(frozen=True)
class Rescale:
    at_s: float
    from_parallelism: int
    to_parallelism: int


@dataclass
class RunMetrics:
    scale_ups: int = 0
    scale_downs: int = 0
    core_seconds: float = 0.0
    busy_slot_seconds: float = 0.0
    downtime_s: float = 0.0
    max_backlog_records: float = 0.0
    max_backlog_s: float = 0.0
    lag_slo_violation_s: float = 0.0
    records_arrived: float = 0.0
    records_processed: float = 0.0
    final_backlog: float = 0.0
    windows_analyzed: int = 0
    ignored_decisions: int = 0
    duration_s: float = 0.0

    @property
    def mean_utilization(self) -> float:
        """Busy slot-seconds over paid slot-seconds (a stopped job's slots count as idle)."""
        return self.busy_slot_seconds / self.core_seconds if self.core_seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}
        out["mean_utilization"] = round(self.mean_utilization, 4)
        return out


@dataclass
class RunResult:
    metrics: RunMetrics
    rescales: list[Rescale]
    # Per tick: the parallelism paid for, records processed, backlog at the end of the tick.
    parallelism: np.ndarray
    processed: np.ndarray
    backlog: np.ndarray
    analyses: list[Analysis] = field(default_factory=list)


def _on_boundary(t: float, window_s: float) -> bool:
    k = round(t / window_s)
    return abs(t - k * window_s) < 1e-6


def stopped_analysis(config: SimConfig, parallelism: int, t: float) -> Analysis:
    """The policy's input at a window boundary while the job is stopped: nothing was reported."""
    return Analysis(
        job_id=config.job_id, window_end=EPOCH + t, parallelism=parallelism, valid=False,
        invalid_reason="no metric reports: the job is stopped for a rescale",
        true_processing_rate=0.0, true_output_rate=0.0, observed_processing_rate=0.0, utilization=0.0,
        closed_at=EPOCH + t,
    )


def simulate(workload: Workload, policy: Policy, config: SimConfig, keep_analyses: bool = False) -> RunResult:
    """Run `policy` over `workload`; see the module docstring for the model."""
    if config.initial_parallelism < 1:
        raise ValueError("initial_parallelism must be >= 1")
    dt, n = workload.dt, workload.ticks
    arrival_rates, slot_rates = workload.arrival_rates, workload.slot_rates
    m = RunMetrics(duration_s=workload.duration_s)
    rescales: list[Rescale] = []
    analyses: list[Analysis] = []
    p_paid = np.zeros(n)
    processed_ticks = np.zeros(n)
    backlog_ticks = np.zeros(n)

    p = config.initial_parallelism
    backlog = 0.0
    restarting = False
    restart_until = -math.inf
    window: WindowState | None = None
    recent: deque[Analysis] = deque(maxlen=FALLBACK_SCAN)

    def complete_restart() -> None:
        nonlocal restarting
        restarting = False
        m.downtime_s += config.restart_downtime_s
        policy.on_rescaled(p, config.restart_downtime_s, EPOCH + restart_until)

    def ask(analysis: Analysis, now: float) -> None:
        nonlocal p, restarting, restart_until
        wanted = policy.decide(analysis, rescaling=restarting)
        if wanted is None or wanted == p:
            return
        if wanted < 1:
            raise ValueError(f"policy {policy.name} asked for parallelism {wanted}")
        if restarting:
            m.ignored_decisions += 1  # one rescale at a time, as execute's lock enforces
            return
        rescales.append(Rescale(now, p, wanted))
        if wanted > p:
            m.scale_ups += 1
        else:
            m.scale_downs += 1
        p, restarting, restart_until = wanted, True, now + config.restart_downtime_s

    for i in range(n):
        t0, t1 = i * dt, (i + 1) * dt
        if restarting and restart_until <= t0:
            complete_restart()
        rate, slot_rate = float(arrival_rates[i]), float(slot_rates[i])
        running_s = min(dt, max(0.0, t1 - restart_until)) if restarting else dt
        arrivals = rate * dt
        available = backlog + arrivals
        processed = min(available, p * slot_rate * running_s)
        backlog = available - processed
        busy = processed / slot_rate

        m.records_arrived += arrivals
        m.records_processed += processed
        m.core_seconds += p * dt  # a restarting job already holds its new slots
        m.busy_slot_seconds += busy
        m.max_backlog_records = max(m.max_backlog_records, backlog)
        if rate > 0:
            m.max_backlog_s = max(m.max_backlog_s, backlog / rate)
        if backlog > config.lag_slo_s * rate:
            m.lag_slo_violation_s += dt
        p_paid[i], processed_ticks[i], backlog_ticks[i] = p, processed, backlog

        if restarting and restart_until <= t1:
            complete_restart()
        closed = None
        if running_s > 0:
            report = MetricReport(
                job_id=config.job_id, timestamp=EPOCH + t1, interval_s=running_s, parallelism=p,
                records_in=round(processed), records_out=round(processed), busy_time_s=busy,
                source=SourceMetrics(arrival_rate=rate, backlog=round(backlog), partitions=config.partitions,
                                     splittable=config.splittable),
            )
            window, closed = add_report(window, report, config.window_s)
        if closed is not None:
            # The analyze stage's fallback for idle windows: the latest valid one of the recent analyses.
            fallback = None
            if closed.records_in == 0:
                fallback = next((a.model_dump() for a in reversed(recent) if a.valid), None)
            analysis = analyze_window(closed.model_copy(update={"closed_at": EPOCH + t1}), fallback)
            recent.append(analysis)
            m.windows_analyzed += 1
            if keep_analyses:
                analyses.append(analysis)
            ask(analysis, t1)
        elif restarting and _on_boundary(t1, config.window_s):
            ask(stopped_analysis(config, p, t1), t1)

    m.final_backlog = backlog
    return RunResult(m, rescales, p_paid, processed_ticks, backlog_ticks, analyses)


def oracle(workload: Workload, utilization: float = 1.0) -> RunResult:
    """The lower bound on cost: each tick, the fewest slots that process that tick's arrivals at
    `utilization` (100 %: the bound), with free and instant rescales (no backlog, no actions)."""
    if not 0 < utilization <= 1:
        raise ValueError("utilization must be in (0, 1]")
    dt = workload.dt
    arrivals = workload.arrival_rates * dt
    slots = np.maximum(1, np.ceil(arrivals / (workload.slot_rates * utilization * dt) - EPSILON))
    m = RunMetrics(duration_s=workload.duration_s)
    m.core_seconds = float((slots * dt).sum())
    m.busy_slot_seconds = float((arrivals / workload.slot_rates).sum())
    m.records_arrived = m.records_processed = float(arrivals.sum())
    return RunResult(m, [], slots, arrivals.copy(), np.zeros(workload.ticks))
