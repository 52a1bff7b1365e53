"""`flink`: a baseline that behaves like the Apache Flink Kubernetes Operator autoscaler (FLIP-271 as shipped).

One job-wide parallelism (our jobs have a single scalable stage, which Flink would see as one
source vertex). See `FlinkPolicy` for the rules and their defaults; every duration is a parameter
in seconds of metric time so that compressed traces can shrink them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, Field

from contracts.analyses import Analysis
from contracts.decisions import DecisionReason
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.policy import Plan, direction, hold

# Ceilings ignore floating-point noise (4.0000000001 slots is 4 slots).
EPSILON = 1e-9
# Observed restart times kept when restart-time tracking is on (job.autoscaler.history.max.count).
RESTART_SAMPLES = 3


def java_round(value: float) -> float:
    """Java's Math.round (half up), which Flink applies to every target capacity."""
    return math.floor(value + 0.5)


def align_to_partitions(new_parallelism: int, current: int, partitions: int, upper_bound: int, lower_bound: int) -> int:
    """Flink's EVENLY_SPREAD alignment (JobVertexScaler.scale): prefer a parallelism that divides the
    partition count, so every subtask reads the same number of partitions.

    Phase 1 searches upward from `new_parallelism` for a divisor (for a scale-down, no higher than
    the current parallelism). Phase 2 falls back downward to the smallest parallelism with the same
    partitions-per-subtask as `new_parallelism`. A result that would reverse the direction of the
    change returns `current` (no change)."""
    align_bound = min(partitions, upper_bound)
    scaling_up = new_parallelism > current
    phase1_bound = align_bound if scaling_up else min(current, align_bound)
    for candidate in range(new_parallelism, phase1_bound + 1):
        if partitions % candidate == 0:
            return candidate
    candidate = new_parallelism
    while candidate > 0:
        if partitions // candidate > partitions // new_parallelism:
            if partitions % candidate != 0:
                candidate += 1
            break
        candidate -= 1
    candidate = max(candidate, lower_bound)
    if (scaling_up and candidate <= current) or (not scaling_up and candidate >= current):
        return current
    return candidate


class FlinkSample(BaseModel):
    """What the policy keeps of one window in its metrics history."""

    window_end: float
    parallelism: int
    utilization: float
    true_processing_rate: float
    arrival_rate: float  # the source's, or Flink's input rate plus lag growth without one
    observed_processing_rate: float


class FlinkMemory(BaseModel):
    """The metrics history since the job (re)started, and the pending scale-down."""

    seen_rescale_at: float | None = None
    running_since: float | None = None
    first_sample_at: float | None = None
    samples: list[FlinkSample] = Field(default_factory=list)
    scale_down_first_trigger: float | None = None
    # (trigger time, recommended parallelism), parallelism strictly decreasing: the first is the max.
    scale_down_recommendations: list[tuple[float, int]] = Field(default_factory=list)

    def restart_history(self, running_since: float) -> None:
        self.running_since = running_since
        self.first_sample_at = None
        self.samples.clear()
        self.cancel_scale_down()

    def cancel_scale_down(self) -> None:
        self.scale_down_first_trigger = None
        self.scale_down_recommendations.clear()


