"""The fleet replayed (`evaluation.fleet`): jobs side by side on one clock through the agents' kernels, the
fleet step keeping the slots held within the budget, and the measures it is judged by."""

from __future__ import annotations

import numpy as np

from evaluation.fleet import FleetCase, evaluate_fleet, starvation_s
from evaluation.suite import EvalSettings


def test_starvation_counts_runs_of_a_minute_below_need_and_late_while_another_holds_spare_slots() -> None:
    windows = 10
    needs = np.full((windows, 2), 3)
    parallelism = np.full((windows, 2), 3)
    late = np.zeros((windows, 2), dtype=bool)
    parallelism[1:8, 0] = 2  # job 0 short for 7 windows...
    late[1:8, 0] = True  # ...and beyond its target
    assert starvation_s(parallelism, needs, late) == 0.0  # nobody holds more than it needs
    parallelism[:, 1] = 4
    assert starvation_s(parallelism, needs, late) == 70.0
    late[1:8, 0] = False  # short but within its target: the planner's choice, not starvation
    assert starvation_s(parallelism, needs, late) == 0.0
    late[1:6, 0] = True  # 5 windows: under a minute
    assert starvation_s(parallelism, needs, late) == 0.0


def test_the_fleet_step_keeps_a_shared_cluster_within_its_budget() -> None:
    settings = EvalSettings(hours=1.0, noise_bound=False)
    out = evaluate_fleet(FleetCase(jobs=3, budget_share=0.6, weights=(2.0, 1.0)), settings, seed=0)
    arms = {arm["arm"]: arm for arm in out["arms"]}
    assert [job["weight"] for job in out["jobs"]] == [2.0, 1.0, 2.0]
    assert out["budget"] < out["sum_of_peaks"]
    assert arms["fleet"]["overrun_s"] == 0 and arms["fleet"]["peak_held"] <= out["budget"]
    assert arms["fleet"]["fleet_budget_decisions"] > 0  # the budget bound, and the reasons say so
    assert arms["alone"]["peak_held"] > out["budget"]  # alone, the jobs would have taken more
    assert arms["quota"]["fleet_budget_decisions"] == 0
    for arm in arms.values():
        assert arm["vs_bound"] > 0 and len(arm["beyond_target_s"]) == 3
