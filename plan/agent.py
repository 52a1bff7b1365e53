"""Plan: turn each analysis into a scaling decision (DS2), guarded, recorded and published."""

from __future__ import annotations

import logging
import time
from typing import Any

from agent import metrics
from agent.app import Runtime
from agent.contracts import Action, Analysis, ScalingDecision
from agent.resilience import until_done
from knowledge.jobs import JobConfig, Mode
from plan.ds2 import Plan, hold, plan_ds2

log = logging.getLogger("autoscaler.plan")


def guarded_plan(
    analysis: Analysis, config: JobConfig, state: dict[str, Any], rescaling: bool
) -> tuple[Plan, dict[str, Any]]:
    """The guards around the policy: mode, a rescale in flight, stale and unsettled windows, and
    no scale-down while a backlog drains. Returns the plan and the state fields to store."""
    current = analysis.parallelism
    updates: dict[str, Any] = {}
    if config.mode is Mode.OFF:
        return hold(current, "mode_off", "autoscaling is off for this job"), updates
    if rescaling:
        return hold(current, "rescale_in_progress", "a rescale of this job is in progress"), updates
    expected = state.get("expected_parallelism")
    if expected is not None:
        # Windows measured before a rescale still arrive after it; a few are dropped, but a job
        # restarted by other means must not be ignored forever.
        budget = state.get("stale_budget", 0)
        if current != expected and budget > 0:
            return hold(
                current, "stale_window",
                f"the window was measured at parallelism {current}, but the job was rescaled to {expected}",
                expected_parallelism=expected,
            ), {"stale_budget": budget - 1}
        updates["expected_parallelism"] = None
    # Windows seen at this parallelism, counting this one: a (re)started job spends its first
    # window starting workers, which understates its true rate.
    seen = state.get("windows_at_parallelism", 0) + 1 if state.get("window_parallelism") == current else 1
    updates |= {"window_parallelism": current, "windows_at_parallelism": seen}
    if seen <= config.stabilization_windows:
        return hold(
            current, "stabilizing",
            f"window {seen} of {config.stabilization_windows} ignored after a (re)start while the job settles",
        ), updates
    plan = plan_ds2(analysis, config)
    backlog, arrival = analysis.backlog or 0, analysis.arrival_rate or 0.0
    if plan.action is Action.SCALE_DOWN and backlog > arrival * config.backlog_tolerance_s:
        return hold(
            current, "backlog_draining",
            f"no scale-down to {plan.to_parallelism} while the backlog ({backlog} records) exceeds "
            f"{config.backlog_tolerance_s:.0f} s of arrivals",
            recommended=plan.to_parallelism, backlog=backlog, arrival_rate=arrival,
        ), updates
    return plan, updates


def register(runtime: Runtime) -> None:
    knowledge = runtime.knowledge
    source = runtime.topic("analyses")
    runtime.topic("decisions")

    async def process(value: bytes) -> None:
        analysis = Analysis.model_validate_json(value)
        job = analysis.job_id
        if not await knowledge.claim_window_for_plan(job, analysis.window_end):
            return  # a redelivered analysis: its decision was already made
        config = await knowledge.job_config(job)
        state = await knowledge.state(job)
        rescaling = await knowledge.lock_holder(job) is not None
        plan, updates = guarded_plan(analysis, config, state, rescaling)
        if updates:
            await knowledge.set_state(job, **updates)
        decision = ScalingDecision(
            job_id=job,
            window_end=analysis.window_end,
            action=plan.action,
            from_parallelism=analysis.parallelism,
            to_parallelism=plan.to_parallelism,
            operator_targets=plan.operator_targets,
            policy=config.policy.value,
            target_utilization=config.target_utilization,
            reason=plan.reason,
            mode=config.mode.value,
            closed_at=analysis.closed_at,
        )
        await knowledge.record_decision(job, decision.model_dump_json())
        await runtime.publish("decisions", job, decision.to_bytes())
        metrics.DECISION_LATENCY.observe(max(0.0, time.time() - analysis.closed_at))
        metrics.DECISIONS.labels(job, decision.action.value, plan.reason.code).inc()
        metrics.RECOMMENDED.labels(job).set(plan.to_parallelism)
        if decision.action.value != "none":
            log.info("%s: %s %d -> %d (%s)", job, decision.action.value, decision.from_parallelism,
                     decision.to_parallelism, plan.reason.message)

    @runtime.app.agent(source, name="plan")
    async def plan_agent(stream: Any) -> None:
        async for value in stream:
            await until_done(lambda value=value: process(value), "plan")
