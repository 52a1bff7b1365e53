"""Per-job configuration: what a user may set per job, with defaults from settings."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.backends import BackendKind
from contracts.periods import PeriodError, parse_periods
from contracts.settings import Settings


class Mode(StrEnum):
    OFF = "off"
    RECOMMEND = "recommend"
    AUTO = "auto"


class JobConfig(BaseModel):
    """Validated per-job configuration. Unknown keys and out-of-range values are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    mode: Mode = Mode.AUTO
    policy: str = Field(
        "default", pattern=r"^[a-z][a-z0-9_-]{0,63}$",
        description="The scaling policy, by its name in the policy registry (`autoscaler policies` lists them).",
    )
    target_utilization: float = Field(0.7, gt=0, le=1)
    utilization_band: float = Field(
        0.15, ge=0, lt=1, description="No rescale while the utilization the target rate implies at the "
        "current parallelism is within target +- band."
    )
    min_parallelism: int = Field(1, ge=1, le=100_000)
    max_parallelism: int = Field(32, ge=1, le=100_000)
    catch_up_duration_s: float = Field(300.0, gt=0)
    stabilization_windows: int = Field(
        1, ge=0, le=100, description="Windows ignored at each new parallelism, including the job's start."
    )
    backlog_tolerance_s: float = Field(
        10.0, ge=0, description="No scale-down while the backlog exceeds this many seconds of arrivals."
    )
    per_operator: bool = Field(
        False, description="Operators scale independently (Flink-like); otherwise one job-level parallelism."
    )
    backlog_target_s: float = Field(
        60.0, gt=0, description="The most backlog the job may carry, in seconds of arrivals: the default "
        "planner keeps it within this target at the least cost; the evaluation counts the time beyond it."
    )
    allow_planned_shortfall: bool = Field(
        True, description="The default planner may choose a parallelism whose capacity (its lower quantile) is "
        "below the arrival rate planned now, letting the backlog grow toward `backlog_target_s` and scaling up "
        "later, where that costs less (the reason says so). Off: each plan starts at a parallelism that carries "
        "the planned rate, unless none within bounds does: a backlog drains, for a few more slot-seconds."
    )
    scaling_backend: BackendKind = Field(
        BackendKind.RESTART, description="How execute rescales the job, so the default planner plans each action's "
        "cost the same way: restart (from the checkpoint: a pause and a replay) or in_place (executors changed on "
        "a standalone cluster: a scale-up runs at the old capacity until they registered, a scale-down holds the "
        "query between batches). Set it to what the job runner runs (`autoscaler job run --backend`)."
    )
    restart_time_s: float = Field(
        30.0, ge=0, description="Restart time assumed until execute has measured one; its arrivals are "
        "added to the backlog to catch up."
    )
    restart_time_cap_s: float = Field(600.0, gt=0, description="Upper bound on the learned restart time.")
    min_samples: int = Field(
        2, ge=1, le=100, description="Valid windows needed at a parallelism (after stabilization) before deciding."
    )
    metrics_window_s: float = Field(
        60.0, ge=0, description="Decisions use the rates averaged over the valid windows of this much metric "
        "time at the current parallelism (the backlog is the latest); 0 uses the latest window alone."
    )
    scale_down_delay_s: float = Field(
        300.0, ge=0, description="A scale-down waits this long (metric time), then goes to the largest "
        "parallelism recommended meanwhile; a scale-up or a window at or above the current cancels it."
    )
    max_scale_up_factor: float = Field(
        100.0, gt=0, description="One step grows parallelism p to at most ceil(p x (1 + factor))."
    )
    max_scale_down_factor: float = Field(
        1.0, gt=0, le=1, description="One step shrinks parallelism p to no less than floor(p x (1 - factor))."
    )
    align_to_partitions: bool = Field(
        True, description="Round to a parallelism that spreads the source's (and shuffle) partitions evenly."
    )
    ineffective_scale_up_threshold: float = Field(
        0.1, ge=0, le=1, description="A scale-up that gains less than this fraction of the capacity it "
        "should have blocks further scale-ups; 0 turns detection off."
    )
    ineffective_block_s: float = Field(
        1800.0, ge=0, description="The longest block of scale-ups after ineffective ones (the first blocks "
        "300 s, each further one in a row twice as long), lifted while the backlog heads beyond its target."
    )
    target_recovery_s: float = Field(
        180.0, gt=0, description="daedalus/hybrid: a scale-out must be predicted to recover (stop to caught up) "
        "within this many seconds."
    )
    checkpoint_interval_s: float = Field(
        10.0, ge=0, description="daedalus/hybrid: worst-case records replayed after a restart are this many "
        "seconds of arrivals (Spark commits offsets every micro-batch: about one trigger interval)."
    )
    forecast_horizon_s: float = Field(900.0, gt=0, description="How far ahead the arrival rate is forecast.")
    forecast_wape_threshold: float = Field(
        0.25, gt=0, description="While ARIMA's last forecast scores above this WAPE, a linear trend is used."
    )
    forecast_retrain_after: int = Field(
        15, ge=1, le=10_000, description="Consecutive poor ARIMA forecasts that trigger a refit from history."
    )
    forecast_min_points: int = Field(
        60, ge=10, le=10_000, description="Windows of arrival rates needed before the first ARIMA fit."
    )
    anomaly_k: float = Field(
        1.0, gt=0, le=10, description="After a rescale, a lag rate beyond k standard deviations of normal is "
        "anomalous; the first sustained return within k ends the recovery."
    )
    planned_capacity: str = Field(
        "", max_length=100_000, description="The capacity `autoscaler capacity plan --job` predicted before the "
        "job ran, as `slots:records/s` pairs (`1:215,2:430,...`); the default planner pools it with what it "
        "measures, so it weighs less as live windows arrive. Empty: none."
    )
    planned_capacity_error: float = Field(
        0.1, gt=0, le=10, description="The planned capacity's relative error (its weight against measurements)."
    )
    cluster: str = Field(
        "", max_length=64, pattern=r"^([a-z0-9][a-z0-9_.-]{0,63})?$", description="The cluster whose slot budget "
        "the job shares (`autoscaler cluster add`); its slots are then allocated across the cluster's jobs "
        "(`plan.fleet`). Empty: the job is planned alone."
    )
    weight: float = Field(
        1.0, gt=0, le=100, description="On a cluster whose budget binds: how much the job's time beyond its "
        "backlog target counts against the others' (a job of weight 2 gives way after one of weight 1)."
    )
    excluded_periods: str = Field(
        "", description="UTC ranges without rescaling, `;`-separated: `22:00-06:00`, `Sat,Sun 00:00-24:00`, "
        "`2026-12-24T00:00/2026-12-27T00:00`."
    )

    @field_validator("planned_capacity")
    @classmethod
    def _planned_parse(cls, value: str) -> str:
        parse_planned_capacity(value)
        return value

    @field_validator("excluded_periods")
    @classmethod
    def _periods_parse(cls, value: str) -> str:
        try:
            parse_periods(value)
        except PeriodError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _bounds_ordered(self) -> JobConfig:
        if self.min_parallelism > self.max_parallelism:
            raise ValueError(
                f"min_parallelism ({self.min_parallelism}) exceeds max_parallelism ({self.max_parallelism})"
            )
        return self

    @classmethod
    def defaults(cls, settings: Settings) -> dict[str, Any]:
        return {
            "target_utilization": settings.target_utilization,
            "min_parallelism": settings.min_parallelism,
            "max_parallelism": settings.max_parallelism,
            "catch_up_duration_s": settings.catch_up_duration_s,
        }

    @classmethod
    def resolve(cls, settings: Settings, overrides: dict[str, str]) -> JobConfig:
        """Settings defaults, then the job's stored overrides."""
        return cls.model_validate({**cls.defaults(settings), **overrides})


