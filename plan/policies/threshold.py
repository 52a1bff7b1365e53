"""`threshold`: a plain utilization-threshold autoscaler, the Kubernetes HPA rule (a baseline).

Per window with utilization u (busy time / (window x parallelism p), as analyze computes it): when
u > `high` (0.8) or u < `low` (0.5), go to desired = ceil(p x u / target) with target 0.65 (the
band's midpoint), bounded to [min_parallelism, max_parallelism]; inside [low, high] hold.
Stabilization: no action until `stabilization_s` (300 s) after the previous rescale ended. Invalid
windows hold. It knows nothing of the backlog or arrival rate: a saturated job reads u = 1.0 and
grows by 1 / 0.65, about 1.54x, per action.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from contracts.analyses import Analysis
from contracts.decisions import DecisionReason
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.policy import Plan, direction, hold

EPSILON = 1e-9


@dataclass(frozen=True)
class ThresholdPolicy:
    name: ClassVar[str] = "threshold"
    summary: ClassVar[str] = "Kubernetes-HPA-like utilization thresholds (0.5-0.8, to 0.65), 300 s stabilization"
    needs_forecast: ClassVar[bool] = False
    high: float = 0.8
    low: float = 0.5
    target: float = 0.65
    stabilization_s: float = 300.0

    def decide(self, state: PlanState, analysis: Analysis, config: JobConfig) -> tuple[PlanState, Plan]:
        p, u = analysis.parallelism, analysis.utilization
        if not analysis.valid:
            return state, hold(p, "invalid_window", analysis.invalid_reason or "window not usable", rule=self.name)
        last = state.last_rescale_at
        if last is not None and analysis.window_end - last < self.stabilization_s:
            return state, hold(p, "stabilization", f"within {self.stabilization_s:.0f} s of the last rescale",
                               rule=self.name)
        if self.low <= u <= self.high:
            return state, hold(p, "within_thresholds", f"utilization {u:.0%} within {self.low:.0%}-{self.high:.0%}",
                               rule=self.name)
        desired = min(max(math.ceil(p * u / self.target - EPSILON), config.min_parallelism), config.max_parallelism)
        if desired == p:
            return state, hold(p, "bounded", f"bounded to [{config.min_parallelism}, {config.max_parallelism}]",
                               rule=self.name)
        action = direction(p, desired)
        reason = DecisionReason(code=action.value, rule=self.name,
                                message=f"utilization {u:.0%} -> {desired} slots at {self.target:.0%}",
                                numbers={"utilization": round(u, 4), "desired": desired})
        return state, Plan(action, desired, reason, recommended=desired)

    def planned_capacity(self, analysis: Analysis, config: JobConfig) -> float | None:
        return None
