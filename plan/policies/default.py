"""`default`: the cost-based planner. Every window it plans the parallelism over the next minutes at the
least cost that keeps the backlog within its target, and applies the first step.

After QEScalor's cost-based elastic scaling (QCESA) and Daedalus's long-lived decisions; the search
is `plan.cost_plan` (dynamic programming over time x parallelism with the backlog carried). What it
plans with, each an estimate on the safe side:
- arrivals: the upper quantile of the arrival level since the last level shift (`plan.level`, a
  CUSUM detector), and over the horizon the upper quantile of analyze's forecast where it is higher,
  while the forecast's predicted changes have come true (`plan.forecast_skill`);
- capacity (`plan.capacity_estimate`): the DS2 true rate measured at each parallelism the job ran at
  (records per busy second per slot, averaged; `known`), extrapolated to the others along a power law
  fitted through them (exponent at most 1: slots never add more than linearly), less its measured
  noise; for a micro-batch job, as a saturated job runs (`plan.batching`): each window's rate raised
  to the one full batches show (DS2's rate falls at small batches: a task has a fixed cost), times the
  share of a full batch its slots spend on records (a fixed cost per batch), all measured online; for a
  job whose task count stays fixed (in place), as its batches run, in ceil(tasks / p) waves (`in_waves`);
- the backlog target, less a reserve for a jump of the arrival rate while a scale-up lands (none on a shared cluster)
  (`reserved_target_s`);
- actions: the measured restart time of each direction (the plan state's downtimes), the replay
  since the last checkpoint (half a checkpoint interval of arrivals), and a penalty per action; for a
  job whose executors are changed in place (`scaling_backend`), a scale-up's measured time at the old
  capacity and a scale-down's hold, with nothing replayed (`contracts.backends`).

A rescale goes ahead only for a real gain (`plan.real_gain`): its schedule must cost less than the
best schedule that holds the current parallelism now (both charged their rescales' penalties), or
holding must break the target; otherwise the planner holds and says what the rescale would save. A
plan may move to a parallelism that runs short of the planned rate now only where the job allows a
planned shortfall (`allow_planned_shortfall`, the default), and the reason says where a first step runs short.

The planner is the schedule search and its gates (`plan.gates`). After a rescale it measures the new
parallelism for FIT_MIN_WINDOWS windows before it searches again, unless the backlog heads beyond its
target (`MeasuringHold`). On the plan, in order (`CostPlanner.gates`): a rescale waits for
LEVEL_WINDOWS windows of the current arrival level, a scale-up only while the backlog is not heading
beyond its target (`LevelHold`); a scale-down within the job's `scale_down_delay_s` of a scale-up
waits unless the arrival level has shifted since, the load dropped (`ScaleDownAfterScaleUp`): one
action per load change. Then the job's own limits, as for every policy: excluded periods, the step
bounds and partition alignment. Each rescale carries its predicted recovery time.

Pure: everything it learns lives in the plan state's `policy_state`. A job planned per operator
(`per_operator`, a Flink-like layout with one parallelism per operator) is sized by DS2 inside its
controls (the `reactive` policy): the schedule search plans one job-wide parallelism.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from contracts.analyses import Analysis, ForecastView
from contracts.backends import backend_in_use, planned_costs
from contracts.decisions import Action, DecisionReason
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.batching import BatchCost
from plan.capacity_estimate import Measured, SlotStats, capacities, in_waves, planned_capacity
from plan.controls import partition_units
from plan.cost_plan import PlanProblem, Schedule, describe, first_steps, solve, solve_with_next
from plan.forecast_skill import ForecastSkill, note
from plan.gates import (
    LEVEL_WINDOWS,
    ExcludedPeriods,
    Gate,
    LevelHold,
    MeasuringHold,
    PartitionAlignment,
    ScaleDownAfterScaleUp,
    StepBounds,
    apply_gates,
)
from plan.guarded import admit, rescale_updates
from plan.level import LevelState
from plan.level import update as update_level
from plan.policies.reactive import ReactivePolicy
from plan.policy import Plan, direction, hold
from plan.proactive import downtimes_expected, predicted_recovery_s
from plan.real_gain import held_message, no_real_gain, shortfall_note

FORECAST_MAX_OFFSET = 0.25  # a forecast whose first value is this far from the measured level is not used
NOISE_PRIOR = 0.1  # the per-window CV of the per-slot rate assumed until three windows were measured
# A backlog of more than this many seconds of arrivals keeps micro-batches at the source's cap (a full
# batch holds a few seconds of work per slot).
SATURATED_BACKLOG_S = 10.0
DEFAULT_WINDOW_S = 10.0  # the monitor's window, until two arrival rates have been seen


class PlannerMemory(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    level: LevelState = Field(default_factory=LevelState)
    slot: SlotStats | None = None
    known: dict[str, Measured] = Field(default_factory=dict)  # by parallelism
    noise_cv: float | None = None  # the latest per-window CV of the per-slot rate
    skill: ForecastSkill = Field(default_factory=ForecastSkill)
    recommended: int | None = None  # the first step of the last plan
    # Whether that recommendation was made on an arrival level of LEVEL_WINDOWS windows or more (or confirmed
    # on one): made on a level's first window, which may straddle the change, it does not stand (`_kept`).
    recommended_settled: bool = True
    batch: BatchCost | None = None
    last_up_at: float | None = None  # metric time of the last scale-up decided


def forecast_offset(level: float | None, first: float) -> float:
    """How far a forecast's first value is from the measured level, relative to it (inf without a level)."""
    return abs(first / level - 1) if level and first > 0 else math.inf