class ConfigError(ValueError):
    pass


def parse_planned_capacity(value: str) -> dict[int, float]:
    """`1:215,2:430` -> {1: 215.0, 2: 430.0}; a clear ValueError for anything else."""
    planned: dict[int, float] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        slots, sep, rate = item.partition(":")
        try:
            p, capacity = int(slots), float(rate)
        except ValueError:
            raise ValueError(f"planned capacity: expected slots:records/s, got {item!r}") from None
        if not sep or p < 1 or not (0 < capacity < float("inf")):
            raise ValueError(f"planned capacity: slots must be >= 1 and records/s > 0, got {item!r}")
        planned[p] = capacity
    return planned


def format_planned_capacity(planned: dict[int, float]) -> str:
    """{1: 215.0, 2: 430.0} -> `1:215,2:430`, what `parse_planned_capacity` reads back."""
    return ",".join(f"{p}:{capacity:g}" for p, capacity in sorted(planned.items()))


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """`key=value` pairs from the command line, checked against JobConfig's fields."""
    parsed: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {item!r}")
        if key not in JobConfig.model_fields:
            raise ConfigError(f"unknown setting {key!r}; known: {', '.join(sorted(JobConfig.model_fields))}")
        parsed[key] = value.strip()
    return parsed


def validate_overrides(settings: Settings, current: dict[str, str], changes: dict[str, str]) -> JobConfig:
    try:
        return JobConfig.resolve(settings, {**current, **changes})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None


# The stored overrides carry the version of their meaning. Version 1 (no field) named the default
# policy `ds2`; since version 2, `ds2` is DS2 alone and the default is `default`.
CONFIG_VERSION_FIELD = "_version"
CONFIG_VERSION = "2"


def stored_overrides(raw: dict[str, str]) -> dict[str, str]:
    """A job's overrides as stored, in today's meaning (without the version field)."""
    overrides = {k: v for k, v in raw.items() if k != CONFIG_VERSION_FIELD}
    if raw.get(CONFIG_VERSION_FIELD) is None and overrides.get("policy") == "ds2":
        overrides["policy"] = "default"
    return overrides
