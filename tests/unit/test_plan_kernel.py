"""Plan's kernel: the planner step declares the slot reservation it needs, and the decision is made
within the slots granted."""

from __future__ import annotations

import pytest

from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.fleet import FleetGrant
from contracts.jobs import JobConfig, Mode
from contracts.plan_state import PlanState
from plan.kernel import Reserve, finish, plan
from plan.policies.threshold import ThresholdPolicy

CONFIG = JobConfig(max_parallelism=32, policy="threshold")


def analysis(utilization: float, parallelism: int) -> Analysis:
    return Analysis.model_validate({
        "job_id": "k", "window_end": 1_700_001_000.0, "parallelism": parallelism, "valid": True,
        "true_processing_rate": 100.0, "true_output_rate": 100.0,
        "observed_processing_rate": 100.0 * utilization * parallelism, "utilization": utilization,
        "arrival_rate": 100.0 * utilization * parallelism, "backlog": 0, "closed_at": 1_700_001_000.0,
    })


def test_without_a_quota_nothing_is_reserved() -> None:
    planned = plan(PlanState(), analysis(0.9, 4), CONFIG, rescaling=False, quota=None, policy=ThresholdPolicy())
    assert planned.reserve is None and planned.plan.to_parallelism == 6
    assert finish(planned, analysis(0.9, 4), CONFIG).decision.to_parallelism == 6


def test_a_scale_up_reserves_its_target_and_a_hold_keeps_what_the_job_has() -> None:
    up = plan(PlanState(), analysis(0.9, 4), CONFIG, rescaling=False, quota=10, policy=ThresholdPolicy())
    assert up.reserve == Reserve(current=4, wanted=6, quota=10, commit=True)
    held = plan(PlanState(), analysis(0.6, 4), CONFIG, rescaling=False, quota=10, policy=ThresholdPolicy())
    assert held.plan.action is Action.NONE and held.reserve == Reserve(4, 4, 10, commit=True)
    recommend = CONFIG.model_copy(update={"mode": Mode.RECOMMEND})
    advice = plan(PlanState(), analysis(0.9, 4), recommend, rescaling=False, quota=10, policy=ThresholdPolicy())
    assert advice.reserve == Reserve(4, 6, 10, commit=False)  # a recommendation holds no slots
    during = plan(PlanState(), analysis(0.9, 4), CONFIG, rescaling=True, quota=10, policy=ThresholdPolicy())
    assert during.reserve is None and during.plan.reason.code == "rescale_in_progress"


def test_the_decision_is_trimmed_to_the_grant_and_says_so_once() -> None:
    planned = plan(PlanState(), analysis(0.9, 4), CONFIG, rescaling=False, quota=10, policy=ThresholdPolicy())
    decided = finish(planned, analysis(0.9, 4), CONFIG, granted=5)
    assert decided.decision.to_parallelism == 5 and decided.decision.action is Action.SCALE_UP
    assert [n.code for n in decided.decision.notices] == ["quota_bound"]
    assert "quota_bound" in decided.state_fields
    again = plan(decided.state, analysis(0.9, 4), CONFIG, rescaling=False, quota=10, policy=ThresholdPolicy())
    assert finish(again, analysis(0.9, 4), CONFIG, granted=5).decision.notices == []
    none_left = finish(planned, analysis(0.9, 4), CONFIG, granted=4)
    assert none_left.decision.action is Action.NONE and none_left.plan.reason.code == "quota_exhausted"


def test_a_reservation_needs_its_answer() -> None:
    planned = plan(PlanState(), analysis(0.9, 4), CONFIG, rescaling=False, quota=10, policy=ThresholdPolicy())
    with pytest.raises(ValueError, match="slots granted"):
        finish(planned, analysis(0.9, 4), CONFIG)


def test_a_job_on_a_cluster_bids_what_it_was_rescaled_to_while_its_windows_are_stale() -> None:
    """A window measured before the job's last rescale still arrives after it: the fleet must count the
    slots the job runs now (seen live: a job rescaled 2 -> 3 bid 2 on a stale window, and the slot it
    still held was granted to another job)."""
    on_cluster = CONFIG.model_copy(update={"cluster": "c"})
    after = PlanState(expected_parallelism=3, stale_budget=2)
    stale = plan(after, analysis(0.6, 2), on_cluster, rescaling=False, quota=None, policy=ThresholdPolicy())
    assert stale.bid is not None and stale.bid.holds == 3
    settled = plan(PlanState(), analysis(0.6, 2), on_cluster, rescaling=False, quota=None, policy=ThresholdPolicy())
    assert settled.bid is not None and settled.bid.holds == 2


def test_a_job_on_a_cluster_bids_what_its_scale_down_ended_at_while_its_windows_are_stale() -> None:
    """A completed scale-down's slots are free at once (execute counts them so): a stale window measured at
    the old count must not claim them back (seen live: the receiver of a move waited a window more)."""
    on_cluster = CONFIG.model_copy(update={"cluster": "c"})
    after = PlanState(expected_parallelism=1, stale_budget=2)
    stale = plan(after, analysis(0.6, 3), on_cluster, rescaling=False, quota=None, policy=ThresholdPolicy())
    assert stale.bid is not None and stale.bid.holds == 1


def test_a_stale_window_of_a_job_on_a_cluster_takes_no_action() -> None:
    """Its grant is measured against what the job runs now, not against the stale count: no rescale from a
    count it no longer runs (seen live: a no-op 4 -> 3 decided on the window after the release to 3)."""
    on_cluster = CONFIG.model_copy(update={"cluster": "c"})
    stale = analysis(0.6, 4)
    planned = plan(PlanState(expected_parallelism=3, stale_budget=2), stale, on_cluster, rescaling=False, quota=None,
                   policy=ThresholdPolicy())
    given = FleetGrant(cluster="c", budget=6, granted=3, allocated=3, binds=True)
    decided = finish(planned, stale, on_cluster, given=given)
    assert decided.decision.action is Action.NONE
    fresh = plan(PlanState(), analysis(0.6, 4), on_cluster, rescaling=False, quota=None, policy=ThresholdPolicy())
    assert finish(fresh, analysis(0.6, 4), on_cluster, given=given).decision.action is Action.SCALE_DOWN
