"""Execute's loop kernel: pure steps from what execute read and the message it got to the effects
it must have, in order.

Each step is a pure function: no clock (`now` is given), no knowledge base, no publishing; the same
inputs give the same effects, so a redelivered message yields the same ids. The agent
(`execute.agent`) is the shell: it reads what a step takes, calls it, and performs the effects in
their order, stopping at the first that fails (the message is then redelivered and taken again from
fresh reads). Every effect is safe to perform again: an event is published once per id (`Emit`), the
runner applies a decision id once, the lock is re-entered by the decision that holds it.

The order of the effects is what makes a crash between any two of them harmless:
- a rescale is tracked before its command is published, so the runner's report always finds it;
- the plan state is recorded before the outcome event, and the rescale is forgotten and the lock
  freed only after that event: until then a redelivered report finds the rescale and ends it again
  (recording the same end twice changes nothing, `PlanState.after_rescale`); the rescale is forgotten
  before the lock is freed (freed first, another decision could take the lock and track its rescale
  before this one is forgotten), and a report redelivered in between frees the lock it still holds;
- a decision is marked done last: until then a redelivery finishes the same execution, under the
  same fencing token, and after it the decision is never executed again.

The lock is the one effect whose reply a step needs (its fencing token): a decision's step ends
where the lock is taken (`on_decision`), and `on_lock` continues from the reply.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from contracts.decisions import (
    Action,
    EventType,
    RescaleCommand,
    RunnerReport,
    RunnerStatus,
    ScalingDecision,
    ScalingEvent,
)
from contracts.execution import InFlight, LockHolder
from contracts.jobs import Mode
from contracts.plan_state import Direction

COMMANDS = "commands"


def event_id(decision_id: str, step: str, code: str | None = None) -> str:
    """The same id for the same step of the same decision, so subscribers can drop a repeat."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"autoscaler:{decision_id}:{step}:{code or ''}").hex


# ---------------------------------------------------------------- effects


@dataclass(frozen=True)
class Emit:
    """Publish the event to `scaling_events` and keep it in the job's history, unless an event with its
    id was published already."""

    event: ScalingEvent


@dataclass(frozen=True)
class Publish:
    """Publish a message (the rescale command) to `topic`, keyed by `key`."""

    topic: str
    key: str
    value: bytes


@dataclass(frozen=True)
class AcquireLock:
    """Take the job's execution lock for the decision, expiring after `ttl_s`; its reply is the fencing
    token, or None when another decision holds the lock."""

    job_id: str
    decision_id: str
    ttl_s: float


@dataclass(frozen=True)
class Held:
    """The decision already holds the job's lock (it took it before a crash): no lock to take."""

    token: int


@dataclass(frozen=True)
class TrackRescale:
    """Keep the rescale in flight (replacing any), to be ended by the runner's report or its deadline."""

    job_id: str
    rescale: InFlight


@dataclass(frozen=True)
class RecordRescaleEnd:
    """Record in the plan state what runs after the rescale (`knowledge.protocols.PlanStates`) and, for a
    job on a cluster, count it as what the job holds there (`knowledge.fleet_rules.runs`)."""

    job_id: str
    running: int
    completed_at: float
    downtime_s: float | None
    direction: Direction
    backend: str | None


@dataclass(frozen=True)
class FinishRescale:
    """Forget the job's rescale in flight."""

    job_id: str


@dataclass(frozen=True)
class ReleaseLock:
    """Free the job's lock if `token` and `decision_id` still hold it (a stale holder frees nothing)."""

    job_id: str
    token: int
    decision_id: str


@dataclass(frozen=True)
class MarkDecisionDone:
    """Remember that the decision was executed: a redelivery of it is ignored from then on."""

    job_id: str
    decision_id: str


Effect = Emit | Publish | TrackRescale | RecordRescaleEnd | FinishRescale | ReleaseLock | MarkDecisionDone


@dataclass(frozen=True)
class Step:
    """A step's effects, to perform in this order; `ignored` says why a message changed nothing."""

    effects: tuple[Effect, ...] = ()
    ignored: str | None = None


