"""Capacity planning (StreamBed): the MST dichotomy, the scaling models, the explorer's answer."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.explore import explore, measure_mst, recommend
from capacity.mst import SENSIBILITY, SUCCESS_SHARE, Batch, Dichotomy, Step, step_from_batches
from capacity.scaling import BY_NAME, Fit, fit_all, select
from capacity.testbed import ModelTestbed, scaling_truths
from evaluation.jobmodel import JobModel, Operator


class Threshold:
    """A testbed that sustains exactly the rates up to `mst`."""

    def __init__(self, mst: float):
        self.mst = mst
        self.rates: list[float] = []

    def run(self, slots: int, rate: float) -> Step:
        self.rates.append(rate)
        return Step(rate, min(rate, self.mst), max(0.0, (rate - self.mst) * 60), 60.0)


@given(st.floats(1.0, 1e6), st.floats(0.01, 100.0), st.floats(1.05, 4.0))
def test_the_dichotomy_finds_the_mst_within_its_sensibility_from_any_start(mst: float, guess_ratio: float,
                                                                           growth: float) -> None:
    testbed = Threshold(mst)
    search = Dichotomy(start=mst * guess_ratio, growth=growth)
    while not search.done:
        search.update(testbed.run(1, search.target()))
    # Never a rate beyond what counts as sustained (99 % processed: StreamBed's tolerance).
    assert search.mst <= mst / SUCCESS_SHARE
    if len(search.steps) < search.max_steps:
        assert search.mst >= mst * (1 - 2.5 * SENSIBILITY)


def test_a_close_guess_with_a_small_growth_takes_fewer_steps_than_doubling() -> None:
    def steps(growth: float) -> int:
        testbed, search = Threshold(1000.0), Dichotomy(start=930.0, growth=growth, sensibility=0.02)
        while not search.done:
            search.update(testbed.run(1, search.target()))
        assert 1000.0 * 0.95 <= search.mst <= 1000.0 / SUCCESS_SHARE
        return len(search.steps)

    assert steps(1.1) < steps(2.0)


def micro_batches(rate: float, capacity: float, cap_records: int, trigger_s: float, count: int) -> list[Batch]:
    """A micro-batch source: each batch admits what arrived (at most `cap_records`) when it starts and
    takes admitted / capacity seconds; the next starts when it is done, at the trigger's earliest."""
    t, admitted, out = 0.0, 0, []
    for _ in range(count):
        log_end = int(rate * t)
        take = min(log_end - admitted, cap_records)
        admitted += take
        out.append(Batch(t, admitted, log_end))
        t += max(trigger_s, take / capacity)
    return out


@given(st.floats(10.0, 5000.0), st.floats(1.0, 5.0), st.floats(0.5, 2.0))
def test_a_batch_aligned_step_tells_sustained_from_not_whatever_the_batch_size(
        capacity: float, batches_per_trigger: float, trigger_s: float) -> None:
    # A full batch holds at least a trigger interval's work: the cap does not bound the throughput.
    cap = math.ceil(capacity * trigger_s * batches_per_trigger)
    for ratio, sustained in ((0.9, True), (1.1, False)):
        rate = capacity * ratio
        step = step_from_batches(rate, micro_batches(rate, capacity, cap, trigger_s, 40)[8:])
        assert step.sustained is sustained
        # Under the MST it admits what arrives; beyond it, what it can.
        assert step.processed == pytest.approx(min(rate, capacity), rel=0.05)


def test_a_batch_aligned_step_needs_batches_that_start_in_order() -> None:
    with pytest.raises(ValueError, match="needs 3 batches"):
        step_from_batches(10.0, [Batch(0.0, 0, 0), Batch(1.0, 10, 10)])
    with pytest.raises(ValueError, match="increasing"):
        step_from_batches(10.0, [Batch(1.0, 0, 0), Batch(1.0, 10, 10), Batch(1.0, 20, 20)])


def test_a_step_that_falls_behind_or_grows_its_backlog_is_not_sustained() -> None:
    assert Step(100, 100, 0, 60).sustained
    assert Step(100, 99.5, 10, 60).sustained
    assert not Step(100, 97, 0, 60).sustained  # processed under 99 %
    assert not Step(100, 100, 500, 60).sustained  # the backlog grew by 5 s of input


def test_a_configuration_that_never_sustains_anything_is_reported_unstable_after_one_repeat() -> None:
    class Never:
        runs = 0

        def run(self, slots: int, rate: float) -> Step:
            self.runs += 1
            return Step(rate, 0.0, rate * 60, 60.0)

    testbed = Never()
    measured = measure_mst(testbed, 2, 100.0)
    assert not measured.stable and measured.mst == 0
    assert measured.steps == testbed.runs and testbed.runs > 2  # two searches, none averaged in
    assert len(measured.trace) == testbed.runs and not any(step.sustained for step in measured.trace)


