"""Daedalus's capacity model: skew-aware worker capacity, decaying averages, scaling curve, hybrid."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analyze.capacity import (
    MAX_EXPONENT,
    MIN_EXPONENT,
    CapacityEstimate,
    CapacityModel,
    IdleWindow,
    UnknownCapacity,
    choose_capacity,
    fit_scaling_curve,
    skew_aware_capacity,
)
from analyze.welford import CoMoments

# Three workers with stable skew (Daedalus, Fig. 4): at any load the second runs at 3/4 and the
# third at 1/2 of the busiest's CPU. Each processes 50 + 900 x utilization records/s.
SKEW = {"a": 0.8, "b": 0.6, "c": 0.4}


def throughput(u: float) -> float:
    return 50.0 + 900.0 * u


def skewed_windows(loads: list[float]) -> list[dict[str, tuple[float, float]]]:
    return [{w: (share * load, throughput(share * load)) for w, share in SKEW.items()} for load in loads]


def test_capacity_is_skew_aware_as_in_the_papers_figure() -> None:
    model = CapacityModel()
    for window in skewed_windows([0.5, 0.6, 0.7, 0.8, 0.9, 1.0]):
        measured = model.observe(3, window)
    # When "a" saturates, "b" runs at 0.6/0.8 = 75% and "c" at 50%: they cannot receive more.
    by_worker = {w.worker: w for w in measured.workers}
    assert by_worker["a"].saturation_utilization == pytest.approx(1.0)
    assert by_worker["b"].saturation_utilization == pytest.approx(0.75)
    assert by_worker["c"].saturation_utilization == pytest.approx(0.5)
    assert {w.method for w in measured.workers} == {"regression"}
    assert by_worker["b"].capacity == pytest.approx(throughput(0.75))
    expected = throughput(1.0) + throughput(0.75) + throughput(0.5)  # 2175 rec/s
    assert measured.capacity == pytest.approx(expected)
    assert measured.capacity < 3 * throughput(1.0)  # what ignoring skew would promise: 2850 rec/s
    # The decaying average still remembers the first windows' ratio estimates (fewer than
    # min_samples points, which overestimate with a positive intercept); it forgets them at 0.7^n.
    assert model.capacity_at(3) > expected * 1.005
    for window in skewed_windows([0.5, 0.6, 0.7, 0.8, 0.9, 1.0] * 2):
        model.observe(3, window)
    assert model.capacity_at(3) == pytest.approx(expected, rel=1e-3)


def test_noisy_skewed_workers_are_estimated_within_two_percent() -> None:
    rng = np.random.default_rng(3)
    model = CapacityModel()
    for load in rng.uniform(0.4, 1.0, 30):
        window = {w: (share * load, throughput(share * load) + rng.normal(0, 5)) for w, share in SKEW.items()}
        measured = model.observe(3, window)
    expected = throughput(1.0) + throughput(0.75) + throughput(0.5)
    assert measured.capacity == pytest.approx(expected, rel=0.02)


def test_without_utilization_spread_the_ratio_estimate_is_used() -> None:
    model = CapacityModel()
    for _ in range(5):
        measured = model.observe(1, {"only": (0.5, 400.0)})
    (worker,) = measured.workers
    assert worker.method == "ratio"
    assert measured.capacity == pytest.approx(800.0)  # 400 rec/s at 50% CPU -> 800 at 100%


def test_a_negative_slope_falls_back_to_the_ratio() -> None:
    regression = CoMoments()
    regression.extend([(0.5, 500.0), (0.6, 480.0), (0.7, 460.0)])
    measured = skew_aware_capacity({"w": regression}, {"w": 0.7})
    assert measured.workers[0].method == "ratio"
    assert measured.capacity == pytest.approx(480.0 / 0.6)


def test_an_idle_window_raises_and_changes_nothing() -> None:
    model = CapacityModel()
    model.observe(2, {"a": (0.5, 500.0), "b": (0.25, 250.0)})
    before = model.to_dict()
    with pytest.raises(IdleWindow):
        model.observe(4, {"a": (0.0, 0.0), "b": (0.0, 0.0)})
    assert model.to_dict() == before


def test_an_idle_worker_adds_no_capacity() -> None:
    model = CapacityModel()
    measured = model.observe(2, {"a": (0.5, 500.0), "idle": (0.0, 0.0)})
    assert measured.capacity == pytest.approx(1000.0)
    assert "idle" not in model.workers


def test_regressions_restart_when_the_scale_out_changes() -> None:
    model = CapacityModel()
    for window in skewed_windows([0.5, 0.7, 0.9]):
        model.observe(3, window)
    assert model.workers["a"].count == 3
    model.observe(4, {"a": (0.5, 500.0)})
    assert model.parallelism == 4
    assert set(model.workers) == {"a"}
    assert model.workers["a"].count == 1
    assert set(model.observed) == {3, 4}


def test_observed_capacity_is_a_decaying_average() -> None:
    model = CapacityModel(alpha=0.3)
    assert model.record(4, 100.0) == 100.0
    assert model.record(4, 200.0) == pytest.approx(130.0)
    assert model.record(4, 200.0) == pytest.approx(151.0)
    estimate = model.estimate(4)
    assert estimate.basis == "observed"
    assert estimate.value == pytest.approx(151.0)


def test_one_seen_scale_out_extrapolates_proportionally() -> None:
    model = CapacityModel()
    model.record(4, 400.0)
    estimate = model.estimate(8)
    assert estimate.basis == "proportional"
    assert estimate.value == pytest.approx(800.0)
    assert estimate.points == ((4, 400.0),)


def test_two_seen_scale_outs_fit_a_power_law() -> None:
    model = CapacityModel()
    for p in (2, 8):
        model.record(p, 100.0 * p**0.75)
    estimate = model.estimate(4)
    assert estimate.basis == "scaling_curve"
    assert estimate.exponent == pytest.approx(0.75)
    assert estimate.value == pytest.approx(100.0 * 4**0.75)
    assert estimate.value < 4 * model.capacity_at(2) / 2  # sublinear: below the proportional guess


def test_power_law_exponent_is_clamped() -> None:
    _, k, _ = fit_scaling_curve({1: 100.0, 2: 300.0})  # k = log2(3) = 1.58: superlinear
    assert k == MAX_EXPONENT
    c, k, _ = fit_scaling_curve({2: 300.0, 4: 200.0})  # falling capacity
    assert k == MIN_EXPONENT
    # c is refitted for the clamped k: the curve passes through the points' geometric centre.
    assert math.log(c) + k * (math.log(2) + math.log(4)) / 2 == pytest.approx((math.log(300) + math.log(200)) / 2)


def test_nothing_measured_is_an_error_not_none() -> None:
    with pytest.raises(UnknownCapacity):
        CapacityModel().estimate(3)


def test_model_round_trips_through_json() -> None:
    model = CapacityModel(alpha=0.5)
    for window in skewed_windows([0.5, 0.7, 0.9]):
        model.observe(3, window)
    model.record(5, 1234.5)
    restored = CapacityModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert restored == model
    assert restored.estimate(7) == model.estimate(7)


def test_invalid_settings_and_samples_are_refused() -> None:
    with pytest.raises(ValueError):
        CapacityModel(alpha=0.0)
    with pytest.raises(ValueError):
        CapacityModel().observe(2, {"a": (float("nan"), 1.0)})
    with pytest.raises(ValueError):
        CapacityModel().record(2, -1.0)


def test_hybrid_uses_ds2_when_busy_time_is_reported() -> None:
    estimate = CapacityEstimate(900.0, "observed", ((4, 900.0),))
    choice = choose_capacity(250.0, estimate, 4)
    assert choice.source == "ds2"
    assert choice.value == pytest.approx(1000.0)
    assert "busy time is reported" in choice.why


def test_hybrid_uses_the_regression_without_busy_time() -> None:
    estimate = CapacityEstimate(1600.0, "proportional", ((4, 800.0),), exponent=1.0)
    value, source, why = choose_capacity(None, estimate, 8)
    assert (value, source) == (1600.0, "regression")
    assert "not reported" in why and "one scale-out seen" in why
    assert choose_capacity(0.0, estimate, 8).source == "regression"


def test_hybrid_without_any_capacity_raises() -> None:
    with pytest.raises(UnknownCapacity):
        choose_capacity(None, None, 4)
