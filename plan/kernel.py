"""Plan's loop kernel: (plan state, analysis, job configuration) -> (plan state, decision). Pure.

`plan` is the planner step and `finish` makes the decision; in between the shell carries out the
one effect `plan` may declare, a slot reservation under the quota (`Reserve`, answered with the
slots granted), because the quota is shared by every job and reserved atomically in knowledge.
`Decided` declares what the shell commits, at once: the decision (plan's history and outbox) and
the plan-state fields that changed. Reads the shell makes for it: the job's plan state and
configuration, and whether execute holds the job's rescale lock (`rescaling`; one rescale per job at
a time; a declared cross-stage read, see docs/architecture.md). The simulator (`evaluation.loop`)
calls the same functions.

Before any policy: autoscaling off for the job holds, and so does a rescale in flight (one at a
time; the state's `rescaling`, which the plan agent sets from execute's lock). Then the job's
policy, chosen by its registry name, decides. A recovery the analysis reports after a rescale this
autoscaler executed (`plan.proactive.after_executed_rescale`) is attached as a `recovered` notice,
beside the prediction made when the rescale was decided; after a parallelism change it did not make
(recommend mode, an operator's restart) there is none. After every policy, a stateful query's state
partitions cap a scale-up (`plan.stateful.StatePartitionCap`) and a rescale's reason states the
state and the event-time lag (`plan.stateful.with_state_note`); the state's rows are kept in the plan
state, so that restarts are planned at the state's size (`PlanState.restarts`). The slot quota is
the plan agent's (it reserves slots atomically across jobs); the `SlotQuota` gate
(`plan.gates.with_quota`) applies its grant. A job on a cluster (`JobConfig.cluster`) bids for its
slots instead (`Planned.bid`, `plan.fleet.bid_of`): the shell runs the fleet step on the cluster's
state in knowledge (`plan.fleet.grant`) and `finish` keeps the plan within the grant
(`plan.fleet.within_grant`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contracts.analyses import Analysis
from contracts.decisions import Action, ScalingDecision
from contracts.fleet import FleetBid, FleetGrant
from contracts.jobs import JobConfig, Mode
from contracts.plan_state import PlanState
from knowledge.fleet_rules import FleetStep
from plan import fleet
from plan.gates import apply_gates, with_quota
from plan.guarded import rescale_updates
from plan.policy import Plan, ScalingPolicy, hold
from plan.proactive import after_executed_rescale, predicts, recovery_notice
from plan.registry import UnknownPolicy, make_policy
from plan.stateful import StatePartitionCap, with_state_note

STAGE = "plan"


@dataclass(frozen=True)
class Reserve:
    """A declared effect: reserve up to `wanted` slots of `quota` for the job, never fewer than
    `current`; with `commit`, the grant becomes the job's allocation. The shell answers with the
    slots granted (`SlotQuota.reserve_slots`)."""

    current: int
    wanted: int
    quota: int
    commit: bool


@dataclass(frozen=True)
class Planned:
    """The planner step's result before the quota: the state to keep, the plan, the reservation, or for
    a job on a cluster its bid (granted by the fleet step; `commit`: the grant is held, in auto mode)."""

    before: PlanState
    state: PlanState
    plan: Plan
    reserve: Reserve | None
    bid: FleetBid | None = None
    commit: bool = False


@dataclass(frozen=True)
class Decided:
    """The decision for the window and the plan-state fields it changed (JSON values)."""

    state: PlanState
    plan: Plan
    decision: ScalingDecision
    state_fields: dict[str, str]

    def message(self) -> str:
        return self.decision.model_dump_json()


def plan(
    before: PlanState, analysis: Analysis, config: JobConfig, *, rescaling: bool, quota: int | None,
    policy: ScalingPolicy | None = None,
) -> Planned:
    """The planner step (`decide`) and, under a slot quota, the reservation it needs: a scale-up asks
    for its target, any other plan keeps what the job has. A recommendation that will not be executed
    (recommend mode) must not hold slots, so it is reserved without commit. Nothing is reserved while
    a rescale is in flight."""
    if policy is None and config.cluster:
        try:
            policy = make_policy(config.policy)
        except UnknownPolicy:
            policy = None  # `decide` holds, saying so
    state, planned = decide(before.model_copy(update={"rescaling": rescaling}), analysis, config, policy)
    if config.cluster:
        if rescaling:
            return Planned(before, state, planned, None)
        problem = getattr(policy, "planning_problem", None)
        posed = problem(state, analysis, config) if problem is not None else fleet.plain_problem(analysis, config)
        # A window measured before the job's last rescale still arrives after it: the job holds what the
        # rescale ended at (the runner's report), up or down, until a window measured at it arrives.
        holds = before.expected_parallelism or analysis.parallelism
        bid = fleet.bid_of(analysis.job_id, posed, holds, planned.to_parallelism, config, analysis.window_end)
        return Planned(before, state, planned, None, bid, commit=config.mode is Mode.AUTO)
    reserve = None
    if quota is not None and not rescaling:
        scaling_up = planned.action is Action.SCALE_UP
        wanted = planned.to_parallelism if scaling_up else analysis.parallelism
        reserve = Reserve(analysis.parallelism, wanted, quota, commit=not scaling_up or config.mode is Mode.AUTO)
    return Planned(before, state, planned, reserve)


def fleet_step(planned: Planned, config: JobConfig) -> FleetStep:
    """The fleet step for the job's bid, as knowledge runs it on the cluster's state (`plan.fleet.grant`)."""
    bid = planned.bid
    if bid is None:
        raise ValueError("only a plan that bid takes a fleet step")
    return lambda state, budget: fleet.grant(state, bid, config.cluster, budget, planned.commit)


def finish(planned: Planned, analysis: Analysis, config: JobConfig, granted: int | None = None,
           given: FleetGrant | None = None) -> Decided:
    """The decision, within the slots `granted` when `planned.reserve` asked for them, or within the fleet
    step's grant `given` for a job that bid (None: its cluster is not registered, and the job holds)."""
    state, chosen = planned.state, planned.plan
    if planned.reserve is not None:
        if granted is None:
            raise ValueError("a plan that reserves slots needs the slots granted")
        state, chosen = with_quota(state, chosen, analysis.parallelism, granted, planned.reserve.quota)
    if planned.bid is not None:
        current = analysis.parallelism
        if given is None:
            chosen = hold(current, "unknown_cluster", f"cluster {config.cluster!r} is not registered "
                          "(`autoscaler cluster add`): the job holds until it is, or its setting `cluster` is unset",
                          rule=fleet.RULE, proposed=chosen)
        elif planned.bid.holds != current:
            # Measured before the job's last rescale: a move from a count it no longer runs would be a rescale
            # to what it runs (seen live: a no-op 4 -> 3 after the release to 3). It acts at its next window.
            if chosen.action is not Action.NONE:
                chosen = hold(current, "stale_window", f"the window was measured at parallelism {current}, but the "
                              f"job was rescaled to {planned.bid.holds}", rule="stale_window", proposed=chosen)
        else:
            fitted = fleet.within_grant(chosen, current, given)
            changed = (fitted.action, fitted.to_parallelism) != (chosen.action, chosen.to_parallelism)
            if changed and fitted.action is not Action.NONE:
                state = state.updated(rescale_updates(current, fitted.to_parallelism, analysis.window_end,
                                                      None, config))
            chosen = fitted
    decision = to_decision(chosen, analysis, config)
    return Decided(state, chosen, decision, state.changed_fields(planned.before))


