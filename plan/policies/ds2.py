"""`ds2`: DS2 as the paper runs it (a baseline): the one-step optimal parallelism every window.

DS2 (Kalavri et al., OSDI 2018) after one warm-up window at each parallelism, with no other
control: no averaging, no delays, no restart-time term. `default` is DS2 inside the production
controls.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from contracts.analyses import Analysis
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.ds2 import plan_ds2
from plan.policy import Plan, hold


class Ds2Memory(BaseModel):
    """The warm-up windows left at the current parallelism, and the rescale they follow."""

    warm_up_left: int = 1
    seen_rescale_at: float | None = None


class Ds2Policy:
    name: ClassVar[str] = "ds2"
    summary: ClassVar[str] = "DS2 alone: the one-step optimal parallelism every window after one warm-up window"
    needs_forecast: ClassVar[bool] = False

    def decide(self, state: PlanState, analysis: Analysis, config: JobConfig) -> tuple[PlanState, Plan]:
        memory = Ds2Memory.model_validate(state.policy_state)
        if state.last_rescale_at != memory.seen_rescale_at:  # a rescale ended: warm up again
            memory = Ds2Memory(warm_up_left=1, seen_rescale_at=state.last_rescale_at)
        p = analysis.parallelism
        if not analysis.valid:
            plan = hold(p, "invalid_window", analysis.invalid_reason or "window not usable", rule=self.name)
        elif memory.warm_up_left > 0:
            memory = memory.model_copy(update={"warm_up_left": memory.warm_up_left - 1})
            plan = hold(p, "warm_up", "the first window at a parallelism is not used", rule=self.name)
        else:
            plan = plan_ds2(analysis, config)
        return state.updated({"policy_state": memory.model_dump()}), plan

    def planned_capacity(self, analysis: Analysis, config: JobConfig) -> float | None:
        rate = analysis.true_processing_rate
        return rate * analysis.parallelism if analysis.valid and rate > 0 else None
