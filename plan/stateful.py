"""What a stateful query changes in a decision: its state partitions cap the useful parallelism, and
its reason states the state's size and the event-time lag. Pure.

A stateful Structured Streaming query (a windowed aggregation, a deduplication, a stream-stream join)
keeps its state in as many partitions as `spark.sql.shuffle.partitions` had when the query first
started; the checkpoint fixes them, whatever the slots. So a slot beyond the state partitions runs no
stateful task, and slots that do not divide them run the stateful stages in ceil(partitions / p)
waves (the planner's capacity model, `plan.capacity_estimate.in_waves`, counts the waves through
`plan.controls.partition_units`; this gate makes the cap a rule every policy obeys).

The gate runs in plan's kernel after every policy, before the slot quota. A query whose state
partitions could not be read is not capped, and a rescale's reason says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.gates import PASS, Verdict, moves
from plan.policy import Plan


class StatePartitionCap:
    """Trims a scale-up beyond the query's state partitions to them (never below the current
    parallelism: a job already beyond the cap is not moved up, and a plan that keeps it there passes);
    holds a scale-up of a job already at the cap or beyond (`state_partitions_cap`). The trim's note and
    the hold's message say that the cap binds, with the number `state_partitions`."""

    rule: ClassVar[str] = "state_partitions"
    codes: ClassVar[tuple[str, ...]] = ("state_partitions_cap",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or plan.action is not Action.SCALE_UP or analysis.state is None:
            return PASS
        cap = analysis.state.partitions
        if cap is None:
            return Verdict(to=plan.to_parallelism, note=(
                "the query's state partitions could not be read: the rescale is not capped by them"))
        if plan.to_parallelism <= cap:
            return PASS
        current = analysis.parallelism
        why = (f"the query's {cap} state partitions (fixed at its first start) cap its useful parallelism: "
               "more slots run no stateful task")
        if current >= cap:
            return Verdict(code="state_partitions_cap", rule=self.rule,
                           message=f"no scale-up to {plan.to_parallelism}: {why}",
                           numbers={"state_partitions": cap, "recommended": plan.to_parallelism})
        return Verdict(to=cap, note=f"scale-up limited to {cap}: {why}", numbers={"state_partitions": cap})


def with_state_note(plan: Plan, analysis: Analysis) -> Plan:
    """A rescale's reason with the query's state and event-time lag, when the analysis has them: the
    rows and memory in state (what a restart reloads) and how far the watermark and the output lag
    behind. Holds are left as they are."""
    if not moves(plan):
        return plan
    parts: list[str] = []
    numbers: dict[str, float | int | None] = {}
    if analysis.state is not None:
        s = analysis.state
        parts.append(f"state {s.rows:,} rows, {s.memory_bytes / 1e6:,.1f} MB in "
                     f"{'unknown' if s.partitions is None else s.partitions} partitions")
        numbers |= {"state_rows": s.rows, "state_memory_bytes": s.memory_bytes, "state_partitions": s.partitions}
    if analysis.watermark_lag_s is not None:
        parts.append(f"watermark {analysis.watermark_lag_s:.0f} s behind")
        numbers["watermark_lag_s"] = round(analysis.watermark_lag_s, 1)
    if analysis.output_lag_s is not None:
        parts.append(f"output event time {analysis.output_lag_s:.0f} s behind")
        numbers["output_lag_s"] = round(analysis.output_lag_s, 1)
    if not parts:
        return plan
    reason = plan.reason.model_copy(update={"message": "; ".join([plan.reason.message, ", ".join(parts)]),
                                            "numbers": {**plan.reason.numbers, **numbers}})
    return replace(plan, reason=reason)
