"""The Redis knowledge base, part two: what analyze and plan read and commit per window, one round trip each.

A window's reads are one pipeline (a consistent snapshot: MULTI/EXEC), and its commit is one Lua script
that checks the stage's watermark and writes everything the window taught, so two workers never commit
one window twice (see `knowledge.protocols.WindowCommits`).
"""

from __future__ import annotations

import json
from typing import Any

from contracts.plan_state import PLAN_STATE_VERSION, PlanState
from knowledge.protocols import (
    FALLBACK_SCAN,
    HISTORY,
    REPUBLISH_SCAN,
    WATERMARKS,
    AnalyzeReads,
    PlanReads,
    Stage,
    StoredForecast,
    committed,
    last_valid,
)
from knowledge.redis_execution import parse_lock
from knowledge.redis_jobs import OLD_DOWNTIME_LISTS, RedisJobs, current_plan_state, stored_learned

# KEYS: the state hash, then `nh` history lists, then `nv` values to set, then keys to delete.
# ARGV: the watermark field, the window's end, the history's length, nh, nv, the number of state
# fields, then the state fields (name, value, ...), the history items, the values.
_COMMIT = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and tonumber(current) >= tonumber(ARGV[2]) then return 0 end
local keep, nh, nv, nf = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local a = 7
if nf > 0 then
  local fields = {}
  for i = 0, 2 * nf - 1 do fields[#fields + 1] = ARGV[a + i] end
  redis.call('HSET', KEYS[1], unpack(fields))
  a = a + 2 * nf
end
for i = 1, nh do
  redis.call('LPUSH', KEYS[1 + i], ARGV[a])
  redis.call('LTRIM', KEYS[1 + i], 0, keep - 1)
  a = a + 1
end
for i = 1, nv do
  redis.call('SET', KEYS[1 + nh + i], ARGV[a])
  a = a + 1
end
for i = 2 + nh + nv, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
"""


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _hash(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


class RedisWindows(RedisJobs):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._commit = self.redis.register_script(_COMMIT)

    async def window_done(self, job_id: str, stage: Stage, window_end: float) -> bool:
        return committed(await self.redis.hget(self._key(job_id, "state"), WATERMARKS[stage]), window_end)

    async def committed_message(self, job_id: str, stage: Stage, window_end: float) -> str | None:
        for item in await self.redis.lrange(self._key(job_id, HISTORY[stage]), 0, REPUBLISH_SCAN - 1):
            if json.loads(item).get("window_end") == window_end:
                return str(item)
        return None

    async def commit_window(
        self,
        job_id: str,
        stage: Stage,
        window_end: float,
        message: str,
        state_fields: dict[str, str] | None = None,
        history: dict[str, str] | None = None,
        values: dict[str, str] | None = None,
        forecast: StoredForecast | None = None,
    ) -> bool:
        """See `knowledge.protocols.WindowCommits`. Committing before publishing, with the message
        kept, means a crash in between republishes the same message (same decision id) instead of
        losing it or deciding twice; the watermark is checked in the script, so two workers commit a
        window once."""
        histories = {**(history or {}), HISTORY[stage]: message}
        sets: dict[str, str | bytes] = dict(values or {})
        deletes: list[str] = []
        if forecast is not None:
            for name, value in (("forecast", forecast.state_json), ("forecast-model", forecast.model)):
                if value is None:
                    deletes.append(name)
                else:
                    sets[name] = value
        fields = {**state_fields, "version": str(PLAN_STATE_VERSION)} if state_fields else {}
        keys = [self._key(job_id, "state"), *(self._key(job_id, n) for n in (*histories, *sets, *deletes))]
        args: list[Any] = [WATERMARKS[stage], repr(float(window_end)), self.settings.history_length,
                           len(histories), len(sets), len(fields)]
        for name, value in fields.items():
            args += [name, value]
        args += [*histories.values(), *sets.values()]
        return bool(await self._commit(keys=keys, args=args))

    # ---------------------------------------------------------------- a window's reads, at once

    async def _state_and_config(self, job_id: str, extra: list[str], lists: dict[str, int]) -> list[Any]:
        """One MULTI/EXEC on the byte client: the state hash, the old downtime lists, the config hash, the
        values `extra` (GET) and the lists `lists` (their first n items); the replies in that order."""
        async with self._raw.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._key(job_id, "state"))
            for name in OLD_DOWNTIME_LISTS:
                pipe.lrange(self._key(job_id, name), 0, -1)
            pipe.hgetall(self._key(job_id, "config"))
            for name in extra:
                pipe.get(self._key(job_id, name))
            for name, n in lists.items():
                pipe.lrange(self._key(job_id, name), 0, n - 1)
            return list(await pipe.execute())

    async def _loaded_state(self, job_id: str, raw: dict[str, str], old: list[list[bytes]]) -> PlanState:
        # An older form, or a first window, is migrated as plan_state migrates it.
        current = current_plan_state(raw, old)
        return current if current is not None else await self.plan_state(job_id)

    async def analyze_reads(self, job_id: str, window_end: float, fallback: bool) -> AnalyzeReads:
        scan = {"rates": FALLBACK_SCAN} if fallback else {}
        state, up, down, config, learned, forecast, model, *recent = await self._state_and_config(
            job_id, ["learned", "forecast", "forecast-model"], scan)
        raw = _hash(state)
        return AnalyzeReads(
            done=committed(raw.get(WATERMARKS["analyze"]), window_end),
            config=self._config(_hash(config)),
            learned=stored_learned(learned),
            plan_state=await self._loaded_state(job_id, raw, [up, down]),
            forecast=StoredForecast(_text(forecast), model),
            fallback=last_valid(json.loads(x) for x in recent[0]) if recent else None,
        )

    async def plan_reads(self, job_id: str, window_end: float) -> PlanReads:
        state, up, down, config, lock = await self._state_and_config(job_id, ["lock"], {})
        raw = _hash(state)
        return PlanReads(
            done=committed(raw.get(WATERMARKS["plan"]), window_end),
            config=self._config(_hash(config)),
            state=await self._loaded_state(job_id, raw, [up, down]),
            lock_holder=parse_lock(_text(lock)),
        )
