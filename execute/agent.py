"""Execute: apply decisions once each, one rescale per job at a time, and report their lifecycle.

A decision becomes a rescale command to the job's runner under a per-job lock with a fencing
token; the runner's report (or a timeout) completes or fails it and frees the lock.
"""

from __future__ import annotations

import logging
import time
import uuid

from contracts import metrics
from contracts.decisions import (
    Action,
    EventType,
    RescaleCommand,
    RunnerReport,
    RunnerStatus,
    ScalingDecision,
    ScalingEvent,
)
from contracts.settings import Settings
from contracts.stage import Incoming, Publish, Subscription, Timer
from knowledge import Knowledge

log = logging.getLogger("autoscaler.execute")

OVERDUE_CHECK_S = 1.0


def event_id(decision_id: str, step: str, code: str | None = None) -> str:
    """The same id for the same step of the same decision, so subscribers can drop a repeat."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"autoscaler:{decision_id}:{step}:{code or ''}").hex


class ExecuteAgent:
    """Reads `decisions` and `runner_reports`; publishes `commands` and `scaling_events`."""

    name = "execute"
    publishes = ("commands", "scaling_events")

    def __init__(self, settings: Settings, knowledge: Knowledge, publish: Publish):
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

    async def apply(self, value: bytes) -> None:
        """Every step is safe to repeat: a redelivered decision (a worker died mid-way) finishes the
        same execution, under the same fencing token, and is never executed a second time."""
        decision = ScalingDecision.model_validate_json(value)
        job = decision.job_id
        if await self.knowledge.decision_done(job, decision.decision_id):
            log.info("%s: decision %s already executed; ignoring the redelivery", job, decision.decision_id)
            return
        for notice in decision.notices:
            # Findings of plan (an ineffective scale-up, the quota binding) reach subscribers as events.
            # A recovery observed after a rescale is an event of its own, with its numbers; plan attaches
            # one only after a rescale this stage carried out (none in recommend mode).
            recovered = notice.code == "recovered"
            await self.emit(ScalingEvent(
                event_id=event_id(decision.decision_id, "notice", notice.code),
                decision_id=decision.decision_id, job_id=job,
                type=EventType.RECOVERED if recovered else EventType.NOTICE, code=notice.code,
                from_parallelism=int(notice.numbers.get("from_parallelism") or decision.from_parallelism)
                if recovered else decision.from_parallelism,
                to_parallelism=int(notice.numbers.get("to_parallelism") or decision.to_parallelism)
                if recovered else decision.to_parallelism,
                detail=notice.message, numbers=notice.numbers if recovered else {},
            ))
        if decision.action is not Action.NONE and decision.mode == "auto":
            await self.rescale(decision)
        elif not decision.notices:
            return  # nothing was done, so nothing can be done twice: no marker to keep
        await self.knowledge.mark_decision_done(job, decision.decision_id)

    async def rescale(self, decision: ScalingDecision) -> None:
        job = decision.job_id
        holder = await self.knowledge.lock_holder(job)
        if holder is not None and holder[1] == decision.decision_id:
            token: int | None = holder[0]  # this decision's own rescale, begun before a crash
        else:
            token = await self.knowledge.acquire_lock(job, decision.decision_id, self.settings.rescale_timeout_s)
        if token is None:
            holder = await self.knowledge.lock_holder(job)
            # Superseded rather than queued: plan decides again from fresh metrics once the running
            # rescale is over, so an old decision must not run after it.
            await self.emit(ScalingEvent(
                event_id=event_id(decision.decision_id, "skipped"),
                decision_id=decision.decision_id, job_id=job, type=EventType.SKIPPED, code="superseded",
                from_parallelism=decision.from_parallelism, to_parallelism=decision.to_parallelism,
                detail=f"superseded: rescale {holder[1] if holder else '?'} of this job is still running",
            ))
            return
        tracked = await self.knowledge.inflight(job)
        if tracked is None or tracked[0]["decision_id"] != decision.decision_id:
            deadline = time.time() + self.settings.rescale_timeout_s
            await self.knowledge.track_rescale(job, decision.model_dump(mode="json"), token, deadline)
        command = RescaleCommand(
            decision_id=decision.decision_id, job_id=job, to_parallelism=decision.to_parallelism,
            fencing_token=token,
        )
        # The runner applies a decision id once, so a command sent again after a crash is harmless.
        await self.publish("commands", job, command.to_bytes())
        await self.emit(ScalingEvent(
            event_id=event_id(decision.decision_id, "started"),
            decision_id=decision.decision_id, job_id=job, type=EventType.STARTED,
            from_parallelism=decision.from_parallelism, to_parallelism=decision.to_parallelism,
            detail=decision.reason.message,
        ))

    async def finish(self, job: str, decision_id: str, token: int) -> None:
        await self.knowledge.finish_rescale(job)
        await self.knowledge.release_lock(job, token, decision_id)

    async def on_report(self, value: bytes) -> None:
        report = RunnerReport.model_validate_json(value)
        if report.status is RunnerStatus.STARTED:
            return
        job = report.job_id
        tracked = await self.knowledge.inflight(job)
        if tracked is None or tracked[0]["decision_id"] != report.decision_id:
            log.warning("%s: runner report for %s matches no rescale in flight; ignored", job, report.decision_id)
            return
        decision, token = tracked
        completed = report.status is RunnerStatus.COMPLETED
        # The parallelism that runs, the stale windows to drop, and the measured restart.
        up = report.to_parallelism > report.from_parallelism
        await self.knowledge.record_rescale_end(
            job, report.running_parallelism, report.timestamp,
            report.downtime_s if completed else None, "up" if up else "down",
            report.backend.value if report.backend is not None else None,
        )
        await self.emit(ScalingEvent(
            event_id=event_id(report.decision_id, "outcome"),
            decision_id=report.decision_id, job_id=job,
            type=EventType.COMPLETED if completed else EventType.FAILED,
            from_parallelism=decision["from_parallelism"], to_parallelism=decision["to_parallelism"],
            downtime_s=report.downtime_s, error=report.error, rolled_back_to=report.rolled_back_to,
            **({"code": "partially_applied", "numbers": {"running_parallelism": report.running_parallelism}}
               if report.partially_applied else {}),
        ))
        await self.finish(job, report.decision_id, token)

    async def fail_overdue(self) -> None:
        for job in await self.knowledge.overdue_rescales(time.time()):
            if not await self.knowledge.claim_overdue(job):
                continue
            tracked = await self.knowledge.inflight(job)
            if tracked is None:
                await self.knowledge.finish_rescale(job)
                continue
            decision, token = tracked
            await self.emit(ScalingEvent(
                event_id=event_id(decision["decision_id"], "outcome"),
                decision_id=decision["decision_id"], job_id=job, type=EventType.FAILED,
                from_parallelism=decision["from_parallelism"], to_parallelism=decision["to_parallelism"],
                error=f"no answer from the job runner within {self.settings.rescale_timeout_s:.0f} s",
            ))
            await self.finish(job, decision["decision_id"], token)
