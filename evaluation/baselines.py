"""Policies the diurnal simulator compares (pure; see `evaluation.ticks.Policy`).

- `ThresholdPolicy`: a plain utilization-threshold autoscaler, the Kubernetes HPA rule.
- `OurPolicy`: our planner (`plan.agent.guarded_plan`, DS2 with its guards) with the state that
  plan and execute keep in knowledge, held in a dict instead of Redis.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contracts.jobs import JobConfig
from contracts.messages import Action, Analysis
from contracts.plan_state import expected_restart_time
from execute.agent import STALE_WINDOW_BUDGET
from plan.controls import RESTART_HISTORY, guarded_plan

EPSILON = 1e-9


@dataclass
class ThresholdPolicy:
    """Kubernetes-HPA-like utilization thresholds.

    Rule, per closed window with utilization u (busy time / (window x parallelism p), as analyze
    computes it): when u > `high` (0.8) or u < `low` (0.5), go to
    `desired = ceil(p x u / target)` with target 0.65 (the band's midpoint), bounded to
    [min_parallelism, max_parallelism]; inside [low, high] hold. Stabilization: no action until
    `stabilization_s` (300 s) of metric time after the previous rescale completed. Invalid windows
    and windows during a rescale hold. It knows nothing of the backlog or arrival rate: a saturated
    job reads u = 1.0 and grows by 1 / 0.65, about 1.54x, per action.
    """

    name: str = "threshold"
    high: float = 0.8
    low: float = 0.5
    target: float = 0.65
    stabilization_s: float = 300.0
    min_parallelism: int = 1
    max_parallelism: int = 32
    last_completed_at: float | None = None
    reasons: Counter[str] = field(default_factory=Counter)

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        if rescaling:
            return self._hold("rescale_in_progress")
        if not analysis.valid:
            return self._hold("invalid_window")
        if self.last_completed_at is not None and analysis.window_end - self.last_completed_at < self.stabilization_s:
            return self._hold("stabilization")
        u, p = analysis.utilization, analysis.parallelism
        if self.low <= u <= self.high:
            return self._hold("within_thresholds")
        desired = min(max(math.ceil(p * u / self.target - EPSILON), self.min_parallelism), self.max_parallelism)
        if desired == p:
            return self._hold("bounded")
        self.reasons["scale_up" if desired > p else "scale_down"] += 1
        return desired

    def on_rescaled(self, to_parallelism: int, downtime_s: float, completed_at: float) -> None:
        self.last_completed_at = completed_at

    def _hold(self, reason: str) -> None:
        self.reasons[reason] += 1
        return None


class OurPolicy:
    """Our planner, driven as the plan agent drives it, with execute's state updates.

    Per window: `guarded_plan(analysis, config, state, rescaling, restart_time_s=...)`, its state
    updates merged into `state` (through JSON, as Redis stores them). After a rescale completes:
    `expected_parallelism`, `stale_budget` (3), `parallelism` and `last_rescale_at`, as execute sets
    them, and the measured downtime; the restart time is estimated from the recent downtimes as the
    plan agent does (None before the first), and the proactive policies get them per direction."""

    def __init__(self, config: JobConfig, name: str = "ours") -> None:
        self.name = name
        self.config = config
        self.state: dict[str, Any] = {}
        self.downtimes: list[float] = []
        self.by_direction: dict[str, list[float]] = {"up": [], "down": []}
        self.parallelism: int | None = None
        self.reasons: Counter[str] = Counter()

    def restart_time_s(self) -> float | None:
        recent = self.downtimes[-RESTART_HISTORY:]
        return expected_restart_time(recent, self.config.restart_time_s, self.config.restart_time_cap_s) \
            if recent else None

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        self.parallelism = analysis.parallelism
        plan, updates = guarded_plan(analysis, self.config, self.state, rescaling, self.restart_time_s(),
                                     downtimes=self.by_direction)
        self._store(updates)
        self.reasons[plan.reason.code] += 1
        if plan.action is Action.NONE or plan.to_parallelism == analysis.parallelism:
            return None
        return plan.to_parallelism

    def on_rescaled(self, to_parallelism: int, downtime_s: float, completed_at: float) -> None:
        self._store({
            "parallelism": to_parallelism, "expected_parallelism": to_parallelism,
            "stale_budget": STALE_WINDOW_BUDGET, "last_rescale_at": completed_at,
        })
        self.downtimes.append(downtime_s)
        up = self.parallelism is None or to_parallelism > self.parallelism
        self.by_direction["up" if up else "down"].append(downtime_s)
        self.by_direction = {k: v[-RESTART_HISTORY:] for k, v in self.by_direction.items()}

    def _store(self, updates: dict[str, Any]) -> None:
        # Knowledge stores each field as JSON; the round trip keeps the planner's view identical.
        self.state.update(json.loads(json.dumps(updates)))
