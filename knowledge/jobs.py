"""Per-job configuration: what a user may set per job, with defaults from settings."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.settings import Settings


class Mode(StrEnum):
    OFF = "off"
    RECOMMEND = "recommend"
    AUTO = "auto"


class Policy(StrEnum):
    DS2 = "ds2"


class JobConfig(BaseModel):
    """Validated per-job configuration. Unknown keys and out-of-range values are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    mode: Mode = Mode.AUTO
    policy: Policy = Policy.DS2
    target_utilization: float = Field(0.7, gt=0, le=1)
    utilization_band: float = Field(
        0.1, ge=0, lt=1, description="No rescale while the utilization the target rate implies at the "
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
