"""The noise-aware bound (evaluation/noise_bound.py) and the oracle's schedule replay it is judged with."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.noise_bound import noise_aware_bound, noise_draws
from evaluation.oracle import oracle_with_restarts, replay_schedule

DT = 5.0
CAPACITY = np.array([0.0, 100.0, 190.0, 270.0, 340.0, 400.0, 450.0])
ARGS = {"restart_downtime_s": 10.0, "backlog_target_s": 30.0, "grace_s": 0.0, "decision_s": 10.0,
        "check_every": 2, "first_decision_s": 10.0}


def load(levels: list[float], steps_per_level: int = 24) -> np.ndarray:
    return np.repeat(np.asarray(levels, dtype=float), steps_per_level)


levels = st.lists(st.floats(50.0, 420.0), min_size=2, max_size=5)


def start_for(rates: np.ndarray) -> int:
    return int(np.searchsorted(CAPACITY[1:], rates[0])) + 1


@settings(max_examples=15, deadline=None)
@given(levels=levels, seed=st.integers(0, 1000))
def test_replaying_the_oracles_schedule_under_its_own_noise_gives_its_backlog(levels: list[float], seed: int) -> None:
    rates = load(levels)
    factors = noise_draws(len(rates) // 2, 2, 0.1, 1, seed)[0]
    args = ARGS | {"initial_parallelism": start_for(rates), "rate_factors": factors}
    result = oracle_with_restarts(rates, CAPACITY, DT, **args)
    replayed = replay_schedule(result.parallelism, rates, CAPACITY, DT, **args)
    assert np.allclose(replayed.backlog, result.backlog)
    assert replayed.violations * DT == result.violation_s and replayed.rescales == result.rescales


def test_a_schedule_changing_off_a_decision_time_is_refused() -> None:
    rates = load([120.0, 300.0], 4)
    schedule = np.array([2, 2, 2, 3, 3, 3, 3, 3])  # changes after 3 steps; decisions every 2
    with pytest.raises(ValueError, match="decision times"):
        replay_schedule(schedule, rates, CAPACITY, DT, **ARGS, initial_parallelism=2)


def test_without_noise_the_bound_is_the_oracle() -> None:
    rates = load([120.0, 330.0, 200.0])
    args = ARGS | {"initial_parallelism": 2}
    bound = noise_aware_bound(rates, CAPACITY, DT, sigma=0.0, scenarios=3, **args)
    oracle = oracle_with_restarts(rates, CAPACITY, DT, **args)
    assert bound.accepted and bound.margin == 1.0 and bound.slot_seconds == oracle.slot_seconds


@settings(max_examples=10, deadline=None)
@given(levels=levels, sigma=st.sampled_from([0.05, 0.1, 0.2]), seed=st.integers(0, 100))
def test_the_bound_costs_at_least_the_noise_free_oracle_and_keeps_its_promise(
        levels: list[float], sigma: float, seed: int) -> None:
    """Planning on less capacity than the mean never costs less; an accepted schedule keeps the target
    (at most the allowed share beyond it) on at least `probability` of the draws it was judged on."""
    rates = load(levels)
    args = ARGS | {"initial_parallelism": start_for(rates)}
    bound = noise_aware_bound(rates, CAPACITY, DT, sigma=sigma, probability=0.8, scenarios=10, seed=seed, **args)
    free = oracle_with_restarts(rates, CAPACITY, DT, **args)
    if free.certified_optimal:
        assert bound.slot_seconds >= free.slot_seconds - 1e-6
    assert bound.margin <= 1.0
    if bound.accepted:
        draws = noise_draws(len(rates) // 2, 2, sigma, 10, seed)
        beyond = [replay_schedule(bound.parallelism, rates, CAPACITY, DT, rate_factors=d, **args).violations * 2 * DT
                  for d in draws]
        allowed = 0.001 * len(rates) * DT
        assert np.mean(np.array(beyond) <= allowed + 1e-9) >= 0.8


def test_more_noise_asks_for_a_larger_margin() -> None:
    rates = load([150.0, 260.0, 300.0, 200.0], 60)
    args = ARGS | {"initial_parallelism": 2}
    calm = noise_aware_bound(rates, CAPACITY, DT, sigma=0.02, scenarios=20, **args)
    noisy = noise_aware_bound(rates, CAPACITY, DT, sigma=0.2, scenarios=20, **args)
    assert calm.accepted and noisy.accepted
    assert noisy.margin < calm.margin and noisy.slot_seconds > calm.slot_seconds


def test_when_no_margin_keeps_the_target_the_least_violating_schedule_is_returned() -> None:
    rates = load([150.0, 440.0], 60)  # 440 rec/s needs 98 % of the largest capacity: noise of 20 % breaks it
    bound = noise_aware_bound(rates, CAPACITY, DT, sigma=0.2, scenarios=10, **ARGS, initial_parallelism=2)
    assert not bound.accepted and bound.beyond_target_s > 0
    assert bound.parallelism.max() == len(CAPACITY) - 1  # the most it can do: the largest parallelism at the peak


def test_the_bound_does_not_take_the_noise() -> None:
    with pytest.raises(ValueError, match="sigma"):
        noise_aware_bound(load([100.0]), CAPACITY, DT, sigma=0.1, rate_factors=np.ones(24), **ARGS)
