"""The Redis knowledge base on a Redis Cluster of three nodes started here: the shared behaviour
(tests/knowledge_contract.py) as on one Redis, one job's keys in one hash slot and the shared keys in
another, and jobs spread over the nodes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.asyncio.cluster import RedisCluster

from contracts.settings import Settings
from knowledge import RedisKnowledge
from monitor.windows import add_report
from stack.processes import Service, start_redis_cluster
from tests.integration.test_knowledge_redis import run_check
from tests.integration.test_redis_batch import run_batching
from tests.knowledge_contract import CHECKS, OPEN_WINDOW_REPORT, Check

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Service]]:
    nodes = start_redis_cluster(3, tmp_path_factory.mktemp("redis-cluster"))
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
def cluster_settings(cluster: list[Service]) -> Settings:
    return Settings(redis_url=f"redis://127.0.0.1:{cluster[0].port}/0", redis_cluster=True, history_length=20)


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_redis_cluster_knowledge(check: Check, cluster_settings: Settings) -> None:
    run_check(check, cluster_settings)


def test_a_jobs_keys_share_a_slot_and_jobs_spread_over_the_nodes(cluster: list[Service],
                                                                  cluster_settings: Settings) -> None:
    prefix = f"test-{uuid.uuid4().hex[:6]}"
    jobs = [f"job-{i}" for i in range(30)]

    async def fill(knowledge: RedisKnowledge) -> None:
        for job in jobs:
            await knowledge.register_job(job)
            state, _ = add_report(None, OPEN_WINDOW_REPORT.model_copy(update={"job_id": job}), 5.0)
            await knowledge.save_windows({job: state})
            await knowledge.commit_window(job, "plan", 10.0, json.dumps({"window_end": 10.0}))
        assert set(await knowledge.load_windows(jobs)) == set(jobs)  # one read across the nodes
        assert await knowledge.jobs() >= set(jobs)

    async def go() -> None:
        knowledge = RedisKnowledge(cluster_settings, prefix=prefix)
        try:
            await fill(knowledge)
            by_node = keys_by_node(cluster, f"{prefix}:job:*")
            for job in jobs:
                holding = [i for i, keys in enumerate(by_node) if any(f"{{{job}}}" in k for k in keys)]
                assert len(holding) == 1, f"{job}'s keys are on nodes {holding}"
                mine = [k for k in by_node[holding[0]] if f"{{{job}}}" in k]
                assert len(mine) >= 3  # configuration, window, plan state and history
            assert sum(1 for keys in by_node if keys) >= 2  # the jobs spread over the nodes
            shared = keys_by_node(cluster, f"{{{prefix}}}:*")
            assert sum(1 for keys in shared if keys) == 1  # the shared keys: one slot, one node
        finally:
            for job in jobs:
                await knowledge.unregister_job(job)
            await knowledge.close()
        assert keys_by_node(cluster, f"{prefix}:job:*") == [[], [], []]  # unregistering leaves nothing

    asyncio.run(go())


def test_a_turns_script_calls_share_one_pipeline_over_the_nodes(cluster_settings: Settings) -> None:
    """As on one Redis (`tests.integration.test_redis_batch`): the calls of one turn, on keys spread over
    the three nodes, are one pipeline with every call's own reply and failure, scripts loaded again."""
    run_batching(RedisCluster.from_url, cluster_settings.redis_url)


def keys_by_node(nodes: list[Service], pattern: str) -> list[list[str]]:
    """The keys matching `pattern` on each node."""
    found = []
    for node in nodes:
        client = redis.Redis(host=node.host, port=node.port, decode_responses=True)
        found.append(sorted(client.scan_iter(match=pattern, count=1000)))
        client.close()
    return found
