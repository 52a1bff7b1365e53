"""Each gate of `plan.gates` on its own: what it passes, trims and holds, and what a hold keeps."""

from __future__ import annotations

import calendar
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from contracts.decisions import Action, DecisionReason
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.gates import (
    BacklogMode,
    DelayedScaleDown,
    ExcludedPeriods,
    Gate,
    LevelHold,
    MeasuringHold,
    MinimumSamples,
    PartitionAlignment,
    ScaleDownAfterScaleUp,
    ScaleUpEffectiveness,
    StepBounds,
    apply_gates,
    with_quota,
)
from plan.guarded import GATES
from plan.policies.default import CostPlanner, PlannerMemory
from plan.policy import Plan, direction, hold
from tests.unit.test_ds2 import analysis

NOTICE = DecisionReason(code="ineffective_scale_up", rule="scale_up_effectiveness", message="told")


def config(**overrides: Any) -> JobConfig:
    return JobConfig.model_validate({"scale_down_delay_s": 300, **overrides})


def proposal(current: int, to: int) -> Plan:
    reason = DecisionReason(code="ds2_optimal", rule="ds2", message="core", numbers={"target_rate": 1.0})
    return Plan(direction(current, to), to, reason, recommended=to, notices=[NOTICE])


def run(gate: Gate, current: int, to: int, state: PlanState | None = None, cite: bool = False,
        job: JobConfig | None = None, **fields: Any) -> tuple[Plan, dict[str, Any]]:
    gated = apply_gates((gate,), proposal(current, to), state or PlanState(), analysis(parallelism=current, **fields),
                        job or config(), cite=cite)
    assert gated.plan is not None
    return gated.plan, gated.updates


def at(text: str) -> float:
    return float(calendar.timegm(datetime.fromisoformat(text).timetuple()))


def test_a_hold_keeps_the_current_parallelism_what_was_recommended_and_the_notices() -> None:
    held, _ = run(ExcludedPeriods(), 2, 5, job=config(excluded_periods="09:00-10:00"),
                  window_end=at("2026-11-20T09:30:00"))
    assert (held.action, held.to_parallelism, held.recommended) == (Action.NONE, 2, 5)
    assert held.reason.code == "excluded_period" and held.reason.rule == "excluded_periods"
    assert held.reason.message == "no rescaling during the excluded period '09:00-10:00'"
    assert held.reason.numbers == {"recommended": 5} and held.notices == [NOTICE]
    cited, _ = run(ExcludedPeriods(), 2, 5, cite=True, job=config(excluded_periods="09:00-10:00"),
                   window_end=at("2026-11-20T09:30:00"))
    assert cited.reason.message == "core; no rescaling during the excluded period '09:00-10:00'"
    assert cited.reason.numbers == {"target_rate": 1.0}
    passed, _ = run(ExcludedPeriods(), 2, 5, job=config(excluded_periods="09:00-10:00"),
                    window_end=at("2026-11-20T10:30:00"))
    assert passed == proposal(2, 5)


def test_the_first_hold_ends_the_list() -> None:
    gates = (ExcludedPeriods(), StepBounds())
    plan = proposal(2, 50)
    job = config(excluded_periods="09:00-10:00", max_scale_up_factor=1.0)
    gated = apply_gates(gates, plan, PlanState(), analysis(parallelism=2, window_end=at("2026-11-20T09:30:00")), job)
    assert gated.held_by == "excluded_periods" and gated.plan is not None and "limited" not in gated.plan.reason.message


@given(current=st.integers(1, 40), to=st.integers(1, 120), low=st.integers(1, 10), span=st.integers(0, 30),
       up=st.floats(0.1, 100), down=st.floats(0.1, 1.0))
def test_step_bounds_keep_a_rescale_within_the_limits_and_its_direction(
        current: int, to: int, low: int, span: int, up: float, down: float) -> None:
    job = config(min_parallelism=low, max_parallelism=low + span, max_scale_up_factor=up, max_scale_down_factor=down)
    plan, _ = run(StepBounds(), current, to, job=job)
    if to == current:
        assert plan == proposal(current, to)
        return
    assert plan.action in (direction(current, to), Action.NONE)
    if to > current:
        assert current <= plan.to_parallelism <= max(current, job.max_parallelism)
    else:
        assert min(current, job.min_parallelism) <= plan.to_parallelism <= current
    assert plan.recommended == to and plan.notices == [NOTICE]


