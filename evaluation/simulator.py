"""The one simulator: a trace replayed into the job model under a policy, one metric window at a time.

Each window, the job model (`evaluation.jobmodel`) sends the `MetricReport`s the Spark reporter
would send (two per window). They go through the job's loop (`evaluation.loop.JobLoop`): the same
kernels the agents run (monitor's window folding, analyze's true rates, capacity model, recovery
detector and, for policies that plan with a forecast, the forecasts analyze would publish
(`evaluation.forecasts`), then plan's planner step on the plan state in an in-memory knowledge
base). A rescale the policy asks for restarts the model, paying its downtime and the replay since
the last checkpoint, while the policy is told it is rescaling (one rescale at a time, as execute's
lock enforces). When the restart ends, the loop records it as execute does.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contracts.analyses import Analysis
from contracts.backends import BackendKind
from contracts.jobs import JobConfig
from contracts.messages import MetricReport
from contracts.plan_state import PlanState
from evaluation.forecasts import ForecastStream
from evaluation.jobmodel import EPOCH, JobModel, JobState, advance, report, rescale
from evaluation.loop import JobLoop
from evaluation.model_files import demo_job_model
from evaluation.traces import Trace
from knowledge.memory import MemoryKnowledge
from plan.policy import ScalingPolicy

WINDOW_S = 10.0  # the agents' default loop interval
REPORTS_PER_WINDOW = 2  # the reporter's interval is half a window, so the backlog's growth is seen
EPSILON = 1e-9
REPORT_EARLY_S = 1e-3


class PolicyRunner:
    """A policy driven as the plan agent drives it: the job's loop (`evaluation.loop.JobLoop`) with
    the policy, whose decisions are counted here (reasons, and each observed recovery beside its
    prediction, as execute publishes them in `recovered` events). `decided` holds each decision's
    reason code with the end of the window it was taken at (seconds since the load started)."""

    def __init__(self, policy: ScalingPolicy, config: JobConfig, job_id: str = "eval",
                 quota: int | None = None, knowledge: MemoryKnowledge | None = None) -> None:
        self.policy = policy
        self.config = config
        self.name = policy.name
        self.job_id = job_id
        self.loop = JobLoop(job_id, config, policy, interval_s=WINDOW_S, quota=quota, knowledge=knowledge)
        self.knowledge = self.loop.knowledge
        self.reasons: Counter[str] = Counter()
        self.recoveries: list[dict[str, Any]] = []
        self.decided: list[tuple[float, str]] = []

    @property
    def state(self) -> PlanState:
        return self.loop.state

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        """The parallelism execute sends the job to, or None. `rescaling` is the simulator's view; plan
        reads execute's lock, which holds the same: from the decision to the runner's answer."""
        decided = self.loop.decide(analysis)
        plan = decided.plan
        self.reasons[plan.reason.code] += 1
        self.decided.append((analysis.window_end - EPOCH, plan.reason.code))
        self.recoveries += [{"at_s": analysis.window_end - EPOCH, **n.numbers} for n in plan.notices
                            if n.code == "recovered"]
        command = self.loop.execute(decided.decision)
        return None if command is None else command.to_parallelism

    def on_rescaled(self, from_parallelism: int, to_parallelism: int, downtime_s: float, completed_at: float,
                    backend: str | None = None) -> None:
        self.loop.rescale_completed(to_parallelism, completed_at, downtime_s,
                                    BackendKind(backend) if backend is not None else None)

    def planned_capacity(self, analysis: Analysis) -> float | None:
        return self.policy.planned_capacity(analysis, self.config)


class ScheduleRunner:
    """A fixed schedule driven as a policy: at the end of window i, the parallelism for window i + 1. It
    replays the oracle's schedule in the simulator, to check that it keeps the target and costs what the
    oracle computed."""

    name = "schedule"

    def __init__(self, per_window: np.ndarray, window_s: float) -> None:
        self.per_window = [int(p) for p in per_window]
        self.window_s = window_s
        self.recoveries: list[dict[str, Any]] = []  # a schedule predicts none

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        i = round((analysis.window_end - EPOCH) / self.window_s)
        return self.per_window[i] if i < len(self.per_window) else None

    def on_rescaled(self, from_parallelism: int, to_parallelism: int, downtime_s: float, completed_at: float,
                    backend: str | None = None) -> None:
        return None

    def planned_capacity(self, analysis: Analysis) -> float | None:
        return None


@dataclass
class Timeline:
    t: list[float] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)
    capacity: list[float] = field(default_factory=list)
    parallelism: list[int] = field(default_factory=list)
    backlog: list[float] = field(default_factory=list)
    # Whether the job reported in the window (a live run measures nothing while the job is down).
    observed: list[bool] = field(default_factory=list)
    window_s: float = 0.0

    def backlog_measures(self, counted: np.ndarray, backlog_target_s: float) -> tuple[np.ndarray, float]:
        """Over the windows `counted` (a mask): each one's lag (its backlog over its arrival rate, 0 without
        arrivals: below EPSILON records/s, where the quotient would overflow) and the seconds the backlog
        was beyond its target (`backlog_target_s` of arrivals)."""
        arrival = np.asarray(self.arrival, dtype=float)[counted]
        backlog = np.asarray(self.backlog, dtype=float)[counted]
        lags = np.divide(backlog, arrival, out=np.zeros_like(backlog), where=arrival > EPSILON)
        ends = self.window_s * (np.flatnonzero(counted) + 1.0)
        return lags, seconds_beyond_target(ends, arrival, backlog, backlog_target_s, self.window_s)


def seconds_beyond_target(ends: np.ndarray, arrival: np.ndarray, backlog: np.ndarray, backlog_target_s: float,
                          first_s: float) -> float:
    """Seconds a job's backlog was beyond its target (`contracts.analyses.records_beyond_target` above 0)
    over its windows, given as their ends (ascending), arrival rates and backlogs. Each window beyond the
    target counts the time since the window before it (the first, `first_s`): a job too busy to report, or
    down for a restart, publishes seldom, and counting its windows would undercount it."""
    ends = np.asarray(ends, dtype=float)
    if ends.size == 0:
        return 0.0
    late = np.asarray(backlog, dtype=float) > backlog_target_s * np.asarray(arrival, dtype=float) + EPSILON
    spans = np.diff(ends, prepend=ends[0] - first_s)
    return float(spans[late].sum())


@dataclass
class PolicyRun:
    policy: str
    trace: str
    slot_seconds: float
    beyond_target_s: float
    lag_p95_s: float
    lag_max_s: float
    scale_ups: int
    scale_downs: int
    ignored_decisions: int
    final_backlog: float
    records_arrived: float
    mean_utilization: float
    capacity_error_pct: float | None
    seconds: float
    timeline: Timeline
    recoveries: list[dict[str, Any]] = field(default_factory=list)  # observed and predicted, per rescale

    @property
    def actions(self) -> int:
        return self.scale_ups + self.scale_downs

    @property
    def peak_backlog(self) -> float:
        return round(max(self.timeline.backlog), 1)

    def as_measured_live(self, backlog_target_s: float) -> dict[str, float]:
        """Peak backlog, 95th-percentile lag and time beyond the target over the windows the job reported
        in, as a live run measures them (`evaluation.live.live_measures`: no window is published while
        the job is down for a restart, so a restart's peak is seen only once the job reports again, and a
        window beyond the target counts the time since the last one reported). The run's own measures count
        every window's true backlog."""
        seen = np.asarray(self.timeline.observed, dtype=bool)
        if not seen.any():
            return {"peak_backlog": 0.0, "lag_p95_s": 0.0, "beyond_target_s": 0.0}
        lags, beyond = self.timeline.backlog_measures(seen, backlog_target_s)
        return {"peak_backlog": round(float(np.asarray(self.timeline.backlog)[seen].max()), 1),
                "lag_p95_s": float(np.percentile(lags, 95)), "beyond_target_s": beyond}

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("timeline", "recoveries")}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()} | {
            "actions": self.actions, "peak_backlog": self.peak_backlog}


