"""Execute: apply decisions once each, one rescale per job at a time, and report their lifecycle.

A decision becomes a rescale command to the job's runner under a per-job lock with a fencing
token; the runner's report (or a timeout) completes or fails it and frees the lock. What to do is
decided by the pure steps of `execute.kernel`; this agent is their shell: it reads what a step takes
from the knowledge base, calls it, and performs the step's effects in their order (the kernel's
docstring says why that order survives a crash between any two of them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from contracts import metrics
from contracts.decisions import RunnerReport, RunnerStatus, ScalingDecision, ScalingEvent
from contracts.settings import Settings
from contracts.stage import Incoming, Publish, Subscription, Timer
from execute import kernel
from execute.kernel import (
    AcquireLock,
    Effect,
    Emit,
    FinishRescale,
    MarkDecisionDone,
    RecordRescaleEnd,
    ReleaseLock,
    TrackRescale,
    event_id,
)
from execute.kernel import Publish as PublishMessage
from knowledge.fleet_rules import runs
from knowledge.protocols import ExecuteKnowledge

log = logging.getLogger("autoscaler.execute")

OVERDUE_CHECK_S = 1.0

__all__ = ["OVERDUE_CHECK_S", "ExecuteAgent", "event_id"]


class ExecuteAgent:
    """Reads `decisions` and `runner_reports`; publishes `commands` and `scaling_events`."""

    name = "execute"
    publishes = ("commands", "scaling_events")

    def __init__(self, settings: Settings, knowledge: ExecuteKnowledge, publish: Publish):
        self.settings = settings
        self.knowledge = knowledge
        self.publish = publish

    def subscriptions(self) -> list[Subscription]:
        return [Subscription("execute", "decisions", self.on_decisions),
                Subscription("execute-results", "runner_reports", self.on_reports)]

    def timers(self) -> list[Timer]:
        return [Timer("overdue-rescales", OVERDUE_CHECK_S, self.fail_overdue)]

    async def partitions_revoked(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def on_decisions(self, records: list[Incoming]) -> None:
        for record in records:
            await self.apply(record.value or b"")

    async def on_reports(self, records: list[Incoming]) -> None:
        for record in records:
            await self.on_report(record.value or b"")

    # ---------------------------------------------------------------- the steps, with their reads

    async def apply(self, value: bytes) -> None:
        """Execute a decision. Safe to repeat: a redelivered decision (a worker died mid-way) finishes
        the same execution, under the same fencing token, and is never executed a second time."""
        await self.execute(ScalingDecision.model_validate_json(value))

    async def execute(self, decision: ScalingDecision) -> None:
        """`apply` for a decision already read (the simulator's loop, `evaluation.loop`, calls it)."""
        job, timeout = decision.job_id, self.settings.rescale_timeout_s
        if not kernel.needs_reads(decision):
            return  # a hold: nothing to do, nothing to read
        done = await self.knowledge.decision_done(job, decision.decision_id)
        holder = None if done else await self.knowledge.lock_holder(job)
        step = kernel.on_decision(decision, done=done, holder=holder, ttl_s=timeout, now=time.time())
        if step.ignored:
            log.info("%s: %s", job, step.ignored)
        await self.perform(step.effects)
        if step.lock is None:
            return
        if isinstance(step.lock, AcquireLock):
            token = await self.acquire(step.lock)
            holder = await self.knowledge.lock_holder(job) if token is None else None  # for `skipped`
        else:
            token, holder = step.lock.token, None
        tracked = await self.knowledge.inflight(job) if token is not None else None
        await self.perform(kernel.on_lock(decision, token=token, holder=holder, tracked=tracked,
                                          timeout_s=timeout, now=time.time()).effects)

    async def on_report(self, value: bytes) -> None:
        """End the rescale a runner's report answers (see `kernel.on_report`)."""
        report = RunnerReport.model_validate_json(value)
        started = report.status is RunnerStatus.STARTED  # nothing to end: no read
        tracked = None if started else await self.knowledge.inflight(report.job_id)
        step = kernel.on_report(report, tracked=tracked, now=time.time())
        if step.ignored:
            log.warning("%s: %s", report.job_id, step.ignored)
        await self.perform(step.effects)

    async def fail_overdue(self) -> None:
        """Fail the rescales past their deadline that this worker claims (exactly one worker claims each)."""
        now = time.time()
        for job in await self.knowledge.overdue_rescales(now):
            if not await self.knowledge.claim_overdue(job):
                continue
            tracked = await self.knowledge.inflight(job)
            await self.perform(kernel.on_overdue(job, tracked=tracked, timeout_s=self.settings.rescale_timeout_s,
                                                 now=time.time()).effects)

    # ---------------------------------------------------------------- the effects

    async def perform(self, effects: Iterable[Effect]) -> None:
        """Perform the effects in order; the first that raises stops the rest (the message is redelivered)."""
        for effect in effects:
            await self.perform_one(effect)

    async def perform_one(self, effect: Effect) -> None:
        match effect:
            case Emit(event):
                await self.emit(event)
            case PublishMessage(topic, key, value):
                await self.publish(topic, key, value)
            case TrackRescale(job, rescale):
                await self.knowledge.track_rescale(job, rescale)
            case RecordRescaleEnd(job, running, completed_at, downtime_s, direction, backend):
                await self.knowledge.record_rescale_end(job, running, completed_at, downtime_s, direction, backend)
                await self.holds_on_cluster(job, running)
            case FinishRescale(job):
                await self.knowledge.finish_rescale(job)
            case ReleaseLock(job, token, decision_id):
                await self.knowledge.release_lock(job, token, decision_id)
            case MarkDecisionDone(job, decision_id):
                await self.knowledge.mark_decision_done(job, decision_id)
            case _:
                raise TypeError(f"not an effect execute performs: {effect!r}")

    async def holds_on_cluster(self, job: str, running: int) -> None:
        """A job on a cluster holds what it runs once its rescale ended (`knowledge.fleet_rules.runs`):
        the slots a scale-down released go to the jobs waiting for them at their next window, without
        waiting for the job's own next window measured at what it runs."""
        cluster = (await self.knowledge.job_config(job)).cluster
        if cluster:
            await self.knowledge.update_fleet(cluster, runs(job, running, cluster))

    async def acquire(self, lock: AcquireLock) -> int | None:
        return await self.knowledge.acquire_lock(lock.job_id, lock.decision_id, lock.ttl_s)

    async def emit(self, event: ScalingEvent) -> None:
        """Publish an event once per decision and step; after a crash it may go out again, same id."""
        if await self.knowledge.event_published(event.job_id, event.event_id):
            return
        await self.publish("scaling_events", event.job_id, event.to_bytes())
        await self.knowledge.record_event(event.job_id, event.model_dump_json(), event.event_id)
        metrics.RESCALES.labels(event.job_id, event.type.value).inc()
        log.info("%s: %s %s %d -> %d%s", event.job_id, event.decision_id[:8], event.type.value,
                 event.from_parallelism, event.to_parallelism,
                 f" ({event.detail or event.error})" if event.detail or event.error else "")
