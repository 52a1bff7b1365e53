"""Every scaling policy by name: the job setting `policy`, the evaluation and the CLI choose from here.

Adding a policy is one module in plan/policies/ (a class with `name`, `summary`, `needs_forecast`,
`decide` and `planned_capacity`, see `plan.policy.ScalingPolicy`) and one line below.
"""

from __future__ import annotations

from typing import Any

from plan.policies.daedalus import DaedalusPolicy
from plan.policies.default import CostPlanner
from plan.policies.ds2 import Ds2Policy
from plan.policies.flink import FlinkPolicy
from plan.policies.hybrid import HybridPolicy
from plan.policies.reactive import ReactivePolicy
from plan.policies.static import StaticPolicy
from plan.policies.threshold import ThresholdPolicy
from plan.policy import ScalingPolicy

POLICIES: dict[str, type[ScalingPolicy]] = {
    CostPlanner.name: CostPlanner,
    ReactivePolicy.name: ReactivePolicy,
    DaedalusPolicy.name: DaedalusPolicy,
    HybridPolicy.name: HybridPolicy,
    Ds2Policy.name: Ds2Policy,
    FlinkPolicy.name: FlinkPolicy,
    ThresholdPolicy.name: ThresholdPolicy,
    StaticPolicy.name: StaticPolicy,
}
DEFAULT_POLICY = CostPlanner.name


class UnknownPolicy(ValueError):
    def __init__(self, name: str):
        super().__init__(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
        self.name = name


def policy_class(name: str) -> type[ScalingPolicy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownPolicy(name) from None


def make_policy(name: str, **parameters: Any) -> ScalingPolicy:
    """The policy called `name`; `parameters` set a baseline's own options (e.g. a Flink duration)."""
    return policy_class(name)(**parameters)
