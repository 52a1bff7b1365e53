"""What a scaling policy is: one class behind one protocol, chosen by its name in `plan.registry`.

A policy is pure and holds nothing between windows: the plan state (`contracts.plan_state`) goes in
with the window's analysis and the job's configuration; the new plan state and a `Plan` come out.
Whatever a policy must remember (a baseline's metric history, a pending scale-down) lives in the
plan state, so the same policy runs in the plan agent (state in the knowledge base) and in the
evaluation (state in memory), and a restarted agent continues where the last one stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from contracts.analyses import Analysis
from contracts.decisions import Action, DecisionReason
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState


@dataclass(frozen=True)
class Plan:
    """A policy's verdict on one window: the action, the parallelism, and why."""

    action: Action
    to_parallelism: int
    reason: DecisionReason
    operator_targets: dict[str, int] = field(default_factory=dict)
    # What the policy recommended before a control held or changed it.
    recommended: int | None = None
    # Things a user should hear about beyond this decision (an ineffective scale-up, the quota).
    notices: list[DecisionReason] = field(default_factory=list)


def hold(parallelism: int, code: str, message: str, rule: str = "ds2", *, proposed: Plan | None = None,
         cite: bool = False, **numbers: float | int | None) -> Plan:
    """No action, with the reason code, the rule that decided and the numbers behind it: the one way a
    held decision is made, by a policy and by a gate (`plan.gates`) alike.

    A hold of a `proposed` plan keeps what it recommended (`Plan.recommended`) and its notices, and says
    what it was: with `cite`, the proposal's reason first (its message, then this one after "; "; its
    numbers, then these), as the default planner's holds do, whose reason is the plan searched; without,
    the recommended parallelism as the number `recommended` (unless the numbers give one), as the guarded
    policies' holds do, whose core's reason the hold replaces."""
    if proposed is not None:
        if cite:
            message = f"{proposed.reason.message}; {message}"
            numbers = {**proposed.reason.numbers, **numbers}
        elif "recommended" not in numbers:
            numbers = {"recommended": proposed.recommended, **numbers}
    reason = DecisionReason(code=code, rule=rule, message=message, numbers=numbers)
    if proposed is None:
        return Plan(Action.NONE, parallelism, reason)
    return Plan(Action.NONE, parallelism, reason, recommended=proposed.recommended, notices=list(proposed.notices))


def direction(current: int, target: int) -> Action:
    if target > current:
        return Action.SCALE_UP
    if target < current:
        return Action.SCALE_DOWN
    return Action.NONE


class ScalingPolicy(Protocol):
    """One autoscaling policy. `name` is its registry name, the value of the job setting `policy`."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `autoscaler policies` and the docs
    needs_forecast: ClassVar[bool]  # analyze forecasts the arrival rate only for such policies

    def decide(self, state: PlanState, analysis: Analysis, config: JobConfig) -> tuple[PlanState, Plan]:
        """The plan for this window and the state to keep. Called for every valid or invalid window
        while no rescale of the job is in flight (the planner step holds before it otherwise)."""
        ...

    def planned_capacity(self, analysis: Analysis, config: JobConfig) -> float | None:
        """The capacity (records/s) at the current parallelism this policy plans with, if it has one."""
        ...
