"""`MemoryKnowledge`: the knowledge base in one process, for unit tests and the evaluation.

It behaves as `RedisKnowledge` does (the behaviour tests in tests/knowledge_contract.py run
against both): values go through JSON as they would to Redis, lists are trimmed to the history
length, markers and the lock expire on the injected clock, fencing tokens grow, a window is
committed once. Each method runs without awaiting anything in between, so on one event loop every
method is atomic, as Redis's transactions and scripts are.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from contracts.execution import InFlight, LockHolder
from contracts.fleet import ClusterConfig, FleetGrant, FleetState
from contracts.jobs import JobConfig, validate_overrides
from contracts.plan_state import PLAN_STATE_VERSION, Direction, PlanState
from contracts.settings import Settings
from contracts.window_state import WindowState
from knowledge import stored_forms
from knowledge.fleet_rules import FleetStep, check_fleet
from knowledge.protocols import (
    DECISION_MARKER_TTL_S,
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
from knowledge.redis_execution import inflight_fields, load_inflight

T = TypeVar("T")


def run_now(call: Coroutine[Any, Any, T]) -> T:
    """Run one of `MemoryKnowledge`'s methods from synchronous code (the evaluation's simulator):
    they never wait on anything, so the coroutine completes at its first step."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    call.close()
    raise RuntimeError("an in-memory knowledge base call waited on something")


