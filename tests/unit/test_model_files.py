"""Job-model files: the demo job's, fitting a measured scaling curve, bad files, the batch overhead."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluation.jobmodel import JobModel, JobState, Operator, advance
from evaluation.model_files import JobModelError, JobModelFile, demo_job_model, fit_scaling, load_job_model


def test_the_demo_job_model_is_read_from_its_file_with_how_it_was_measured() -> None:
    demo = demo_job_model()
    model = demo.model()
    assert model.capacity(3) == pytest.approx(3 * demo.slot_rate)
    assert model.capacity(4) == pytest.approx(demo.slot_rate * (3 + demo.efficiency_beyond_knee))
    assert (model.downtime_up_s, model.downtime_down_s) == (demo.downtime_up_s, demo.downtime_down_s)
    assert demo.measured["date"] and demo.measured["how"]


@given(rate=st.floats(50, 2000), knee=st.integers(1, 6), efficiency=st.sampled_from([0.0, 0.25, 0.5, 0.8]))
def test_the_fit_recovers_a_knee_curve_from_its_per_slot_rates(rate: float, knee: int, efficiency: float) -> None:
    op = Operator("x", rate, knee=knee, efficiency_beyond_knee=efficiency)
    measured = {p: op.instance_rate(p) for p in range(1, 9)}
    slot_rate, fitted_knee, fitted_efficiency = fit_scaling(measured)
    fitted = Operator("x", slot_rate, knee=fitted_knee, efficiency_beyond_knee=fitted_efficiency)
    for p in range(1, 9):
        assert fitted.capacity(p) == pytest.approx(op.capacity(p), rel=1e-6)


def test_linear_rates_fit_without_a_knee() -> None:
    assert fit_scaling({1: 200.0, 2: 200.0, 4: 200.0}) == (pytest.approx(200.0), None, 1.0)
    with pytest.raises(JobModelError, match="no per-slot rate"):
        fit_scaling({})


def test_a_file_that_is_not_a_job_model_gets_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JobModelError, match="cannot read"):
        load_job_model(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**demo_job_model().model_dump(mode="json"), "slot_rate": -1}))
    with pytest.raises(JobModelError, match="slot_rate"):
        load_job_model(bad)
    bad.write_text("not json")
    with pytest.raises(JobModelError, match="is not a job model"):
        load_job_model(bad)


def test_a_written_model_reads_back(tmp_path: Path) -> None:
    from evaluation.model_files import write_job_model

    model = JobModelFile(name="j", slot_rate=100.0, downtime_up_s=10.0, downtime_down_s=5.0, rate_noise=0.05,
                         batch_overhead_s=0.5, measured={"how": "test"})
    assert load_job_model(write_job_model(model, tmp_path / "m.json")) == model


def test_the_batch_overhead_takes_its_share_of_a_saturated_job_but_not_of_its_busy_time() -> None:
    plain = JobModel(operators=(Operator("x", 100.0),))
    batched = JobModel(operators=(Operator("x", 100.0),), batch_overhead_s=1.0, batch_work_s=4.0)
    assert batched.capacity(2) == pytest.approx(plain.capacity(2) * 4 / 5)
    state = JobState(parallelism=[2], backlog=10_000.0)
    outcome = advance(batched, state, 0.0, 10.0, 0.0)
    assert outcome.processed == pytest.approx(1600.0)  # 2 slots x 100/s x 4/5 x 10 s
    assert outcome.busy_slot_s == pytest.approx(16.0)  # DS2's busy time counts the records' work only
    with pytest.raises(ValueError, match="batch"):
        JobModel(operators=(Operator("x", 1.0),), batch_overhead_s=-1.0)


def test_a_calibration_becomes_a_model_whose_rates_overhead_and_restarts_are_the_measured_ones() -> None:
    from contracts.messages import MetricReport
    from evaluation.calibrate import Calibration, Drain, model_file

    def drained(p: int, per_slot: float, overhead: float, batches: int = 2) -> Drain:
        # Reports of 5 s: full batches of 2 s of work per slot plus the overhead, back to back.
        reports = []
        for i, wobble in enumerate((0.95, 1.0, 1.05, 1.0)):
            records = round(per_slot * wobble * p * 2.0 * batches)
            busy = records / (per_slot * wobble)
            reports.append(MetricReport(job_id="j", timestamp=100.0 + 5 * i, interval_s=5.0, parallelism=p,
                                        records_in=records, records_out=records, busy_time_s=busy,
                                        batches=batches, batch_time_s=batches * overhead + busy / p))
        return Drain.of(p, reports)

    drains = [drained(1, 200.0, 0.5), drained(2, 200.0, 0.5), drained(4, 150.0, 0.5)]
    assert drains[0].batch_overhead_s == pytest.approx(0.5)
    assert drains[0].batch_work_s == pytest.approx(2.0)
    assert drains[0].slot_rate == pytest.approx(200.0, rel=0.01)
    model = model_file(Calibration(drains, [20.0, 30.0, 25.0], [10.0, 12.0]), "j", {"cost_ms": "5"}, 40.0)
    assert model.slot_rate == pytest.approx(200.0, rel=0.01)
    assert model.knee is not None and model.knee >= 2  # per-slot rate falls beyond 2 slots
    assert (model.downtime_up_s, model.downtime_down_s) == (25.0, 11.0)
    assert model.batch_overhead_s == pytest.approx(0.5) and model.batch_work_s == pytest.approx(2.0)
    assert 0 < model.rate_noise < 0.1
    assert model.measured["drains"][2]["parallelism"] == 4
    simulated = model.model()
    assert simulated.capacity(1) == pytest.approx(200.0 * 2.0 / 2.5, rel=0.01)  # the overhead's share is gone


def test_the_warm_up_records_each_reports_cost_per_batch_and_the_model_file_keeps_it() -> None:
    from contracts.messages import MetricReport
    from evaluation.calibrate import Calibration, Drain, batch_overheads, model_file

    def sent(batches: int, overhead: float, records: int = 500) -> MetricReport:
        busy = records / 250.0
        return MetricReport(job_id="j", timestamp=100.0, interval_s=5.0, parallelism=1, records_in=records,
                            records_out=records, busy_time_s=busy, batches=batches or None,
                            batch_time_s=batches * overhead + busy if batches else None)

    # A JVM warming up: the cost per batch falls; a report without batches or records has none.
    reports = [sent(2, 1.7), sent(4, 0.5), sent(0, 0.0), sent(5, 0.25), sent(5, 0.0, records=0)]
    assert batch_overheads(reports) == [1.7, 0.5, 0.25]
    drain = Drain(parallelism=1, reports=4, records=100, seconds=5.0, slot_rate=200.0, throughput=20.0,
                  batch_overhead_s=0.5, batch_work_s=2.0, rate_cv=None, rates=(190.0, 210.0, 200.0))
    model = model_file(Calibration([drain], [10.0], [5.0], warm_up=[1.7, 0.5, 0.25]), "j", {}, 40.0)
    assert model.measured["warm_up_overheads_s"] == [1.7, 0.5, 0.25]


def test_a_calibration_with_too_few_reports_for_the_noise_says_so() -> None:
    from evaluation.calibrate import Calibration, Drain, model_file

    drain = Drain(parallelism=1, reports=1, records=100, seconds=5.0, slot_rate=200.0, throughput=20.0,
                  batch_overhead_s=0.5, batch_work_s=2.0, rate_cv=None, rates=(200.0,))
    with pytest.raises(RuntimeError, match="rate noise"):
        model_file(Calibration([drain], [10.0], [5.0]), "j", {}, 40.0)


def test_the_rate_noise_can_come_from_the_levels_held_between_restarts() -> None:
    from evaluation.calibrate import Calibration, Drain, model_file

    # One batch per drain gives no report-to-report spread; the steady levels still measure it.
    drain = Drain(parallelism=1, reports=1, records=100, seconds=5.0, slot_rate=200.0, throughput=20.0,
                  batch_overhead_s=0.5, batch_work_s=2.0, rate_cv=None, rates=(200.0,))
    levels = [[190.0, 210.0, 200.0], [95.0, 105.0]]  # +-5 % around each level's own mean
    model = model_file(Calibration([drain], [10.0], [5.0], levels), "j", {}, 40.0)
    relative = [0.95, 1.05, 1.0, 0.95, 1.05]
    expected = statistics.stdev(relative) / math.sqrt(2)
    assert model.rate_noise == pytest.approx(expected, abs=1e-4)
    assert model.measured["steady_rates"] == levels


def test_capacity_at_unseen_parallelisms_is_the_planners_prediction_from_the_smallest_two() -> None:
    from evaluation.calibrate import Drain, unseen_capacities

    def drain(p: int, slot_rate: float, throughput: float) -> Drain:
        return Drain(parallelism=p, reports=6, records=1000, seconds=30.0, slot_rate=slot_rate, throughput=throughput,
                     batch_overhead_s=0.5, batch_work_s=2.0, rate_cv=0.05, rates=(slot_rate,) * 4)

    # Linear at 200 rec/s per busy slot-second; a full batch is 2 s of work and 0.5 s of overhead, so
    # p slots drain 200 p x 2 / 2.5 = 160 p rec/s. At 4 slots the job does worse than linear.
    rows = unseen_capacities([drain(1, 200.0, 160.0), drain(2, 200.0, 320.0), drain(3, 200.0, 480.0),
                              drain(4, 150.0, 400.0)])
    assert [r["parallelism"] for r in rows] == [3, 4]
    assert rows[0]["predicted"] == pytest.approx(480.0, rel=1e-3) and abs(rows[0]["error"]) < 1e-3
    assert rows[1]["predicted"] == pytest.approx(640.0, rel=1e-3) and rows[1]["error"] == pytest.approx(0.6, abs=1e-3)
    assert unseen_capacities([drain(1, 200.0, 160.0)]) == []


@given(share=st.floats(0.05, 1.0), task_s=st.sampled_from([0.0, 0.3]))
def test_simulated_micro_batches_show_the_models_fixed_cost_per_batch(share: float, task_s: float) -> None:
    from evaluation.jobmodel import micro_batches

    base = {"name": "m", "slot_rate": 200.0, "downtime_up_s": 20.0, "downtime_down_s": 10.0, "rate_noise": 0.1}
    model = JobModelFile(**base, batch_overhead_s=0.4, batch_work_s=5.0, task_overhead_s=task_s).model()
    share = min(share, model.batch_efficiency)  # a saturated job works this share of its time on records
    batches = micro_batches(model, 600.0, share)
    assert batches is not None
    busy_per_slot = share * 600.0 + batches * task_s
    overhead = (600.0 - busy_per_slot) / batches  # Analysis.batch_overhead_s's formula
    assert overhead == pytest.approx(0.4, rel=0.02)
    assert micro_batches(JobModelFile(**base).model(), 600.0, share) is None


@pytest.mark.parametrize("trigger_s", [0.0, 1.0])
@pytest.mark.parametrize("task_s", [0.0, 0.5])
def test_a_task_cost_lowers_small_batch_rates_and_the_planner_sees_through_it(task_s: float,
                                                                              trigger_s: float) -> None:
    """The simulated reports of a job with a per-task cost: DS2's rate falls at low load, the batch
    overhead is measured exactly, and plan.batching's fit turns a low-load rate into the capacity,
    with batches back to back or started by a trigger."""
    from evaluation.jobmodel import JobState, advance, report
    from plan.batching import BatchCost

    model = JobModelFile(name="m", slot_rate=200.0, downtime_up_s=20.0, downtime_down_s=10.0, rate_noise=0.0,
                         batch_overhead_s=0.4, batch_work_s=5.0, task_overhead_s=task_s,
                         trigger_interval_s=trigger_s).model()
    p = 2
    capacity = model.capacity(p)
    assert capacity == pytest.approx(p * 200.0 * 5.0 / 5.4, rel=1e-9)  # full batches: DS2 rate x share
    batch, rates = None, {}
    for load in (0.2, 0.5, 0.8, 1.2, 0.3, 0.6, 1.2, 0.4):
        state = JobState(parallelism=[p], backlog=5000.0 if load > 1 else 0.0)
        outcome = advance(model, state, 0.0, 60.0, load * capacity)
        r = report(model, state, "j", 60.0, outcome, load * capacity)
        assert r is not None and r.batches
        overhead = (r.batch_time_s - r.busy_time_s / p) / r.batches
        assert overhead == pytest.approx(0.4, rel=0.05)
        work, records = r.busy_time_s / (p * r.batches), r.records_in / (p * r.batches)
        rates[load] = r.records_in / r.busy_time_s
        batch = BatchCost.first(overhead, work, load > 1, records) if batch is None else \
            batch.add(overhead, work, load > 1, records)
    assert batch is not None
    if task_s == 0:
        assert rates[0.2] == pytest.approx(rates[1.2], rel=1e-3)  # records are whole
        return
    assert rates[0.2] < 0.8 * rates[1.2]
    low = JobState(parallelism=[p])
    outcome = advance(model, low, 0.0, 60.0, 0.2 * capacity)
    r = report(model, low, "j", 60.0, outcome, 0.2 * capacity)
    assert r is not None and r.batches
    seen = p * r.records_in / r.busy_time_s * batch.saturation_factor(r.records_in / (p * r.batches))
    assert seen * batch.efficiency == pytest.approx(capacity, rel=0.03)


def test_a_trigger_spaces_a_quiet_jobs_batches_so_its_rate_at_low_load_is_higher() -> None:
    """A processing-time trigger starts a batch at most once per interval: a job with little to do
    runs one batch a second instead of one every (fixed costs) / (1 - share) seconds, and pays fewer
    task costs, as the live job does (its trigger is the runner's 1 s)."""
    from evaluation.jobmodel import JobState, advance, report

    base = {"name": "m", "slot_rate": 240.0, "downtime_up_s": 11.0, "downtime_down_s": 7.0, "rate_noise": 0.0,
            "batch_overhead_s": 0.24, "batch_work_s": 5.0, "task_overhead_s": 0.19}
    rates, counts = {}, {}
    for trigger in (0.0, 1.0):
        model = JobModelFile(**base, trigger_interval_s=trigger).model()
        state = JobState(parallelism=[2])
        outcome = advance(model, state, 0.0, 60.0, 150.0)
        r = report(model, state, "j", 60.0, outcome, 150.0)
        assert r is not None and r.batches and r.batch_time_s is not None
        rates[trigger], counts[trigger] = r.records_in / r.busy_time_s, r.batches
        assert (r.batch_time_s - r.busy_time_s / 2) / r.batches == pytest.approx(0.24, rel=0.05)
    assert counts[1.0] == 60 and counts[0.0] > 1.5 * 60
    assert rates[1.0] > 1.2 * rates[0.0]
    # Saturated, the trigger changes nothing: batches run back to back, full.
    full = {t: advance(JobModelFile(**base, trigger_interval_s=t).model(), JobState(parallelism=[2], backlog=1e6),
                       0.0, 60.0, 600.0) for t in (0.0, 1.0)}
    assert full[0.0] == full[1.0]
