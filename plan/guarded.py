"""A policy inside the production controls: the base of the reactive, daedalus and hybrid policies.

Order, per window (mode and a rescale in flight are the planner step's, before any policy): stale
window, stabilization, invalid window (`admit`), then the gates (`plan.gates`): `MinimumSamples`
before the policy's core (on rates averaged over the metrics window), and on its plan `GATES`:
excluded period, scale-up effectiveness, step bounds, partition alignment, backlog mode, delayed
scale-down. The slot quota is applied by the plan agent, which reserves slots atomically across
jobs (`plan.gates.with_quota`).

A subclass gives its `core` (the parallelism it recommends for the smoothed rates) and the
capacity it predicts recoveries with; everything else is shared.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.jobs import JobConfig, Mode
from contracts.plan_state import PlanState
from plan.controls import check_scale_up_effectiveness, smoothed, smoothing_samples
from plan.gates import (
    BacklogMode,
    DelayedScaleDown,
    ExcludedPeriods,
    Gate,
    MinimumSamples,
    PartitionAlignment,
    ScaleUpEffectiveness,
    StepBounds,
    apply_gates,
)
from plan.policy import Plan, hold
from plan.proactive import Capacity, ds2_capacity, predicted_recovery_s

# The gates on a core's plan, in order (`plan.gates`).
GATES: tuple[Gate, ...] = (ExcludedPeriods(), ScaleUpEffectiveness(), StepBounds(), PartitionAlignment(),
                           BacklogMode(), DelayedScaleDown())


class GuardedPolicy:
    """A policy core inside the controls (see the module docstring)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    needs_forecast: ClassVar[bool] = False

    def core(self, rates: Analysis, config: JobConfig, state: PlanState, restart_time_s: float) -> Plan:
        """The recommendation for the rates averaged over the metrics window."""
        raise NotImplementedError

    def capacity_of(self, analysis: Analysis, config: JobConfig) -> Capacity | None:
        """Capacity (records/s) per parallelism this policy plans with; None while it has none."""
        rate = analysis.true_processing_rate
        return (lambda p: ds2_capacity(p, rate)) if rate > 0 else None

    def planned_capacity(self, analysis: Analysis, config: JobConfig) -> float | None:
        if not analysis.valid:
            return None
        capacity_of = self.capacity_of(analysis, config)
        return None if capacity_of is None else capacity_of(analysis.parallelism)

    def decide(self, state: PlanState, analysis: Analysis, config: JobConfig) -> tuple[PlanState, Plan]:
        plan, changes = guarded_plan(self, analysis, config, state)
        return state.updated(changes), plan


def guarded_plan(
    policy: GuardedPolicy, analysis: Analysis, config: JobConfig, state: PlanState
) -> tuple[Plan, dict[str, Any]]:
    """The policy's core inside its controls. Returns the plan and the plan-state changes."""
    current = analysis.parallelism
    now = analysis.window_end
    held_early, updates = admit(analysis, config, state)
    if held_early is not None:
        return held_early, updates
    same = state.window_parallelism == current
    samples = updates["samples_at_parallelism"]
    samples += 1
    recent = smoothing_samples(state.samples if same else None, analysis, config.metrics_window_s)
    updates |= {"samples_at_parallelism": samples, "samples": recent}
    # Every valid window at the new parallelism is evidence on the last scale-up.
    check_updates, notice = check_scale_up_effectiveness(analysis, state, config)
    updates |= check_updates
    notices = [notice] if notice else []
    early = apply_gates((MinimumSamples(samples),), None, state, analysis, config).plan
    if early is not None:
        return replace(early, notices=notices), updates
    state = state.updated(updates)

    restart = state.restarts.restart_time(config.restart_time_s, config.restart_time_cap_s)
    restart = config.restart_time_s if restart is None else min(restart, config.restart_time_cap_s)
    rates = smoothed(analysis, recent)
    plan = replace(policy.core(rates, config, state, restart), notices=notices)
    if plan.action is not Action.NONE:
        plan = replace(plan, recommended=plan.to_parallelism)
    gated = apply_gates(GATES, plan, state, analysis, config)
    plan, updates = gated.plan or plan, updates | gated.updates
    if plan.action is not Action.NONE:
        plan, recovery_updates = _with_predicted_recovery(policy, plan, rates, config, state, current, now)
        updates |= recovery_updates
    if plan.action is Action.SCALE_UP:
        # Judge the scale-up by the first settled window at the new parallelism.
        updates["scale_up_check"] = {"from": current, "to": plan.to_parallelism,
                                     "per_slot_before": analysis.true_processing_rate,
                                     "capacity_before": current * analysis.true_processing_rate}
    return plan, updates


