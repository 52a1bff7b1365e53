"""Execute's shell (`execute.agent`) on the in-memory knowledge base: a rescale from decision to report, and
a worker that dies between any two effects and gets the message again."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from contracts.decisions import EventType, RescaleCommand, RunnerStatus, ScalingEvent
from contracts.execution import InFlight, LockHolder
from contracts.fleet import ClusterConfig, FleetGrant, FleetState
from contracts.settings import Settings
from execute.agent import ExecuteAgent
from execute.kernel import Effect
from knowledge import MemoryKnowledge
from knowledge.redis_execution import inflight_fields, load_inflight
from tests.unit.test_execute_kernel import QUOTA, decision, report

# The effects of the decision below (its notice, track, command, started, done) and of its report
# (record, outcome, forget, free): a worker may die before any of them.
EFFECTS = 9
GRANT = FleetGrant(cluster="c", budget=6, granted=0, allocated=0, binds=False)


class Crash(Exception):
    pass


class Worker(ExecuteAgent):
    """An execute worker that dies before its `crash_at`-th effect (counted from 0), once."""

    def __init__(self, knowledge: MemoryKnowledge, published: list[tuple[str, bytes]], crash_at: int | None = None):
        async def publish(topic: str, key: str, value: bytes) -> None:
            published.append((topic, value))

        super().__init__(Settings(), knowledge, publish)
        self.crash_at, self.performed = crash_at, 0

    async def perform_one(self, effect: Effect) -> None:
        if self.performed == self.crash_at:
            self.crash_at = None
            raise Crash
        self.performed += 1
        await super().perform_one(effect)


def outcome(published: list[tuple[str, bytes]]) -> tuple[list[str], list[tuple[str, int]]]:
    """The event ids and the (decision, token) of each command, as published."""
    events = [ScalingEvent.model_validate_json(v).event_id for t, v in published if t == "scaling_events"]
    commands = [RescaleCommand.model_validate_json(v) for t, v in published if t == "commands"]
    return events, [(c.decision_id, c.fencing_token) for c in commands]


def test_a_rescale_from_decision_to_report() -> None:
    async def run() -> None:
        knowledge, published = MemoryKnowledge(Settings()), []
        worker = Worker(knowledge, published)
        await worker.apply(decision().to_bytes())
        holder = await knowledge.lock_holder("job")
        assert holder is not None and holder.decision_id == "d1"
        tracked = await knowledge.inflight("job")
        assert tracked is not None and (tracked.decision_id, tracked.token) == ("d1", holder.token)
        assert tracked.deadline > time.time() + 100  # the timeout from now
        assert outcome(published)[1] == [("d1", holder.token)]
        await worker.apply(decision(decision_id="d2", to=3).to_bytes())  # while d1 runs: superseded
        await worker.on_report(report(downtime_s=20.0, backend="restart").to_bytes())
        assert await knowledge.lock_holder("job") is None and await knowledge.inflight("job") is None
        state = await knowledge.plan_state("job")
        assert (state.parallelism, state.downtimes.up, state.backend) == (4, [20.0], "restart")
        assert [e["type"] for e in await knowledge.events("job")] == ["completed", "skipped", "started"]
        assert await knowledge.decision_done("job", "d1") and await knowledge.decision_done("job", "d2")

    asyncio.run(run())


def test_an_overdue_rescale_fails_once_and_frees_the_lock() -> None:
    async def run() -> None:
        knowledge, published = MemoryKnowledge(Settings()), []
        token = await knowledge.acquire_lock("job", "d1", 60)
        assert token is not None
        await knowledge.track_rescale("job", InFlight(decision_id="d1", from_parallelism=2, to_parallelism=4,
                                                      token=token, deadline=time.time() - 1))
        await Worker(knowledge, published).fail_overdue()
        await Worker(knowledge, published).fail_overdue()  # another worker: nothing left to claim
        assert [e["type"] for e in await knowledge.events("job")] == ["failed"]
        assert await knowledge.lock_holder("job") is None and await knowledge.inflight("job") is None
        await Worker(knowledge, published).on_report(report().to_bytes())  # the runner answers too late
        assert len(await knowledge.events("job")) == 1 and (await knowledge.plan_state("job")).parallelism is None

    asyncio.run(run())


async def execute_all(crash_at: int | None) -> tuple[MemoryKnowledge, list[tuple[str, bytes]], int]:
    """A rescale decision with a notice, then the runner's report; the worker dies once, before its
    `crash_at`-th effect, and each message that failed is delivered again (to a fresh worker)."""
    knowledge: MemoryKnowledge = MemoryKnowledge(Settings())
    published: list[tuple[str, bytes]] = []
    worker = Worker(knowledge, published, crash_at)
    try:
        await worker.apply(decision(notices=(QUOTA,)).to_bytes())
    except Crash:
        await Worker(knowledge, published).apply(decision(notices=(QUOTA,)).to_bytes())
    token = outcome(published)[1][-1][1]  # the runner answers the command with its token
    done = report(RunnerStatus.COMPLETED, downtime_s=20.0).model_copy(update={"fencing_token": token}).to_bytes()
    try:
        await worker.on_report(done)
    except Crash:
        await Worker(knowledge, published).on_report(done)
    return knowledge, published, worker.performed


@pytest.mark.parametrize("crash_at", range(EFFECTS))
def test_a_worker_dying_before_any_effect_loses_nothing_and_does_nothing_twice(crash_at: int) -> None:
    async def run() -> None:
        expected, clean, performed = await execute_all(None)
        assert performed == EFFECTS  # so a crash before each effect is tried
        knowledge, published, _ = await execute_all(crash_at)
        events, commands = outcome(published)
        assert sorted(set(events)) == sorted(outcome(clean)[0])  # every event went out ...
        assert len(events) == len(set(events))  # ... once
        assert len({token for _, token in commands}) == 1  # every command for the decision under one token
        assert await knowledge.plan_state("job") == await expected.plan_state("job")  # the downtime counted once
        assert (await knowledge.plan_state("job")).downtimes.up == [20.0]
        assert await knowledge.lock_holder("job") is None and await knowledge.inflight("job") is None
        assert await knowledge.decision_done("job", "d1")
        assert [e["type"] for e in await knowledge.events("job")] == [
            EventType.COMPLETED, EventType.STARTED, EventType.NOTICE]

    asyncio.run(run())


def test_an_in_flight_rescale_stored_in_the_older_form_is_read() -> None:
    whole_decision = json.loads(decision().model_dump_json())  # what the form before kept: the whole decision
    old = {"decision": json.dumps(whole_decision), "token": "7"}
    expected = InFlight(decision_id="d1", from_parallelism=2, to_parallelism=4, token=7, deadline=900.0)
    assert load_inflight(old, 900.0) == expected  # its deadline from the overdue index
    assert load_inflight(old, None) == expected.model_copy(update={"deadline": 0.0})  # claimed: past due
    assert load_inflight({}, 900.0) is None
    # The current form keeps its own deadline, and a worker of the form before can still read it.
    current = inflight_fields(expected)
    assert load_inflight(current, None) == expected
    assert json.loads(current["decision"])["to_parallelism"] == 4 and int(current["token"]) == 7


def test_the_lock_holder_is_the_token_and_the_decision() -> None:
    assert LockHolder(3, "d1") == (3, "d1") and LockHolder(3, "d1").decision_id == "d1"


def test_a_job_on_a_cluster_holds_what_it_runs_once_its_rescale_ended() -> None:
    """The runner's report is what the fleet counts from then: a scale-up granted 4 that got 3 holds 3, and
    the slot is free for the others at once; a job on no cluster, or not yet in its fleet, changes no fleet."""
    async def run() -> None:
        knowledge, published = MemoryKnowledge(Settings()), []
        await knowledge.register_cluster(ClusterConfig(name="c", workers=2, slots_per_worker=3))
        await knowledge.register_job("job", {"cluster": "c"})
        await knowledge.register_job("other", {"cluster": "c"})
        await knowledge.update_fleet("c", lambda state, budget: (FleetState(held={"job": 4, "other": 2}), GRANT))
        worker = Worker(knowledge, published)
        await worker.apply(decision().to_bytes())
        assert (await knowledge.fleet_state("c")).held == {"job": 4, "other": 2}  # in flight: counted as granted
        await worker.on_report(report(RunnerStatus.FAILED, running=3, error="granted 3 of 4").to_bytes())
        assert (await knowledge.fleet_state("c")).held == {"job": 3, "other": 2}
        await knowledge.update_fleet("c", lambda state, budget: (FleetState(held={"other": 2}), GRANT))
        await worker.apply(decision(decision_id="d2").to_bytes())
        await worker.on_report(report(decision_id="d2", running=4).to_bytes())
        assert (await knowledge.fleet_state("c")).held == {"other": 2}  # not in the fleet yet: left as it is

    asyncio.run(run())