@dataclass(frozen=True)
class Completion:
    """The job runner's answer to a rescale, as the simulator gives it (what `tap` sees)."""

    running: int
    downtime_s: float
    completed_at: float


def rate_factors(windows: int, seed: int, sigma: float | None = None) -> np.ndarray:
    """Per window, the factor every instance's rate is multiplied by (GC pauses, co-located load): log-normal
    with mean 1 and log-sd `sigma` (default: the demo job model's). The same realisation goes to every
    policy and to the oracle."""
    if sigma is None:
        sigma = demo_job_model().rate_noise
    if sigma <= 0:
        return np.ones(windows)
    return np.random.default_rng(seed).lognormal(-sigma**2 / 2, sigma, windows)


def static_parallelism(model: JobModel, peak: float, max_parallelism: int) -> int:
    """The fewest slots whose capacity carries the peak."""
    for p in range(1, max_parallelism + 1):
        if model.capacity(p) >= peak:
            return p
    return max_parallelism


class JobSim:
    """One job's replay, one window at a time (`step`), so that several jobs can be replayed side by side
    on one clock (a fleet: `evaluation.fleet`); `simulate` replays one job to its end. The arguments are
    `simulate`'s."""

    def __init__(self, trace: Trace, model: JobModel, policy: PolicyRunner | ScheduleRunner, config: JobConfig,
                 initial_parallelism: int, backlog_target_s: float, forecasts: ForecastStream | None = None,
                 seed: int = 0, rate_noise: float | None = None, job_id: str = "eval",
                 factors: np.ndarray | None = None, start_s: float = 0.0,
                 tap: Callable[[MetricReport | Completion], None] | None = None) -> None:
        self.started = time.perf_counter()
        self.trace, self.model, self.policy, self.tap = trace, model, policy, tap
        self.initial_parallelism, self.backlog_target_s, self.start_s = initial_parallelism, backlog_target_s, start_s
        self.noise = rate_factors(len(trace.rates), seed, rate_noise) if factors is None else factors
        self.state = JobState([initial_parallelism] * (1 if model.fused else len(model.operators)),
                              restart_until=EPOCH + start_s if start_s > 0 else -math.inf)
        self.loop = policy.loop if isinstance(policy, PolicyRunner) else JobLoop(job_id, config,
                                                                                interval_s=trace.window_s)
        self.job_id = self.loop.job_id
        if forecasts is not None:
            self.loop.forecaster = lambda window, _settings: forecasts.at(window.window_end)
        self.timeline = Timeline(window_s=trace.window_s)
        self.ups = self.downs = self.ignored = 0
        self.capacity_errors: list[float] = []
        self.pending_completion: tuple[int, float, float] | None = None  # from parallelism, downtime, end

    def step(self, i: int) -> None:
        """Window i: the job's reports, its runner's answer, the window's analysis and decision."""
        model, state, policy, loop, tap, timeline = (self.model, self.state, self.policy, self.loop, self.tap,
                                                     self.timeline)
        w = self.trace.window_s
        half = w / REPORTS_PER_WINDOW
        start, end = EPOCH + i * w, EPOCH + (i + 1) * w
        rate = float(self.trace.rates[i])
        for k in range(REPORTS_PER_WINDOW):
            s = start + k * half
            outcome = advance(model, state, s, half, rate, float(self.noise[i]))
            # Stamped a hair before the interval's end, so that both reports fall in window i (a
            # report stamped on the boundary opens the next window, as live).
            sent = report(model, state, self.job_id, s + half - REPORT_EARLY_S, outcome, rate)
            if sent is not None:
                loop.fold(sent)
                if tap is not None:
                    tap(sent)
        if self.pending_completion is not None and self.pending_completion[2] <= end:
            from_p, downtime, completed_at = self.pending_completion
            if tap is not None:
                tap(Completion(state.job_parallelism, downtime, completed_at))
            # As the job runner reports it: how it changed the job.
            policy.on_rescaled(from_p, state.job_parallelism, downtime, completed_at,
                               "in_place" if model.in_place else "restart")
            self.pending_completion = None
        restarting = self.pending_completion is not None
        window = loop.close(closed_at=end)
        true_capacity = model.capacity(state.parallelism if not model.fused else state.job_parallelism)
        timeline.t.append((i + 1) * w)
        timeline.arrival.append(rate)
        timeline.capacity.append(true_capacity)
        timeline.parallelism.append(state.job_parallelism)
        timeline.backlog.append(state.backlog)
        timeline.observed.append(window is not None)
        if window is None:
            return  # the job was down the whole window: no reports, no window, no decision
        analysis = loop.analyze(window)
        estimate = policy.planned_capacity(analysis)
        if estimate is not None and not restarting:
            self.capacity_errors.append(abs(estimate - true_capacity) / true_capacity)
        wanted = policy.decide(analysis, rescaling=restarting)
        if wanted is None:
            return
        if wanted == state.job_parallelism:
            # Already there (the job model changed since the window's reports): the runner answers at once.
            policy.on_rescaled(wanted, wanted, 0.0, end, "in_place" if model.in_place else "restart")
            if tap is not None:
                tap(Completion(wanted, 0.0, end))
            return
        if restarting:
            self.ignored += 1  # one rescale at a time, as execute's lock enforces
            return
        if wanted > state.job_parallelism:
            self.ups += 1
        else:
            self.downs += 1
        from_p = state.job_parallelism
        downtime = rescale(model, state, wanted, end)
        self.pending_completion = (from_p, downtime, end + downtime)

    @property
    def holding(self) -> int:
        """The slots the job holds now: a rescale in flight holds the larger of its two sides."""
        held = self.state.job_parallelism
        if self.pending_completion is not None:
            held = max(held, self.pending_completion[0])
        return held

    def result(self) -> PolicyRun:
        """The run's measures (slots, lag and time beyond the target count from the job's start)."""
        state, timeline, w = self.state, self.timeline, self.trace.window_s
        lags, beyond = timeline.backlog_measures(np.asarray(timeline.t) > self.start_s, self.backlog_target_s)
        lag_array = lags if len(lags) else np.zeros(1)
        slots = self.initial_parallelism * (1 if self.model.fused else len(self.model.operators))
        before_start = min(self.start_s, len(self.trace.rates) * w) * slots
        return PolicyRun(
            policy=self.policy.name, trace=self.trace.name, slot_seconds=state.slot_seconds - before_start,
            beyond_target_s=beyond, lag_p95_s=float(np.percentile(lag_array, 95)), lag_max_s=float(lag_array.max()),
            scale_ups=self.ups, scale_downs=self.downs, ignored_decisions=self.ignored, final_backlog=state.backlog,
            records_arrived=state.arrived,
            mean_utilization=state.busy_slot_seconds / state.slot_seconds if state.slot_seconds else 0.0,
            capacity_error_pct=100 * float(np.mean(self.capacity_errors)) if self.capacity_errors else None,
            seconds=time.perf_counter() - self.started, timeline=timeline,
            recoveries=list(getattr(self.policy, "recoveries", [])),  # a runner that predicts none has none
        )


def simulate(
    trace: Trace,
    model: JobModel,
    policy: PolicyRunner | ScheduleRunner,
    config: JobConfig,
    initial_parallelism: int,
    backlog_target_s: float,
    forecasts: ForecastStream | None = None,
    seed: int = 0,
    rate_noise: float | None = None,
    job_id: str = "eval",
    factors: np.ndarray | None = None,
    start_s: float = 0.0,
    tap: Callable[[MetricReport | Completion], None] | None = None,
) -> PolicyRun:
    """Replay `trace` into `model` under `policy`, one window at a time (see the module docstring).
    With `start_s`, the job starts that long after the load, as a live job does (Spark's start-up):
    the arrivals wait meanwhile, and its slots, lag and time beyond the target count from its start.
    `tap` sees every report the job sends and every answer of its runner, in order (a recording)."""
    sim = JobSim(trace, model, policy, config, initial_parallelism, backlog_target_s, forecasts, seed, rate_noise,
                 job_id, factors, start_s, tap)
    for i in range(len(trace.rates)):
        sim.step(i)
    return sim.result()
