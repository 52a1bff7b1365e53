"""The plan state of one job: what plan and execute remember between windows, typed and versioned.

Plan updates it every window (the controls' counters, the smoothing samples, a pending scale-down,
the scale-up under judgement, the policy's own state); execute updates it when a rescale ends
(the parallelism that runs, the windows still measured before it, the measured downtime). The
knowledge base keeps it as one field per attribute (JSON), so that plan and execute each write
only the fields they changed and never overwrite each other's.

Versions: 1 is this model. Version 0 is the untyped form kept before it: the same fields in the
job's state hash beside the stages' watermarks, and the measured downtimes in their own lists;
`PlanState.load` reads either.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from enum import StrEnum
from functools import cache, lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

PLAN_STATE_VERSION = 1
# Windows measured at the old parallelism that plan may still drop after a rescale completes.
STALE_WINDOW_BUDGET = 3
# Measured restarts kept per direction (the restart-time estimates look back over these).
DOWNTIMES_KEPT = 10
# A scale-in restarts in about half a scale-out's time (no new resources to start): Daedalus's priors
# are 30 s out and 15 s in (3.4). The Spark job's: see docs/results.md, "Measurements moved from docstrings".
DOWN_TO_UP = 0.5


class Direction(StrEnum):
    """Which way a rescale goes; its value ("up", "down") is how it is stored and names the
    `Downtimes` list it is measured in. A plain "up" or "down" is accepted wherever one is taken."""

    UP = "up"
    DOWN = "down"

    @classmethod
    def of(cls, before: int, after: int) -> Direction:
        """The direction of a change from `before` to `after` parallelism: up when it grows, else down."""
        return cls.UP if after > before else cls.DOWN

    @classmethod
    def parse(cls, value: str) -> Direction:
        """`value` as a direction; ValueError for anything but "up" or "down"."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"direction must be 'up' or 'down', got {value!r}") from None

    @property
    def other(self) -> Direction:
        return Direction.DOWN if self is Direction.UP else Direction.UP


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def expected_restart_time(recent_downtimes: Sequence[float], default_s: float, cap_s: float) -> float:
    """The slowest of the recent measured restarts (a restart is rarely faster than the last slow
    one), capped; the configured default until one has been measured."""
    recent = [d for d in recent_downtimes if d >= 0]
    return min(max(recent), cap_s) if recent else min(default_s, cap_s)


# Measured restarts with a known state size a restart-time slope needs, at two sizes at least.
STATE_FIT_MIN = 3


@lru_cache(maxsize=4096)
def _state_slope(up: tuple[float, ...], up_state: tuple[int | None, ...], down: tuple[float, ...],
                 down_state: tuple[int | None, ...]) -> float:
    """`Downtimes.state_slope` on its lists (each restart's seconds and its state's rows, `state_rows`),
    cached: every read of a plan state's restarts asks for it, and the lists change only when a restart
    is measured."""
    slopes: list[float] = []
    known = 0
    for measured, rows in ((up, up_state), (down, down_state)):
        points = [(float(r), seconds) for seconds, r in zip(measured, rows, strict=True)
                  if r is not None and math.isfinite(seconds) and seconds >= 0]
        known += len(points)
        slopes += [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:]
                   if x2 != x1]
    if known < STATE_FIT_MIN or not slopes:
        return 0.0
    return max(0.0, statistics.median(slopes))


