"""`reactive`: DS2's one-step optimal parallelism inside the production controls (the default until the
cost-based planner, `plan.policies.default`, replaced it).

DS2 (Kalavri et al., OSDI 2018): the true processing rate per slot (records per busy second) gives
the slots that carry the target rate at the target utilization in one step; the target rate is the
arrival rate plus the backlog, and what arrives during the restart, drained within the catch-up
duration. The controls (`plan.guarded`) add hysteresis, stabilization, averaged rates, delays and
bounds, after the Flink autoscaler (FLIP-271).
"""

from __future__ import annotations

from contracts.analyses import Analysis
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.ds2 import plan_ds2
from plan.guarded import GuardedPolicy
from plan.policy import Plan


class ReactivePolicy(GuardedPolicy):
    name = "reactive"
    summary = "DS2's one-step optimal parallelism with backlog catch-up, inside the production controls"
    needs_forecast = False

    def core(self, rates: Analysis, config: JobConfig, state: PlanState, restart_time_s: float) -> Plan:
        return plan_ds2(rates, config, restart_time_s=restart_time_s)
