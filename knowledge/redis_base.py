"""What every part of the Redis knowledge base shares: the clients, the key layout, bounded lists.

Keys are namespaced `<prefix>:job:<job id>:<name>`; every list is trimmed to the configured history
length and per-decision markers expire, so memory per job is bounded.

On a Redis Cluster (the setting `redis_cluster`) the keys carry hash tags: `<prefix>:job:{<job id>}:<name>`,
so one job's keys share a hash slot (a window's reads, its commit script and every per-job transaction
stay on one node), and `{<prefix>}:<name>` for the keys every job shares (the job index, the quota, the
in-flight index, clusters and fleets, counters), which share one slot of their own. A transaction may
hold one slot's keys only there, so the few that touch a job's keys and a shared index run as one
transaction per slot, in the order `_transaction` documents; on a single Redis they stay one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from contracts.settings import Settings
from infra.security import redis_client_kwargs


class RedisBase:
    def __init__(self, settings: Settings, client: aioredis.Redis | None = None, prefix: str = "autoscaler"):
        self.settings = settings
        self.prefix = prefix
        self.cluster = settings.redis_cluster
        security = redis_client_kwargs(settings)  # AUTH and TLS from settings
        connect: Any = RedisCluster.from_url if self.cluster else aioredis.from_url
        self.redis: aioredis.Redis = client or connect(
            settings.redis_url, decode_responses=True, health_check_interval=10, **security
        )
        # Forecast models are bytes; the main client decodes text.
        self._raw: aioredis.Redis = connect(settings.redis_url, decode_responses=False,
                                            health_check_interval=10, **security)
        # The keys every job shares: one hash slot of their own on a cluster.
        self._shared = f"{{{prefix}}}" if self.cluster else prefix

    def _key(self, job_id: str, name: str) -> str:
        if self.cluster:
            return f"{self.prefix}:job:{{{job_id}}}:{name}"
        return f"{self.prefix}:job:{job_id}:{name}"

    async def _transaction(self, *parts: Callable[[Any], object]) -> list[Any]:
        """Run `parts` (each queues commands on a pipeline: one job's keys, or the shared keys) as one
        MULTI/EXEC and return the replies in order. On a cluster, where a transaction holds one slot's
        keys, each part is a MULTI/EXEC of its own, in the order given: callers put first the part whose
        effect alone is the safer state to stop in."""
        if not self.cluster:
            async with self.redis.pipeline(transaction=True) as pipe:
                for part in parts:
                    part(pipe)
                return list(await pipe.execute())
        replies: list[Any] = []
        for part in parts:
            async with self.redis.pipeline(transaction=True) as pipe:
                part(pipe)
                replies += await pipe.execute()
        return replies

    async def _get_many(self, keys: list[str]) -> list[Any]:
        """GET of many keys in one round trip per node (MGET; on a cluster, one per slot's node)."""
        if self.cluster:
            return list(await self.redis.mget_nonatomic(keys))  # type: ignore[attr-defined]
        return list(await self.redis.mget(keys))

    async def _set_many(self, values: Mapping[str, str | bytes]) -> None:
        """SET of many keys, as `_get_many` reads them."""
        if self.cluster:
            await self.redis.mset_nonatomic(values)  # type: ignore[attr-defined]
        else:
            await self.redis.mset(values)

    @property
    def _jobs_key(self) -> str:
        return f"{self._shared}:jobs"

    @property
    def _allocations_key(self) -> str:
        return f"{self._shared}:slot-allocations"

    @property
    def _counters_key(self) -> str:
        return f"{self._shared}:counters"

    @property
    def _inflight_key(self) -> str:
        return f"{self._shared}:inflight"

    @property
    def _clusters_key(self) -> str:
        return f"{self._shared}:clusters"

    @property
    def _orphans_key(self) -> str:
        return f"{self._shared}:orphaned-jobs"

    def _fleet_key(self, name: str) -> str:
        return f"{self._shared}:fleet:{name}"

    async def _recent_json(self, job_id: str, name: str, limit: int) -> list[dict[str, Any]]:
        return [json.loads(item) for item in await self.redis.lrange(self._key(job_id, name), 0, limit - 1)]

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def close(self) -> None:
        await self.redis.aclose()
        await self._raw.aclose()
