"""The Redis knowledge base, part one: jobs, open windows, analyze's models, plan state."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import redis.asyncio as aioredis
from pydantic_core import to_json

from contracts.jobs import CONFIG_VERSION, CONFIG_VERSION_FIELD, JobConfig, stored_overrides, validate_overrides
from contracts.plan_state import PLAN_STATE_VERSION, Direction, PlanState
from contracts.window_state import WindowState
from knowledge import stored_forms
from knowledge.protocols import FALLBACK_SCAN, last_valid
from knowledge.redis_fleet import RedisFleet

# The plan state's older form kept its measured downtimes in these lists, and analyze's last seen
# parallelism in the state hash.
OLD_DOWNTIME_LISTS = ("downtimes:up", "downtimes:down")
OLD_FIELDS = ("parallelism_seen",)


def current_plan_state(raw: dict[str, str], old: list[list[Any]]) -> PlanState | None:
    """The plan state from its hash and the old downtime lists, where nothing is to migrate (a current
    state, or a job never planned); None where `RedisJobs.plan_state` must migrate it."""
    if "version" in raw:
        return PlanState.load(raw)
    if not raw and not any(old):
        return PlanState.load(raw, {"up": [], "down": []})
    return None


def stored_learned(raw: str | bytes | None) -> dict[str, Any] | None:
    """Analyze's learned state from its stored JSON (None when none is stored)."""
    return stored_forms.learned(json.loads(raw)) if raw else None