def capped_upper(values: np.ndarray, upper: list[float], band: float) -> np.ndarray:
    """A forecast's upper quantile, no lower than its point forecast and at most `band` (a log ratio) above it."""
    return np.minimum(np.maximum(np.asarray(upper, dtype=float), values), values * math.exp(band))


def planned_rates(level: float, forecast: ForecastView | None, now: float, steps: int, step_s: float,
                  trusted: bool = True, band: float = math.inf, floor: bool = True) -> np.ndarray:
    """The arrival rate to plan each step with: the level's upper quantile, raised where a trusted forecast
    expects more. The forecast counts as its relative change: its upper quantile at the step's middle over
    its upper quantile at its first point, applied to the level (the last value beyond its end; before its
    first point the level stands alone). The level's quantile already covers the uncertainty of the rate
    now, so only the forecast's change and the widening of its band with the lead count on top of it (over
    the point forecast's first value the band would count twice; docs/results.md). It is used when its
    change over the next minutes has come true lately (`trusted`, see `plan.forecast_skill`) and it starts
    near the level (within FORECAST_MAX_OFFSET). Its upper quantile is capped at `band` (a log ratio) above
    its point forecast: no wider than its errors (`band=0`: the point forecast). Without `floor`, a forecast
    that falls lowers the rates below the level too: what is expected, not what is safe to plan with."""
    rates = np.full(steps, level)
    if not trusted or forecast is None or not forecast.values or forecast.values[0] <= 0:
        return rates
    first = forecast.values[0]
    if forecast_offset(level, first) > FORECAST_MAX_OFFSET:
        return rates
    values = np.asarray(forecast.values, dtype=float)
    if forecast.upper and len(forecast.upper) == len(values):
        values = capped_upper(values, forecast.upper, band)
        first = float(values[0])
    times = forecast.start + np.arange(len(values)) * forecast.step_s
    middles = now + (np.arange(steps) + 0.5) * step_s
    expected = level * np.interp(middles, times, values, left=first) / first
    return np.maximum(rates, expected) if floor else expected


def reserved_target_s(target_s: float, level: LevelState, landing_s: float, z: float) -> float:
    """The backlog target the plan keeps, in seconds of arrivals: the job's, less what an arrival rate at the
    level's upper `z` quantile for one window (its per-window noise, `LevelState.sigma`) would add while a
    scale-up lands: the LEVEL_WINDOWS windows of a new level a scale-up waits for (`plan.gates.LevelHold`),
    then its pause and ramp (`landing_s`). A plan
    that rides its backlog up to the target has no room left for a jump before a scale-up lands (measured in
    docs/results.md). At most half the target is reserved; z = 0 (the point estimates) reserves nothing."""
    times = [t for t, _ in level.recent]
    window_s = times[-1] - times[-2] if len(times) >= 2 else DEFAULT_WINDOW_S
    reserve = (math.exp(z * level.sigma) - 1.0) * (LEVEL_WINDOWS * window_s + landing_s)
    return max(target_s - reserve, target_s / 2)


