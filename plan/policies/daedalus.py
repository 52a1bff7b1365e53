"""`daedalus`: Daedalus's proactive scale-out choice inside the production controls.

Daedalus (Pfister et al., 2024), Algorithm 1: the smallest parallelism whose capacity exceeds the
observed rate and the forecast peak over the horizon, and whose predicted recovery (records
replayed since the checkpoint, the backlog, and what arrives during the learned downtime, drained
by the spare capacity under the forecast) is within `target_recovery_s`. Capacities come from
analyze's CPU-throughput regression: measured per scale-out, on the fitted scaling curve
elsewhere. Until there is a forecast and a capacity it falls back to DS2 and says so.
"""

from __future__ import annotations

from dataclasses import replace

from contracts.analyses import Analysis
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.ds2 import plan_ds2
from plan.guarded import GuardedPolicy
from plan.policy import Plan
from plan.proactive import Capacity, plan_proactive, regression_capacity


class DaedalusPolicy(GuardedPolicy):
    name = "daedalus"
    summary = "Daedalus: forecast peak and predicted recovery time, capacity from the CPU-throughput regression"
    needs_forecast = True

    def capacity(self, analysis: Analysis) -> tuple[Capacity | None, str]:
        """The capacity per scale-out this policy trusts, and where it comes from."""
        view = analysis.capacity
        return (regression_capacity(view) if view is not None else None), "regression"

    def capacity_of(self, analysis: Analysis, config: JobConfig) -> Capacity | None:
        return self.capacity(analysis)[0]

    def core(self, rates: Analysis, config: JobConfig, state: PlanState, restart_time_s: float) -> Plan:
        # Metric time of plan's own last rescale decision: execute's `last_rescale_at` is wall time.
        last = state.rescale_decided_at
        since = None if last is None else rates.window_end - float(last)
        plan, why_not = plan_proactive(rates, config, state.restarts, since, self.capacity(rates), self.name)
        if plan is not None:
            return plan
        fallback = plan_ds2(rates, config, restart_time_s=restart_time_s)
        message = f"{self.name} cannot decide yet ({why_not}); DS2: {fallback.reason.message}"
        return replace(fallback, reason=fallback.reason.model_copy(update={"message": message}))
