"""The Redis knowledge base, part two: decisions and events, execute's fencing, the slot quota, counters."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from contracts.execution import InFlight, LockHolder
from contracts.settings import Settings
from knowledge.protocols import DECISION_MARKER_TTL_S
from knowledge.redis_base import RedisBase

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


def inflight_fields(rescale: InFlight) -> dict[str, str]:
    """How a rescale in flight is stored (one hash per job): `decision` (JSON of its id and its from and
    to parallelism), `token` and `deadline`. Workers of the form before read `decision` and `token` only,
    so a worker not yet upgraded can still end a rescale this one tracked."""
    decision = {"decision_id": rescale.decision_id, "from_parallelism": rescale.from_parallelism,
                "to_parallelism": rescale.to_parallelism}
    return {"decision": json.dumps(decision), "token": str(rescale.token), "deadline": repr(rescale.deadline)}


def parse_lock(value: str | None) -> LockHolder | None:
    """The lock's holder from its stored value (`<token>:<decision id>`); None when it is free."""
    if not value:
        return None
    token, _, decision_id = value.partition(":")
    return LockHolder(int(token), decision_id)


def load_inflight(fields: Mapping[str, str], indexed_deadline: float | None) -> InFlight | None:
    """A rescale in flight from its stored fields (None when there are none), in either stored form.

    The older form kept the whole decision as `decision` (its other keys are ignored here) and no
    `deadline`: its deadline is the overdue index's (`indexed_deadline`), and a rescale already claimed
    from that index (being failed as overdue) is past its deadline, read as 0.0."""
    if not fields:
        return None
    decision = json.loads(fields["decision"])
    deadline = fields.get("deadline")
    return InFlight(
        decision_id=decision["decision_id"], from_parallelism=decision["from_parallelism"],
        to_parallelism=decision["to_parallelism"], token=int(fields["token"]),
        deadline=float(deadline) if deadline is not None else indexed_deadline or 0.0,
    )


class RedisExecution(RedisBase):
    def __init__(self, settings: Settings, client: aioredis.Redis | None = None, prefix: str = "autoscaler"):
        super().__init__(settings, client, prefix)
        self._release_lock = self.redis.register_script(_RELEASE_LOCK)
        self._reserve_slots = self.redis.register_script(_RESERVE_SLOTS)

    # ---------------------------------------------------------------- decisions and events

    async def decisions(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]:
        return await self._recent_json(job_id, "decisions", limit)

    # ---------------------------------------------------------------- execute: idempotency and the lock

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

    async def lock_holder(self, job_id: str) -> LockHolder | None:
        return parse_lock(await self.redis.get(self._key(job_id, "lock")))

    async def release_lock(self, job_id: str, token: int, decision_id: str) -> bool:
        return bool(await self._release_lock(keys=[self._key(job_id, "lock")], args=[f"{token}:{decision_id}"]))

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

    # ---------------------------------------------------------------- the rescale in flight

    async def track_rescale(self, job_id: str, rescale: InFlight) -> None:
        """The record replaces the job's last one whole (no field of an older form is left behind)."""
        key = self._key(job_id, "inflight")

        def record(pipe: Any) -> None:
            pipe.delete(key)
            pipe.hset(key, mapping=inflight_fields(rescale))

        # The record before its deadline in the index: an indexed rescale always has its record.
        await self._transaction(record, lambda pipe: pipe.zadd(self._inflight_key, {job_id: rescale.deadline}))

    async def inflight(self, job_id: str) -> InFlight | None:
        fields, indexed = await self._transaction(lambda pipe: pipe.hgetall(self._key(job_id, "inflight")),
                                                  lambda pipe: pipe.zscore(self._inflight_key, job_id))
        return load_inflight(fields, indexed)

    async def finish_rescale(self, job_id: str) -> None:
        # Out of the index first: a rescale left indexed without its record would be failed as overdue.
        await self._transaction(lambda pipe: pipe.zrem(self._inflight_key, job_id),
                                lambda pipe: pipe.delete(self._key(job_id, "inflight")))

    async def claim_overdue(self, job_id: str) -> bool:
        """True for exactly one caller: several execute workers may see the same overdue rescale."""
        return bool(await self.redis.zrem(self._inflight_key, job_id))

    async def overdue_rescales(self, now: float) -> list[str]:
        return list(await self.redis.zrangebyscore(self._inflight_key, 0, now))

    # ---------------------------------------------------------------- slot quota

    async def reserve_slots(self, job_id: str, current: int, wanted: int, quota: int, commit: bool) -> int:
        """Slots granted to the job (see _RESERVE_SLOTS); `commit` records the grant as its allocation."""
        return int(await self._reserve_slots(
            keys=[self._allocations_key], args=[job_id, current, wanted, quota, "1" if commit else "0"]
        ))

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