class RedisJobs(RedisFleet):
    # ---------------------------------------------------------------- registry and config

    async def _overrides(self, job_id: str) -> dict[str, str]:
        return stored_overrides(await self.redis.hgetall(self._key(job_id, "config")))

    def _config(self, stored: dict[str, str]) -> JobConfig:
        """The job's configuration from its stored config hash."""
        return JobConfig.resolve(self.settings, stored_overrides(stored))

    async def _store_overrides(self, job_id: str, overrides: dict[str, str]) -> None:
        key = self._key(job_id, "config")

        def config(pipe: Any) -> None:
            pipe.delete(key)
            pipe.hset(key, mapping={**overrides, CONFIG_VERSION_FIELD: CONFIG_VERSION})

        # The configuration before the index: a job is listed only once it has one.
        await self._transaction(config, lambda pipe: pipe.sadd(self._jobs_key, job_id))

    async def register_job(self, job_id: str, overrides: dict[str, str] | None = None) -> JobConfig:
        merged = {**await self._overrides(job_id), **(overrides or {})}
        config = validate_overrides(self.settings, merged, {})
        await self.check_job_cluster(job_id, config)
        await self._store_overrides(job_id, merged)
        await self._unorphan(job_id)
        return config

    async def set_config(self, job_id: str, changes: dict[str, str]) -> JobConfig:
        if not await self.job_exists(job_id):
            raise KeyError(f"unknown job {job_id!r}; register it first")
        return await self.register_job(job_id, changes)

    async def unset_config(self, job_id: str, keys: list[str]) -> JobConfig:
        if not await self.job_exists(job_id):
            raise KeyError(f"unknown job {job_id!r}; register it first")
        kept = {k: v for k, v in (await self._overrides(job_id)).items() if k not in keys}
        await self._store_overrides(job_id, kept)
        return JobConfig.resolve(self.settings, kept)

    async def config_overrides(self, job_id: str) -> dict[str, str]:
        return await self._overrides(job_id)

    async def unregister_job(self, job_id: str) -> None:
        await self.forget_bid(job_id)
        await self._unorphan(job_id)
        # The fencing counter stays: a runner of the job may outlive its registration, and the tokens of a
        # job registered again under the same id must still grow past every token that runner accepted.
        fence = self._key(job_id, "fence")
        keys = [key async for key in self.redis.scan_iter(match=self._key(job_id, "*"), count=500) if key != fence]

        def unlisted(pipe: Any) -> None:
            pipe.srem(self._jobs_key, job_id)
            pipe.hdel(self._allocations_key, job_id)
            pipe.zrem(self._inflight_key, job_id)  # its rescale in flight's deadline

        # Unlisted before its keys go: a job is never listed without its configuration.
        await self._transaction(unlisted, *([lambda pipe: pipe.delete(*keys)] if keys else []))

    async def job_exists(self, job_id: str) -> bool:
        return bool(await self.redis.sismember(self._jobs_key, job_id))

    async def jobs(self) -> set[str]:
        return set(await self.redis.smembers(self._jobs_key))

    async def job_config(self, job_id: str) -> JobConfig:
        return self._config(await self.redis.hgetall(self._key(job_id, "config")))

    # ---------------------------------------------------------------- monitor: open windows

    async def load_windows(self, job_ids: Iterable[str]) -> dict[str, WindowState]:
        ids = list(job_ids)
        if not ids:
            return {}
        raw = await self._get_many([self._key(job_id, "window") for job_id in ids])
        return {job_id: WindowState.from_dict(json.loads(value))
                for job_id, value in zip(ids, raw, strict=True) if value}

    async def save_windows(self, windows: Mapping[str, WindowState]) -> None:
        if windows:
            # pydantic-core's serializer: JSON that json.loads reads back the same (without json.dumps's spaces,
            # and Infinity and NaN written as json.dumps writes them), in a third of its time; the
            # monitor saves every open window it changed, thousands a second at thousands of jobs.
            await self._set_many({self._key(job_id, "window"): to_json(state.to_dict())
                                  for job_id, state in windows.items()})

    # ---------------------------------------------------------------- analyze: models

    async def last_valid_analysis(self, job_id: str, scan: int = FALLBACK_SCAN) -> dict[str, Any] | None:
        return last_valid(await self._recent_json(job_id, "rates", scan))

    async def last_analysis(self, job_id: str) -> dict[str, Any] | None:
        recent = await self._recent_json(job_id, "rates", 1)
        return recent[0] if recent else None

    async def analyses(self, job_id: str, limit: int = 720) -> list[dict[str, Any]]:
        return await self._recent_json(job_id, "rates", limit)

    async def learned(self, job_id: str) -> dict[str, Any] | None:
        return stored_learned(await self.redis.get(self._key(job_id, "learned")))

    async def forecast(self, job_id: str) -> tuple[str | None, bytes | None]:
        async with self._raw.pipeline(transaction=True) as pipe:
            pipe.get(self._key(job_id, "forecast"))
            pipe.get(self._key(job_id, "forecast-model"))
            state, model = await pipe.execute()
        return (state.decode() if state else None), model

    async def save_forecast(self, job_id: str, state_json: str, model: bytes | None) -> None:
        async with self._raw.pipeline(transaction=True) as pipe:
            pipe.set(self._key(job_id, "forecast"), state_json)
            if model is None:
                pipe.delete(self._key(job_id, "forecast-model"))
            else:
                pipe.set(self._key(job_id, "forecast-model"), model)
            await pipe.execute()

    # ---------------------------------------------------------------- plan state

    async def plan_state(self, job_id: str) -> PlanState:
        state_key = self._key(job_id, "state")
        lists = [self._key(job_id, name) for name in OLD_DOWNTIME_LISTS]
        # One round trip where there is nothing to migrate (a current state, or a job never planned): this
        # is read for every window of every job; only an old state is migrated under WATCH below.
        async with self.redis.pipeline(transaction=True) as read:
            read.hgetall(state_key)
            for key in lists:
                read.lrange(key, 0, -1)
            raw, *old = await read.execute()
        current = current_plan_state(raw, old)
        if current is not None:
            return current
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(state_key, *lists)
                    raw = await pipe.hgetall(state_key)
                    if "version" in raw:
                        await pipe.unwatch()
                        return PlanState.load(raw)
                    up, down = [[float(v) for v in reversed(await pipe.lrange(key, 0, -1))] for key in lists]
                    state = PlanState.load(raw, {"up": up, "down": down})
                    if not raw and not up and not down:
                        await pipe.unwatch()
                        return state  # a job never planned: nothing to migrate
                    pipe.multi()
                    pipe.hset(state_key, mapping=state.stored_fields())
                    pipe.hdel(state_key, *OLD_FIELDS)
                    pipe.delete(*lists)
                    await pipe.execute()
                    return state
                except aioredis.WatchError:
                    continue

    async def record_rescale_end(
        self, job_id: str, running: int, completed_at: float, downtime_s: float | None,
        direction: Direction | None, backend: str | None = None,
    ) -> PlanState:
        state_key = self._key(job_id, "state")
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                before = await self.plan_state(job_id)
                try:
                    await pipe.watch(state_key)
                    if PlanState.load(await pipe.hgetall(state_key)) != before:
                        await pipe.unwatch()
                        continue  # plan committed meanwhile: start again from its state
                    after = before.after_rescale(running, completed_at, downtime_s, direction, backend)
                    pipe.multi()
                    pipe.hset(state_key, mapping={**after.changed_fields(before), "version": str(PLAN_STATE_VERSION)})
                    await pipe.execute()
                    return after
                except aioredis.WatchError:
                    continue