@dataclass(frozen=True)
class DecisionStep(Step):
    """`lock`: None when the decision needs no rescale (then `effects` end the decision); else the lock
    to take after `effects` (or the one held), whose token `on_lock` continues with."""

    lock: AcquireLock | Held | None = None


# ---------------------------------------------------------------- steps


def needs_reads(decision: ScalingDecision) -> bool:
    """Whether `on_decision` depends on what it is given (`done`, the lock's holder): a decision with no
    notice and no rescale to carry out does nothing either way, so the shell reads nothing for it (most
    windows of most jobs are such holds)."""
    return bool(decision.notices) or (decision.action is not Action.NONE and decision.mode is Mode.AUTO)


def on_decision(decision: ScalingDecision, *, done: bool, holder: LockHolder | None, ttl_s: float,
                now: float) -> DecisionStep:
    """A decision from plan, given whether it was executed already (`done`) and who holds the job's lock.

    A decision already done changes nothing. Each notice becomes an event: `recovered` with the
    recovery's numbers, else `notice`. An `auto` decision that changes the parallelism needs the lock:
    held by this very decision (its rescale began before a crash) it continues with that token, else
    the lock is to be taken. A decision that needs no rescale is marked done, unless nothing at all was
    done (no notice): then there is nothing to do twice and no marker to keep."""
    job = decision.job_id
    if done:
        return DecisionStep(ignored=f"decision {decision.decision_id} already executed; ignoring the redelivery")
    effects: tuple[Effect, ...] = tuple(Emit(notice_event(decision, i, now)) for i in range(len(decision.notices)))
    if decision.action is not Action.NONE and decision.mode is Mode.AUTO:
        if holder is not None and holder.decision_id == decision.decision_id:
            return DecisionStep(effects, lock=Held(holder.token))
        return DecisionStep(effects, lock=AcquireLock(job, decision.decision_id, ttl_s))
    if not decision.notices:
        return DecisionStep()
    return DecisionStep((*effects, MarkDecisionDone(job, decision.decision_id)))


def notice_event(decision: ScalingDecision, index: int, now: float) -> ScalingEvent:
    """The event of the decision's notice at `index`: a finding of plan (an ineffective scale-up, the
    quota binding) as `notice`; a recovery observed after a rescale this stage carried out (plan attaches
    one only then) as `recovered`, with its numbers and the parallelisms it was between."""
    notice = decision.notices[index]
    recovered = notice.code == "recovered"
    return ScalingEvent(
        event_id=event_id(decision.decision_id, "notice", notice.code),
        decision_id=decision.decision_id, job_id=decision.job_id, timestamp=now,
        type=EventType.RECOVERED if recovered else EventType.NOTICE, code=notice.code,
        from_parallelism=int(notice.numbers.get("from_parallelism") or decision.from_parallelism)
        if recovered else decision.from_parallelism,
        to_parallelism=int(notice.numbers.get("to_parallelism") or decision.to_parallelism)
        if recovered else decision.to_parallelism,
        detail=notice.message, numbers=notice.numbers,
    )


