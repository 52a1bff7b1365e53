"""Plan: the shell around `plan.kernel`: each analysis becomes a scaling decision, within the slot
quota or its cluster's fleet step, committed with the plan state and published."""

from __future__ import annotations

import logging
import threading
import time

from contracts import metrics
from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.settings import Settings
from contracts.stage import JOB_BATCH_MAX, JOB_BATCH_WITHIN_S, Incoming, Publish, Subscription, Timer, per_key
from knowledge.protocols import PlanKnowledge
from plan import kernel
from plan.cost_plan import warm_up

log = logging.getLogger("autoscaler.plan")


class PlanAgent:
    """Reads `analyses`; publishes `decisions`."""

    name = "plan"
    publishes = ("decisions",)

    def __init__(self, settings: Settings, knowledge: PlanKnowledge, publish: Publish):
        self.settings = settings
        self.knowledge = knowledge
        self.publish = publish
        # Loads the compiled schedule search while the worker joins its group, not on the first window.
        threading.Thread(target=warm_up, name="planner-warm-up", daemon=True).start()

    def subscriptions(self) -> list[Subscription]:
        return [Subscription("plan", "analyses", self.process, JOB_BATCH_MAX, JOB_BATCH_WITHIN_S)]

    def timers(self) -> list[Timer]:
        return []

    async def partitions_revoked(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def process(self, records: list[Incoming]) -> None:
        await per_key(records, lambda record: self.plan(record.value or b""))

    async def plan(self, value: bytes) -> None:
        knowledge = self.knowledge
        analysis = Analysis.model_validate_json(value)
        job = analysis.job_id
        reads = await knowledge.plan_reads(job, analysis.window_end)
        if reads.done:
            # A redelivered analysis: its decision was made; publish it again, same decision id, in
            # case the crash came between commit and publish (execute runs each id once).
            committed = await knowledge.committed_message(job, "plan", analysis.window_end)
            if committed is not None:
                await self.publish("decisions", job, committed.encode())
            return
        config, before = reads.config, reads.state
        # Execute's lock: one rescale per job at a time (a declared cross-stage read).
        rescaling = reads.lock_holder is not None
        planned = kernel.plan(before, analysis, config, rescaling=rescaling, quota=self.settings.slot_quota)
        granted = given = None
        if planned.reserve is not None:
            r = planned.reserve
            granted = await knowledge.reserve_slots(job, r.current, r.wanted, r.quota, commit=r.commit)
        if planned.bid is not None:  # a job on a cluster: the fleet step, atomically on the cluster's state
            given = await knowledge.update_fleet(config.cluster, kernel.fleet_step(planned, config))
        decided = kernel.finish(planned, analysis, config, granted, given)
        decision, plan, message = decided.decision, decided.plan, decided.message()
        if not await knowledge.commit_window(job, kernel.STAGE, analysis.window_end, message,
                                             state_fields=decided.state_fields):
            return  # another worker decided this window meanwhile and publishes its decision
        await self.publish("decisions", job, message.encode())
        metrics.DECISION_LATENCY.observe(max(0.0, time.time() - analysis.closed_at))
        metrics.DECISIONS.labels(job, decision.action.value, plan.reason.code).inc()
        if decision.action is Action.NONE and plan.recommended not in (None, analysis.parallelism):
            metrics.SUPPRESSIONS.labels(job, plan.reason.code).inc()
        metrics.RECOMMENDED.labels(job).set(plan.recommended or plan.to_parallelism)
        metrics.TARGET.labels(job).set(plan.to_parallelism)
        if decision.action is not Action.NONE:
            log.info("%s: %s %d -> %d (%s)", job, decision.action.value, decision.from_parallelism,
                     decision.to_parallelism, plan.reason.message)