def test_step_bounds_trim_by_the_limits_and_say_so() -> None:
    plan, _ = run(StepBounds(), 4, 30, job=config(max_parallelism=12))
    assert plan.to_parallelism == 12 and plan.reason.message == "core; scale-up limited to 12 by max_parallelism 12"
    plan, _ = run(StepBounds(), 2, 20, job=config(max_scale_up_factor=1.0))
    assert plan.to_parallelism == 4 and "max_scale_up_factor 1" in plan.reason.message
    plan, _ = run(StepBounds(), 10, 2, job=config(max_scale_down_factor=0.5))
    assert plan.to_parallelism == 5 and plan.action is Action.SCALE_DOWN


def test_partition_alignment_spreads_unsplittable_partitions_evenly_unless_turned_off() -> None:
    plan, _ = run(PartitionAlignment(), 2, 3, splittable=False, partitions=8)
    assert plan.to_parallelism == 4 and "aligned 3 -> 4" in plan.reason.message
    off, _ = run(PartitionAlignment(), 2, 3, job=config(align_to_partitions=False), splittable=False, partitions=8)
    assert off == proposal(2, 3)


def test_a_guarded_scale_down_waits_for_the_delay_then_takes_the_largest_recommendation() -> None:
    held, pending = run(DelayedScaleDown(), 8, 4, window_end=100.0)
    assert held.reason.code == "scale_down_delayed" and held.to_parallelism == 8 and held.recommended == 4
    assert held.reason.numbers == {"recommended": 4, "largest_recommended": 4, "waited_s": 0.0}
    state = PlanState().updated(pending)
    _, later = run(DelayedScaleDown(), 8, 6, state=state, window_end=200.0)
    state = state.updated(later)
    plan, done = run(DelayedScaleDown(), 8, 3, state=state, window_end=400.0)
    assert plan.action is Action.SCALE_DOWN and plan.to_parallelism == 6 and done["scale_down_since"] is None
    cancelled = apply_gates((DelayedScaleDown(),), hold(8, "at_optimal", "stay"), state, analysis(parallelism=8),
                            config())
    assert cancelled.updates == {"scale_down_since": None, "scale_down_max": None}


def test_the_default_planner_waits_to_scale_down_after_its_scale_up_unless_the_load_dropped() -> None:
    held, _ = run(ScaleDownAfterScaleUp(last_up_at=0.0, shifted_at=None), 8, 6, cite=True, window_end=100.0)
    assert held.reason.code == "scale_down_delayed" and held.reason.rule == "default"
    assert held.reason.message == "core; scaled up 100 s ago: a scale-down waits for the load to drop or 200 s more"
    assert run(ScaleDownAfterScaleUp(0.0, shifted_at=50.0), 8, 6, window_end=100.0)[0] == proposal(8, 6)
    assert run(ScaleDownAfterScaleUp(0.0, None), 8, 6, window_end=300.0)[0] == proposal(8, 6)
    assert run(ScaleDownAfterScaleUp(0.0, None), 8, 9, window_end=100.0)[0] == proposal(8, 9)


def test_measuring_holds_wait_unless_the_backlog_heads_beyond_its_target() -> None:
    pressing = {"backlog": 100_000, "arrival_rate": 350.0}
    for gate, code in ((MeasuringHold(1), "measuring"), (LevelHold(1), "measuring_level")):
        assert run(gate, 2, 5)[0].reason.code == code
        assert run(gate, 2, 5, **pressing)[0] == proposal(2, 5)
    assert run(LevelHold(1), 5, 2, **pressing)[0].reason.code == "measuring_level"  # a scale-down always waits
    assert run(MeasuringHold(3), 2, 5)[0] == proposal(2, 5) and run(LevelHold(2), 2, 5)[0] == proposal(2, 5)
    before = apply_gates((MeasuringHold(0),), None, PlanState(), analysis(parallelism=2), config()).plan
    assert before is not None and before.reason.message.startswith("window 0 of 3 measured at parallelism 2")
    assert run(MinimumSamples(1), 2, 5, job=config(min_samples=2))[0].reason.code == "collecting_samples"
    assert run(MinimumSamples(2), 2, 5, job=config(min_samples=2))[0] == proposal(2, 5)