def on_lock(decision: ScalingDecision, *, token: int | None, holder: LockHolder | None,
            tracked: InFlight | None, timeout_s: float, now: float) -> Step:
    """A rescale decision once the lock was asked for: `token` is its fencing token (None: refused),
    `holder` who holds the lock when it was refused, `tracked` the job's rescale in flight.

    Refused, the decision is superseded rather than queued (plan decides again from fresh metrics once
    the running rescale is over, so an old decision must not run after it): `skipped`, and done.
    Granted, the rescale is tracked with a deadline `timeout_s` from `now` (unless this decision's is
    tracked already: a redelivery keeps its record), the command goes to the runner with the token,
    `started` is emitted, and the decision is done."""
    job, decision_id = decision.job_id, decision.decision_id
    if token is None:
        skipped = ScalingEvent(
            event_id=event_id(decision_id, "skipped"), decision_id=decision_id, job_id=job, timestamp=now,
            type=EventType.SKIPPED, code="superseded",
            from_parallelism=decision.from_parallelism, to_parallelism=decision.to_parallelism,
            detail=f"superseded: rescale {holder.decision_id if holder else '?'} of this job is still running",
        )
        return Step((Emit(skipped), MarkDecisionDone(job, decision_id)))
    effects: list[Effect] = []
    if tracked is None or tracked.decision_id != decision_id:
        effects.append(TrackRescale(job, InFlight(
            decision_id=decision_id, from_parallelism=decision.from_parallelism,
            to_parallelism=decision.to_parallelism, token=token, deadline=now + timeout_s,
        )))
    command = RescaleCommand(decision_id=decision_id, job_id=job, to_parallelism=decision.to_parallelism,
                             fencing_token=token, issued_at=now)
    started = ScalingEvent(
        event_id=event_id(decision_id, "started"), decision_id=decision_id, job_id=job, timestamp=now,
        type=EventType.STARTED, from_parallelism=decision.from_parallelism,
        to_parallelism=decision.to_parallelism, detail=decision.reason.message,
    )
    effects += [Publish(COMMANDS, job, command.to_bytes()), Emit(started), MarkDecisionDone(job, decision_id)]
    return Step(tuple(effects))


def on_report(report: RunnerReport, *, tracked: InFlight | None, now: float) -> Step:
    """A job runner's report, given the job's rescale in flight.

    `started` changes nothing (the rescale is under way). A report of no rescale in flight (one
    redelivered after the rescale ended) changes nothing but the lock: held still by the command it
    answers (its token and decision), it is freed, as it would have been had the worker that ended the
    rescale not died between forgetting it and freeing the lock. Else the rescale has ended: the plan state
    records what runs now, when, the downtime (measured only for a completed rescale), the direction
    and how the runner changed the job; `completed` or `failed` goes out (a failure that stopped
    between the two parallelisms says so: `partially_applied`); the rescale is forgotten and the
    lock freed."""
    if report.status is RunnerStatus.STARTED:
        return Step()
    job = report.job_id
    if tracked is None or tracked.decision_id != report.decision_id:
        return Step((ReleaseLock(job, report.fencing_token, report.decision_id),),
                    ignored=f"runner report for {report.decision_id} matches no rescale in flight (ended already)")
    completed = report.status is RunnerStatus.COMPLETED
    outcome = ScalingEvent(
        event_id=event_id(report.decision_id, "outcome"), decision_id=report.decision_id, job_id=job,
        timestamp=now, type=EventType.COMPLETED if completed else EventType.FAILED,
        from_parallelism=tracked.from_parallelism, to_parallelism=tracked.to_parallelism,
        downtime_s=report.downtime_s, error=report.error, rolled_back_to=report.rolled_back_to,
        **({"code": "partially_applied", "numbers": {"running_parallelism": report.running_parallelism}}
           if report.partially_applied else {}),
    )
    return Step((
        RecordRescaleEnd(
            job, report.running_parallelism, report.timestamp, report.downtime_s if completed else None,
            Direction.of(report.from_parallelism, report.to_parallelism),
            report.backend.value if report.backend is not None else None,
        ),
        Emit(outcome), FinishRescale(job), ReleaseLock(job, tracked.token, report.decision_id),
    ))


def on_overdue(job_id: str, *, tracked: InFlight | None, timeout_s: float, now: float) -> Step:
    """A rescale past its deadline, once this worker claimed it (exactly one worker does), given the
    job's rescale in flight: it fails with the reason (no answer within `timeout_s`), is forgotten and
    its lock freed. With nothing in flight any more only the leftover deadline is cleared."""
    if tracked is None:
        return Step((FinishRescale(job_id),))
    failed = ScalingEvent(
        event_id=event_id(tracked.decision_id, "outcome"), decision_id=tracked.decision_id, job_id=job_id,
        timestamp=now, type=EventType.FAILED,
        from_parallelism=tracked.from_parallelism, to_parallelism=tracked.to_parallelism,
        error=f"no answer from the job runner within {timeout_s:.0f} s",
    )
    return Step((Emit(failed), FinishRescale(job_id), ReleaseLock(job_id, tracked.token, tracked.decision_id)))
