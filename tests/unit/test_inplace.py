"""The in-place backend's pure parts: which executors go, the admission share, costs, the fallback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st

from agent.job_cli import choose_backend
from contracts.backends import BackendKind, backend_in_use, in_place_cost
from contracts.jobs import JobConfig
from contracts.plan_state import Downtimes
from evaluation.model_files import demo_model
from evaluation.simulator import PolicyRunner, simulate
from evaluation.traces import Trace
from knowledge.memory import run_now
from pipeline.inplace import InPlaceExecutors, NotInPlace, can_change_in_place, executors_to_remove
from pipeline.restart import RestartFromCheckpoint, SparkJobConfig
from pipeline.source_control import read_share, write_share
from plan.policies.default import CostPlanner
from tests.support.backends import arm_setup, compare, executor_seconds, rotated, summarize


@given(st.sets(st.integers(0, 500), min_size=1, max_size=40), st.integers(0, 45))
def test_the_newest_executors_go_and_exactly_the_target_stay(ids: set[int], target: int) -> None:
    names = [str(i) for i in ids]
    gone = executors_to_remove(names, target)
    stay = set(names) - set(gone)
    assert len(stay) == min(target, len(names))
    assert set(gone) <= set(names)
    if gone and stay:
        assert max(int(s) for s in stay) < min(int(g) for g in gone)


def test_executor_ids_are_ordered_as_numbers_not_text() -> None:
    assert executors_to_remove(["10", "9", "2"], 2) == ["10"]
    with pytest.raises(ValueError):
        executors_to_remove(["1"], -1)


def test_the_share_file_scales_admission_and_a_bad_one_admits_all(tmp_path: Path) -> None:
    share = tmp_path / "share"
    assert read_share(share) == 1.0  # no file: the whole limit
    write_share(share, 0.25)
    assert read_share(share) == pytest.approx(0.25)
    for text in ("abc", "0", "-1", ""):
        share.write_text(text)
        assert read_share(share) == 1.0
    share.write_text("3")
    assert read_share(share) == 1.0  # never more than the limit


def test_in_place_costs_no_pause_to_add_and_a_hold_to_remove() -> None:
    measured = Downtimes(up=[8.0, 12.0], down=[0.4, 0.2])
    assert in_place_cost(2, 2, measured, 10.0, 3.0).pause_s == 0.0
    up = in_place_cost(1, 3, measured, 10.0, 3.0)
    assert (up.pause_s, up.reduced_s, up.replay_s) == (0.0, 12.0, 0.0)  # the slowest recent one
    down = in_place_cost(3, 1, measured, 10.0, 3.0)
    assert (down.pause_s, down.reduced_s, down.replay_s) == (0.4, 0.0, 0.0)
    fresh = Downtimes()
    assert in_place_cost(1, 3, fresh, 10.0, 3.0).reduced_s == 10.0  # the defaults until measured
    assert in_place_cost(3, 1, fresh, 10.0, 3.0).pause_s == 3.0


def _config(tmp_path: Path, master: str | None) -> SparkJobConfig:
    return SparkJobConfig(job_id="demo", entry_point="pipeline.demo:build", checkpoint_dir=tmp_path, master=master)


def test_local_mode_cannot_change_executors_and_falls_back_saying_why(tmp_path: Path) -> None:
    assert can_change_in_place("spark://127.0.0.1:7077") is None
    reason = can_change_in_place("local[4]")
    assert reason is not None and "restarts the query" in reason
    with pytest.raises(NotInPlace):
        InPlaceExecutors(_config(tmp_path, None), 4)
    local = choose_backend("inplace", _config(tmp_path, None), 4)
    assert isinstance(local, RestartFromCheckpoint) and local.kind is BackendKind.RESTART
    assert choose_backend("auto", _config(tmp_path, None), 4).kind is BackendKind.RESTART


def test_a_cluster_rescales_in_place_with_the_task_count_fixed_at_the_maximum(tmp_path: Path) -> None:
    cluster = _config(tmp_path, "spark://127.0.0.1:7077")
    backend = choose_backend("auto", cluster, 6)
    assert isinstance(backend, InPlaceExecutors) and backend.kind is BackendKind.IN_PLACE
    assert backend.config.options["minPartitions"] == "6"
    assert backend.config.spark_conf["spark.sql.shuffle.partitions"] == "6"
    assert backend.config.spark_conf["spark.dynamicAllocation.enabled"] == "false"
    assert backend.fixed_tasks == 6  # reported, so that the planner knows the batches' waves
    assert choose_backend("restart", cluster, 6).kind is BackendKind.RESTART
    assert choose_backend("restart", cluster, 6).fixed_tasks is None
    assert choose_backend("auto", cluster, None).kind is BackendKind.RESTART  # no maximum: no fixed task count
    with pytest.raises(typer.BadParameter):
        choose_backend("inplace", cluster, None)
    with pytest.raises(typer.BadParameter):
        choose_backend("elastic", cluster, 6)


def test_the_backend_in_use_is_what_the_runner_reports_and_a_fallback_is_said() -> None:
    assert backend_in_use(BackendKind.IN_PLACE, None) == (BackendKind.IN_PLACE, None)
    assert backend_in_use(BackendKind.RESTART, "restart") == (BackendKind.RESTART, None)
    kind, note = backend_in_use(BackendKind.IN_PLACE, "restart")
    assert kind is BackendKind.RESTART and note is not None and "local mode" in note


def test_a_job_configured_in_place_whose_runner_restarts_it_is_planned_with_restart_costs_saying_so() -> None:
    """A runner asked for in place that falls back (local mode) reports `restart`; from then on the default
    planner plans with restart costs and each decision's reason says why."""
    load = Trace("step", np.array([300.0] * 30 + [900.0] * 60), 10.0, "a step")
    config = JobConfig(max_parallelism=8, scaling_backend=BackendKind.IN_PLACE)
    runner = PolicyRunner(CostPlanner(), config)
    simulate(load, demo_model(), runner, config, 2, backlog_target_s=60.0, rate_noise=0.0)
    assert runner.state.backend == "restart"
    decisions = run_now(runner.knowledge.decisions("eval", limit=1000))
    planned = sorted((d for d in decisions if d["reason"]["code"] != "learning"), key=lambda d: d["window_end"])
    assert planned
    noted = ["planned with restart costs" in d["reason"]["message"] for d in planned]
    # The note appears once the runner has said how it rescales (after the first rescale), and stays.
    assert not noted[0] and any(noted) and noted == sorted(noted)


