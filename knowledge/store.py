"""The knowledge base: the only code that talks to Redis.

Keys are namespaced `<prefix>:job:<job id>:...`; every list is trimmed to the configured history
length and per-decision markers expire, so memory per job is bounded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis

from contracts.jobs import JobConfig, validate_overrides
from contracts.settings import Settings

# Long past any redelivery (offsets not yet committed) or republication (recent windows).
DECISION_MARKER_TTL_S = 24 * 3600
# How far back a redelivered window's message is looked for in the stage's history: a redelivery
# reaches back only over windows whose offsets were not yet committed to the broker.
REPUBLISH_SCAN = 16
# Per stage that commits windows (see commit_window): its per-job watermark, and the history list
# that keeps its messages (and serves as its outbox).
_WATERMARKS = {"analyze": "analyzed_until", "plan": "planned_until"}
_HISTORY = {"analyze": "rates", "plan": "decisions"}

# Release the lock only if the caller still holds it (fencing: a stale holder cannot free a newer lock).
_RELEASE_LOCK = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end
"""


# Grant a job up to `wanted` slots within the quota left by the other jobs' allocations, never less
# than it already runs with; atomic, so concurrent plans cannot overbook the quota together.
_RESERVE_SLOTS = """
local others = 0
local all = redis.call('hgetall', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] then others = others + tonumber(all[i + 1]) end
end
local granted = math.min(tonumber(ARGV[3]), tonumber(ARGV[4]) - others)
if granted < tonumber(ARGV[2]) then granted = tonumber(ARGV[2]) end
if ARGV[5] == '1' then redis.call('hset', KEYS[1], ARGV[1], granted) end
return granted
"""


