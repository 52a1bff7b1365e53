"""What the default planner plans with: the capacity per parallelism (measured where known, pooled
elsewhere, micro-batch windows corrected for their fixed cost) and the planned arrival rates from a
forecast."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.analyses import Analysis, ForecastView
from plan.capacity_estimate import Measured, capacities
from plan.policies.default import CostPlanner, PlannerMemory, planned_rates


def test_capacity_is_measured_where_known_and_pooled_elsewhere() -> None:
    known = {"2": Measured(capacity=400.0, n=100), "4": Measured(capacity=760.0, n=100)}
    cap = capacities(known, 8, noise_cv=0.0, z=1.28)
    assert cap[2] == pytest.approx(400.0, rel=0.02) and cap[4] == pytest.approx(760.0, rel=0.02)
    assert cap[1] <= 200.0  # no better than linear below a measured point
    assert 760.0 < cap[8] < 2 * 760.0  # sub-linear beyond, along the fitted curve
    assert (np.diff(cap[1:]) >= 0).all()


def test_one_noisy_window_at_a_new_parallelism_does_not_outweigh_the_rest() -> None:
    known = {"2": Measured(capacity=400.0, n=200), "8": Measured(capacity=1000.0, n=1)}  # truth near 1500
    cap = capacities(known, 8, noise_cv=0.1, z=1.28)
    assert cap[8] > 1100.0


def batch_window(t: float, records_per_task: float, arrival: float, backlog: int, fixed: float = 0.19,
                 per_record: float = 1 / 242, overhead: float = 0.3) -> Analysis:
    """A one-slot window of a micro-batch job whose tasks cost `fixed` + records x `per_record`
    busy seconds (the calibrated demo job's costs)."""
    busy = fixed + records_per_task * per_record
    return Analysis(job_id="j", window_end=t, parallelism=1, valid=True, true_processing_rate=records_per_task / busy,
                    true_output_rate=0.0, observed_processing_rate=arrival, utilization=0.5,
                    batch_overhead_s=overhead, batch_work_s=busy, arrival_rate=arrival, backlog=backlog, closed_at=t)


def test_small_batches_measured_before_the_correction_is_known_do_not_hold_the_capacity_down() -> None:
    # Live (cos, 2026-11-27): a job that starts at a low load measures 140-170 rec/s per slot in small
    # batches for minutes, its full batches 240. Averaged in uncorrected, those windows held the planned
    # capacity at one slot near 200 rec/s for the rest of the run.
    planner, memory = CostPlanner(), PlannerMemory()
    full = 1250.0
    truth = full / (0.19 + full / 242)
    sizes = [60, 80, 100, 120, 90, 70, 110, 100, 130, 85, 95, 105]
    for i, x in enumerate(sizes):
        memory = planner._learn(memory, batch_window(10.0 * i, x, arrival=x, backlog=50))
    assert memory.known["1"].provisional and memory.known["1"].capacity < 0.75 * truth
    memory = planner._learn(memory, batch_window(200.0, full, arrival=300.0, backlog=6000))
    assert not memory.known["1"].provisional
    for i, x in enumerate([100, 90, 120, 80, 110, 100]):
        memory = planner._learn(memory, batch_window(210.0 + 10 * i, x, arrival=x, backlog=50))
    assert memory.known["1"].capacity == pytest.approx(truth, rel=0.03)


def test_a_window_without_micro_batch_metrics_is_never_provisional() -> None:
    planner, memory = CostPlanner(), PlannerMemory()
    window = batch_window(10.0, 100, arrival=100, backlog=0).model_copy(update={"batch_overhead_s": None,
                                                                              "batch_work_s": None})
    memory = planner._learn(memory, window)
    assert not memory.known["1"].provisional
    measured = memory.known["1"]
    assert measured.learned(50.0, provisional=True) == measured  # a provisional window moves no corrected estimate
    assert measured.learned(50.0, provisional=False).n == 2


def test_a_forecast_raises_the_planned_rate_only_when_it_is_trusted() -> None:
    view = ForecastView(values=[100.0, 150.0, 200.0], upper=[110.0, 170.0, 230.0], start=60.0, step_s=60.0,
                        method="arima", wape=0.05)
    rates = planned_rates(100.0, view, 0.0, 4, 60.0)
    # The upper quantile's change from its first point (110 -> 230), on the level: the band at the first point
    # is not added on top of the level's own quantile.
    assert rates[0] == 100.0 and rates[-1] == pytest.approx(100.0 * 230.0 / 110.0)
    assert (planned_rates(100.0, view, 0.0, 4, 60.0, trusted=False) == 100.0).all()
    far = view.model_copy(update={"values": [300.0, 300.0, 300.0]})
    assert (planned_rates(100.0, far, 0.0, 4, 60.0) == 100.0).all()

    narrow = planned_rates(100.0, view, 0.0, 4, 60.0, band=math.log(1.05))  # errors of 5 % at most
    # The interval no wider than the errors seen: capped at 5 % over the point forecast at every lead, so only
    # the point forecast's change (100 -> 200) is left.
    assert narrow[-1] == pytest.approx(200.0)


def test_the_expected_rates_follow_the_point_forecast_down_too() -> None:
    falling = ForecastView(values=[200.0, 150.0, 100.0], upper=[220.0, 180.0, 130.0], start=60.0, step_s=60.0,
                           method="arima", wape=0.05)
    assert (planned_rates(200.0, falling, 0.0, 4, 60.0) == 200.0).all()  # planned with: never below the level
    expected = planned_rates(200.0, falling, 0.0, 4, 60.0, band=0.0, floor=False)
    assert expected[0] == 200.0  # before the forecast's first point: the level
    assert expected[1:].tolist() == pytest.approx([175.0, 125.0, 100.0])  # the point forecast at the steps' middles
    assert (planned_rates(200.0, falling, 0.0, 4, 60.0, trusted=False, floor=False) == 200.0).all()


def capacities_one_p_at_a_time(known: dict[str, Measured], top: int, noise_cv: float, z: float,
                               planned: dict[int, float], planned_error: float) -> np.ndarray:
    """The pooled estimate at each p on its own (the docstring of `capacities`, written as a loop)."""
    from plan.capacity_estimate import EXPONENT_PRIOR, EXPONENT_RANGE, EXTRAPOLATION_ERROR, FIT_MIN_WINDOWS

    points = sorted((int(p), m) for p, m in known.items() if m.capacity > 0)
    planned = {p: c for p, c in planned.items() if 1 <= p <= top and c > 0}
    out = np.zeros(top + 1)
    settled = [(p, m) for p, m in points if m.n >= FIT_MIN_WINDOWS]
    exponent = EXPONENT_PRIOR if len(settled) < 2 else float(np.clip(np.polyfit(
        np.log([p for p, _ in settled]), np.log([m.capacity for _, m in settled]), 1)[0], *EXPONENT_RANGE))
    for p in range(1, top + 1):
        pairs = [(m.capacity * (p / q) ** (exponent if p > q else 1.0),
                  noise_cv**2 / m.effective + (math.log2(p / q) * EXTRAPOLATION_ERROR) ** 2) for q, m in points]
        pairs += [(planned[p], planned_error**2)] if p in planned else []
        if pairs:
            weights = [1 / max(v, 1e-12) for _, v in pairs]
            estimate = sum(w * e for w, (e, _) in zip(weights, pairs, strict=True)) / sum(weights)
            out[p] = estimate * max(0.5, 1 - z * math.sqrt(1 / sum(weights)))
    return np.maximum.accumulate(out)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(1, 64), st.tuples(st.floats(1.0, 1e6), st.integers(1, 400)), max_size=8),
       st.integers(1, 64), st.floats(0.0, 0.5), st.floats(0.0, 2.0),
       st.dictionaries(st.integers(-2, 70), st.floats(0.0, 1e6), max_size=4), st.floats(0.0, 0.5))
def test_capacities_pool_each_p_as_the_docstring_says(points: dict[int, tuple[float, int]], top: int,
                                                        noise_cv: float, z: float, planned: dict[int, float],
                                                        planned_error: float) -> None:
    known = {str(p): Measured(capacity=c, n=n) for p, (c, n) in points.items()}
    assert np.allclose(capacities(known, top, noise_cv, z, planned, planned_error),
                       capacities_one_p_at_a_time(known, top, noise_cv, z, planned, planned_error),
                       rtol=1e-12, atol=0.0)
