"""What every part of the Redis knowledge base shares: the clients, the key layout, bounded lists.

Keys are namespaced `<prefix>:job:<job id>:<name>`; every list is trimmed to the configured history
length and per-decision markers expire, so memory per job is bounded.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from contracts.settings import Settings
from infra.security import redis_client_kwargs


class RedisBase:
    def __init__(self, settings: Settings, client: aioredis.Redis | None = None, prefix: str = "autoscaler"):
        self.settings = settings
        self.prefix = prefix
        security = redis_client_kwargs(settings)  # AUTH and TLS from settings
        self.redis: aioredis.Redis = client or aioredis.from_url(
            settings.redis_url, decode_responses=True, health_check_interval=10, **security
        )
        # Forecast models are bytes; the main client decodes text.
        self._raw: aioredis.Redis = aioredis.from_url(settings.redis_url, decode_responses=False,
                                                      health_check_interval=10, **security)

    def _key(self, job_id: str, name: str) -> str:
        return f"{self.prefix}:job:{job_id}:{name}"

    @property
    def _jobs_key(self) -> str:
        return f"{self.prefix}:jobs"

    @property
    def _allocations_key(self) -> str:
        return f"{self.prefix}:slot-allocations"

    @property
    def _counters_key(self) -> str:
        return f"{self.prefix}:counters"

    @property
    def _inflight_key(self) -> str:
        return f"{self.prefix}:inflight"

    @property
    def _clusters_key(self) -> str:
        return f"{self.prefix}:clusters"

    @property
    def _orphans_key(self) -> str:
        return f"{self.prefix}:orphaned-jobs"

    def _fleet_key(self, name: str) -> str:
        return f"{self.prefix}:fleet:{name}"

    async def _recent_json(self, job_id: str, name: str, limit: int) -> list[dict[str, Any]]:
        return [json.loads(item) for item in await self.redis.lrange(self._key(job_id, name), 0, limit - 1)]

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def close(self) -> None:
        await self.redis.aclose()
        await self._raw.aclose()
