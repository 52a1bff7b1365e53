"""The fleet step through the plan agent on a real Redis: jobs on one cluster, planned by plan workers at
the same moment, never hold more than the cluster's slots, and the decisions say where the budget bound."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from contracts.decisions import ScalingDecision
from contracts.fleet import ClusterConfig
from contracts.settings import Settings
from knowledge import RedisKnowledge
from plan.agent import PlanAgent
from tests.unit.test_ds2 import analysis

pytestmark = pytest.mark.integration


def test_plan_workers_racing_on_one_cluster_keep_its_budget(settings: Settings) -> None:
    async def go() -> tuple[list[ScalingDecision], dict[str, int]]:
        prefix = f"fleet-{uuid.uuid4().hex[:6]}"
        workers = [RedisKnowledge(settings, prefix=prefix) for _ in range(3)]  # three plan workers
        published: list[bytes] = []

        async def publish(topic: str, key: str, value: bytes) -> None:
            if topic == "decisions":
                published.append(value)

        try:
            await workers[0].register_cluster(ClusterConfig(name="shared", workers=2, slots_per_worker=4))
            jobs = [f"job-{i}" for i in range(5)]
            for job in jobs:  # DS2 sizes each for 350 rec/s at 100 per slot: 5 slots; 5 x 5 > 8
                await workers[0].register_job(job, {"cluster": "shared", "policy": "ds2", "utilization_band": "0"})
            agents = [PlanAgent(settings, k, publish) for k in workers]
            for end in (100.0, 110.0, 120.0, 130.0):  # each round: every job's window at once, on any worker
                await asyncio.gather(*(agents[(i + int(end)) % 3].plan(analysis(job_id=job, window_end=end).to_bytes())
                                       for i, job in enumerate(jobs)))
            state = await workers[0].fleet_state("shared")
            return [ScalingDecision.model_validate_json(v) for v in published], state.held
        finally:
            for k in workers:
                await k.redis.delete(*[key async for key in k.redis.scan_iter(match=f"{prefix}:*")] or ["-"])
                await k.close()

    decisions, held = asyncio.run(go())
    assert len(decisions) == 20
    for end in (100.0, 110.0, 120.0, 130.0):  # each round's decisions fit the 8 slots, and so do the grants held
        assert sum(d.to_parallelism for d in decisions if d.window_end == end) <= 8
    assert sum(held.values()) == 8  # 5 jobs wanting 5 slots each share the 8 by weight: 2, 2, 2, 1, 1
    assert sorted(held.values()) == [1, 1, 2, 2, 2]
    bound = [d for d in decisions if d.reason.code == "fleet_budget"]
    assert bound and all("budget of 8 slots binds" in d.reason.message for d in bound)
    # Once every job has bid, their needs (5 each) exceed the budget: the last round says it is shared by weight.
    assert all("shared by weight" in d.reason.message for d in bound if d.window_end == 130.0)