@dataclass(frozen=True)
class FlinkPolicy:
    """The Flink Kubernetes Operator's job autoscaler, job-wide, with its documented defaults.

    Option names are Flink's (`job.autoscaler.*`); every duration is a parameter in seconds of metric
    time so that compressed traces can shrink them. The rules, in the order Flink applies them:

    1. Hold while a rescale is in progress (the planner step) or when the window is invalid.
    2. Stabilization (`stabilization.interval`, 300 s): no metrics are collected until this long
       after the job (re)started, so start-up transients and catch-up after a restart are ignored.
       The start is when the last rescale ended (the plan state's `last_rescale_at`), or the first
       analysis seen for a fresh job.
    3. Metrics window (`metrics.window`, 900 s): no decision until the window is full, i.e. this
       long after the first sample collected after stabilization; then rates are averaged over the
       analyses of the last `metrics_window_s`. A rescale (or a parallelism change) clears the
       history, as Flink clears it when the job restarts. A larger window smooths noise.
    4. Rates: the true processing rate is the busy-time-weighted mean of `true_processing_rate`
       (Flink's average input rate over average busy time) times the parallelism; the arrival rate
       is the mean `arrival_rate` (Flink's input rate plus lag growth); the backlog is the latest.
    5. Target capacity = backlog / `catch-up.duration` (1800 s: drain the backlog within it)
       + arrival x `restart.time` / catch-up duration (300 s: also drain what piles up while the
       job restarts) + arrival / `target.utilization` (0.7: headroom for load spikes).
       Restart-time tracking (`restart.time-tracking.enabled`, off) uses the largest of the last
       3 observed downtimes of each direction (the plan state keeps them per direction), capped at
       `restart.time-tracking.limit` (900 s).
    6. Scale factor = target capacity / true processing rate, bounded to
       [1 - `scale-down.max-factor` (0.6), 1 + `scale-up.max-factor` (100000)], so one step removes
       at most 60 % of the slots (a scale-down is the riskier guess) while a scale-up is unbounded.
       New parallelism = ceil(factor x p), bounded to [min(p, the job's `min_parallelism`),
       max(p, the job's `max_parallelism`)] and, for a source that cannot split a partition
       (`splittable` false), to its partition count (idle readers are useless).
    7. Alignment (`align_to_partitions`, on; Flink's EVENLY_SPREAD mode, default): with a known
       partition count, pick a divisor of it (see `align_to_partitions`) so load spreads evenly. A
       splittable source asked for more slots than partitions is left unaligned (Flink would cap
       it; our Spark-like jobs can split partitions).
    8. Scale-down interval (`scale-down.interval`, 3600 s; it replaced `scale-up.grace-period`,
       1 h, whose key it still accepts): a scale-down runs only after scale-downs have been
       recommended for this long since the first one, and then to the largest parallelism
       recommended within the interval, merging several scale-downs into one restart. A scale-up
       or no-change recommendation, or a rescale, cancels the pending scale-down.
    9. Utilization boundary (`target.utilization.boundary`, 0.3): no rescale while the true
       processing rate lies between the target capacity at utilization 0.7 + 0.3 (without the
       restart term) and at 0.7 - 0.3 (with it), i.e. roughly 40-100 % busy, to avoid churn.
       While processing backlog (backlog / average processed rate above
       `backlog-processing.lag-threshold`, 300 s) the band is 100 % to 0 %: never scale down
       while catching up, scale up only if the job cannot drain the backlog in time.

    Not modelled (off by default or without an equivalent here): per-vertex parallelism,
    ineffective-scaling detection, the observed-true-processing-rate switch, memory tuning,
    quotas and excluded periods.
    """

    name: ClassVar[str] = "flink"
    summary: ClassVar[str] = "Flink Kubernetes Operator autoscaler (FLIP-271) with its shipped defaults"
    needs_forecast: ClassVar[bool] = False
    target_utilization: float = 0.7
    utilization_boundary: float = 0.3
    metrics_window_s: float = 900.0
    stabilization_s: float = 300.0
    catch_up_duration_s: float = 1800.0
    restart_time_s: float = 300.0
    track_restart_time: bool = False
    restart_time_limit_s: float = 900.0
    backlog_lag_threshold_s: float = 300.0
    scale_down_interval_s: float = 3600.0
    max_scale_down_factor: float = 0.6
    max_scale_up_factor: float = 100000.0
    align_to_partitions: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1 or self.utilization_boundary < 0:
            raise ValueError("target_utilization must be in (0, 1] and utilization_boundary >= 0")
        if self.metrics_window_s <= 0 or min(self.stabilization_s, self.catch_up_duration_s, self.restart_time_s,
                                             self.restart_time_limit_s, self.backlog_lag_threshold_s,
                                             self.scale_down_interval_s) < 0:
            raise ValueError("metrics_window_s must be positive and the other durations non-negative")
        if not 0 <= self.max_scale_down_factor <= 1 or self.max_scale_up_factor < 0:
            raise ValueError("max_scale_down_factor must be in [0, 1] and max_scale_up_factor >= 0")

    # ---------------------------------------------------------------- the policy protocol

    def decide(self, state: PlanState, analysis: Analysis, config: JobConfig) -> tuple[PlanState, Plan]:
        memory = FlinkMemory.model_validate(state.policy_state)
        if state.last_rescale_at is not None and state.last_rescale_at != memory.seen_rescale_at:
            memory.seen_rescale_at = state.last_rescale_at
            memory.restart_history(state.last_rescale_at)  # Flink clears its history when the job restarts
        plan = self._decide(memory, analysis, state, config)
        return state.updated({"policy_state": memory.model_dump()}), plan

    def planned_capacity(self, analysis: Analysis, config: JobConfig) -> float | None:
        rate = analysis.true_processing_rate
        return rate * analysis.parallelism if analysis.valid and rate > 0 else None

    def _decide(self, memory: FlinkMemory, analysis: Analysis, state: PlanState, config: JobConfig) -> Plan:
        if not analysis.valid:
            return self._hold(analysis, "invalid_window")
        now = analysis.window_end
        if memory.samples and memory.samples[-1].parallelism != analysis.parallelism:
            memory.restart_history(now)  # the job changed under us: Flink clears its history too
        if memory.running_since is None:
            memory.running_since = now
        if now < memory.running_since + self.stabilization_s - EPSILON:
            return self._hold(analysis, "stabilization")
        if memory.first_sample_at is None:
            memory.first_sample_at = now
        memory.samples.append(FlinkSample(
            window_end=now, parallelism=analysis.parallelism, utilization=analysis.utilization,
            true_processing_rate=analysis.true_processing_rate, arrival_rate=self._arrival_rate(analysis),
            observed_processing_rate=analysis.observed_processing_rate,
        ))
        if now - memory.first_sample_at < self.metrics_window_s - EPSILON:
            return self._hold(analysis, "metrics_window_not_full")
        while memory.samples[0].window_end <= now - self.metrics_window_s + EPSILON:
            memory.samples.pop(0)
        return self._evaluate(memory, analysis, state, config)

    # ---------------------------------------------------------------- the rules

    def expected_restart_time_s(self, state: PlanState) -> float:
        measured = [*state.restarts.up[-RESTART_SAMPLES:], *state.restarts.down[-RESTART_SAMPLES:]]
        if self.track_restart_time and measured:
            return min(max(measured), self.restart_time_limit_s)
        return self.restart_time_s

    def target_capacity(self, arrival_rate: float, backlog: float, utilization: float, restart_time_s: float) -> float:
        """Records/s the job must process: backlog catch-up + restart catch-up + arrivals at `utilization`."""
        utilization = min(max(utilization, 0.0), 1.0)
        if utilization == 0:
            return math.inf
        catch_up = self.catch_up_duration_s
        backlog_rate = backlog / catch_up if catch_up > 0 else 0.0
        restart_rate = arrival_rate * restart_time_s / catch_up if catch_up > 0 else 0.0
        return java_round(backlog_rate + restart_rate + arrival_rate / utilization)

    def _evaluate(self, memory: FlinkMemory, analysis: Analysis, state: PlanState, config: JobConfig) -> Plan:
        now, current = analysis.window_end, analysis.parallelism
        per_slot_rate = self._average_true_processing_rate(memory.samples)
        if not per_slot_rate > 0:
            return self._hold(analysis, "no_true_processing_rate")
        capacity = per_slot_rate * current
        arrival_rate = sum(s.arrival_rate for s in memory.samples) / len(memory.samples)
        processed_rate = sum(s.observed_processing_rate for s in memory.samples) / len(memory.samples)
        backlog = float(analysis.backlog or 0)
        restart_time_s = self.expected_restart_time_s(state)

        target = self.target_capacity(arrival_rate, backlog, self.target_utilization, restart_time_s)
        wanted = self._bounded_parallelism(current, target / capacity, analysis, config)
        if wanted == current:
            memory.cancel_scale_down()
            return self._hold(analysis, "no_change")
        if wanted > current:
            memory.cancel_scale_down()
        else:
            delayed = self._delay_scale_down(memory, now, wanted)
            if delayed is None:
                return self._hold(analysis, "scale_down_interval")
            wanted = delayed
        if self._within_utilization_boundary(capacity, arrival_rate, backlog, processed_rate, restart_time_s):
            return self._hold(analysis, "within_utilization_boundary")
        action = direction(current, wanted)
        numbers = {"target_capacity": target, "capacity": round(capacity, 3), "arrival_rate": round(arrival_rate, 3),
                   "restart_time_s": restart_time_s}
        message = f"target capacity {target:.0f} rec/s over {capacity:.1f} at {current} -> {wanted}"
        reason = DecisionReason(code=action.value, rule=self.name, numbers=numbers, message=message)
        return Plan(action, wanted, reason, recommended=wanted)

    def _bounded_parallelism(self, current: int, scale_factor: float, analysis: Analysis, config: JobConfig) -> int:
        scale_factor = min(max(scale_factor, 1 - self.max_scale_down_factor), 1 + self.max_scale_up_factor)
        lower = min(current, config.min_parallelism)
        upper = max(current, config.max_parallelism)
        partitions = analysis.partitions
        if partitions is not None and not analysis.splittable:
            upper = min(upper, partitions)
        wanted = min(max(lower, math.ceil(scale_factor * current - EPSILON)), upper)
        if not self.align_to_partitions or partitions is None or wanted == current:
            return wanted
        if analysis.splittable and wanted > partitions:
            return wanted
        return align_to_partitions(wanted, current, partitions, upper, lower)

    def _delay_scale_down(self, memory: FlinkMemory, now: float, wanted: int) -> int | None:
        """Record a scale-down recommendation; the parallelism to scale down to once the interval
        has passed since the first one (the largest recommended within it), else None."""
        if self.scale_down_interval_s <= 0:
            return wanted
        if memory.scale_down_first_trigger is None:
            memory.scale_down_first_trigger = now
        recommendations = memory.scale_down_recommendations
        while recommendations and recommendations[-1][1] <= wanted:
            recommendations.pop()
        recommendations.append((now, wanted))
        if now - memory.scale_down_first_trigger < self.scale_down_interval_s - EPSILON:
            return None
        window_start = now - self.scale_down_interval_s
        while recommendations[0][0] < window_start - EPSILON:
            recommendations.pop(0)
        return recommendations[0][1]

    def _within_utilization_boundary(
        self, capacity: float, arrival_rate: float, backlog: float, processed_rate: float, restart_time_s: float
    ) -> bool:
        if self._processing_backlog(backlog, processed_rate):
            upper_utilization, lower_utilization = 1.0, 0.0
        else:
            upper_utilization = self.target_utilization + self.utilization_boundary
            lower_utilization = self.target_utilization - self.utilization_boundary
        scale_up_threshold = self.target_capacity(arrival_rate, backlog, upper_utilization, 0.0)
        scale_down_threshold = self.target_capacity(arrival_rate, backlog, lower_utilization, restart_time_s)
        return scale_up_threshold <= capacity <= scale_down_threshold

    def _processing_backlog(self, backlog: float, processed_rate: float) -> bool:
        if processed_rate > 0:
            return backlog / processed_rate > self.backlog_lag_threshold_s
        return backlog > 0  # Java: lag / 0.0 is +inf when there is a backlog, NaN (false) when not

    @staticmethod
    def _average_true_processing_rate(samples: list[FlinkSample]) -> float:
        busy = [s.utilization * s.parallelism for s in samples]
        total_busy = sum(busy)
        if total_busy > 0:
            return sum(s.true_processing_rate * b for s, b in zip(samples, busy, strict=True)) / total_busy
        return sum(s.true_processing_rate for s in samples) / len(samples)

    @staticmethod
    def _arrival_rate(analysis: Analysis) -> float:
        if analysis.arrival_rate is not None:
            return analysis.arrival_rate
        # Without a source arrival rate Flink uses its input rate plus the lag growth rate.
        return max(0.0, analysis.observed_processing_rate + (analysis.backlog_growth_rate or 0.0))

    def _hold(self, analysis: Analysis, code: str) -> Plan:
        return hold(analysis.parallelism, code, code.replace("_", " "), rule=self.name)
