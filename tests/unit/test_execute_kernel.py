"""Execute's kernel (`execute.kernel`): what each step decides from what execute read, with no services."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contracts.decisions import (
    Action,
    DecisionReason,
    EventType,
    RescaleCommand,
    RunnerReport,
    RunnerStatus,
    ScalingDecision,
)
from contracts.execution import InFlight, LockHolder
from contracts.plan_state import STALE_WINDOW_BUDGET, Direction, PlanState
from execute.kernel import (
    AcquireLock,
    Emit,
    FinishRescale,
    Held,
    MarkDecisionDone,
    Publish,
    RecordRescaleEnd,
    ReleaseLock,
    Step,
    TrackRescale,
    event_id,
    needs_reads,
    on_decision,
    on_lock,
    on_overdue,
    on_report,
)

NOW = 5000.0
TIMEOUT = 180.0
QUOTA = DecisionReason(code="quota_bound", message="the slot quota binds")
RECOVERED = DecisionReason(code="recovered", message="back to normal",
                           numbers={"observed_s": 30.0, "from_parallelism": 2, "to_parallelism": 4})


def decision(action: Action = Action.SCALE_UP, mode: str = "auto", notices: tuple[DecisionReason, ...] = (),
             decision_id: str = "d1", to: int = 4) -> ScalingDecision:
    return ScalingDecision(
        decision_id=decision_id, job_id="job", window_end=1000.0, action=action, from_parallelism=2,
        to_parallelism=to, policy="default", target_utilization=0.7, notices=list(notices), mode=mode,
        reason=DecisionReason(code="ds2_optimal", message="scale to keep up"), closed_at=1000.0,
    )


def report(status: RunnerStatus = RunnerStatus.COMPLETED, decision_id: str = "d1", running: int = 4,
           **extra: object) -> RunnerReport:
    return RunnerReport(decision_id=decision_id, job_id="job", status=status, from_parallelism=2, to_parallelism=4,
                        running_parallelism=running, fencing_token=7, timestamp=1234.0, **extra)  # type: ignore[arg-type]


def tracked(decision_id: str = "d1", token: int = 7) -> InFlight:
    return InFlight(decision_id=decision_id, from_parallelism=2, to_parallelism=4, token=token, deadline=NOW + 60)


def events(step: Step) -> list[tuple[EventType, str | None]]:
    return [(e.event.type, e.event.code) for e in step.effects if isinstance(e, Emit)]


# ---------------------------------------------------------------- decisions


def test_a_decision_executed_already_changes_nothing() -> None:
    step = on_decision(decision(notices=(QUOTA,)), done=True, holder=None, ttl_s=TIMEOUT, now=NOW)
    assert step.effects == () and step.lock is None and step.ignored


def test_notices_become_events_and_a_recovery_carries_its_numbers() -> None:
    step = on_decision(decision(Action.NONE, notices=(QUOTA, RECOVERED)), done=False, holder=None,
                       ttl_s=TIMEOUT, now=NOW)
    assert events(step) == [(EventType.NOTICE, "quota_bound"), (EventType.RECOVERED, "recovered")]
    notice, recovered = (e.event for e in step.effects if isinstance(e, Emit))
    assert notice.numbers == {} and recovered.numbers["observed_s"] == 30.0
    assert (recovered.from_parallelism, recovered.to_parallelism) == (2, 4)
    assert notice.event_id == event_id("d1", "notice", "quota_bound") and notice.timestamp == NOW
    assert step.effects[-1] == MarkDecisionDone("job", "d1") and step.lock is None


def test_a_decision_that_does_nothing_leaves_no_marker() -> None:
    assert on_decision(decision(Action.NONE), done=False, holder=None, ttl_s=TIMEOUT, now=NOW) == on_decision(
        decision(Action.SCALE_UP, mode="recommend"), done=False, holder=None, ttl_s=TIMEOUT, now=NOW)
    assert on_decision(decision(Action.NONE), done=False, holder=None, ttl_s=TIMEOUT, now=NOW).effects == ()


@given(action=st.sampled_from(list(Action)), mode=st.sampled_from(["auto", "recommend"]),
       notices=st.sampled_from([(), (QUOTA,), (RECOVERED, QUOTA)]), done=st.booleans(),
       holder=st.sampled_from([None, LockHolder(3, "d1"), LockHolder(4, "other")]))
def test_a_decision_that_needs_no_reads_does_the_same_whatever_they_would_say(
    action: Action, mode: str, notices: tuple[DecisionReason, ...], done: bool, holder: LockHolder | None,
) -> None:
    d = decision(action, mode, notices)
    step = on_decision(d, done=done, holder=holder, ttl_s=TIMEOUT, now=NOW)
    if not needs_reads(d):  # the shell skips the reads and does nothing
        assert step.effects == () and step.lock is None
    else:
        assert step.effects or step.lock is not None or done


def test_a_recommended_rescale_takes_no_lock_but_its_notices_go_out() -> None:
    step = on_decision(decision(mode="recommend", notices=(QUOTA,)), done=False, holder=None, ttl_s=TIMEOUT, now=NOW)
    assert step.lock is None and events(step) == [(EventType.NOTICE, "quota_bound")]


def test_a_rescale_takes_the_lock_unless_it_holds_it_already() -> None:
    fresh = on_decision(decision(), done=False, holder=LockHolder(3, "other"), ttl_s=TIMEOUT, now=NOW)
    assert fresh.lock == AcquireLock("job", "d1", TIMEOUT) and fresh.effects == ()
    resumed = on_decision(decision(), done=False, holder=LockHolder(9, "d1"), ttl_s=TIMEOUT, now=NOW)
    assert resumed.lock == Held(9)


def test_a_refused_lock_supersedes_the_decision_naming_the_running_one() -> None:
    step = on_lock(decision(), token=None, holder=LockHolder(3, "other"), tracked=None, timeout_s=TIMEOUT, now=NOW)
    assert events(step) == [(EventType.SKIPPED, "superseded")]
    skipped = step.effects[0]
    assert isinstance(skipped, Emit) and "other" in (skipped.event.detail or "")
    assert step.effects[-1] == MarkDecisionDone("job", "d1")
    unknown = on_lock(decision(), token=None, holder=None, tracked=None, timeout_s=TIMEOUT, now=NOW).effects[0]
    assert isinstance(unknown, Emit) and "?" in (unknown.event.detail or "")


def test_a_granted_lock_tracks_the_rescale_then_commands_it_then_starts_then_is_done() -> None:
    step = on_lock(decision(), token=7, holder=None, tracked=tracked("older", 5), timeout_s=TIMEOUT, now=NOW)
    track, publish, started, done = step.effects
    assert track == TrackRescale("job", InFlight(decision_id="d1", from_parallelism=2, to_parallelism=4, token=7,
                                                 deadline=NOW + TIMEOUT))
    assert isinstance(publish, Publish) and (publish.topic, publish.key) == ("commands", "job")
    command = RescaleCommand.model_validate_json(publish.value)
    assert (command.decision_id, command.to_parallelism, command.fencing_token, command.issued_at) == ("d1", 4, 7, NOW)
    assert isinstance(started, Emit) and started.event.type is EventType.STARTED
    assert started.event.event_id == event_id("d1", "started")
    assert done == MarkDecisionDone("job", "d1")


def test_a_redelivered_rescale_keeps_the_record_it_tracked() -> None:
    step = on_lock(decision(), token=7, holder=None, tracked=tracked("d1", 7), timeout_s=TIMEOUT, now=NOW + 30)
    assert not any(isinstance(e, TrackRescale) for e in step.effects)
    assert [type(e) for e in step.effects] == [Publish, Emit, MarkDecisionDone]


# ---------------------------------------------------------------- runner reports and the timeout


def test_a_started_report_changes_nothing_and_one_of_no_rescale_in_flight_only_frees_its_lock() -> None:
    assert on_report(report(RunnerStatus.STARTED), tracked=tracked(), now=NOW) == Step()
    for other in (None, tracked("d0")):
        # Ended already: a worker may have died before freeing the lock of the command this answers.
        step = on_report(report(), tracked=other, now=NOW)
        assert step.effects == (ReleaseLock("job", 7, "d1"),) and step.ignored


def test_a_completed_rescale_is_recorded_then_reported_then_forgotten_and_unlocked() -> None:
    step = on_report(report(downtime_s=21.5, backend="in_place"), tracked=tracked(token=7), now=NOW)
    record, outcome, finish, release = step.effects
    assert record == RecordRescaleEnd("job", 4, 1234.0, 21.5, Direction.UP, "in_place")
    assert isinstance(outcome, Emit) and outcome.event.type is EventType.COMPLETED
    assert outcome.event.event_id == event_id("d1", "outcome") and outcome.event.downtime_s == 21.5
    assert (finish, release) == (FinishRescale("job"), ReleaseLock("job", 7, "d1"))


def test_a_failed_rescale_records_no_downtime_and_says_when_it_went_part_way() -> None:
    step = on_report(report(RunnerStatus.FAILED, running=3, downtime_s=9.0, error="2 of 4 executors"),
                     tracked=tracked(), now=NOW)
    record, outcome, *_ = step.effects
    assert isinstance(record, RecordRescaleEnd) and record.downtime_s is None and record.running == 3
    assert isinstance(outcome, Emit) and outcome.event.type is EventType.FAILED
    assert outcome.event.code == "partially_applied" and outcome.event.numbers == {"running_parallelism": 3}
    rolled_back = on_report(report(RunnerStatus.FAILED, running=2, rolled_back_to=2), tracked=tracked(), now=NOW)
    event = rolled_back.effects[1]
    assert isinstance(event, Emit) and event.event.code is None and event.event.rolled_back_to == 2


def test_an_overdue_rescale_fails_and_frees_the_lock_and_a_leftover_deadline_is_cleared() -> None:
    step = on_overdue("job", tracked=tracked(token=7), timeout_s=TIMEOUT, now=NOW)
    failed, finish, release = step.effects
    assert isinstance(failed, Emit) and failed.event.type is EventType.FAILED and "180 s" in (failed.event.error or "")
    assert failed.event.event_id == event_id("d1", "outcome")  # the same step as the runner's answer: once
    assert (finish, release) == (FinishRescale("job"), ReleaseLock("job", 7, "d1"))
    assert on_overdue("job", tracked=None, timeout_s=TIMEOUT, now=NOW) == Step((FinishRescale("job"),))


# ---------------------------------------------------------------- properties

holders = st.one_of(st.none(), st.builds(LockHolder, st.integers(1, 9), st.sampled_from(["d1", "d2"])))
inflights = st.one_of(st.none(), st.builds(tracked, st.sampled_from(["d1", "d2"]), st.integers(1, 9)))


@given(action=st.sampled_from(list(Action)), mode=st.sampled_from(["auto", "recommend"]),
       notices=st.sampled_from([(), (QUOTA,), (RECOVERED,), (QUOTA, RECOVERED)]),
       done=st.booleans(), holder=holders, reply=st.one_of(st.none(), st.integers(1, 9)), inflight=inflights,
       now=st.floats(0, 1e9))
def test_a_decision_is_executed_at_most_once_in_a_crash_safe_order(
    action: Action, mode: str, notices: tuple[DecisionReason, ...], done: bool, holder: LockHolder | None,
    reply: int | None, inflight: InFlight | None, now: float,
) -> None:
    the = decision(action, mode, notices)
    first = on_decision(the, done=done, holder=holder, ttl_s=TIMEOUT, now=now)
    assert first == on_decision(the, done=done, holder=holder, ttl_s=TIMEOUT, now=now)  # pure: same in, same out
    rescale = not done and action is not Action.NONE and mode == "auto"
    assert (first.lock is not None) == rescale
    effects = list(first.effects)
    token = None
    if isinstance(first.lock, Held):
        token = first.lock.token
        assert holder is not None and holder.decision_id == "d1" and token == holder.token
    elif isinstance(first.lock, AcquireLock):
        token = reply
    if first.lock is not None:
        assert not any(isinstance(e, MarkDecisionDone) for e in effects)  # not done before the lock's step
        effects += on_lock(the, token=token, holder=holder, tracked=inflight, timeout_s=TIMEOUT, now=now).effects
    marks = [i for i, e in enumerate(effects) if isinstance(e, MarkDecisionDone)]
    assert marks == ([len(effects) - 1] if effects else [])  # done once, last, and only when something was done
    assert (not effects) == (done or (not rescale and not notices))
    ids = [e.event.event_id for e in effects if isinstance(e, Emit)]
    assert len(ids) == len(set(ids))  # one event per step of the decision
    commands = [i for i, e in enumerate(effects) if isinstance(e, Publish)]
    assert len(commands) == (1 if rescale and token is not None else 0)
    for i in commands:
        command = effects[i]
        assert isinstance(command, Publish)
        assert RescaleCommand.model_validate_json(command.value).fencing_token == token  # fenced by its own lock
        tracks = [j for j, e in enumerate(effects) if isinstance(e, TrackRescale)]
        assert tracks == ([] if inflight is not None and inflight.decision_id == "d1" else [i - 1])


@given(status=st.sampled_from(list(RunnerStatus)), frm=st.integers(1, 8), to=st.integers(1, 8),
       running=st.integers(1, 8), downtime=st.one_of(st.none(), st.floats(0, 100)), inflight=inflights)
def test_a_report_ends_only_its_own_rescale_recorded_before_it_is_forgotten(
    status: RunnerStatus, frm: int, to: int, running: int, downtime: float | None, inflight: InFlight | None,
) -> None:
    answer = RunnerReport(decision_id="d1", job_id="job", status=status, from_parallelism=frm, to_parallelism=to,
                          running_parallelism=running, fencing_token=1, downtime_s=downtime, timestamp=99.0)
    step = on_report(answer, tracked=inflight, now=NOW)
    ends = status is not RunnerStatus.STARTED and inflight is not None and inflight.decision_id == "d1"
    if not ends:  # at most the lock of the command it answers, which frees nothing it does not hold
        assert step.effects in ((), (ReleaseLock("job", 1, "d1"),))
        return
    assert inflight is not None
    assert [type(e) for e in step.effects] == [RecordRescaleEnd, Emit, FinishRescale, ReleaseLock]
    record, outcome, _, release = step.effects
    assert isinstance(record, RecordRescaleEnd) and isinstance(release, ReleaseLock) and isinstance(outcome, Emit)
    assert record.direction is (Direction.UP if to > frm else Direction.DOWN)
    assert record.downtime_s == (downtime if status is RunnerStatus.COMPLETED else None)
    assert release.token == inflight.token  # the lock is freed with the token the command carried
    assert (outcome.event.from_parallelism, outcome.event.to_parallelism) == (2, 4)  # as decided


def test_recording_the_same_end_again_changes_nothing() -> None:
    """A report redelivered after a crash between recording its end and forgetting the rescale."""
    ended = PlanState(stale_budget=0).after_rescale(4, 1234.0, 21.5, Direction.UP)
    assert ended.downtimes.up == [21.5] and ended.stale_budget == STALE_WINDOW_BUDGET
    used = ended.updated({"stale_budget": 1})  # plan dropped stale windows meanwhile
    assert used.after_rescale(4, 1234.0, 21.5, Direction.UP) == used
    assert used.after_rescale(4, 1300.0, 20.0, "up").downtimes.up == [21.5, 20.0]  # the next rescale counts
