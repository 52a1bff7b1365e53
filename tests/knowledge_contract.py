"""What every knowledge base must do, written once and run against each implementation:
`MemoryKnowledge` in tests/unit/test_knowledge_memory.py, `RedisKnowledge` on a real redis-server in
tests/integration/test_knowledge_redis.py. Each check gets a fresh job id and a knowledge base."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from contracts.execution import InFlight
from contracts.fleet import ClusterConfig, FleetGrant, FleetState
from contracts.jobs import ConfigError
from contracts.messages import MetricReport
from contracts.plan_state import STALE_WINDOW_BUDGET, Direction, PlanState
from contracts.window_state import WindowState
from knowledge import Knowledge
from knowledge.protocols import StoredForecast
from monitor.windows import add_report, already_applied

Check = Callable[[Knowledge, str], Awaitable[None]]
# A report that fills every part of a window's state: workers, source, operators, batches, spans.
OPEN_WINDOW_REPORT = MetricReport.model_validate({
    "job_id": "job", "timestamp": 15.5, "interval_s": 5.0, "worker_id": "a", "parallelism": 2,
    "records_in": 10, "records_out": 5, "busy_time_s": 1.5, "cpu_utilization": 0.5, "batches": 2,
    "batch_time_s": 0.25, "shuffle_partitions": 8,
    "source": {"arrival_rate": 2.5, "backlog": 3, "partitions": 2},
    "operators": [{"operator_id": "read", "parallelism": 2, "records_in": 10, "records_out": 10,
                   "busy_time_s": 0.5, "arrival_rate": 2.0}],
})
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


@check
async def registry_and_configuration(k: Knowledge, job: str) -> None:
    assert not await k.job_exists(job)
    with pytest.raises(KeyError):
        await k.set_config(job, {"mode": "off"})
    config = await k.register_job(job, {"max_parallelism": "12"})
    assert config.max_parallelism == 12 and job in await k.jobs() and await k.job_exists(job)
    assert (await k.set_config(job, {"mode": "recommend"})).mode.value == "recommend"
    assert await k.config_overrides(job) == {"max_parallelism": "12", "mode": "recommend"}
    with pytest.raises(ConfigError):
        await k.set_config(job, {"target_utilization": "1.5"})
    assert (await k.job_config(job)).target_utilization == 0.7  # nothing was changed
    assert (await k.unset_config(job, ["mode"])).mode.value == "auto"
    await k.unregister_job(job)
    assert not await k.job_exists(job) and await k.config_overrides(job) == {}


@check
async def open_windows_round_trip(k: Knowledge, job: str) -> None:
    assert await k.load_windows([job]) == {}
    state, _ = add_report(None, OPEN_WINDOW_REPORT, 10.0, 3, 7)
    state, _ = add_report(state, OPEN_WINDOW_REPORT.model_copy(update={"worker_id": "b"}), 10.0, 4, 2)
    await k.save_windows({job: state})
    loaded = await k.load_windows([job, f"{job}-other"])
    assert loaded == {job: state} and loaded[job].to_dict() == state.to_dict()
    assert already_applied(loaded[job], 3, 7, OPEN_WINDOW_REPORT)  # what was applied stays applied
    await k.save_windows({job: WindowState(20.0, offsets={3: 9})})  # a job's window is replaced whole
    assert await k.load_windows([job]) == {job: WindowState(20.0, offsets={3: 9})}


@check
async def a_window_commits_once_and_its_message_can_be_published_again(k: Knowledge, job: str) -> None:
    message = json.dumps({"window_end": 1010.0, "decision_id": "a"})
    assert not await k.window_done(job, "plan", 1010.0)
    fields = PlanState(quota_bound=True).changed_fields(PlanState())
    assert await k.commit_window(job, "plan", 1010.0, message, state_fields=fields)
    # A crash here, before publishing: the redelivered window finds its decision, same id.
    assert await k.window_done(job, "plan", 1010.0) and not await k.window_done(job, "analyze", 1010.0)
    assert await k.committed_message(job, "plan", 1010.0) == message
    assert not await k.commit_window(job, "plan", 1010.0, json.dumps({"window_end": 1010.0, "decision_id": "b"}))
    # The same commit made again (a client's retry after its reply was lost): its caller still publishes.
    assert await k.commit_window(job, "plan", 1010.0, message, state_fields=fields)
    assert [d["decision_id"] for d in await k.decisions(job)] == ["a"]  # written once
    assert not await k.commit_window(job, "plan", 1000.0, json.dumps({"window_end": 1000.0}))  # older: done
    assert (await k.plan_state(job)).quota_bound is True
    assert [d["decision_id"] for d in await k.decisions(job)] == ["a"]
    # Two workers racing on the same window (a rebalance): exactly one commit wins.
    rivals = [json.dumps({"window_end": 1020.0, "decision_id": f"r{i}"}) for i in range(8)]
    won = await asyncio.gather(*(k.commit_window(job, "plan", 1020.0, m) for m in rivals))
    assert sum(won) == 1
    assert await k.committed_message(job, "plan", 1020.0) == rivals[won.index(True)]
    assert await k.committed_message(job, "analyze", 1020.0) is None


@check
async def a_windows_reads_come_at_once_as_the_single_reads_return_them(k: Knowledge, job: str) -> None:
    await k.register_job(job, {"max_parallelism": "9"})
    fresh = await k.plan_reads(job, 1010.0)
    assert not fresh.done and fresh.lock_holder is None and fresh.config.max_parallelism == 9
    assert fresh.state == await k.plan_state(job)
    first = await k.analyze_reads(job, 1010.0, fallback=True)
    assert not first.done and first.learned is None and first.fallback is None and first.needs_forecast is None
    assert first.forecast == StoredForecast(None, None) and first.config == await k.job_config(job)
    valid = json.dumps({"window_end": 1010.0, "valid": True, "parallelism": 2})
    assert await k.commit_window(job, "analyze", 1010.0, valid, values={"learned": json.dumps({"n": 1})},
                                 forecast=StoredForecast('{"points": 1}', b"model\x00bytes"))
    assert await k.commit_window(job, "analyze", 1020.0, json.dumps({"window_end": 1020.0, "valid": False}),
                                 forecast=StoredForecast('{"points": 2}', None))
    reads = await k.analyze_reads(job, 1020.0, fallback=True)
    assert reads.done and not (await k.analyze_reads(job, 1030.0, fallback=False)).done
    assert reads.learned == await k.learned(job) and reads.fallback == await k.last_valid_analysis(job)
    assert reads.fallback is not None and reads.fallback["window_end"] == 1010.0
    assert reads.forecast == StoredForecast(*await k.forecast(job)) == StoredForecast('{"points": 2}', None)
    assert (await k.analyze_reads(job, 1030.0, fallback=False)).fallback is None  # not asked for
    planned = PlanState(quota_bound=True, needs_forecast=False)
    assert await k.commit_window(job, "plan", 1010.0, json.dumps({"window_end": 1010.0}),
                                 state_fields=planned.changed_fields(PlanState()))
    assert (await k.analyze_reads(job, 1030.0, fallback=False)).needs_forecast is False
    token = await k.acquire_lock(job, "d1", 30.0)
    assert token is not None
    reads_plan = await k.plan_reads(job, 1010.0)
    assert reads_plan.done and not (await k.plan_reads(job, 1020.0)).done
    assert reads_plan.state == await k.plan_state(job) and reads_plan.state.quota_bound is True
    assert reads_plan.lock_holder == await k.lock_holder(job) and reads_plan.lock_holder is not None


@check
async def analyses_are_kept_newest_first_and_trimmed(k: Knowledge, job: str) -> None:
    assert await k.last_analysis(job) is None and await k.last_valid_analysis(job) is None
    limit = k.settings.history_length  # type: ignore[attr-defined]
    for i in range(limit + 5):
        analysis = json.dumps({"window_end": float(i), "valid": i == 3, "parallelism": i})
        await k.commit_window(job, "analyze", float(i), analysis, values={"learned": json.dumps({"n": i})})
    assert (await k.last_analysis(job) or {})["parallelism"] == limit + 4
    assert await k.last_valid_analysis(job, scan=limit) is None  # window 3 was trimmed away
    history = await k.analyses(job, limit=limit + 5)
    assert [a["parallelism"] for a in history] == list(range(limit + 4, 4, -1))  # newest first, trimmed
    assert [a["parallelism"] for a in await k.analyses(job, limit=2)] == [limit + 4, limit + 3]
    assert (await k.learned(job) or {})["n"] == limit + 4  # the last one committed (in its current form)
    await k.save_forecast(job, '{"points": 3}', b"model")
    assert await k.forecast(job) == ('{"points": 3}', b"model")
    await k.save_forecast(job, '{"points": 4}', None)
    assert await k.forecast(job) == ('{"points": 4}', None)


@check
async def plan_state_keeps_what_plan_and_execute_write_and_only_that(k: Knowledge, job: str) -> None:
    assert await k.plan_state(job) == PlanState()
    before = PlanState()
    planned = before.updated({"window_parallelism": 2, "windows_at_parallelism": 3, "rescale_decided_at": 990.0})
    assert await k.commit_window(job, "plan", 1000.0, json.dumps({"window_end": 1000.0}),
                                 state_fields=planned.changed_fields(before))
    ended = await k.record_rescale_end(job, 4, 1005.0, 21.5, Direction.UP, "in_place")
    assert (ended.parallelism, ended.expected_parallelism, ended.stale_budget) == (4, 4, STALE_WINDOW_BUDGET)
    assert ended.downtimes.up == [21.5] and ended.window_parallelism == 2  # plan's fields kept
    assert ended.backend == "in_place"  # how the runner said it changed the job
    failed = await k.record_rescale_end(job, 4, 1009.0, None, Direction.DOWN)  # a failed rescale: no downtime
    assert failed.downtimes.down == [] and failed.last_rescale_at == 1009.0
    assert failed.backend == "in_place"  # a report that does not say keeps what the last one said
    # Plan writes only what it changed: execute's fields survive a later plan commit.
    later = failed.updated({"windows_at_parallelism": 4})
    await k.commit_window(job, "plan", 1010.0, json.dumps({"window_end": 1010.0}),
                          state_fields=later.changed_fields(failed))
    stored = await k.plan_state(job)
    assert stored == later and stored.parallelism == 4 and stored.downtimes.up == [21.5]


@check
async def events_and_decisions_are_marked_once(k: Knowledge, job: str) -> None:
    assert not await k.decision_done(job, "d1") and not await k.event_published(job, "e1")
    await k.record_event(job, json.dumps({"type": "started"}), "e1")
    await k.record_event(job, json.dumps({"type": "completed"}))
    assert await k.event_published(job, "e1") and not await k.event_published(job, "e2")
    assert [e["type"] for e in await k.events(job)] == ["completed", "started"]
    await k.mark_decision_done(job, "d1")
    assert await k.decision_done(job, "d1")


@check
async def the_lock_fences_stale_holders(k: Knowledge, job: str) -> None:
    first = await k.acquire_lock(job, "d1", ttl_s=30)
    assert first is not None and await k.lock_holder(job) == (first, "d1")
    assert await k.acquire_lock(job, "d2", ttl_s=30) is None  # held
    assert not await k.release_lock(job, first, "d2")  # not its holder
    assert await k.release_lock(job, first, "d1") and await k.lock_holder(job) is None
    second = await k.acquire_lock(job, "d3", ttl_s=30)
    assert second is not None and second > first  # tokens only grow
    assert not await k.release_lock(job, first, "d1")  # a stale holder cannot free the newer lock
    assert await k.lock_holder(job) == (second, "d3")


@check
async def fencing_tokens_keep_growing_when_a_job_is_registered_again(k: Knowledge, job: str) -> None:
    # A runner of the job may outlive its registration: the commands of the job registered again under the
    # same id must not carry tokens below those the runner already accepted (it ignores them as stale).
    await k.register_job(job, {})
    first = await k.acquire_lock(job, "d1", ttl_s=30)
    assert first is not None
    await k.unregister_job(job)
    assert await k.lock_holder(job) is None  # the lock goes with the registration
    await k.register_job(job, {})
    again = await k.acquire_lock(job, "d2", ttl_s=30)
    assert again is not None and again > first
    await k.unregister_job(job)


@check
async def the_lock_expires(k: Knowledge, job: str) -> None:
    assert await k.acquire_lock(job, "d1", ttl_s=0.2) is not None
    await asyncio.sleep(0.4)
    assert await k.lock_holder(job) is None
    assert await k.acquire_lock(job, "d2", ttl_s=30) is not None


@check
async def an_overdue_rescale_is_claimed_by_exactly_one_caller(k: Knowledge, job: str) -> None:
    assert await k.inflight(job) is None
    rescale = InFlight(decision_id="d1", from_parallelism=2, to_parallelism=4, token=7, deadline=100.0)
    await k.track_rescale(job, rescale)
    assert await k.inflight(job) == rescale
    assert job in await k.overdue_rescales(now=200.0) and job not in await k.overdue_rescales(now=50.0)
    claims = await asyncio.gather(*(k.claim_overdue(job) for _ in range(4)))
    assert sum(claims) == 1
    assert await k.inflight(job) == rescale  # claimed, still readable to fail it
    later = InFlight(decision_id="d2", from_parallelism=4, to_parallelism=3, token=8, deadline=300.0)
    await k.track_rescale(job, later)  # the next rescale replaces it whole
    assert await k.inflight(job) == later and job not in await k.overdue_rescales(now=200.0)
    await k.finish_rescale(job)
    assert await k.inflight(job) is None and job not in await k.overdue_rescales(now=200.0)


@check
async def slot_reservations_respect_the_quota_and_what_a_job_holds(k: Knowledge, job: str) -> None:
    other = f"{job}-other"
    assert await k.reserve_slots(other, 4, 6, quota=10, commit=True) == 6
    assert await k.reserve_slots(job, 2, 8, quota=10, commit=False) == 4  # 10 - 6
    assert await k.reserve_slots(job, 5, 8, quota=10, commit=True) == 5  # never below what it runs
    assert await k.reserve_slots(other, 6, 9, quota=10, commit=True) == 6  # 10 - 5, but keeps its 6
    await k.unregister_job(job)
    await k.unregister_job(other)


@check
async def a_fleet_step_runs_on_the_clusters_stored_state(k: Knowledge, job: str) -> None:
    name = f"c-{job}".lower().replace("_", "-")[:60]
    assert await k.update_fleet(name, lambda state, budget: (state, FleetGrant(
        cluster=name, budget=budget, granted=1, allocated=1, binds=False))) is None  # unknown cluster
    await k.register_cluster(ClusterConfig(name=name, workers=2, slots_per_worker=3))
    assert (await k.clusters())[name].budget == 6
    await k.register_job(job, {"cluster": name, "min_parallelism": "2"})

    def step(state: FleetState, budget: int) -> tuple[FleetState, FleetGrant]:
        held = {**state.held, job: state.held.get(job, 0) + 2}
        return FleetState(bids=state.bids, held=held), FleetGrant(
            cluster=name, budget=budget, granted=held[job], allocated=held[job], binds=False)

    assert (await k.update_fleet(name, step)).granted == 2  # type: ignore[union-attr]
    assert (await k.update_fleet(name, step)).granted == 4  # type: ignore[union-attr]
    assert (await k.fleet_state(name)).held == {job: 4}
    await k.remove_cluster(name)  # its job's reports are dead-lettered until the cluster is back
    assert (await k.orphaned_jobs()).get(job) == name
    await k.register_cluster(ClusterConfig(name=name, workers=2, slots_per_worker=3))
    assert job not in await k.orphaned_jobs()
    await k.unregister_job(job)
    assert job not in (await k.fleet_state(name)).held
    await k.remove_cluster(name)
    assert name not in await k.clusters()


@check
async def counters_add_up(k: Knowledge, job: str) -> None:
    before = (await k.counters()).get(f"{job}:n", 0)
    await k.incr_counters({f"{job}:n": 2})
    await k.incr_counters({f"{job}:n": 3, f"{job}:m": 1})
    counts = await k.counters()
    assert counts[f"{job}:n"] == before + 5 and counts[f"{job}:m"] == 1