class MemoryKnowledge:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time):
        self.settings = settings
        self.clock = clock
        self._jobs: set[str] = set()
        self._config: dict[str, dict[str, str]] = {}
        self._windows: dict[str, str] = {}
        self._state: defaultdict[str, dict[str, str]] = defaultdict(dict)  # plan-state fields and watermarks
        self._lists: defaultdict[tuple[str, str], list[str]] = defaultdict(list)  # newest first
        self._values: dict[tuple[str, str], str] = {}
        self._forecasts: dict[str, tuple[str | None, bytes | None]] = {}
        self._markers: dict[tuple[str, str], float] = {}  # expiry
        self._fences: defaultdict[str, int] = defaultdict(int)
        self._locks: dict[str, tuple[str, float]] = {}  # "token:decision", expiry
        self._inflight: dict[str, dict[str, str]] = {}  # the stored fields, as Redis keeps them
        self._deadlines: dict[str, float] = {}
        self._allocations: dict[str, int] = {}
        self._clusters: dict[str, ClusterConfig] = {}
        self._fleets: dict[str, FleetState] = {}
        self._orphans: dict[str, str] = {}  # job -> its removed cluster
        self._counters: defaultdict[str, int] = defaultdict(int)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def _push(self, job_id: str, name: str, item: str) -> None:
        items = self._lists[(job_id, name)]
        items.insert(0, item)
        del items[self.settings.history_length:]

    def _recent(self, job_id: str, name: str, limit: int) -> list[dict[str, Any]]:
        return [json.loads(item) for item in self._lists[(job_id, name)][:limit]]

    def _live(self, expiry: float) -> bool:
        return expiry > self.clock()

    # ---------------------------------------------------------------- registry and config

    async def register_job(self, job_id: str, overrides: dict[str, str] | None = None) -> JobConfig:
        merged = {**self._config.get(job_id, {}), **(overrides or {})}
        config = validate_overrides(self.settings, merged, {})
        if config.cluster:
            check_fleet(config.cluster, self._clusters.get(config.cluster),
                        {**self._minimums(config.cluster), job_id: config.min_parallelism})
        self._jobs.add(job_id)
        self._config[job_id] = merged
        self._orphans.pop(job_id, None)
        return config

    async def set_config(self, job_id: str, changes: dict[str, str]) -> JobConfig:
        if job_id not in self._jobs:
            raise KeyError(f"unknown job {job_id!r}; register it first")
        return await self.register_job(job_id, changes)

    async def unset_config(self, job_id: str, keys: list[str]) -> JobConfig:
        if job_id not in self._jobs:
            raise KeyError(f"unknown job {job_id!r}; register it first")
        self._config[job_id] = {k: v for k, v in self._config.get(job_id, {}).items() if k not in keys}
        return await self.job_config(job_id)

    async def config_overrides(self, job_id: str) -> dict[str, str]:
        return dict(self._config.get(job_id, {}))

    async def unregister_job(self, job_id: str) -> None:
        self._jobs.discard(job_id)
        self._allocations.pop(job_id, None)
        self._orphans.pop(job_id, None)
        self._fleets = {name: fleet.without(job_id) for name, fleet in self._fleets.items()}
        # The fencing counter stays (a runner may outlive the registration; see the Redis knowledge base).
        for store in (self._config, self._windows, self._state, self._forecasts, self._locks,
                      self._inflight, self._deadlines):
            store.pop(job_id, None)  # type: ignore[attr-defined]
        for keyed in (self._lists, self._values, self._markers):
            for key in [k for k in keyed if k[0] == job_id]:
                del keyed[key]  # type: ignore[attr-defined]

    async def job_exists(self, job_id: str) -> bool:
        return job_id in self._jobs

    async def jobs(self) -> set[str]:
        return set(self._jobs)

    async def job_config(self, job_id: str) -> JobConfig:
        return JobConfig.resolve(self.settings, self._config.get(job_id, {}))

    # ---------------------------------------------------------------- monitor: open windows

    async def load_windows(self, job_ids: Iterable[str]) -> dict[str, WindowState]:
        return {job_id: WindowState.from_dict(json.loads(self._windows[job_id]))
                for job_id in job_ids if job_id in self._windows}

    async def save_windows(self, windows: Mapping[str, WindowState]) -> None:
        self._windows.update({job_id: json.dumps(state.to_dict()) for job_id, state in windows.items()})

    # ---------------------------------------------------------------- analyze: models

    async def last_valid_analysis(self, job_id: str, scan: int = FALLBACK_SCAN) -> dict[str, Any] | None:
        return last_valid(self._recent(job_id, "rates", scan))

    async def last_analysis(self, job_id: str) -> dict[str, Any] | None:
        recent = self._recent(job_id, "rates", 1)
        return recent[0] if recent else None

    async def analyses(self, job_id: str, limit: int = 720) -> list[dict[str, Any]]:
        return self._recent(job_id, "rates", limit)

    async def learned(self, job_id: str) -> dict[str, Any] | None:
        raw = self._values.get((job_id, "learned"))
        return stored_forms.learned(json.loads(raw)) if raw else None

    async def forecast(self, job_id: str) -> tuple[str | None, bytes | None]:
        return self._forecasts.get(job_id, (None, None))

    async def save_forecast(self, job_id: str, state_json: str, model: bytes | None) -> None:
        self._forecasts[job_id] = (state_json, model)

    # ---------------------------------------------------------------- analyze and plan: one commit per window

    async def window_done(self, job_id: str, stage: Stage, window_end: float) -> bool:
        return committed(self._state[job_id].get(WATERMARKS[stage]), window_end)

    async def committed_message(self, job_id: str, stage: Stage, window_end: float) -> str | None:
        for item in self._lists[(job_id, HISTORY[stage])][:REPUBLISH_SCAN]:
            if json.loads(item).get("window_end") == window_end:
                return item
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
        if await self.window_done(job_id, stage, window_end):
            # This very commit, made already: the stage's history begins with its message (as in Redis).
            same = float(self._state[job_id][WATERMARKS[stage]]) == window_end
            return same and self._lists[(job_id, HISTORY[stage])][:1] == [message]
        if forecast is not None:
            self._forecasts[job_id] = (forecast.state_json, forecast.model)
        state = self._state[job_id]
        state[WATERMARKS[stage]] = json.dumps(window_end)
        if state_fields:
            state.update({**state_fields, "version": str(PLAN_STATE_VERSION)})
        for name, item in {**(history or {}), HISTORY[stage]: message}.items():
            self._push(job_id, name, item)
        for name, item in (values or {}).items():
            self._values[(job_id, name)] = item
        return True

    async def analyze_reads(self, job_id: str, window_end: float, fallback: bool) -> AnalyzeReads:
        return AnalyzeReads(
            done=await self.window_done(job_id, "analyze", window_end), config=await self.job_config(job_id),
            learned=await self.learned(job_id), needs_forecast=(await self.plan_state(job_id)).needs_forecast,
            forecast=StoredForecast(*await self.forecast(job_id)),
            fallback=await self.last_valid_analysis(job_id) if fallback else None,
        )

    async def plan_reads(self, job_id: str, window_end: float) -> PlanReads:
        return PlanReads(done=await self.window_done(job_id, "plan", window_end), config=await self.job_config(job_id),
                         state=await self.plan_state(job_id), lock_holder=await self.lock_holder(job_id))

    # ---------------------------------------------------------------- plan state

    async def plan_state(self, job_id: str) -> PlanState:
        return PlanState.load(self._state.get(job_id, {}))

    async def record_rescale_end(
        self, job_id: str, running: int, completed_at: float, downtime_s: float | None,
        direction: Direction | None, backend: str | None = None,
    ) -> PlanState:
        before = await self.plan_state(job_id)
        after = before.after_rescale(running, completed_at, downtime_s, direction, backend)
        self._state[job_id].update({**after.changed_fields(before), "version": str(PLAN_STATE_VERSION)})
        return after

    # ---------------------------------------------------------------- decisions and events

    async def decisions(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]:
        return self._recent(job_id, "decisions", limit)

    async def events(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]:
        return self._recent(job_id, "events", limit)

    async def record_event(self, job_id: str, event_json: str, event_id: str | None = None) -> None:
        self._push(job_id, "events", event_json)
        if event_id is not None:
            self._markers[(job_id, f"event:{event_id}")] = self.clock() + DECISION_MARKER_TTL_S

    async def event_published(self, job_id: str, event_id: str) -> bool:
        return self._live(self._markers.get((job_id, f"event:{event_id}"), 0.0))

    async def decision_done(self, job_id: str, decision_id: str) -> bool:
        return self._live(self._markers.get((job_id, f"decision:{decision_id}"), 0.0))

    async def mark_decision_done(self, job_id: str, decision_id: str) -> None:
        self._markers[(job_id, f"decision:{decision_id}")] = self.clock() + DECISION_MARKER_TTL_S

    # ---------------------------------------------------------------- execute: the lock and the rescale in flight

    async def acquire_lock(self, job_id: str, decision_id: str, ttl_s: float) -> int | None:
        self._fences[job_id] += 1
        token = self._fences[job_id]
        if await self.lock_holder(job_id) is not None:
            return None
        self._locks[job_id] = (f"{token}:{decision_id}", self.clock() + ttl_s)
        return token

    async def lock_holder(self, job_id: str) -> LockHolder | None:
        held = self._locks.get(job_id)
        if held is None or not self._live(held[1]):
            self._locks.pop(job_id, None)
            return None
        token, _, decision_id = held[0].partition(":")
        return LockHolder(int(token), decision_id)

    async def release_lock(self, job_id: str, token: int, decision_id: str) -> bool:
        held = self._locks.get(job_id)
        if held is None or not self._live(held[1]) or held[0] != f"{token}:{decision_id}":
            return False
        del self._locks[job_id]
        return True

    async def track_rescale(self, job_id: str, rescale: InFlight) -> None:
        self._inflight[job_id] = inflight_fields(rescale)
        self._deadlines[job_id] = rescale.deadline

    async def inflight(self, job_id: str) -> InFlight | None:
        return load_inflight(self._inflight.get(job_id, {}), self._deadlines.get(job_id))

    async def finish_rescale(self, job_id: str) -> None:
        self._inflight.pop(job_id, None)
        self._deadlines.pop(job_id, None)

    async def claim_overdue(self, job_id: str) -> bool:
        return self._deadlines.pop(job_id, None) is not None

    async def overdue_rescales(self, now: float) -> list[str]:
        return [job for job, deadline in sorted(self._deadlines.items(), key=lambda kv: kv[1]) if deadline <= now]

    # ---------------------------------------------------------------- slot quota and counters

    async def reserve_slots(self, job_id: str, current: int, wanted: int, quota: int, commit: bool) -> int:
        others = sum(slots for job, slots in self._allocations.items() if job != job_id)
        granted = max(current, min(wanted, quota - others))
        if commit:
            self._allocations[job_id] = granted
        return granted

    # ---------------------------------------------------------------- clusters and fleets

    def _minimums(self, cluster: str) -> dict[str, int]:
        configs = {job: JobConfig.resolve(self.settings, self._config.get(job, {})) for job in self._jobs}
        return {job: c.min_parallelism for job, c in configs.items() if c.cluster == cluster}

    async def register_cluster(self, cluster: ClusterConfig) -> None:
        check_fleet(cluster.name, cluster, self._minimums(cluster.name))
        self._clusters[cluster.name] = cluster
        self._orphans = {job: c for job, c in self._orphans.items() if c != cluster.name}

    async def remove_cluster(self, name: str) -> None:
        self._orphans.update({job: name for job in self._minimums(name)})
        self._clusters.pop(name, None)
        self._fleets.pop(name, None)

    async def orphaned_jobs(self) -> dict[str, str]:
        return dict(self._orphans)

    async def clusters(self) -> dict[str, ClusterConfig]:
        return dict(self._clusters)

    async def fleet_state(self, name: str) -> FleetState:
        return self._fleets.get(name, FleetState())

    async def update_fleet(self, name: str, step: FleetStep) -> FleetGrant | None:
        cluster = self._clusters.get(name)
        if cluster is None:
            return None
        self._fleets[name], granted = step(self._fleets.get(name, FleetState()), cluster.budget)
        return granted

    async def incr_counters(self, counts: dict[str, int]) -> None:
        for name, value in counts.items():
            self._counters[name] += value

    async def counters(self) -> dict[str, int]:
        return dict(self._counters)