def test_executor_seconds_integrate_the_granted_cores_over_the_span() -> None:
    samples = [(0.0, 1), (10.0, 3), (20.0, 0), (25.0, 2)]
    assert executor_seconds(samples, 0.0, 30.0) == 1 * 10 + 3 * 10 + 0 * 5 + 2 * 5
    assert executor_seconds(samples, 5.0, 15.0) == 1 * 5 + 3 * 5  # clipped to the span
    assert executor_seconds([], 0.0, 30.0) == 0.0


def test_the_three_arms_differ_only_in_how_the_job_is_sized() -> None:
    inplace, restart, dynamic = (arm_setup(arm, "spark://h:7077", 4) for arm in ("inplace", "restart", "dynamic"))
    assert inplace == (["--master", "spark://h:7077", "--backend", "inplace"], {"scaling_backend": "in_place"}, 1)
    assert restart == (["--master", "spark://h:7077", "--backend", "restart"], {}, 1)
    args, registration, start = dynamic
    assert registration == {"mode": "recommend"} and start == 4  # the agents measure, never act
    conf = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
    assert conf["spark.dynamicAllocation.enabled"] == "true" and conf["spark.dynamicAllocation.initialExecutors"] == "1"
    with pytest.raises(ValueError, match="unknown arm"):
        arm_setup("magic", "spark://h:7077", 4)


def test_each_round_starts_one_arm_later_and_the_summary_is_median_and_worst() -> None:
    arms = ["inplace", "restart", "dynamic"]
    orders = [rotated(arms, r) for r in range(3)]
    assert [order[0] for order in orders] == arms  # each arm runs first once
    assert all(sorted(order) == sorted(arms) for order in orders) and rotated(arms, 3) == arms

    def row(arm: str, executor_s: float, beyond_s: float) -> dict[str, object]:
        return {"arm": arm, "executor_seconds": executor_s, "beyond_target_s": beyond_s, "peak_backlog": 10.0,
                "lag_p95_s": 1.25, "actions": 2, "max_executors": 4}

    summary = summarize([row("inplace", 900, 0), row("dynamic", 1800, 0), row("inplace", 1000, 5),
                         row("inplace", 950, 0)])
    assert list(summary) == ["inplace", "dynamic"]
    assert summary["inplace"]["runs"] == "3"
    assert summary["inplace"]["executor_seconds"] == "950 [1000]" and summary["inplace"]["beyond_target_s"] == "0 [5]"
    assert summary["dynamic"]["executor_seconds"] == "1800 [1800]" and summary["dynamic"]["actions"] == "2"


def test_the_backends_comparison_pairs_the_same_cases() -> None:
    def case(seed: int, slots: float, oracle: float) -> dict[str, object]:
        run = {"policy": "default", "slot_seconds": slots, "vs_oracle": slots / oracle, "seconds_beyond_target": 0.0,
               "actions": 3}
        return {"trace": "wiki", "regime": "compressed", "seed": seed, "runs": [run],
                "oracle": {"slot_seconds": oracle}}

    restart = [case(0, 1000.0, 900.0), case(1, 1200.0, 1000.0)]
    in_place = [case(0, 900.0, 850.0), case(1, 1140.0, 950.0)]
    (row,) = compare(restart, in_place, "default")  # type: ignore[arg-type]
    assert row["seeds"] == 2 and row["in_place_over_restart_worst"] == 0.95
    assert row["in_place_over_restart_median"] == pytest.approx((0.9 + 0.95) / 2)
    assert row["in_place_vs_oracle_worst"] == pytest.approx(1.2)
