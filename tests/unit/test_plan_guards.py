"""The guards around DS2: each scenario below goes wrong without its guard."""

from __future__ import annotations

from typing import Any

from contracts.decisions import Action
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.kernel import decide
from plan.policies.reactive import ReactivePolicy
from tests.unit.test_ds2 import analysis

CONFIG = JobConfig(
    target_utilization=0.7, utilization_band=0.0, restart_time_s=0, scale_down_delay_s=0, min_samples=1,
    metrics_window_s=0,
)


def run(state: PlanState | dict[str, Any], rescaling: bool = False, config: JobConfig = CONFIG,
        **overrides: Any):  # type: ignore[no-untyped-def]
    """One window through the planner step with the default policy; the plan and the new state."""
    current = state if isinstance(state, PlanState) else PlanState().updated(state)
    new, plan = decide(current.model_copy(update={"rescaling": rescaling}), analysis(**overrides), config,
                       ReactivePolicy())
    return plan, new


def test_first_window_at_a_new_parallelism_is_ignored_including_the_job_start() -> None:
    plan, state = run({})
    assert plan.reason.code == "stabilizing" and plan.action is Action.NONE
    plan, state = run(state)
    assert plan.reason.code == "ds2_optimal" and plan.to_parallelism == 5
    # A new parallelism starts the count again.
    plan, state = run(state, parallelism=5)
    assert plan.reason.code == "stabilizing"
    no_wait = JobConfig.model_validate(CONFIG.model_dump() | {"stabilization_windows": 0})
    assert run({}, config=no_wait)[0].reason.code == "ds2_optimal"


def test_windows_from_before_a_rescale_are_dropped_within_a_budget() -> None:
    state = {"expected_parallelism": 5, "stale_budget": 2, "window_parallelism": 1, "windows_at_parallelism": 3}
    plan, state = run(state, parallelism=1)
    assert plan.reason.code == "stale_window"
    plan, state = run(state, parallelism=1)
    assert plan.reason.code == "stale_window"
    # Budget spent: the job evidently runs at 1 (restarted by other means); decide again.
    plan, state = run(state, parallelism=1)
    assert plan.reason.code == "ds2_optimal" and state.expected_parallelism is None


def test_reaching_the_expected_parallelism_clears_the_expectation() -> None:
    plan, state = run({"expected_parallelism": 5, "stale_budget": 3}, parallelism=5)
    assert plan.reason.code == "stabilizing" and state.expected_parallelism is None


def test_no_scale_down_while_the_backlog_drains() -> None:
    settled = {"window_parallelism": 8, "windows_at_parallelism": 5}
    draining, _ = run(settled, parallelism=8, backlog=20_000)
    assert draining.reason.code == "backlog_draining" and draining.action is Action.NONE
    assert draining.reason.numbers["recommended"] == 6
    drained, _ = run(settled, parallelism=8, backlog=1_000)
    # 1,000 records are under 10 s of arrivals: (350 + 1,000 / 300) / 70 -> 6 slots.
    assert drained.action is Action.SCALE_DOWN and drained.to_parallelism == 6
    # Scale-ups are never held by the backlog.
    assert run({"window_parallelism": 2, "windows_at_parallelism": 5}, parallelism=2, backlog=20_000)[0].action \
        is Action.SCALE_UP


def test_mode_off_and_rescale_in_progress_hold() -> None:
    off = JobConfig.model_validate(CONFIG.model_dump() | {"mode": "off"})
    assert run({}, config=off)[0].reason.code == "mode_off"
    assert run({}, rescaling=True)[0].reason.code == "rescale_in_progress"