@pytest.mark.parametrize(("truth", "name", "params"), [
    ("linear", "linear", (120.0, 0.0)),
    ("amdahl", "amdahl", (100.0, 0.05)),
    ("usl", "usl", (100.0, 0.03, 0.002)),
    ("knee", "knee", (100.0, 4.0, 0.3)),
])
def test_exact_measurements_select_their_own_curve_and_extrapolate_it(truth: str, name: str,
                                                                     params: tuple[float, ...]) -> None:
    slots = np.arange(1, 9, dtype=float)
    mst = BY_NAME[truth].curve(slots, *params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chosen = select(slots, mst)
    truth_far = BY_NAME[truth].curve(np.array([32.0, 64.0]), *params)
    assert chosen.loo_error < 0.01
    assert np.allclose(chosen.predict([32, 64]), truth_far, rtol=0.02), (chosen, truth_far)


def test_too_few_measurements_fit_nothing_and_bad_ones_are_refused() -> None:
    assert fit_all([1, 2], [100, 200]) == []
    with pytest.raises(ValueError, match="too few"):
        select([1, 2], [100, 200])
    with pytest.raises(ValueError):
        fit_all([1, 2, 3], [100, -1, 300])


def test_the_answer_plans_for_110_percent_and_a_rate_out_of_reach_gets_the_best_reachable() -> None:
    linear = Fit("linear", (100.0, 0.0), 0.01)
    answer = recommend([linear], 1000)
    assert answer.reachable and answer.slots == 11  # 1,100 rec/s needs 11 slots of 100
    assert answer.low < answer.predicted_mst < answer.high
    peaked = Fit("usl", (100.0, 0.05, 0.01), 0.02)  # peaks near 10 slots, at about 400 rec/s
    out_of_reach = recommend([peaked], 2000)
    assert not out_of_reach.reachable and out_of_reach.slots is None
    assert out_of_reach.predicted_mst == pytest.approx(peaked.predict(np.arange(1, 4097)).max())
    assert "out of reach" in out_of_reach.message and str(out_of_reach.best_slots) in out_of_reach.message
    with pytest.raises(ValueError):
        recommend([linear], 0)


def test_where_plausible_models_part_the_answer_provisions_for_the_most_pessimistic() -> None:
    # Two curves the testbed cannot tell apart (equal leave-one-out errors) that part by far more than
    # 10 % at 40 slots: the linear one (chosen) and Amdahl's law with a 1 % serial share.
    linear, amdahl = Fit("linear", (100.0, 0.0), 0.01, 0.005), Fit("amdahl", (100.0, 0.01), 0.01, 0.005)
    answer = recommend([linear, amdahl], 3000)
    assert answer.models_disagree and "amdahl" in answer.message and "caution" in answer.message
    assert answer.slots is not None
    n = answer.slots
    # The pessimistic curve reaches the rate with its headroom there, and not one slot earlier.
    assert amdahl.at(n) >= 1.1 * 3000 > amdahl.at(n - 1)
    assert answer.predicted_mst == pytest.approx(amdahl.at(n))
    # Alone, the chosen curve answers with its headroom only.
    assert recommend([linear], 3010).slots == 34 < n  # 3,311 rec/s at 100 per slot


def test_usl_terms_bend_the_job_models_capacity() -> None:
    plain = JobModel(operators=(Operator("a", 100.0),))
    usl = JobModel(operators=(Operator("a", 100.0, contention=0.1, coherency=0.01),))
    assert usl.capacity(1) == plain.capacity(1)
    assert usl.capacity(8) < plain.capacity(8)
    assert usl.capacity(30) < usl.capacity(10)  # past its peak (about 9.5 slots), capacity falls
    with pytest.raises(ValueError):
        Operator("a", 100.0, coherency=-0.1)


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 1000))
def test_the_explorer_on_a_noiseless_linear_job_answers_with_the_fewest_slots_for_110_percent(seed: int) -> None:
    model = scaling_truths()["linear"]
    testbed = ModelTestbed(model, rate_noise=0.0, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = explore(testbed, list(range(1, 9)), first_guess=30.0, seed=seed)
    assert {1, 8} <= {m.slots for m in result.measurements}
    assert result.stopped
    assert math.isclose(result.model.at(64), model.capacity(64), rel_tol=0.03)
    answer = recommend(result.fits, model.capacity(32))
    assert answer.slots is not None and 35 <= answer.slots <= 37  # 110 % of 32 slots' rate


def test_the_explorer_stops_when_the_testbed_budget_is_spent() -> None:
    testbed = ModelTestbed(scaling_truths()["linear"], rate_noise=0.0)
    result = explore(testbed, list(range(1, 9)), first_guess=30.0, budget_slot_s=1.0)
    assert result.stopped == "budget spent" and len(result.measurements) == 2  # the corners only


def test_the_command_writes_a_report_and_a_plot_and_refuses_what_it_cannot_answer(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from capacity.cli import capacity_app

    cli = typer.Typer()
    cli.add_typer(capacity_app, name="capacity")  # as `autoscaler capacity plan`
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["capacity", "plan", "--truth", "linear", "--rate", "3000", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    # 110 % of 3,000 rec/s at 100 per slot: 33 slots at least; never fewer than the rate needs in truth.
    assert report["answer"]["reachable"] and 33 <= report["answer"]["slots"] <= 40
    assert report["true_mst_at_answer"] >= 3000
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert {m["slots"] for m in report["measurements"]} >= {1, 8}
    # Every step the searches made, and what the two smallest configurations predict for the others.
    assert all(len(m["trace"]) == m["steps"] and any(t["sustained"] for t in m["trace"])
               for m in report["measurements"])
    measured = sorted({m["slots"] for m in report["measurements"]})
    assert {row["slots"] for row in report["from_smallest"]} == set(measured[2:])
    assert report["testbed"] == "model"
    live_with_truth = CliRunner().invoke(cli, ["capacity", "plan", "--live", "--truth", "knee", "--rate", "10"])
    assert live_with_truth.exit_code != 0 and "no --truth" in live_with_truth.output
    # A rate beyond the model's reach: the best reachable rate and exit status 2, never a configuration.
    far = CliRunner().invoke(cli, ["capacity", "plan", "--truth", "usl", "--rate", "1e9", "--out", str(out)])
    assert far.exit_code == 2 and "out of reach" in far.output
    assert json.loads(out.read_text())["answer"]["slots"] is None
    bad = CliRunner().invoke(cli, ["capacity", "plan", "--rate", "-1", "--out", str(out)])
    assert bad.exit_code != 0 and "positive" in bad.output
    starved = CliRunner().invoke(cli, ["capacity", "plan", "--truth", "knee", "--rate", "500", "--budget-core-hours",
                                                "0.001", "--out", str(out)])
    assert starved.exit_code == 1 and "no scaling model could be fitted" in starved.output


def test_a_planned_capacity_alone_sizes_a_new_job_and_measurements_outweigh_it() -> None:
    from plan.capacity_estimate import Measured, capacities

    planned = {p: 100.0 * p for p in range(1, 9)}
    alone = capacities({}, 8, noise_cv=0.05, z=1.28, planned=planned, planned_error=0.1)
    assert alone[0] == 0 and alone[4] == pytest.approx(400 * (1 - 1.28 * 0.1))
    assert capacities({}, 8, noise_cv=0.05, z=1.28)[4] == 0  # nothing known without a plan
    # The job measures 80 rec/s per slot at 4 slots: a few windows pull the estimate, many replace the plan.
    few = capacities({"4": Measured(capacity=320.0, n=2)}, 8, noise_cv=0.05, z=0.0, planned=planned)
    many = capacities({"4": Measured(capacity=320.0, n=500)}, 8, noise_cv=0.05, z=0.0, planned=planned)
    assert 320 < few[4] < 400 and many[4] == pytest.approx(320.0, rel=0.02)
    assert abs(many[4] - 320) < abs(few[4] - 320)


def test_the_planner_plans_a_new_jobs_first_step_from_its_planned_capacity() -> None:
    from contracts.analyses import Analysis
    from contracts.jobs import JobConfig
    from contracts.plan_state import PlanState
    from plan.level import update
    from plan.policies.default import CostPlanner, PlannerMemory

    level = PlannerMemory().level
    for i in range(6):
        level, _ = update(level, 10.0 * i, 500.0)
    memory = PlannerMemory(level=level)  # the arrival level is known; no capacity was measured yet
    now = Analysis(job_id="j", window_end=60.0, parallelism=1, valid=True, true_processing_rate=0.0,
                   true_output_rate=0.0, observed_processing_rate=0.0, utilization=0.0, arrival_rate=500.0,
                   backlog=0, closed_at=60.0)
    planner = CostPlanner()
    assert planner.problem(memory, now, JobConfig(max_parallelism=8), PlanState()) is None
    planned = JobConfig(max_parallelism=8, planned_capacity=",".join(f"{p}:{100 * p}" for p in range(1, 9)))
    problem = planner.problem(memory, now, planned, PlanState())
    assert problem is not None and problem.capacity[6] == pytest.approx(600 * (1 - 1.28 * 0.1))


@pytest.mark.parametrize("value", ["1:x", "0:100", "2:-5", "abc", "1:inf", "3"])
def test_a_malformed_planned_capacity_is_refused(value: str) -> None:
    from pydantic import ValidationError

    from contracts.jobs import JobConfig

    with pytest.raises(ValidationError, match="planned capacity"):
        JobConfig(planned_capacity=value)


@given(st.dictionaries(st.integers(1, 4096), st.floats(1e-3, 1e9, allow_nan=False, allow_infinity=False), max_size=50))
def test_a_planned_capacity_reads_back_as_it_was_written(planned: dict[int, float]) -> None:
    from contracts.jobs import format_planned_capacity, parse_planned_capacity

    read = parse_planned_capacity(format_planned_capacity(planned))
    assert read.keys() == planned.keys()
    assert all(math.isclose(read[p], c, rel_tol=1e-5) for p, c in planned.items())  # `:g` keeps 6 digits