class Knowledge:
    def __init__(self, settings: Settings, client: aioredis.Redis | None = None, prefix: str = "autoscaler"):
        self.settings = settings
        self.prefix = prefix
        from infra.security import redis_client_kwargs  # AUTH and TLS from settings

        security = redis_client_kwargs(settings)
        self.redis: aioredis.Redis = client or aioredis.from_url(
            settings.redis_url, decode_responses=True, health_check_interval=10, **security
        )
        # Forecast models are pickled bytes; the main client decodes text.
        self._raw: aioredis.Redis = aioredis.from_url(settings.redis_url, decode_responses=False,
                                                      health_check_interval=10, **security)
        self._release_lock = self.redis.register_script(_RELEASE_LOCK)
        self._reserve_slots = self.redis.register_script(_RESERVE_SLOTS)

    # ---------------------------------------------------------------- keys

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

    async def _push_trimmed(self, job_id: str, name: str, value: str | float) -> None:
        """Prepend to a per-job list, keeping it at most `history_length` long."""
        key = self._key(job_id, name)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lpush(key, value)
            pipe.ltrim(key, 0, self.settings.history_length - 1)
            await pipe.execute()

    async def _recent_json(self, job_id: str, name: str, limit: int) -> list[dict[str, Any]]:
        return [json.loads(item) for item in await self.redis.lrange(self._key(job_id, name), 0, limit - 1)]

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def close(self) -> None:
        await self.redis.aclose()
        await self._raw.aclose()

    # ---------------------------------------------------------------- registry and config

    async def register_job(self, job_id: str, overrides: dict[str, str] | None = None) -> JobConfig:
        current = await self.redis.hgetall(self._key(job_id, "config"))
        config = validate_overrides(self.settings, current, overrides or {})
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.sadd(self._jobs_key, job_id)
            if overrides:
                pipe.hset(self._key(job_id, "config"), mapping=overrides)
            await pipe.execute()
        return config

    async def set_config(self, job_id: str, changes: dict[str, str]) -> JobConfig:
        if not await self.job_exists(job_id):
            raise KeyError(f"unknown job {job_id!r}; register it first")
        return await self.register_job(job_id, changes)

    async def unset_config(self, job_id: str, keys: list[str]) -> JobConfig:
        """Return the keys to their defaults from settings."""
        if not await self.job_exists(job_id):
            raise KeyError(f"unknown job {job_id!r}; register it first")
        if keys:
            await self.redis.hdel(self._key(job_id, "config"), *keys)
        return await self.job_config(job_id)

    async def config_overrides(self, job_id: str) -> dict[str, str]:
        return dict(await self.redis.hgetall(self._key(job_id, "config")))

    async def unregister_job(self, job_id: str) -> None:
        keys = [key async for key in self.redis.scan_iter(match=self._key(job_id, "*"), count=500)]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.srem(self._jobs_key, job_id)
            pipe.hdel(self._allocations_key, job_id)
            if keys:
                pipe.delete(*keys)
            await pipe.execute()

    async def job_exists(self, job_id: str) -> bool:
        return bool(await self.redis.sismember(self._jobs_key, job_id))

    async def jobs(self) -> set[str]:
        return set(await self.redis.smembers(self._jobs_key))

    async def job_config(self, job_id: str) -> JobConfig:
        overrides = await self.redis.hgetall(self._key(job_id, "config"))
        return JobConfig.resolve(self.settings, overrides)

    # ---------------------------------------------------------------- monitor: open windows

    async def load_windows(self, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        ids = list(job_ids)
        if not ids:
            return {}
        raw = await self.redis.mget([self._key(job_id, "window") for job_id in ids])
        return {job_id: json.loads(value) for job_id, value in zip(ids, raw, strict=True) if value}

    async def save_windows(self, windows: dict[str, dict[str, Any]]) -> None:
        if not windows:
            return
        await self.redis.mset({self._key(job_id, "window"): json.dumps(state) for job_id, state in windows.items()})

    # ---------------------------------------------------------------- analyze: true-rate history

    async def rate_history(self, job_id: str, limit: int = 100) -> list[dict[str, Any]]:
        return await self._recent_json(job_id, "rates", limit)

    async def last_valid_analysis(self, job_id: str, scan: int = 60) -> dict[str, Any] | None:
        for item in await self.rate_history(job_id, scan):
            if item.get("valid"):
                return item
        return None

    # ---------------------------------------------------------------- analyze: models (Daedalus)

    async def learned(self, job_id: str) -> dict[str, Any] | None:
        """Capacity model and recovery detector of the job (see analyze.proactive.Learned)."""
        raw = await self.redis.get(self._key(job_id, "learned"))
        return json.loads(raw) if raw else None

    async def forecast(self, job_id: str) -> tuple[str | None, bytes | None]:
        """The forecast state (JSON) and the pickled model, written together by `save_forecast`."""
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

    async def recoveries(self, job_id: str, limit: int = 100) -> list[dict[str, Any]]:
        return await self._recent_json(job_id, "recoveries", limit)

    # ---------------------------------------------------------------- analyze and plan: one commit per window

    async def window_done(self, job_id: str, stage: str, window_end: float) -> bool:
        """Whether `stage` already committed its result for this window (or a later one)."""
        current = await self.redis.hget(self._key(job_id, "state"), _WATERMARKS[stage])
        return current is not None and float(current) >= window_end

    async def committed_message(self, job_id: str, stage: str, window_end: float) -> str | None:
        """The message `stage` committed for this window, to publish again after a crash."""
        for item in await self.redis.lrange(self._key(job_id, _HISTORY[stage]), 0, REPUBLISH_SCAN - 1):
            if json.loads(item).get("window_end") == window_end:
                return str(item)
        return None

    async def commit_window(
        self,
        job_id: str,
        stage: str,
        window_end: float,
        message: str,
        state: dict[str, Any] | None = None,
        history: dict[str, str] | None = None,
        values: dict[str, str] | None = None,
    ) -> bool:
        """Commit everything a stage learned from one window, and the message it will publish, at once.

        The message goes into the stage's history. Returns False when the window was already
        committed (a redelivery, or another worker got there first). Committing before publishing,
        with the message kept, means a crash in between republishes the same message (same
        decision id) instead of losing it or deciding twice."""
        state_key = self._key(job_id, "state")
        history = {**(history or {}), _HISTORY[stage]: message}
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(state_key)
                    current = await pipe.hget(state_key, _WATERMARKS[stage])
                    if current is not None and float(current) >= window_end:
                        await pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.hset(state_key, _WATERMARKS[stage], window_end)
                    if state:
                        pipe.hset(state_key, mapping={k: json.dumps(v) for k, v in state.items()})
                    for name, item in history.items():
                        pipe.lpush(self._key(job_id, name), item)
                        pipe.ltrim(self._key(job_id, name), 0, self.settings.history_length - 1)
                    for name, item in (values or {}).items():
                        pipe.set(self._key(job_id, name), item)
                    await pipe.execute()
                    return True
                except aioredis.WatchError:
                    continue

    # ---------------------------------------------------------------- plan: decisions

    async def decisions(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]:
        return await self._recent_json(job_id, "decisions", limit)

    # ---------------------------------------------------------------- execute: idempotency, lock, state

    async def decision_done(self, job_id: str, decision_id: str) -> bool:
        """Whether execute already finished with this decision: the idempotency key of execution."""
        return bool(await self.redis.exists(self._key(job_id, f"decision:{decision_id}")))

    async def mark_decision_done(self, job_id: str, decision_id: str) -> None:
        await self.redis.set(self._key(job_id, f"decision:{decision_id}"), time.time(), ex=DECISION_MARKER_TTL_S)

    async def event_published(self, job_id: str, event_id: str) -> bool:
        return bool(await self.redis.exists(self._key(job_id, f"event:{event_id}")))

    async def acquire_lock(self, job_id: str, decision_id: str, ttl_s: float) -> int | None:
        """Take the per-job execution lock; returns a fencing token that grows with every acquisition."""
        token = int(await self.redis.incr(self._key(job_id, "fence")))
        value = f"{token}:{decision_id}"
        if await self.redis.set(self._key(job_id, "lock"), value, nx=True, px=int(ttl_s * 1000)):
            return token
        return None

    async def lock_holder(self, job_id: str) -> tuple[int, str] | None:
        value = await self.redis.get(self._key(job_id, "lock"))
        if not value:
            return None
        token, _, decision_id = value.partition(":")
        return int(token), decision_id

    async def release_lock(self, job_id: str, token: int, decision_id: str) -> bool:
        return bool(await self._release_lock(keys=[self._key(job_id, "lock")], args=[f"{token}:{decision_id}"]))

    async def set_state(self, job_id: str, **fields: Any) -> None:
        await self.redis.hset(self._key(job_id, "state"), mapping={k: json.dumps(v) for k, v in fields.items()})

    async def state(self, job_id: str) -> dict[str, Any]:
        raw = await self.redis.hgetall(self._key(job_id, "state"))
        out: dict[str, Any] = {}
        for key, value in raw.items():
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
        return out

    async def track_rescale(self, job_id: str, decision: dict[str, Any], token: int, deadline: float) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._key(job_id, "inflight"), mapping={"decision": json.dumps(decision), "token": token})
            pipe.zadd(f"{self.prefix}:inflight", {job_id: deadline})
            await pipe.execute()

    async def inflight(self, job_id: str) -> tuple[dict[str, Any], int] | None:
        raw = await self.redis.hgetall(self._key(job_id, "inflight"))
        if not raw:
            return None
        return json.loads(raw["decision"]), int(raw["token"])

    async def finish_rescale(self, job_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key(job_id, "inflight"))
            pipe.zrem(f"{self.prefix}:inflight", job_id)
            await pipe.execute()

    async def claim_overdue(self, job_id: str) -> bool:
        """True for exactly one caller: several execute workers may see the same overdue rescale."""
        return bool(await self.redis.zrem(f"{self.prefix}:inflight", job_id))

    async def overdue_rescales(self, now: float) -> list[str]:
        return list(await self.redis.zrangebyscore(f"{self.prefix}:inflight", 0, now))

    async def record_event(self, job_id: str, event_json: str, event_id: str | None = None) -> None:
        """Keep the event in the job's history; with its id, remember that it was published."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(self._key(job_id, "events"), event_json)
            pipe.ltrim(self._key(job_id, "events"), 0, self.settings.history_length - 1)
            if event_id is not None:
                pipe.set(self._key(job_id, f"event:{event_id}"), 1, ex=DECISION_MARKER_TTL_S)
            await pipe.execute()

    async def events(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]:
        return await self._recent_json(job_id, "events", limit)

    async def record_downtime(self, job_id: str, direction: str, downtime_s: float) -> None:
        await self._push_trimmed(job_id, f"downtimes:{direction}", downtime_s)

    async def downtimes(self, job_id: str, direction: str) -> list[float]:
        return [float(v) for v in await self.redis.lrange(self._key(job_id, f"downtimes:{direction}"), 0, -1)]

    async def downtimes_by_direction(self, job_id: str, limit: int = 10) -> dict[str, list[float]]:
        """The latest measured restarts per direction, oldest first."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for direction in ("up", "down"):
                pipe.lrange(self._key(job_id, f"downtimes:{direction}"), 0, limit - 1)
            up, down = await pipe.execute()
        return {"up": [float(v) for v in reversed(up)], "down": [float(v) for v in reversed(down)]}

    async def recent_downtimes(self, job_id: str, limit: int = 10) -> list[float]:
        """The latest measured restarts, either direction."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for direction in ("up", "down"):
                pipe.lrange(self._key(job_id, f"downtimes:{direction}"), 0, limit - 1)
            up, down = await pipe.execute()
        return [float(v) for v in [*up, *down]]

    # ---------------------------------------------------------------- slot quota

    async def reserve_slots(self, job_id: str, current: int, wanted: int, quota: int, commit: bool) -> int:
        """Slots granted to the job (see _RESERVE_SLOTS); `commit` records the grant as its allocation."""
        return int(await self._reserve_slots(
            keys=[self._allocations_key], args=[job_id, current, wanted, quota, "1" if commit else "0"]
        ))

    async def set_allocation(self, job_id: str, slots: int) -> None:
        await self.redis.hset(self._allocations_key, job_id, slots)

    async def allocations(self) -> dict[str, int]:
        return {k: int(v) for k, v in (await self.redis.hgetall(self._allocations_key)).items()}

    # ---------------------------------------------------------------- counters

    async def incr_counters(self, counts: dict[str, int]) -> None:
        if not counts:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, value in counts.items():
                pipe.hincrby(self._counters_key, name, value)
            await pipe.execute()

    async def counters(self) -> dict[str, int]:
        return {k: int(v) for k, v in (await self.redis.hgetall(self._counters_key)).items()}