class Downtimes(_Part):
    """Measured restarts (seconds) per direction, oldest first, at most `DOWNTIMES_KEPT` each; beside
    each, the rows in the job's state when it restarted (`up_state`, `down_state`, aligned with the
    restarts from the newest; None where unknown: a stateless job, or one measured before sizes were kept)."""

    up: list[float] = Field(default_factory=list)
    down: list[float] = Field(default_factory=list)
    up_state: list[int | None] = Field(default_factory=list)
    down_state: list[int | None] = Field(default_factory=list)
    # Of each restart, the seconds that reload the state (the same both ways), set by `at_state`: 0 as stored.
    reload_s: float = Field(0.0, exclude=True)

    def expected(self, direction: Direction, default_s: float, cap_s: float = math.inf,
                 recent: int = 5) -> float:
        """The downtime to expect for a rescale in `direction`: the longest of the `recent` last
        measured ones in that direction, capped at `cap_s`; `default_s` until one is measured.

        The maximum, not the median: a recovery prediction is a worst case on purpose (as Daedalus
        replays a full checkpoint interval), and a restart is rarely faster than the last slow one.
        The window of `recent` measurements lets one slow outlier age out; `cap_s` bounds it meanwhile."""
        direction = Direction.parse(direction)
        if recent < 1:
            raise ValueError(f"recent must be >= 1, got {recent!r}")
        measured = [d for d in self.measured(direction) if math.isfinite(d) and d >= 0][-recent:]
        return expected_restart_time(measured, default_s, cap_s)

    def typical(self, direction: Direction, default_s: float, recent: int = 5) -> float:
        """The restart a prediction of what will be observed expects: the median of the `recent` last
        measured ones in `direction`; else the other direction's, its part beyond the state's reload
        (`reload_s`) scaled by DOWN_TO_UP (a scale-in's is about half a scale-out's: no new resources to
        start, but a stateful query reloads its state either way); else `default_s` for a scale-out and
        DOWN_TO_UP of it for a scale-in."""
        direction = Direction.parse(direction)
        # Each direction's restart, relative to a scale-out's.
        scale = {Direction.UP: 1.0, Direction.DOWN: DOWN_TO_UP}
        for side in (direction, direction.other):
            measured = [d for d in self.measured(side)[-recent:] if math.isfinite(d) and d >= 0]
            if measured:
                median = statistics.median(measured)
                if side is direction:
                    return median
                reload = min(self.reload_s, median)
                return (median - reload) * scale[direction] / scale[side] + reload
        return default_s * scale[direction]

    def restart_time(self, default_s: float, cap_s: float) -> float | None:
        """The restart time to plan a rescale with, either direction (see `expected_restart_time`);
        None until one has been measured."""
        measured = [*self.up, *self.down]
        return expected_restart_time(measured, default_s, cap_s) if measured else None

    def measured(self, direction: Direction) -> list[float]:
        """The measured restarts in `direction`, oldest first."""
        return self.up if Direction.parse(direction) is Direction.UP else self.down

    def state_rows(self, direction: Direction) -> list[int | None]:
        """The state's rows at each of `measured(direction)`, None where unknown."""
        direction = Direction.parse(direction)
        measured = self.measured(direction)
        sizes = (self.up_state if direction is Direction.UP else self.down_state)[-len(measured):] if measured else []
        return [None] * (len(measured) - len(sizes)) + list(sizes)

    def add(self, direction: Direction, downtime_s: float, state_rows: int | None = None) -> Downtimes:
        direction = Direction.parse(direction)
        kept = [*self.measured(direction), float(downtime_s)][-DOWNTIMES_KEPT:]
        sizes = [*self.state_rows(direction), state_rows][-DOWNTIMES_KEPT:]
        return self.model_copy(update={direction.value: kept, f"{direction.value}_state": sizes})

    def state_slope(self) -> float:
        """Seconds a restart takes per row of state, fitted on the measured restarts whose state size is
        known: the Theil-Sen slope, the median of the slopes between pairs of restarts in the same
        direction (each direction keeps its own base time; reloading a row costs the same either way),
        robust to a slow outlier; never below 0. 0 until `STATE_FIT_MIN` such restarts and a pair at two
        sizes. Restart time grows with the state a restart reloads (Spark's state store loads each
        partition's state from the checkpoint)."""
        return _state_slope(tuple(self.up), tuple(self.state_rows(Direction.UP)),
                            tuple(self.down), tuple(self.state_rows(Direction.DOWN)))

    def at_state(self, rows: int | None) -> Downtimes:
        """These restarts as if each had reloaded `rows` rows of state: each measured one whose state
        size is known moves by `state_slope()` x the difference; the rest, and all of them when `rows` is
        None or no slope is fitted yet, stay as measured. Every estimate above (`expected`, `typical`,
        `restart_time`) on the result is then one for a restart at the job's state size now."""
        slope = self.state_slope() if rows is not None else 0.0
        if slope <= 0.0:
            return self
        assert rows is not None
        reload_s = slope * rows

        def moved(direction: Direction) -> list[float]:
            return [max(0.0, seconds + slope * (rows - size)) if size is not None else seconds
                    for seconds, size in zip(self.measured(direction), self.state_rows(direction), strict=True)]

        return self.model_copy(update={"up": moved(Direction.UP), "down": moved(Direction.DOWN), "reload_s": reload_s})


class RateSample(_Part):
    """One valid window's rates, kept for the rates averaged over the metrics window."""

    window_end: float
    arrival_rate: float | None = None
    true_processing_rate: float
    true_output_rate: float
    utilization: float


class ScaleUpCheck(_Part):
    """A scale-up to judge at the first settled window at its new parallelism."""

    from_parallelism: int = Field(alias="from")
    to: int
    per_slot_before: float
    capacity_before: float
    per_slot_after: list[float] = Field(default_factory=list)  # the windows judged so far at the new parallelism


class PendingRecovery(_Part):
    """The rescale whose recovery the detector will report, with its predicted recovery time."""

    from_parallelism: int = Field(alias="from")
    to: int
    predicted_s: float | None = None
    window_end: float


