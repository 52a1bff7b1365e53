"""`autoscaler explain`'s summary: the last action, and what was suppressed before and after it."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from agent.explain import decision_table, is_suppression, summary
from contracts.analyses import Analysis
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState
from plan.kernel import to_decision
from plan.policies.default import CostPlanner


def decision(t: float, action: str, frm: int, to: int, code: str, recommended: int | None = None) -> dict[str, Any]:
    return {"window_end": t, "action": action, "from_parallelism": frm, "to_parallelism": to,
            "recommended_parallelism": recommended,
            "reason": {"code": code, "rule": "r", "message": f"{code} message", "numbers": {"backlog": 10}}}


# Newest first, as knowledge returns them.
HISTORY = [
    decision(90, "none", 4, 4, "scale_down_delayed", recommended=2),
    decision(80, "none", 4, 4, "at_optimal", recommended=4),
    decision(70, "scale_up", 1, 4, "ds2_optimal", recommended=4),
    decision(60, "none", 1, 1, "collecting_samples"),
    decision(50, "none", 1, 1, "excluded_period", recommended=4),
    decision(40, "none", 1, 1, "excluded_period", recommended=3),
    decision(30, "scale_down", 2, 1, "ds2_optimal", recommended=1),
    decision(20, "none", 2, 2, "backlog_draining", recommended=1),
]


def test_summary_names_the_last_action_and_the_suppressions_around_it() -> None:
    lines = summary(HISTORY)
    assert lines[0].startswith("latest window (00:01:30): scale_down_delayed")
    assert lines[1].startswith("last action: scale_up 1 -> 4 at 00:01:10 (r/ds2_optimal)")
    # Before it, back to the previous action: the excluded period held it twice; the older
    # backlog suppression belongs to the action before.
    assert lines[2] == "suppressed before it: 2 window(s) wanting [3, 4]: excluded_period x2"
    assert lines[3] == "suppressed since: 1 window(s) wanting [2]: scale_down_delayed x1"


def test_without_actions_the_summary_says_so() -> None:
    lines = summary([decision(10, "none", 2, 2, "within_utilization_band", recommended=3)])
    assert lines[1] == "no scaling action among the last 1 decisions"
    assert lines[2] == "suppressed since: 1 window(s) wanting [3]: within_utilization_band x1"
    assert summary([]) == ["no decisions recorded for this job yet"]


def test_the_table_can_show_only_actions_and_suppressions() -> None:
    assert [is_suppression(d) for d in HISTORY[:3]] == [True, False, False]
    console = Console(width=250, record=True)
    console.print(decision_table(HISTORY, only_changes=True))
    text = console.export_text()
    assert "scale_down_delayed" in text and "collecting_samples" not in text and "at_optimal" not in text


def test_a_planner_decision_shows_its_schedule_its_cost_and_the_next_best() -> None:
    planner, config, state = CostPlanner(), JobConfig(max_parallelism=8), PlanState()
    records = []
    # The step's second window: the planner waits for two windows of a new level before it rescales.
    for i, (arrival, backlog) in enumerate([(300.0, 0)] * 8 + [(700.0, 13_000), (700.0, 20_000)]):
        analysis = Analysis(job_id="j", window_end=10.0 * i, parallelism=2, valid=True, true_processing_rate=200.0,
                            true_output_rate=200.0, observed_processing_rate=min(arrival, 400.0),
                            utilization=min(1.0, arrival / 400.0), arrival_rate=arrival, backlog=backlog,
                            closed_at=10.0 * i)
        state, plan = planner.decide(state, analysis, config)
        records.insert(0, to_decision(plan, analysis, config).model_dump(mode="json"))
    console = Console(record=True, width=400)
    console.print(decision_table(records, only_changes=True))
    text = console.export_text()
    assert "scale_up" in text and "cost_plan" in text
    assert "over 30 min costs" in text and "next best" in text
    assert "plan_cost_slot_s=" in text and "alternative_cost_slot_s=" in text and "alternative_first=" in text
