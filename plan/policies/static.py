"""`static`: never rescales; the job keeps the parallelism it was started with (provisioned for the peak)."""

from __future__ import annotations

from typing import ClassVar

from contracts.analyses import Analysis
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.policy import Plan, hold


class StaticPolicy:
    name: ClassVar[str] = "static"
    summary: ClassVar[str] = "Never rescales (provisioned once, e.g. for the peak)"
    needs_forecast: ClassVar[bool] = False

    def decide(self, state: PlanState, analysis: Analysis, config: JobConfig) -> tuple[PlanState, Plan]:
        return state, hold(analysis.parallelism, "static", "the static policy never rescales", rule=self.name)

    def planned_capacity(self, analysis: Analysis, config: JobConfig) -> float | None:
        return None
