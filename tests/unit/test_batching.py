"""The micro-batch cost model (plan.batching): the per-task fit and the saturation factor."""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from contracts.plan_state import Downtimes
from plan.batching import MAX_SATURATION_FACTOR, BatchCost, TaskCost


def ds2_rate(records: float, fixed: float, per_record: float) -> float:
    return records / (fixed + records * per_record)


@settings(max_examples=60, deadline=None)
@given(fixed=st.floats(0.0, 1.0), per_record=st.floats(0.001, 0.02),
       sizes=st.lists(st.floats(10, 2000), min_size=8, max_size=40))
def test_task_fit_recovers_the_line(fixed: float, per_record: float, sizes: list[float]) -> None:
    cost = TaskCost()
    for x in sizes:
        cost = cost.add(x, fixed + x * per_record)
    mean = sum(sizes) / len(sizes)
    spread = math.sqrt(sum((x - mean) ** 2 for x in sizes) / len(sizes)) / mean
    assume(spread > 0.3)  # else too alike to tell the two costs apart (the fit's bound is 0.25)
    fit = cost.fit()
    assert fit is not None
    got_fixed, got_per_record = fit
    mean_busy = fixed + mean * per_record
    if fixed <= 0.9 * mean_busy:  # else the fit clips the fixed cost on purpose
        assert math.isclose(got_fixed, fixed, rel_tol=1e-6, abs_tol=1e-6)
        assert math.isclose(got_per_record, per_record, rel_tol=1e-6)


def test_no_fit_from_alike_batches() -> None:
    cost = TaskCost()
    for i in range(50):
        x = 100 + (i % 3)
        cost = cost.add(x, 0.4 + 0.004 * x)
    assert cost.fit() is None


def test_saturation_factor_turns_a_small_batch_rate_into_a_full_one() -> None:
    fixed, per_record = 0.5, 0.004
    full_records = 1250
    full_work = fixed + full_records * per_record
    batch = BatchCost.first(0.4, full_work, True, full_records)
    for x in [100, 300, 600, 900, 1250, 200, 1250, 150]:
        batch = batch.add(0.4, fixed + x * per_record, x == 1250, x)
    factor = batch.saturation_factor(150)
    assert math.isclose(factor * ds2_rate(150, fixed, per_record), ds2_rate(full_records, fixed, per_record),
                        rel_tol=1e-3)
    assert batch.saturation_factor(full_records) == 1.0
    assert batch.saturation_factor(None) == 1.0
    assert 1.0 <= batch.saturation_factor(1) <= MAX_SATURATION_FACTOR


def test_no_factor_before_a_full_batch() -> None:
    batch = BatchCost.first(0.4, 0.5 + 0.004 * 100, False, 100)
    for x in [100, 300, 600, 900, 200]:
        batch = batch.add(0.4, 0.5 + 0.004 * x, False, x)
    assert batch.full_work_s is None
    assert batch.saturation_factor(100) == 1.0


def test_typical_restart_is_the_median_of_its_direction_then_the_other() -> None:
    downtimes = Downtimes(up=[10.0, 30.0, 12.0], down=[])
    assert downtimes.typical("up", 99.0) == 12.0
    assert downtimes.typical("down", 99.0) == 6.0  # a scale-in: half the scale-outs' (Daedalus's priors)
    assert Downtimes(down=[5.0]).typical("up", 99.0) == 10.0
    assert Downtimes().typical("up", 99.0) == 99.0
    assert Downtimes().typical("down", 99.0) == 49.5
    assert Downtimes(up=[1.0], down=[4.0, 6.0]).typical("down", 99.0) == 5.0