def decide(
    state: PlanState, analysis: Analysis, config: JobConfig, policy: ScalingPolicy | None = None
) -> tuple[PlanState, Plan]:
    """The plan for one window and the state to keep. `policy` defaults to the job's (`config.policy`)."""
    current = analysis.parallelism
    if analysis.state is not None and state.state_rows != analysis.state.rows:
        state = state.updated({"state_rows": analysis.state.rows})  # restarts are planned at this size
    if config.mode is Mode.OFF:
        return state, hold(current, "mode_off", "autoscaling is off for this job", rule="mode")
    if state.rescaling:
        return state, hold(current, "rescale_in_progress", "a rescale of this job is in progress", rule="one_rescale")
    if policy is None:
        try:
            policy = make_policy(config.policy)
        except UnknownPolicy as exc:
            return state, hold(current, "unknown_policy", str(exc), rule="policy")
    new, plan = policy.decide(state, analysis, config)
    capped = apply_gates((StatePartitionCap(),), plan, new, analysis, config)
    plan = with_state_note(capped.plan or plan, analysis)
    if new.needs_forecast != policy.needs_forecast:
        new = new.updated({"needs_forecast": policy.needs_forecast})
    if analysis.recovery is not None:
        if after_executed_rescale(analysis.recovery, state):
            notice = recovery_notice(analysis.recovery, state.pending_recovery, state)
            plan = replace(plan, notices=[*plan.notices, notice])
        # The prediction is spent once its own recovery is seen, unless this window rescales again; a
        # recovery from the rescale before leaves it waiting for its own.
        pending = state.pending_recovery
        if new.pending_recovery == pending and (pending is None or predicts(pending, analysis.recovery)):
            new = new.updated({"pending_recovery": None})
    return new, plan


def to_decision(plan: Plan, analysis: Analysis, config: JobConfig) -> ScalingDecision:
    """The decision published for the window, with what the policy recommended and why."""
    return ScalingDecision(
        job_id=analysis.job_id,
        window_end=analysis.window_end,
        action=plan.action,
        from_parallelism=analysis.parallelism,
        to_parallelism=plan.to_parallelism,
        operator_targets=plan.operator_targets,
        policy=config.policy,
        target_utilization=config.target_utilization,
        reason=plan.reason,
        recommended_parallelism=plan.recommended,
        notices=plan.notices,
        mode=config.mode,
        closed_at=analysis.closed_at,
    )
