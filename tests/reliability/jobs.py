"""Job entry points for the fault tests (registered through AUTOSCALER_JOB_ENTRY_POINTS)."""

from __future__ import annotations

from typing import Any

from pipeline import demo
from pipeline.job import JobContext


def build_failing_above_two(spark: Any, ctx: JobContext) -> Any:
    """The demo job, on a cluster with room for two task slots only: more cannot start."""
    if ctx.parallelism > 2:
        raise RuntimeError(f"no room for {ctx.parallelism} task slots (2 free)")
    return demo.build(spark, ctx)