class CostPlanner:
    """The default policy (see the module docstring)."""

    name: ClassVar[str] = "default"
    summary: ClassVar[str] = ("cost-based planner: the least slot-seconds over the next 30 min that keep the backlog "
                              "within target, with restart costs, forecast and capacity quantiles")
    needs_forecast: ClassVar[bool] = True

    def __init__(self, horizon_s: float = 1800.0, step_s: float = 60.0, rate_z: float = 1.28,
                 capacity_z: float = 1.28, action_penalty_slot_s: float = 300.0) -> None:
        self.horizon_s = horizon_s
        self.step_s = step_s
        self.rate_z = rate_z
        self.capacity_z = capacity_z
        self.action_penalty_slot_s = action_penalty_slot_s

    def planned_capacity(self, analysis: Analysis, config: JobConfig) -> float | None:
        rate = analysis.true_processing_rate
        return analysis.parallelism * rate if analysis.valid and rate > 0 else None

    def planning_problem(self, state: PlanState, analysis: Analysis, config: JobConfig) -> PlanProblem | None:
        """The problem this window posed, on the state `decide` left (what a fleet bid is priced on)."""
        if not state.policy_state:
            return None
        return self.problem(PlannerMemory.model_validate(state.policy_state), analysis, config, state)

    def decide(self, state: PlanState, analysis: Analysis, config: JobConfig) -> tuple[PlanState, Plan]:
        if config.per_operator and analysis.operators:
            # One parallelism per operator (a Flink-like layout): DS2 sizes each operator in one step.
            return ReactivePolicy().decide(state, analysis, config)
        memory = PlannerMemory.model_validate(state.policy_state) if state.policy_state else PlannerMemory()
        now = analysis.window_end
        if analysis.arrival_rate is not None:
            # The level averages at most the job's metrics window (`metrics_window_s`), as its other rates do.
            level, shifted = update_level(memory.level, now, analysis.arrival_rate, config.metrics_window_s)
            # A forecast fitted across a level shift has not been seen on the new level: it earns trust anew.
            skill = note(ForecastSkill() if shifted else memory.skill, now, level.level(), analysis.forecast)
            memory = memory.model_copy(update={"level": level, "skill": skill})
        early, updates = admit(analysis, config, state)
        if early is None:
            memory = self._learn(memory, analysis)
        updates["policy_state"] = memory.model_dump(mode="json")
        if early is not None:
            return state.updated(updates), early
        state = state.updated(updates)
        measured = memory.slot.n if memory.slot is not None and memory.slot.parallelism == analysis.parallelism else 0
        measuring = apply_gates((MeasuringHold(measured),), None, state, analysis, config).plan
        if measuring is not None:
            return state, measuring
        plan, changes = self._plan(memory, analysis, config, state)
        remembered: dict[str, Any] = {}
        if plan.recommended is not None:
            settled = len(memory.level.points) >= LEVEL_WINDOWS or (
                plan.recommended == memory.recommended and memory.recommended_settled)
            if plan.recommended != memory.recommended or settled != memory.recommended_settled:
                remembered.update(recommended=plan.recommended, recommended_settled=settled)
        if plan.action is Action.SCALE_UP:
            remembered["last_up_at"] = now
        if remembered:
            memory = memory.model_copy(update=remembered)
            changes["policy_state"] = memory.model_dump(mode="json")
        return state.updated(changes), plan

    def _learn(self, memory: PlannerMemory, analysis: Analysis) -> PlannerMemory:
        p, rate = analysis.parallelism, analysis.true_processing_rate
        if rate <= 0 or analysis.utilization <= 0:
            return memory
        slot = memory.slot if memory.slot is not None and memory.slot.parallelism == p else SlotStats(parallelism=p)
        slot = slot.add(rate)
        batch = memory.batch
        # Records per slot per micro-batch: DS2's rate depends on it (`plan.batching`).
        size = analysis.batch_work_s * rate if analysis.batch_work_s else None
        # Batches are full while the backlog holds more than a full batch's records.
        full = (analysis.backlog or 0) > SATURATED_BACKLOG_S * (analysis.arrival_rate or 0.0) > 0
        if analysis.batch_overhead_s is not None:
            work = analysis.batch_work_s
            batch = (BatchCost.first(analysis.batch_overhead_s, work, full, size) if batch is None
                     else batch.add(analysis.batch_overhead_s, work, full, size))
        # Each window's rate as full batches would show it (the mean of rates measured at varied batch
        # sizes is not the rate at their mean size: corrected one by one). Until the correction is
        # known, a window of small batches is provisional: live, a job that starts at a low load
        # measured 140-170 rec/s per slot for minutes, and averaged in, they held its estimate 10-15 %
        # below its full batches' rate for the rest of the run.
        capacity = p * rate * (batch.saturation_factor(size) if batch is not None else 1.0)
        provisional = batch is not None and not full and not batch.corrects
        known = dict(memory.known)
        previous = known.get(str(p))
        known[str(p)] = (Measured(capacity=capacity, provisional=provisional) if previous is None
                         else previous.learned(capacity, provisional))
        return memory.model_copy(update={"slot": slot, "known": known, "batch": batch,
                                         "noise_cv": slot.cv if slot.cv is not None else memory.noise_cv})

    def problem(self, memory: PlannerMemory, analysis: Analysis, config: JobConfig, state: PlanState,
                quantiles: bool = True) -> PlanProblem | None:
        """The planning problem this window poses; None while the arrival level or capacity is unknown.
        Without `quantiles`, with the point estimates (the mean level and capacities). A job on a shared
        cluster (`config.cluster`) plans at its full backlog target, with no reserve (`reserved_target_s`):
        there the reserve raised what every job wanted at the fleet's joint peak, where the fleet step
        shares the budget by weight and moved slots back and forth (docs/results.md)."""
        level = memory.level.upper_level(self.rate_z if quantiles else 0.0)
        planned = dict(planned_capacity(config.planned_capacity))
        if level is None or not (memory.known or planned):
            return None
        steps = max(1, math.ceil(self.horizon_s / self.step_s))
        rates = planned_rates(level, analysis.forecast, analysis.window_end, steps, self.step_s,
                              memory.skill.trusted(), memory.skill.band())
        noise = memory.noise_cv if memory.noise_cv is not None else NOISE_PRIOR
        # Measured capacities are rates of full micro-batches (times the batch efficiency below); a planned
        # one is the testbed's sustained throughput, efficiency included.
        efficiency = memory.batch.efficiency if memory.batch is not None else 1.0
        capacity = capacities(memory.known, config.max_parallelism, noise, self.capacity_z if quantiles else 0.0,
                              {p: c / efficiency for p, c in planned.items()}, config.planned_capacity_error)
        capacity = in_waves(capacity * efficiency, [count for _, count in partition_units(analysis)])
        up, down = downtimes_expected(state.restarts, config)
        costs = planned_costs(backend_in_use(config.scaling_backend, state.backend)[0], state.restarts, up, down,
                              (analysis.arrival_rate or 0.0) * config.checkpoint_interval_s / 2)
        ramp = min(costs.up_ramp_s, config.restart_time_cap_s)
        target_s = reserved_target_s(config.backlog_target_s, memory.level, costs.up_pause_s + ramp,
                                     self.rate_z if quantiles and not config.cluster else 0.0)
        return PlanProblem(
            parallelism=analysis.parallelism, backlog=float(analysis.backlog or 0), rates=rates, step_s=self.step_s,
            capacity=capacity, min_parallelism=config.min_parallelism, downtime_up_s=costs.up_pause_s,
            downtime_down_s=costs.down_pause_s, replay_records=costs.replay_records,
            backlog_target_s=target_s, action_penalty_s=self.action_penalty_slot_s, ramp_up_s=ramp,
            allow_planned_shortfall=config.allow_planned_shortfall,
        )

    def _plan(self, memory: PlannerMemory, analysis: Analysis, config: JobConfig, state: PlanState
              ) -> tuple[Plan, dict[str, Any]]:
        current = analysis.parallelism
        problem = self.problem(memory, analysis, config, state)
        if problem is None:
            return hold(current, "learning", "no arrival level or capacity measured yet", rule=self.name), {}
        chosen, alternative = solve_with_next(problem)
        basis = problem  # the problem the plan was made on: the point estimates' where a recommendation is kept
        kept = self._kept(memory, analysis, config, state, chosen)
        extra = 0.0  # what the next best pays beyond its schedule: changing a kept recommendation
        if kept is not None:
            (basis, chosen, alternative), extra = kept, self.action_penalty_slot_s
        target = chosen.first
        numbers = _numbers(chosen, alternative, problem, extra)
        message = (f"plan {describe(chosen, self.step_s)} over {self.horizon_s / 60:g} min costs {chosen.cost:,.0f} "
                   "slot-s" + (" on the point estimates" if kept else ""))
        if alternative is not None:
            message += f"; next best ({alternative.first} now) {alternative.cost + extra:,.0f}" + (
                f" ({alternative.cost:,.0f} and {extra:,.0f} to change the recommendation)" if kept else "")
        if kept is not None:  # kept on the point estimates: what the quantiles expect of it is told too
            cautious = solve(problem, force_first=target)
            numbers["expected_violation_s"] = round(cautious.violation_s, 1)
            if cautious.violation_s > 0:
                message += (f"; planned with the quantiles, it expects {cautious.violation_s:.0f} s of arrivals "
                            "beyond the backlog target")
        elif chosen.violation_s > 0:
            message += f"; expects {chosen.violation_s:.0f} s of arrivals beyond the backlog target at best"
        short = shortfall_note(basis, chosen)
        if short is not None:
            message += f"; {short}"
        fallback = backend_in_use(config.scaling_backend, state.backend)[1]
        if fallback is not None:
            message += f"; {fallback}"
        if target == current:
            return hold(current, "planned_hold", message, rule=self.name, **numbers), {}
        held = no_real_gain(basis, chosen)
        if held is not None:  # a rescale that saves no more than its penalties: holding instead
            message += f"; {held_message(basis, chosen, held, self.step_s)}"
            return hold(current, "planned_hold", message, rule=self.name, **numbers,
                        hold_cost_slot_s=round(held.cost, 1)), {}
        proposal = Plan(direction(current, target), target,
                        DecisionReason(code="cost_plan", rule=self.name, message=message, numbers=numbers),
                        recommended=target)
        gated = apply_gates(self.gates(memory), proposal, state, analysis, config, cite=True)
        plan = gated.plan or proposal
        if gated.held_by is not None:
            return plan, {}
        to, message, numbers = plan.to_parallelism, plan.reason.message, dict(plan.reason.numbers)
        if to == current:
            return replace(hold(current, "planned_hold", message, rule=self.name, **numbers), recommended=target), {}
        # The prediction is of what will be observed: the point estimates, not the quantiles planned with.
        expected = self.problem(memory, analysis, config, state, quantiles=False) or problem
        top = expected.max_parallelism
        numbers["expected_capacity_at_target"] = round(float(expected.capacity[min(to, top)]), 2)
        numbers["predicted_recovery_s"] = predicted_recovery_s(
            analysis, config, to, state.restarts, lambda p: float(expected.capacity[min(p, top)]),
            rates=self.expected_rates(memory, analysis, expected))
        changes = rescale_updates(current, to, analysis.window_end, numbers["predicted_recovery_s"], config)
        reason = DecisionReason(code="cost_plan", rule=self.name, message=message, numbers=numbers)
        return Plan(direction(current, to), to, reason, recommended=target), changes

    def gates(self, memory: PlannerMemory) -> tuple[Gate, ...]:
        """The gates on a planned rescale, in order: a new arrival level measured, the scale-down delay after
        a scale-up, then the job's limits (excluded periods, step bounds, partition alignment)."""
        return (LevelHold(len(memory.level.points)), ScaleDownAfterScaleUp(memory.last_up_at, memory.level.shifted_at),
                ExcludedPeriods(), StepBounds(), PartitionAlignment())

    def _kept(self, memory: PlannerMemory, analysis: Analysis, config: JobConfig, state: PlanState, best: Schedule
              ) -> tuple[PlanProblem, Schedule, Schedule | None] | None:
        """The last recommendation, where it stands (None where the plan is `best`): the problem on the point
        estimates (the mean level and capacities), its schedule and the next best on them. A recommendation
        that does not carry the rate now on them (where the job allows no planned shortfall) stands no more,
        nor does one made on an arrival level's first window (it may straddle the change; a scale-up it
        recommended would be followed by another once the level is measured: docs/results.md).

        A recommendation not acted on (recommend mode, a held rescale) changes only when the point
        estimates say it no longer keeps the target or costs an action's penalty more than the best: a
        Schmitt trigger whose band is the estimates' uncertainty, so noise does not flip it. It is reported
        on the terms it was kept on: its cost on the point estimates, and as the next best the cheapest
        schedule starting elsewhere on them, which costs no less than the best, so the kept plan costs at
        most the next best's cost and an action's penalty (to change the recommendation)."""
        kept = memory.recommended
        if kept is None or kept in (best.first, analysis.parallelism) or not memory.recommended_settled:
            return None
        point = self.problem(memory, analysis, config, state, quantiles=False)
        if point is None or not 1 <= kept <= point.max_parallelism or not first_steps(point)[kept - 1]:
            return None
        keeping, (point_best, point_next) = solve(point, force_first=kept), solve_with_next(point)
        if keeping.violation_s > 0 or keeping.cost > point_best.cost + self.action_penalty_slot_s:
            return None
        return point, keeping, point_best if point_best.first != kept else point_next

    @staticmethod
    def rate_now(memory: PlannerMemory, now: float, z: float) -> float | None:
        """The arrival rate now: the level's upper `z` quantile (the mean since the last shift), or where
        the recent rates rise or fall, the one further along the change of it and their trend line's end
        (`plan.level`). Each lags where the other does not: the level on a ramp (a scale-up predicted from
        it recovered in twice the time predicted, simulated and live), the line across a step. Neither is
        extrapolated: near a peak or a trough the trend would run past it. None before the first window.
        (The plan itself starts from the level: planned from this rate on a rise, a steady load's noise
        sometimes showed a rise and flipped a recommendation; docs/results.md.)"""
        level = memory.level.upper_level(z)
        trend = memory.level.trend(now)
        if level is None or trend is None or trend.slope == 0:
            return level
        return max(level, trend.rate) if trend.slope > 0 else min(level, trend.rate)

    def expected_rates(self, memory: PlannerMemory, analysis: Analysis, expected: PlanProblem
                       ) -> tuple[list[float], float]:
        """The arrivals a recovery prediction expects (values, step): from the rate now, as a trusted
        forecast expects them to change, falling ones too (the planned rates never fall below the rate they
        start from), from the rate now (`rate_now`, on the point estimate; a falling trend counts too)."""
        now = self.rate_now(memory, analysis.window_end, 0.0)
        rates = planned_rates(now or float(expected.rates[0]), analysis.forecast, analysis.window_end,
                              len(expected.rates), self.step_s, memory.skill.trusted(), band=0.0, floor=False)
        return list(rates), expected.step_s


def _numbers(chosen: Schedule, alternative: Schedule | None, problem: PlanProblem, extra: float = 0.0
             ) -> dict[str, float | int | None]:
    return {
        "plan_cost_slot_s": round(chosen.cost, 1),
        "alternative_first": alternative.first if alternative else None,
        "alternative_cost_slot_s": round(alternative.cost + extra, 1) if alternative else None,
        "expected_violation_s": round(chosen.violation_s, 1),
        "planned_rate_now": round(float(problem.rates[0]), 2),
        "planned_rate_max": round(float(problem.rates.max()), 2),
        "capacity_at_target": round(float(problem.capacity[chosen.first]), 2),
        "downtime_up_s": round(problem.downtime_up_s, 1),
        "downtime_down_s": round(problem.downtime_down_s, 1),
        "rescales_planned": chosen.rescales,
    }