def admit(analysis: Analysis, config: JobConfig, state: PlanState) -> tuple[Plan | None, dict[str, Any]]:
    """What every planning policy checks first: a stale window (measured before the last rescale), the
    windows ignored while a (re)started job settles, an invalid window. Returns a hold (or None to go
    on) and the plan-state changes (the windows counted at this parallelism)."""
    current = analysis.parallelism
    updates: dict[str, Any] = {}
    expected = state.expected_parallelism
    if expected is not None:
        # Windows measured before a rescale still arrive after it; a few are dropped, but a job
        # restarted by other means must not be ignored forever.
        budget = state.stale_budget
        if current != expected and budget > 0:
            return hold(
                current, "stale_window",
                f"the window was measured at parallelism {current}, but the job was rescaled to {expected}",
                rule="stale_window", expected_parallelism=expected,
            ), {"stale_budget": budget - 1}
        updates["expected_parallelism"] = None
    # Windows seen at this parallelism, counting this one: a (re)started job spends its first
    # window starting workers, which understates its true rate.
    same = state.window_parallelism == current
    seen = state.windows_at_parallelism + 1 if same else 1
    samples = state.samples_at_parallelism if same else 0
    updates |= {"window_parallelism": current, "windows_at_parallelism": seen, "samples_at_parallelism": samples}
    if seen <= config.stabilization_windows:
        return hold(
            current, "stabilizing",
            f"window {seen} of {config.stabilization_windows} ignored after a (re)start while the job settles",
            rule="stabilization",
        ), updates
    if not analysis.valid:
        return hold(current, "invalid_window", analysis.invalid_reason or "window not usable",
                    rule="valid_window"), updates
    return None, updates


def _with_predicted_recovery(
    policy: GuardedPolicy, plan: Plan, rates: Analysis, config: JobConfig, state: PlanState, current: int,
    now: float,
) -> tuple[Plan, dict[str, Any]]:
    """The recovery to expect for the parallelism that will run, ending where the detector will call
    it over (the backlog tolerance). A proactive policy plans with a worst case (drained to zero):
    kept beside it as `planned_recovery_s`."""
    planned = plan.reason.numbers.get("predicted_recovery_s")
    capacity_of = policy.capacity_of(rates, config) if rates.capacity is not None else \
        GuardedPolicy.capacity_of(policy, rates, config)
    predicted = predicted_recovery_s(rates, config, plan.to_parallelism, state.restarts, capacity_of)
    if predicted is None and plan.reason.numbers.get("chosen") == plan.to_parallelism:
        predicted = planned
    numbers = {**plan.reason.numbers, "predicted_recovery_s": predicted}
    if planned is not None:
        numbers["planned_recovery_s"] = planned
    plan = replace(plan, reason=plan.reason.model_copy(update={"numbers": numbers}))
    return plan, rescale_updates(current, plan.to_parallelism, now, predicted, config)


def rescale_updates(current: int, to: int, now: float, predicted_s: float | None, config: JobConfig
                    ) -> dict[str, Any]:
    """The plan-state changes of a rescale decided: the recovery it predicts, and when it was decided."""
    updates: dict[str, Any] = {"pending_recovery": {"from": current, "to": to, "predicted_s": predicted_s,
                                                    "window_end": now}}
    if config.mode is Mode.AUTO:  # a recommendation does not restart the job
        updates["rescale_decided_at"] = now
    return updates
