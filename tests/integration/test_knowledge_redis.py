"""The Redis knowledge base against a real redis-server: the shared behaviour (tests/knowledge_contract.py),
and the migration of a plan state stored in its older, untyped form."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from contracts.execution import InFlight
from contracts.settings import Settings
from knowledge import RedisKnowledge
from tests.knowledge_contract import CHECKS, Check
from tests.unit.test_window_state import STORED as STORED_WINDOW

pytestmark = pytest.mark.integration


def run_check(check: Check, settings: Settings) -> None:
    """One shared check on a fresh job, against the Redis the settings name (one server or a cluster)."""

    async def go() -> None:
        # A key prefix of its own: the quota and the counters are shared by every job under a prefix.
        knowledge = RedisKnowledge(settings.model_copy(update={"history_length": 20}),
                                   prefix=f"test-{uuid.uuid4().hex[:6]}")
        job = f"job-{uuid.uuid4().hex[:6]}"
        try:
            await check(knowledge, job)
        finally:
            await knowledge.unregister_job(job)
            await knowledge.close()

    asyncio.run(go())


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_redis_knowledge(check: Check, settings: Settings) -> None:
    run_check(check, settings)


def test_a_plan_state_stored_the_old_way_is_read_and_migrated_once(settings: Settings) -> None:
    async def go() -> None:
        knowledge = RedisKnowledge(settings)
        job = f"old-{uuid.uuid4().hex[:6]}"
        key = knowledge._key(job, "state")
        try:
            # As the untyped plan state was kept: one JSON value per field beside the watermarks and
            # analyze's last parallelism, the downtimes (newest first) in lists of their own.
            old = {"planned_until": "1010.0", "analyzed_until": "1020.0", "parallelism_seen": "2",
                   "expected_parallelism": "4", "stale_budget": "2", "quota_bound": "true",
                   "scale_up_check": json.dumps({"from": 2, "to": 4, "per_slot_before": 200.0,
                                                 "capacity_before": 400.0}),
                   "samples": json.dumps([{"window_end": 1000.0, "arrival_rate": 350.0,
                                           "true_processing_rate": 100.0, "true_output_rate": 100.0,
                                           "utilization": 0.9}])}
            await knowledge.redis.hset(key, mapping=old)
            await knowledge.redis.lpush(knowledge._key(job, "downtimes:up"), 20.0, 25.0)
            reads = await knowledge.plan_reads(job, 1010.0)  # a window's reads migrate it as plan_state does
            state = reads.state
            assert reads.done and not (await knowledge.analyze_reads(job, 1030.0, fallback=False)).done
            assert (state.expected_parallelism, state.stale_budget, state.quota_bound) == (4, 2, True)
            assert state.scale_up_check is not None and state.scale_up_check.from_parallelism == 2
            assert state.samples[0].arrival_rate == 350.0
            assert state.downtimes.up == [20.0, 25.0] and state.downtimes.down == []
            stored = await knowledge.redis.hgetall(key)
            assert stored["version"] == "1" and "parallelism_seen" not in stored
            assert stored["planned_until"] == "1010.0"  # the watermarks stay
            assert not await knowledge.redis.exists(knowledge._key(job, "downtimes:up"))
            assert await knowledge.plan_state(job) == state  # read again: the same, nothing to migrate
        finally:
            await knowledge.unregister_job(job)
            await knowledge.close()

    asyncio.run(go())


def test_a_rescale_in_flight_stored_the_old_way_is_read(settings: Settings) -> None:
    async def go() -> None:
        knowledge = RedisKnowledge(settings)
        job = f"old-{uuid.uuid4().hex[:6]}"
        key = knowledge._key(job, "inflight")
        try:
            # As execute kept it before the typed record: the whole decision and the token; the deadline
            # only in the overdue index.
            decision = {"schema_version": 1, "decision_id": "d1", "job_id": job, "action": "scale_up",
                        "from_parallelism": 2, "to_parallelism": 4, "mode": "auto", "policy": "default"}
            await knowledge.redis.hset(key, mapping={"decision": json.dumps(decision), "token": "7"})
            await knowledge.redis.zadd(knowledge._inflight_key, {job: 900.0})
            expected = InFlight(decision_id="d1", from_parallelism=2, to_parallelism=4, token=7, deadline=900.0)
            assert await knowledge.inflight(job) == expected
            assert await knowledge.claim_overdue(job)  # being failed as overdue: past its deadline
            assert await knowledge.inflight(job) == expected.model_copy(update={"deadline": 0.0})
            # Tracked again, it is stored in the current form, which the form before can still read.
            await knowledge.track_rescale(job, expected)
            stored = await knowledge.redis.hgetall(key)
            assert json.loads(stored["decision"])["from_parallelism"] == 2 and stored["token"] == "7"
            assert await knowledge.inflight(job) == expected
            await knowledge.unregister_job(job)
            assert job not in await knowledge.overdue_rescales(now=1000.0)
        finally:
            await knowledge.unregister_job(job)
            await knowledge.close()

    asyncio.run(go())


def test_a_configuration_stored_before_policy_names_keeps_its_meaning(settings: Settings) -> None:
    async def go() -> None:
        knowledge = RedisKnowledge(settings)
        job = f"cfg-{uuid.uuid4().hex[:6]}"
        try:
            # Before the policy registry, `ds2` named the default policy (DS2 inside the controls).
            await knowledge.redis.sadd(knowledge._jobs_key, job)
            await knowledge.redis.hset(knowledge._key(job, "config"), mapping={"policy": "ds2", "mode": "recommend"})
            assert (await knowledge.job_config(job)).policy == "default"
            await knowledge.set_config(job, {"max_parallelism": "6"})
            assert (await knowledge.job_config(job)).policy == "default"
            await knowledge.set_config(job, {"policy": "ds2"})  # now explicitly DS2 alone
            assert (await knowledge.job_config(job)).policy == "ds2"
        finally:
            await knowledge.unregister_job(job)
            await knowledge.close()

    asyncio.run(go())


def test_a_window_stored_by_an_earlier_version_is_read_and_stored_the_same_way(settings: Settings) -> None:
    async def go() -> None:
        knowledge = RedisKnowledge(settings)
        job = f"old-{uuid.uuid4().hex[:6]}"
        try:
            # As the monitor kept it before the typed state, here from before duplicate detection (no "seen").
            old = json.loads(STORED_WINDOW)
            del old["seen"]
            await knowledge.redis.set(knowledge._key(job, "window"), json.dumps(old))
            state = (await knowledge.load_windows([job]))[job]
            assert state.reports == 3 and state.offsets == {0: 42, 1: 9} and len(state.seen) == 0
            await knowledge.save_windows({job: state})
            assert json.loads(await knowledge.redis.get(knowledge._key(job, "window"))) == {**old, "seen": {}}
        finally:
            await knowledge.unregister_job(job)
            await knowledge.close()

    asyncio.run(go())
