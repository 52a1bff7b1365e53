"""Plan: turn each analysis into a scaling decision (the job's policy), guarded, recorded and published."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

from contracts import metrics
from contracts.jobs import Mode
from contracts.messages import Action, Analysis, ScalingDecision
from contracts.plan_state import expected_restart_time
from contracts.settings import Settings
from contracts.stage import Incoming, Publish, Subscription, Timer
from knowledge.store import Knowledge
from plan.controls import RESTART_HISTORY, apply_quota, guarded_plan
from plan.proactive import recovery_notice

log = logging.getLogger("autoscaler.plan")


class PlanAgent:
    """Reads `analyses`; publishes `decisions`."""

    name = "plan"
    publishes = ("decisions",)

    def __init__(self, settings: Settings, knowledge: Knowledge, publish: Publish):
        self.settings = settings
        self.knowledge = knowledge
        self.publish = publish

    def subscriptions(self) -> list[Subscription]:
        return [Subscription("plan", "analyses", self.process)]

    def timers(self) -> list[Timer]:
        return []

    async def partitions_revoked(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def process(self, records: list[Incoming]) -> None:
        for record in records:
            await self.plan(record.value or b"")

    async def plan(self, value: bytes) -> None:
        knowledge = self.knowledge
        analysis = Analysis.model_validate_json(value)
        job = analysis.job_id
        if await knowledge.window_done(job, "plan", analysis.window_end):
            # A redelivered analysis: its decision was made; publish it again, same decision id, in
            # case the crash came between commit and publish (execute runs each id once).
            committed = await knowledge.committed_message(job, "plan", analysis.window_end)
            if committed is not None:
                await self.publish("decisions", job, committed.encode())
            return
        config = await knowledge.job_config(job)
        state = await knowledge.state(job)
        rescaling = await knowledge.lock_holder(job) is not None
        by_direction = await knowledge.downtimes_by_direction(job, RESTART_HISTORY)
        downtimes = [*by_direction["up"], *by_direction["down"]]
        restart = expected_restart_time(downtimes, config.restart_time_s, config.restart_time_cap_s) \
            if downtimes else None
        plan, updates = guarded_plan(analysis, config, state, rescaling, restart_time_s=restart,
                                     downtimes=by_direction)
        history: dict[str, str] = {}
        if analysis.recovery is not None:
            notice = recovery_notice(analysis.recovery, state.get("pending_recovery"))
            plan = replace(plan, notices=[*plan.notices, notice])
            updates.setdefault("pending_recovery", None)  # unless this window rescales again
            history["recoveries"] = json.dumps({"window_end": analysis.window_end, **notice.numbers})
        quota = self.settings.slot_quota
        if quota is not None and not rescaling:
            scaling_up = plan.action is Action.SCALE_UP
            wanted = plan.to_parallelism if scaling_up else analysis.parallelism
            # A recommendation that will not be executed must not hold slots.
            commit = not scaling_up or config.mode is Mode.AUTO
            granted = await knowledge.reserve_slots(job, analysis.parallelism, wanted, quota, commit=commit)
            plan, notice = apply_quota(plan, analysis.parallelism, granted, quota)
            if notice is not None:
                # Say so when the quota starts to bind, not at every window it keeps binding.
                if not state.get("quota_bound"):
                    plan = replace(plan, notices=[*plan.notices, notice])
                updates["quota_bound"] = True
            elif state.get("quota_bound"):
                updates["quota_bound"] = False
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
            recommended_parallelism=plan.recommended,
            notices=plan.notices,
            mode=config.mode.value,
            closed_at=analysis.closed_at,
        )
        message = decision.model_dump_json()
        if not await knowledge.commit_window(job, "plan", analysis.window_end, message, state=updates,
                                             history=history):
            return  # another worker decided this window meanwhile and publishes its decision
        await self.publish("decisions", job, message.encode())
        metrics.DECISION_LATENCY.observe(max(0.0, time.time() - analysis.closed_at))
        metrics.DECISIONS.labels(job, decision.action.value, plan.reason.code).inc()
        if decision.action is Action.NONE and plan.recommended not in (None, analysis.parallelism):
            metrics.SUPPRESSIONS.labels(job, plan.reason.code).inc()
        metrics.RECOMMENDED.labels(job).set(plan.recommended or plan.to_parallelism)
        metrics.TARGET.labels(job).set(plan.to_parallelism)
        if decision.action.value != "none":
            log.info("%s: %s %d -> %d (%s)", job, decision.action.value, decision.from_parallelism,
                     decision.to_parallelism, plan.reason.message)