class PlanState(BaseModel):
    """Everything plan and execute keep for one job between windows."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    version: Literal[1] = PLAN_STATE_VERSION
    # Written by execute when a rescale ends.
    parallelism: int | None = Field(None, description="What the job runs at, as the runner last reported.")
    expected_parallelism: int | None = Field(
        None, description="Windows measured at another parallelism are stale until one arrives at this one.")
    stale_budget: int = Field(0, description="How many stale windows may still be dropped.")
    last_rescale_at: float | None = Field(None, description="When the last rescale ended (the runner's clock).")
    downtimes: Downtimes = Field(default_factory=Downtimes)
    backend: Literal["restart", "in_place"] | None = Field(
        None, description="How the job runner changes the job, as it last reported (`contracts.backends`).")
    # Written by plan, every window.
    window_parallelism: int | None = None
    windows_at_parallelism: int = 0
    samples_at_parallelism: int = 0
    samples: list[RateSample] = Field(default_factory=list)
    scale_up_check: ScaleUpCheck | None = None
    scale_up_blocked_until: float | None = None
    ineffective_streak: int = Field(0, description="Ineffective scale-ups in a row: each doubles the next block.")
    scale_down_since: float | None = None
    scale_down_max: int | None = None
    scale_down_from: int | None = None
    pending_recovery: PendingRecovery | None = None
    rescale_decided_at: float | None = Field(None, description="Metric time of plan's own last rescale decision.")
    quota_bound: bool = False
    state_rows: int | None = Field(None, description="Rows in the job's state in the last window analysed; "
                                   "execute pairs it with a restart's downtime (`Downtimes.state_slope`).")
    needs_forecast: bool | None = Field(
        None, description="Whether the job's policy plans with an arrival-rate forecast; None until plan says.")
    policy_state: dict[str, Any] = Field(
        default_factory=dict, description="A policy's own memory (e.g. a baseline's metric history), which "
        "that policy validates with its own model.")
    # Not stored: the plan shell sets it from execute's lock before each window.
    rescaling: bool = Field(False, exclude=True)

    @property
    def restarts(self) -> Downtimes:
        """The measured restarts as expected at the job's state size now (`Downtimes.at_state`): what
        every planner plans a restart with."""
        return self.downtimes.at_state(self.state_rows)

    # ---------------------------------------------------------------- updates

    def updated(self, changes: Mapping[str, Any]) -> PlanState:
        """This state with `changes` applied, each validated (plain dicts become the typed parts)."""
        if not changes:
            return self
        return self.model_copy(update={name: _field_adapter(name).validate_python(value)
                                       for name, value in changes.items()})

    def after_rescale(self, running: int, completed_at: float, downtime_s: float | None,
                      direction: Direction | None, backend: str | None = None) -> PlanState:
        """What execute records when the runner reports the end of a rescale: the parallelism that
        runs, the stale windows to drop, when it ended, for a completed rescale its downtime, and how
        the runner changed the job (`backend`, when it said). The end of a rescale recorded already
        (the same end time and parallelism: a report redelivered after a crash) changes nothing, so its
        downtime is not counted twice."""
        if self.last_rescale_at == completed_at and self.parallelism == running:
            return self
        downtimes = self.downtimes
        if downtime_s is not None and direction is not None:
            downtimes = downtimes.add(direction, downtime_s, self.state_rows)
        return self.model_copy(update={
            "parallelism": running, "expected_parallelism": running, "stale_budget": STALE_WINDOW_BUDGET,
            "last_rescale_at": completed_at, "downtimes": downtimes,
            "backend": _field_adapter("backend").validate_python(backend) if backend is not None else self.backend,
        })

    # ---------------------------------------------------------------- storage

    def stored_fields(self) -> dict[str, str]:
        """One JSON value per stored field, as the knowledge base keeps them."""
        return {name: json.dumps(value) for name, value in self.model_dump(mode="json", by_alias=True).items()}

    def changed_fields(self, before: PlanState) -> dict[str, str]:
        """The stored fields that differ from `before`: what a writer must store, and nothing else."""
        changed = {name for name, field in PlanState.model_fields.items()
                   if not field.exclude and getattr(self, name) != getattr(before, name)}
        if not changed:
            return {}
        dumped = self.model_dump(mode="json", by_alias=True, include=changed)
        return {name: json.dumps(value) for name, value in dumped.items()}

    @classmethod
    def load(cls, fields: Mapping[str, str], downtimes: Mapping[str, Sequence[float]] | None = None) -> PlanState:
        """The state from its stored fields (JSON strings), migrating older versions.

        Version 0 kept the fields in the job's state hash beside other stages' (ignored here), and
        its measured downtimes in separate lists: `downtimes` (per direction, oldest first)."""
        values = {name: _json(text) for name, text in fields.items()}
        version = values.get("version", 0)
        if version == 0:
            values = {name: value for name, value in values.items() if name in cls.model_fields}
            values["version"] = PLAN_STATE_VERSION
            if downtimes:
                values["downtimes"] = {d: [float(x) for x in downtimes.get(d, ())][-DOWNTIMES_KEPT:]
                                       for d in ("up", "down")}
        elif version != PLAN_STATE_VERSION:
            raise ValueError(f"plan state version {version} is newer than this planner's {PLAN_STATE_VERSION}")
        values = {name: value for name, value in values.items() if name in cls.model_fields and name != "rescaling"}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ValueError(f"unreadable plan state: {exc.errors(include_url=False)[:3]}") from None


@cache
def _field_adapter(name: str) -> TypeAdapter[Any]:
    field = PlanState.model_fields.get(name)
    if field is None or name in ("version", "rescaling"):
        raise ValueError(f"{name!r} is not a field of the plan state a stage may change")
    return TypeAdapter(field.annotation)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return text
