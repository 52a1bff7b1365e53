"""The Redis knowledge base, part two: what analyze and plan read and commit per window, one round trip each.

A window's reads are one Lua script (atomic: a consistent snapshot), and its commit is one that checks
the stage's watermark and writes everything the window taught, so two workers never commit one window
twice (see `knowledge.protocols.WindowCommits`). On a single Redis, the scripts of the windows a stage
handles together go in one pipeline (`knowledge.redis_batch.BatchedScripts`).
"""

from __future__ import annotations

import json
from typing import Any

from contracts.plan_state import PLAN_STATE_VERSION
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
from knowledge.redis_batch import BatchedScripts
from knowledge.redis_execution import parse_lock
from knowledge.redis_jobs import OLD_DOWNTIME_LISTS, RedisJobs, current_plan_state, stored_learned

# KEYS: the state hash, then `nh` history lists, then `nv` values to set, then keys to delete.
# ARGV: the watermark field, the window's end, the history's length, nh, nv, the number of state
# fields, then the state fields (name, value, ...), the history items, the values.
_COMMIT = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local keep, nh, nv, nf = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if current and tonumber(current) >= tonumber(ARGV[2]) then
  -- This very commit, made already (a retry whose reply was lost): the stage's history, the last
  -- list, begins with its message.
  if tonumber(current) == tonumber(ARGV[2]) and redis.call('LINDEX', KEYS[1 + nh], 0) == ARGV[6 + 2 * nf + nh] then
    return 1
  end
  return 0
end
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

# A window's reads, each one script (atomic, so a consistent snapshot; all of one job's keys, so one
# hash slot on a cluster). Analyze: KEYS state, config, learned, forecast, forecast-model, rates; ARGV
# the watermark field and how many recent analyses to scan (0: none). It reads two fields of the plan
# state, never the whole of it. Plan: KEYS state, the old downtime lists, config, lock.
_ANALYZE_READS = """
local recent = {}
if tonumber(ARGV[2]) > 0 then recent = redis.call('LRANGE', KEYS[6], 0, tonumber(ARGV[2]) - 1) end
local fields = redis.call('HMGET', KEYS[1], ARGV[1], 'needs_forecast')
return {fields[1], fields[2], redis.call('HGETALL', KEYS[2]), redis.call('GET', KEYS[3]),
        redis.call('GET', KEYS[4]), redis.call('GET', KEYS[5]), recent}
"""
_PLAN_READS = """
return {redis.call('HGETALL', KEYS[1]), redis.call('LRANGE', KEYS[2], 0, -1), redis.call('LRANGE', KEYS[3], 0, -1),
        redis.call('HGETALL', KEYS[4]), redis.call('GET', KEYS[5])}
"""


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _pairs(flat: list[bytes]) -> dict[str, str]:
    """A hash from the flat field, value, ... list a script's HGETALL returns."""
    it = iter(flat)
    return {k.decode(): v.decode() for k, v in zip(it, it, strict=True)}


class RedisWindows(RedisJobs):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._commit = self.redis.register_script(_COMMIT)
        self._analyze_reads = self._raw.register_script(_ANALYZE_READS)
        self._plan_reads = self._raw.register_script(_PLAN_READS)
        self._batch, self._raw_batch = BatchedScripts(self.redis), BatchedScripts(self._raw)

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
        histories = {**{n: v for n, v in (history or {}).items() if n != HISTORY[stage]}, HISTORY[stage]: message}
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
        return bool(await self._batch.call(self._commit, keys, args))

    # ---------------------------------------------------------------- a window's reads, at once

    async def analyze_reads(self, job_id: str, window_end: float, fallback: bool) -> AnalyzeReads:
        keys = [self._key(job_id, name) for name in ("state", "config", "learned", "forecast", "forecast-model",
                                                     "rates")]
        watermark, needs, config, learned, forecast, model, recent = await self._raw_batch.call(
            self._analyze_reads, keys, [WATERMARKS["analyze"], FALLBACK_SCAN if fallback else 0])
        return AnalyzeReads(
            done=committed(_text(watermark), window_end),
            config=self._config(_pairs(config)),
            learned=stored_learned(learned),
            needs_forecast=json.loads(needs) if needs else None,
            forecast=StoredForecast(_text(forecast), model),
            fallback=last_valid(json.loads(x) for x in recent) if fallback else None,
        )

    async def plan_reads(self, job_id: str, window_end: float) -> PlanReads:
        keys = [self._key(job_id, name) for name in ("state", *OLD_DOWNTIME_LISTS, "config", "lock")]
        state, up, down, config, lock = await self._raw_batch.call(self._plan_reads, keys)
        raw = _pairs(state)
        # An older form, or a first window, is migrated as plan_state migrates it.
        loaded = current_plan_state(raw, [up, down])
        return PlanReads(
            done=committed(raw.get(WATERMARKS["plan"]), window_end),
            config=self._config(_pairs(config)),
            state=loaded if loaded is not None else await self.plan_state(job_id),
            lock_holder=parse_lock(_text(lock)),
        )
