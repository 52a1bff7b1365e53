"""A stateful job in the one simulator: the job model's state partitions and state-sized restarts,
through the same monitor, analyze and plan code as live. Pure."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.jobs import JobConfig
from evaluation.jobmodel import JobModel, JobState, Operator, advance, rescale
from evaluation.simulator import PolicyRunner, simulate
from evaluation.traces import Trace
from plan.registry import make_policy

W = 10.0


def stateful(partitions: int = 6, per_million_s: float = 10.0) -> JobModel:
    return JobModel((Operator("job", 100.0),), checkpoint_interval_s=0.0, downtime_up_s=10.0, downtime_down_s=5.0,
                    state_partitions=partitions, state_retention_s=600.0, restart_s_per_million_rows=per_million_s)


def test_slots_beyond_the_state_partitions_add_nothing_and_uneven_ones_run_in_waves() -> None:
    job = stateful(partitions=6)
    assert job.capacity(6) == pytest.approx(600.0)
    assert job.capacity(9) == pytest.approx(600.0)  # no stateful task for the 3 more
    assert job.capacity(4) == pytest.approx(300.0)  # 6 tasks on 4 slots: two waves, as on 3 slots
    assert JobModel((Operator("job", 100.0),)).capacity(4) == pytest.approx(400.0)


def test_a_restart_reloads_the_state() -> None:
    job = stateful(per_million_s=10.0)
    state = JobState([2])
    advance(job, state, 0.0, W, 500.0)  # 500 rec/s x 600 s retention = 300,000 rows
    assert state.state_rows == pytest.approx(300_000)
    assert rescale(job, state, 4, W) == pytest.approx(10.0 + 3.0)


def run(policy: str, rates: list[float], job: JobModel, p0: int = 2):  # type: ignore[no-untyped-def]
    config = JobConfig(max_parallelism=16, policy=policy, scale_down_delay_s=0.0)
    runner = PolicyRunner(make_policy(policy), config)
    trace = Trace("stateful", np.array(rates, dtype=float), W, "test load")
    return simulate(trace, job, runner, config, p0, backlog_target_s=60.0, rate_noise=0.0), runner


@pytest.mark.parametrize("policy", ["default", "ds2", "reactive", "threshold"])
def test_no_policy_scales_a_stateful_job_beyond_its_state_partitions(policy: str) -> None:
    # 900 rec/s needs 9 slots of 100; the state has 6 partitions, so 6 is all any policy may take.
    result, _ = run(policy, [200.0] * 30 + [900.0] * 60, stateful(partitions=6))
    assert max(result.timeline.parallelism) <= 6
    assert result.scale_ups >= 1


def test_the_default_planner_goes_to_the_state_partitions_in_one_action() -> None:
    # Its capacity model counts the waves: 2 -> 6 at once, not through 4 (two waves, as on 3 slots).
    result, _ = run("default", [200.0] * 30 + [900.0] * 60, stateful(partitions=6))
    assert (result.scale_ups, result.scale_downs) == (1, 0)
    assert result.timeline.parallelism[-1] == 6


def test_the_cap_is_said_in_the_decisions_reason() -> None:
    _, runner = run("ds2", [200.0] * 30 + [900.0] * 60, stateful(partitions=6))
    assert runner.reasons["state_partitions_cap"] >= 1  # held at the cap while the load wants more


def test_restarts_are_kept_with_the_state_size_and_the_slope_is_learned() -> None:
    # Steps up and down at growing rates: each restart reloads more state.
    rates = [r for level in (150.0, 350.0, 150.0, 450.0, 200.0, 550.0, 250.0) for r in [level] * 40]
    _, runner = run("threshold", rates, stateful(partitions=16, per_million_s=20.0))
    downtimes = runner.state.downtimes
    sizes = [s for s in [*downtimes.state_rows("up"), *downtimes.state_rows("down")] if s is not None]
    assert len(sizes) >= 3 and len(set(sizes)) >= 2
    # 20 s per million rows of state, as the job model reloads it: the fit finds it from the restarts.
    assert downtimes.state_slope() == pytest.approx(20.0 / 1e6, rel=0.25)
