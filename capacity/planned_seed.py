"""A capacity plan seeds a registered job's knowledge: its planned capacity per slot count and that
capacity's error go into the job's configuration, which the default planner pools with what it
measures (`plan.capacity_estimate.capacities`). `autoscaler capacity plan --job` (StreamBed's slot
curve) and `autoscaler capacity profiles --job` (QEScalor's executor profile) both store through here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from contracts.jobs import format_planned_capacity

MAX_PLANNED_SLOTS = 4096  # a job configuration holds the planned capacity up to this many slots

Curve = tuple[dict[int, float], float]  # capacity (rec/s) per slot count, and its relative error


class NothingToSeed(ValueError):
    """The plan names no slot count the job may run at."""


def not_registered(job: str) -> str:
    return f"{job} is not registered (autoscaler jobs register {job})"


def require_registered(job: str) -> None:
    """Refuses an unknown job before any testbed time is spent."""
    from contracts.settings import get_settings
    from knowledge import with_knowledge

    if not with_knowledge(get_settings(), lambda k: k.job_exists(job)):
        raise typer.BadParameter(not_registered(job), param_hint="--job")


def seed_planned(job: str, curve_for: Callable[[int], Curve]) -> dict[str, Any]:
    """Stores `curve_for(slots)` in `job`'s configuration, slots being the job's largest parallelism
    (at most MAX_PLANNED_SLOTS); returns the largest slot count stored and the error."""
    from contracts.settings import get_settings
    from knowledge import RedisKnowledge, with_knowledge

    async def store(knowledge: RedisKnowledge) -> dict[str, Any]:
        config = await knowledge.job_config(job)
        slots = min(config.max_parallelism, MAX_PLANNED_SLOTS)
        curve, error = curve_for(slots)
        if not curve:
            raise NothingToSeed(f"{job}: the plan names no slot count up to its max_parallelism ({slots}); "
                             "nothing stored")
        # set_config refuses a job that is not registered (KeyError).
        await knowledge.set_config(job, {"planned_capacity": format_planned_capacity(curve),
                                         "planned_capacity_error": f"{error:.3f}"})
        return {"slots": max(curve), "error": error}

    try:
        return with_knowledge(get_settings(), store)
    except KeyError:
        raise typer.BadParameter(not_registered(job), param_hint="--job") from None
    except NothingToSeed as exc:
        raise typer.BadParameter(str(exc), param_hint="--job") from None