def test_no_scale_down_while_the_backlog_drains() -> None:
    held, updates = run(BacklogMode(), 8, 4, backlog=10_000, arrival_rate=350.0)
    assert held.reason.code == "backlog_draining" and updates == {"scale_down_since": None, "scale_down_max": None}
    assert run(BacklogMode(), 8, 4, backlog=100, arrival_rate=350.0)[0] == proposal(8, 4)
    assert run(BacklogMode(), 4, 8, backlog=10_000, arrival_rate=350.0)[0] == proposal(4, 8)


def test_a_scale_up_waits_while_the_last_is_judged_or_blocked() -> None:
    judging = PlanState().updated({"scale_up_check": {"from": 2, "to": 4, "per_slot_before": 100.0,
                                                      "capacity_before": 200.0}})
    assert run(ScaleUpEffectiveness(), 4, 6, state=judging)[0].reason.code == "judging_scale_up"
    blocked = PlanState().updated({"scale_up_blocked_until": 500.0})
    held, _ = run(ScaleUpEffectiveness(), 4, 6, state=blocked, window_end=100.0)
    assert held.reason.code == "scale_up_blocked" and held.reason.numbers == {"recommended": 6, "blocked_until": 500.0}
    assert run(ScaleUpEffectiveness(), 4, 6, state=blocked, window_end=600.0)[0] == proposal(4, 6)
    assert run(ScaleUpEffectiveness(), 4, 2, state=blocked, window_end=100.0)[0] == proposal(4, 2)


def test_the_quota_trims_holds_and_tells_once() -> None:
    state, trimmed = with_quota(PlanState(), proposal(2, 5), 2, granted=4, quota=10)
    assert trimmed.to_parallelism == 4 and state.quota_bound
    assert [n.code for n in trimmed.notices] == ["ineffective_scale_up", "quota_bound"]
    state, held = with_quota(state, proposal(2, 5), 2, granted=2, quota=10)
    assert held.action is Action.NONE and held.reason.code == "quota_exhausted" and held.notices == [NOTICE]
    assert held.reason.numbers == {"quota": 10, "granted": 2, "recommended": 5} and held.recommended == 5
    state, free = with_quota(state, proposal(2, 5), 2, granted=5, quota=10)
    assert free == proposal(2, 5) and not state.quota_bound


@given(current=st.integers(1, 20), to=st.integers(1, 40), extra=st.integers(0, 40))
def test_the_quota_never_grants_more_than_it_reserved(current: int, to: int, extra: int) -> None:
    granted = current + extra
    _, plan = with_quota(PlanState(), proposal(current, to), current, granted, quota=100)
    assert plan.to_parallelism <= max(granted, current) if to > current else plan == proposal(current, to)
    assert plan.action is not Action.NONE or plan.to_parallelism == current


@given(current=st.integers(1, 20), to=st.integers(1, 40), hour=st.integers(0, 23), backlog=st.integers(0, 50_000),
       since=st.none() | st.floats(0, 1000))
def test_a_held_plan_always_keeps_the_current_parallelism(current: int, to: int, hour: int, backlog: int,
                                                          since: float | None) -> None:
    state = PlanState().updated({"scale_down_since": since, "scale_down_from": current, "scale_down_max": to})
    window = analysis(parallelism=current, backlog=backlog, window_end=at(f"2026-11-20T{hour:02d}:30:00"))
    gated = apply_gates(GATES, proposal(current, to), state, window,
                        config(excluded_periods="09:00-12:00", max_parallelism=16))
    assert gated.plan is not None
    if gated.held_by is not None or gated.plan.action is Action.NONE:
        assert gated.plan.to_parallelism == current and gated.plan.action is Action.NONE
    else:
        assert gated.plan.to_parallelism <= max(current, 16)
    assert gated.plan.notices[0] == NOTICE


def test_the_docs_list_the_gates_in_the_order_the_policies_apply_them() -> None:
    text = (Path(__file__).parents[2] / "docs" / "policies.md").read_text()
    section = text.split("## Gates", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)`", section, flags=re.MULTILINE)
    default = [MeasuringHold(0), *CostPlanner().gates(PlannerMemory())]
    guarded = [MinimumSamples(0), *GATES]
    for order in (default, guarded):
        names = [type(gate).__name__ for gate in order]
        assert [name for name in listed if name in names] == names
    assert "SlotQuota" in listed
