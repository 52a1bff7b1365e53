from __future__ import annotations

import json

import pytest

from contracts.backends import ActionCost, restart_cost
from contracts.decisions import RescaleCommand, RunnerReport, RunnerStatus
from contracts.plan_state import Downtimes
from execute.backend import RunnerFatal, StartError, rescale_with_rollback
from execute.runner import APPLIED_KEPT, RunnerState, Verdict, partial_note
from pipeline.restart import first_batch_done, query_name


def command(decision: str = "d1", token: int = 5, to: int = 3, job: str = "orders", issued: float = 1000.0):
    return RescaleCommand(decision_id=decision, job_id=job, to_parallelism=to, fencing_token=token, issued_at=issued)


def classify(state: RunnerState, cmd: RescaleCommand, running: int = 1, now: float = 1001.0, **kw) -> Verdict:
    return state.classify(cmd, "orders", running, now, max_age_s=60.0, **kw)


def report(decision: str, status: RunnerStatus = RunnerStatus.COMPLETED) -> RunnerReport:
    return RunnerReport(
        decision_id=decision, job_id="orders", status=status, from_parallelism=1, to_parallelism=3,
        running_parallelism=3, fencing_token=5, downtime_s=4.0,
    )


def test_classify_commands() -> None:
    state = RunnerState(max_fencing_token=5)
    assert classify(state, command()) == Verdict.APPLY
    assert classify(state, command(job="other")) == Verdict.OTHER_JOB
    assert classify(state, command(token=4)) == Verdict.STALE_TOKEN
    assert classify(state, command(token=6)) == Verdict.APPLY
    assert classify(state, command(issued=900.0)) == Verdict.EXPIRED
    assert classify(state, command(to=1)) == Verdict.NOOP
    assert classify(state, command(to=9), max_parallelism=8) == Verdict.OUT_OF_BOUNDS
    state.record(report("d1"))
    assert classify(state, command()) == Verdict.DUPLICATE


def test_tokens_only_grow() -> None:
    state = RunnerState()
    state.accept_token(7)
    state.accept_token(3)
    assert state.max_fencing_token == 7


def test_state_round_trip_and_bound(tmp_path) -> None:
    state = RunnerState(parallelism=3, max_fencing_token=9)
    for i in range(APPLIED_KEPT + 10):
        state.record(report(f"d{i}"))
    assert len(state.applied) == APPLIED_KEPT
    assert "d0" not in state.applied and f"d{APPLIED_KEPT + 9}" in state.applied
    path = tmp_path / "state.json"
    state.save(path)
    loaded = RunnerState.load(path)
    assert (loaded.parallelism, loaded.max_fencing_token) == (3, 9)
    assert RunnerReport.model_validate(loaded.applied["d12"]).downtime_s == 4.0
    assert RunnerState.load(tmp_path / "missing.json").parallelism is None
    (tmp_path / "bad.json").write_text("{not json")
    assert RunnerState.load(tmp_path / "bad.json").applied == {}


def test_rescale_succeeds_after_a_retry() -> None:
    calls: list[int] = []

    def start(n: int) -> None:
        calls.append(n)
        if len(calls) == 1:
            raise StartError("flaky")

    outcome = rescale_with_rollback(start, target=4, last_good=2, retries=2)
    assert outcome.ok and outcome.parallelism == 4 and outcome.attempts == 2
    assert calls == [4, 4]


def test_rescale_rolls_back_when_the_target_never_starts() -> None:
    calls: list[int] = []

    def start(n: int) -> None:
        calls.append(n)
        if n > 2:
            raise StartError(f"no room for {n}")

    outcome = rescale_with_rollback(start, target=5, last_good=2, retries=1)
    assert not outcome.ok
    assert (outcome.parallelism, outcome.rolled_back_to, outcome.attempts) == (2, 2, 3)
    assert calls == [5, 5, 2]
    assert "no room for 5" in outcome.errors[0]


def test_rescale_fatal_when_nothing_starts() -> None:
    def start(n: int) -> None:
        raise StartError("down")

    with pytest.raises(RunnerFatal):
        rescale_with_rollback(start, target=5, last_good=2, retries=0)


def progress(rows: int, end: dict, latest: dict) -> dict:
    return {
        "timestamp": "2024-05-01T12:00:00.000Z",
        "numInputRows": rows,
        "durationMs": {"triggerExecution": 10},
        "sources": [{"endOffset": end, "latestOffset": latest}],
        "sink": {"numOutputRows": -1},
    }


def test_first_batch_done() -> None:
    assert not first_batch_done(None)
    assert first_batch_done(progress(10, {"0": 10}, {"0": 50}))
    assert first_batch_done(progress(0, {"0": 50}, {"0": 50}))  # nothing to read
    assert not first_batch_done(progress(0, {"0": 10}, {"0": 50}))  # backlog, nothing read yet


def test_query_name_is_an_identifier() -> None:
    assert query_name("orders.v2:eu-1") == "job_orders_v2_eu_1"


def test_a_restart_is_expected_to_cost_what_was_measured_in_its_direction() -> None:
    measured = Downtimes()
    assert restart_cost(2, 2, measured, 30.0, 1.0) == ActionCost(pause_s=0.0)
    assert restart_cost(2, 4, measured, 30.0, 1.0) == ActionCost(pause_s=30.0, replay_s=1.0)  # nothing measured
    measured = measured.add("up", 22.0).add("up", 25.0).add("down", 12.0)
    assert restart_cost(2, 4, measured, 30.0, 1.0).pause_s == 25.0  # the longest recent one
    assert restart_cost(4, 2, measured, 30.0, 1.0).pause_s == 12.0


def test_the_measured_downtimes_survive_a_runner_restart_and_old_state_files_load(tmp_path) -> None:
    path = tmp_path / "runner-state.json"
    state = RunnerState(parallelism=2, downtimes=Downtimes().add("up", 21.0))
    state.save(path)
    assert RunnerState.load(path).downtimes.up == [21.0]
    path.write_text(json.dumps({"parallelism": 3, "max_fencing_token": 4, "applied": {}}))  # before costs
    old = RunnerState.load(path)
    assert (old.parallelism, old.max_fencing_token, old.downtimes) == (3, 4, Downtimes())


def test_a_change_that_went_part_of_the_way_is_reported_as_partially_applied() -> None:
    def failed(running: int, to: int = 3) -> RunnerReport:
        return report("d1", RunnerStatus.FAILED).model_copy(update={"running_parallelism": running,
                                                                    "to_parallelism": to})

    assert failed(2).partially_applied  # 1 -> 3 asked, 2 granted
    assert not failed(1).partially_applied and not failed(3).partially_applied  # nothing, or all of it
    assert failed(2, to=1).model_copy(update={"from_parallelism": 4}).partially_applied  # 4 -> 1 stopped at 2
    assert not report("d1").partially_applied  # completed
    assert partial_note(1, 2, 3) == "partially applied: the job runs at 2 of 3 (from 1); "
    assert partial_note(1, 1, 3) == partial_note(1, 3, 3) == ""
