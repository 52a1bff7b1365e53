"""The knowledge base, split by concern: what each stage may ask of it.

Two implementations keep the same behaviour: `RedisKnowledge` (deployed; several workers share it)
and `MemoryKnowledge` (one process: unit tests and the evaluation). The behaviour tests in
tests/knowledge_contract.py run against both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from contracts.execution import InFlight, LockHolder
from contracts.fleet import ClusterConfig, FleetGrant, FleetState
from contracts.jobs import JobConfig
from contracts.plan_state import Direction, PlanState
from contracts.window_state import WindowState
from knowledge.fleet_rules import FleetStep

Stage = Literal["analyze", "plan"]

# Per stage that commits windows: its per-job watermark and the history list that keeps its
# messages (and serves as its outbox).
WATERMARKS: dict[str, str] = {"analyze": "analyzed_until", "plan": "planned_until"}
HISTORY: dict[str, str] = {"analyze": "rates", "plan": "decisions"}
# How far back a redelivered window's message is looked for in the stage's history: a redelivery
# reaches back only over windows whose offsets were not yet committed to the broker.
REPUBLISH_SCAN = 16
# How many of analyze's recent windows are searched for the last valid one (an idle window's fallback).
FALLBACK_SCAN = 60
# Long past any redelivery (offsets not yet committed) or republication (recent windows).
DECISION_MARKER_TTL_S = 24 * 3600


class JobRegistry(Protocol):
    """Registered jobs and their configuration (overrides of the settings' defaults)."""

    async def register_job(self, job_id: str, overrides: dict[str, str] | None = None) -> JobConfig:
        """Register (or re-register) a job with optional overrides; invalid ones raise ConfigError."""
        ...

    async def set_config(self, job_id: str, changes: dict[str, str]) -> JobConfig:
        """Change a registered job's overrides; KeyError for an unknown job."""
        ...

    async def unset_config(self, job_id: str, keys: list[str]) -> JobConfig:
        """Return settings to their defaults; KeyError for an unknown job."""
        ...

    async def config_overrides(self, job_id: str) -> dict[str, str]: ...

    async def unregister_job(self, job_id: str) -> None:
        """Forget the job and everything kept for it but its fencing counter: the tokens of a job registered
        again under the same id keep growing past those a runner of it accepted."""
        ...

    async def job_exists(self, job_id: str) -> bool: ...

    async def jobs(self) -> set[str]: ...

    async def job_config(self, job_id: str) -> JobConfig: ...


class OpenWindows(Protocol):
    """The monitor's open window per job, with the offsets already applied."""

    async def load_windows(self, job_ids: Iterable[str]) -> dict[str, WindowState]:
        """The stored windows of these jobs (jobs without one are left out); a window stored in an
        older form is read as `WindowState.from_dict` reads it."""
        ...

    async def save_windows(self, windows: Mapping[str, WindowState]) -> None:
        """Store each job's window (`WindowState.to_dict`, as JSON), replacing what was stored."""
        ...


class AnalysisModels(Protocol):
    """What analyze learns per job: true-rate history, capacity model and detector, forecast."""

    async def last_valid_analysis(self, job_id: str, scan: int = FALLBACK_SCAN) -> dict[str, Any] | None: ...

    async def last_analysis(self, job_id: str) -> dict[str, Any] | None: ...

    async def analyses(self, job_id: str, limit: int = 720) -> list[dict[str, Any]]:
        """Analyze's published windows, newest first (the history the dashboard charts)."""
        ...

    async def learned(self, job_id: str) -> dict[str, Any] | None:
        """The capacity model and recovery detector (analyze.learning.Learned as a dict)."""
        ...

    async def forecast(self, job_id: str) -> tuple[str | None, bytes | None]:
        """The forecast state (JSON) and the model's bytes, written together by `save_forecast`."""
        ...

    async def save_forecast(self, job_id: str, state_json: str, model: bytes | None) -> None: ...


def committed(watermark: str | None, window_end: float) -> bool:
    """Whether a stage's stored watermark says the window ending at `window_end` was committed."""
    return watermark is not None and float(watermark) >= window_end


def last_valid(analyses: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The first valid analysis of these (newest first): an idle window's fallback."""
    return next((item for item in analyses if item.get("valid")), None)


@dataclass(frozen=True)
class StoredForecast:
    """A job's forecast as analyze keeps it: the state (JSON) and the model's bytes (None: no model)."""

    state_json: str | None = None
    model: bytes | None = None


@dataclass(frozen=True)
class AnalyzeReads:
    """Everything analyze reads for one window, read at once (`WindowReads.analyze_reads`)."""

    done: bool  # the window (or a later one) was committed already
    config: JobConfig
    learned: dict[str, Any] | None
    needs_forecast: bool | None  # the plan state's field: whether the job's policy plans with a forecast
    forecast: StoredForecast
    fallback: dict[str, Any] | None  # the last valid analysis, when asked for


@dataclass(frozen=True)
class PlanReads:
    """Everything plan reads for one window, read at once (`WindowReads.plan_reads`)."""

    done: bool
    config: JobConfig
    state: PlanState
    lock_holder: LockHolder | None


class WindowReads(Protocol):
    """What analyze and plan read for a window, each in one round trip: a stage that reads its inputs
    one by one pays a round trip each, and at thousands of jobs those waits are the agents' load."""

    async def analyze_reads(self, job_id: str, window_end: float, fallback: bool) -> AnalyzeReads:
        """Whether analyze committed this window, the job's configuration, learned state, whether its
        policy needs a forecast (the plan state's `needs_forecast`), its forecast, and (`fallback`) its
        last valid analysis, as the single reads return them."""
        ...

    async def plan_reads(self, job_id: str, window_end: float) -> PlanReads:
        """Whether plan committed this window, the job's configuration, plan state and execute's lock."""
        ...


class WindowCommits(Protocol):
    """Analyze and plan commit everything a window taught them, with the message they publish, at once."""

    async def window_done(self, job_id: str, stage: Stage, window_end: float) -> bool:
        """Whether `stage` committed this window (or a later one)."""
        ...

    async def committed_message(self, job_id: str, stage: Stage, window_end: float) -> str | None:
        """The message `stage` committed for this window, to publish again after a crash."""
        ...

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
        """Commit the window's message (into the stage's history), plan-state fields (JSON values,
        only those that changed), other histories and values, and the job's forecast (analyze: as
        `save_forecast` stores it), atomically, in one round trip. False when the window was already
        committed with another message: a redelivery, or another worker got there first. True, and
        nothing written twice, when this message is already the window's: a commit made again after its
        reply was lost (a client's retry), so its caller still publishes it."""
        ...


class PlanStates(Protocol):
    """The typed plan state: plan writes it every window, execute when a rescale ends."""

    async def plan_state(self, job_id: str) -> PlanState:
        """The job's plan state; an older stored form is migrated in place on first read."""
        ...

    async def record_rescale_end(
        self, job_id: str, running: int, completed_at: float, downtime_s: float | None,
        direction: Direction | None, backend: str | None = None,
    ) -> PlanState:
        """What execute records when a rescale ends (see `PlanState.after_rescale`), with how the runner
        changed the job (`backend`) when it said. Only those fields are written: plan's survive."""
        ...


class Decisions(Protocol):
    """Plan's decisions and execute's events, and the markers that make execution idempotent."""

    async def decisions(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]: ...

    async def events(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]: ...

    async def record_event(self, job_id: str, event_json: str, event_id: str | None = None) -> None:
        """Keep the event in the job's history; with its id, remember that it was published."""
        ...

    async def event_published(self, job_id: str, event_id: str) -> bool: ...

    async def decision_done(self, job_id: str, decision_id: str) -> bool: ...

    async def mark_decision_done(self, job_id: str, decision_id: str) -> None: ...


class Fencing(Protocol):
    """One rescale per job at a time: a lock with a fencing token, and the rescale in flight."""

    async def acquire_lock(self, job_id: str, decision_id: str, ttl_s: float) -> int | None:
        """The lock's fencing token (it grows with every acquisition), or None when it is held."""
        ...

    async def lock_holder(self, job_id: str) -> LockHolder | None: ...

    async def release_lock(self, job_id: str, token: int, decision_id: str) -> bool:
        """Release the lock only if the caller still holds it: a stale holder cannot free a newer lock."""
        ...

    async def track_rescale(self, job_id: str, rescale: InFlight) -> None:
        """Keep the job's rescale in flight (replacing any) and list it as overdue from its deadline."""
        ...

    async def inflight(self, job_id: str) -> InFlight | None:
        """The job's rescale in flight; one stored in an older form is read as well."""
        ...

    async def finish_rescale(self, job_id: str) -> None:
        """Forget the job's rescale in flight and its deadline."""
        ...

    async def claim_overdue(self, job_id: str) -> bool:
        """True for exactly one caller: several execute workers may see the same overdue rescale."""
        ...

    async def overdue_rescales(self, now: float) -> list[str]: ...


class SlotQuota(Protocol):
    async def reserve_slots(self, job_id: str, current: int, wanted: int, quota: int, commit: bool) -> int:
        """Slots granted to the job: up to `wanted` within what the other jobs' allocations leave of
        `quota`, never fewer than `current`; `commit` records the grant as the job's allocation."""
        ...


class Fleets(Protocol):
    """Clusters and their fleets: each registered cluster's capacity and the state of its fleet step
    (`contracts.fleet.FleetState`: every job's latest bid and the slots each holds)."""

    async def register_cluster(self, cluster: ClusterConfig) -> None:
        """Register (or resize) a cluster; ConfigError if its budget is below its jobs' minimums."""
        ...

    async def remove_cluster(self, name: str) -> None:
        """Forget a cluster and its fleet state (its jobs hold, saying so, until moved)."""
        ...

    async def clusters(self) -> dict[str, ClusterConfig]: ...

    async def orphaned_jobs(self) -> dict[str, str]:
        """The registered jobs whose cluster was removed (job -> cluster), until they are registered again
        on a cluster that exists (or none), or their cluster is added back."""
        ...

    async def fleet_state(self, name: str) -> FleetState: ...

    async def update_fleet(self, name: str, step: FleetStep) -> FleetGrant | None:
        """Run the fleet step on the cluster's stored state and budget, atomically against other workers'
        steps (retried when raced), and store the state it returns; None for an unknown cluster."""
        ...


class Counters(Protocol):
    async def incr_counters(self, counts: dict[str, int]) -> None: ...

    async def counters(self) -> dict[str, int]: ...


class ExecuteKnowledge(Decisions, Fencing, PlanStates, Protocol):
    """What execute asks of the knowledge base: the once-per-decision and once-per-event markers, the
    lock and the rescale in flight, the plan-state fields it records when a rescale ends and, for a job
    on a cluster, what it holds there from then (its configuration names the cluster)."""

    async def job_config(self, job_id: str) -> JobConfig: ...

    async def update_fleet(self, name: str, step: FleetStep) -> FleetGrant | None: ...


class MonitorKnowledge(OpenWindows, Counters, Protocol):
    """What monitor asks of the knowledge base: the registered jobs (and those whose cluster was removed),
    the open windows, the counters."""

    async def jobs(self) -> set[str]: ...

    async def orphaned_jobs(self) -> dict[str, str]: ...


class AnalyzeKnowledge(WindowReads, WindowCommits, Protocol):
    """What analyze asks of the knowledge base: its window's reads at once (among them one read of plan's
    state, `needs_forecast`: whether the job's policy plans with a forecast; see docs/architecture.md),
    its window commits with the forecast, and the forecast alone for a refit that lands between windows."""

    async def forecast(self, job_id: str) -> tuple[str | None, bytes | None]: ...

    async def save_forecast(self, job_id: str, state_json: str, model: bytes | None) -> None: ...


class PlanKnowledge(WindowReads, WindowCommits, SlotQuota, Protocol):
    """What plan asks of the knowledge base: its window's reads at once (the job's configuration and plan
    state, and one read of execute's state: whether it holds the job's rescale lock; see
    docs/architecture.md), its window commits with the plan state's fields, the slot quota and the
    cluster's fleet step."""

    async def update_fleet(self, name: str, step: FleetStep) -> FleetGrant | None: ...


class Knowledge(JobRegistry, OpenWindows, AnalysisModels, WindowReads, WindowCommits, PlanStates, Decisions, Fencing,
                SlotQuota, Fleets, Counters, Protocol):
    """All of it, as a stage's agent and the command line use it."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
