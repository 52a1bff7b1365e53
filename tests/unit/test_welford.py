"""Exact Welford moments and Chan's merge against numpy; the regression slope; serialization."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from analyze.welford import CoMoments, DegenerateRegression, Line, Moments

values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def tolerance(xs: list[float]) -> float:
    # Rounding error of any summation grows with n and the squared magnitude of the data.
    scale = max(1.0, max(abs(x) for x in xs))
    return 1e-12 * len(xs) * scale * scale


def moments(xs: list[float]) -> Moments:
    m = Moments()
    m.extend(xs)
    return m


def comoments(pairs: list[tuple[float, float]]) -> CoMoments:
    c = CoMoments()
    c.extend(pairs)
    return c


@settings(max_examples=150, deadline=None)
@given(xs=st.lists(values, min_size=2, max_size=60), data=st.data())
def test_moments_and_merge_agree_with_numpy(xs: list[float], data: st.DataObject) -> None:
    split = data.draw(st.integers(min_value=0, max_value=len(xs)), label="split")
    whole = moments(xs)
    merged = moments(xs[:split]).merge(moments(xs[split:]))
    arr = np.array(xs)
    for m in (whole, merged):
        assert m.count == len(xs)
        assert m.mean == pytest.approx(float(arr.mean()), rel=1e-9, abs=1e-9 * max(1.0, float(np.abs(arr).max())))
        assert m.variance() == pytest.approx(float(arr.var()), rel=1e-9, abs=tolerance(xs))
        assert m.variance(sample=True) == pytest.approx(float(arr.var(ddof=1)), rel=1e-9, abs=tolerance(xs))
        assert m.sample_variance == m.variance(sample=True)
        assert m.std() == pytest.approx(float(arr.std()), rel=1e-6, abs=tolerance(xs) ** 0.5)


@settings(max_examples=150, deadline=None)
@given(pairs=st.lists(st.tuples(values, values), min_size=2, max_size=60), data=st.data())
def test_comoments_and_merge_agree_with_numpy(pairs: list[tuple[float, float]], data: st.DataObject) -> None:
    split = data.draw(st.integers(min_value=0, max_value=len(pairs)), label="split")
    whole = comoments(pairs)
    merged = comoments(pairs[:split]).merge(comoments(pairs[split:]))
    x, y = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    tol = tolerance([v for p in pairs for v in p])
    for c in (whole, merged):
        assert c.count == len(pairs)
        assert c.x.variance() == pytest.approx(float(x.var()), rel=1e-9, abs=tol)
        assert c.y.variance() == pytest.approx(float(y.var()), rel=1e-9, abs=tol)
        assert c.covariance() == pytest.approx(float(np.cov(x, y, ddof=0)[0, 1]), rel=1e-9, abs=tol)
        assert c.covariance(sample=True) == pytest.approx(float(np.cov(x, y, ddof=1)[0, 1]), rel=1e-9, abs=tol)


@settings(max_examples=100, deadline=None)
@given(
    xs=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=3, max_size=50, unique=True),
    slope=st.floats(min_value=-5e3, max_value=5e3),
    intercept=st.floats(min_value=-1e3, max_value=1e3),
    splits=st.lists(st.integers(min_value=0, max_value=50), max_size=4),
)
def test_exact_line_is_recovered_through_any_batching(
    xs: list[float], slope: float, intercept: float, splits: list[int]
) -> None:
    # Batches merged with Chan's formula must equal one stream: the batched update of Daedalus's
    # implementation does not (its slope is off by about 23% after the first batch).
    arr = np.array(xs)
    assume(arr.std() >= 0.01)  # nearly constant x: the slope is ill-conditioned for any method
    pairs = [(x, intercept + slope * x) for x in xs]
    cuts = sorted({0, len(pairs), *(min(s, len(pairs)) for s in splits)})
    total = CoMoments()
    for a, b in pairwise(cuts):
        total = total.merge(comoments(pairs[a:b]))
    expected_slope, expected_intercept = np.polyfit(arr, [p[1] for p in pairs], 1)
    assert total.slope == pytest.approx(slope, rel=1e-6, abs=1e-6)
    assert total.slope == pytest.approx(float(expected_slope), rel=1e-6, abs=1e-6)
    assert total.intercept == pytest.approx(float(expected_intercept), rel=1e-6, abs=1e-6)


def noisy_throughput(seed: int, n: int = 100) -> tuple[CoMoments, float]:
    """A worker processing 1000 rec/s per unit of CPU plus 20 rec/s of baseline, CPU between 20% and
    95%, throughput measured with 5 rec/s of noise (0.5-2.5% of it: CPU and throughput are tightly
    linear in Daedalus's measurements, Fig. 4b)."""
    rng = np.random.default_rng(seed)
    slope = 1000.0
    u = rng.uniform(0.2, 0.95, n)
    y = 20.0 + slope * u + rng.normal(0.0, 5.0, n)
    c = CoMoments()
    c.extend(zip(u.tolist(), y.tolist(), strict=True))
    return c, slope


def test_slope_error_below_one_percent_after_100_noisy_samples() -> None:
    c, slope = noisy_throughput(seed=7)
    assert abs(c.slope - slope) / slope < 0.01
    assert c.correlation() > 0.99


@settings(max_examples=100, derandomize=True, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_slope_error_below_one_percent_for_any_seed(seed: int) -> None:
    c, slope = noisy_throughput(seed)
    assert abs(c.slope - slope) / slope < 0.01


def test_degenerate_regression_raises_instead_of_returning_none() -> None:
    c = comoments([(0.5, 100.0), (0.5, 110.0), (0.5, 90.0)])
    with pytest.raises(DegenerateRegression):
        _ = c.slope
    with pytest.raises(ValueError):
        c.line()
    with pytest.raises(DegenerateRegression):
        _ = comoments([(0.5, 100.0)]).intercept


def test_line_predicts() -> None:
    line = comoments([(0.0, 10.0), (1.0, 30.0), (0.5, 20.0)]).line()
    assert line == Line(intercept=pytest.approx(10.0), slope=pytest.approx(20.0))
    assert line(0.25) == pytest.approx(15.0)


def test_variance_needs_samples_and_rejects_non_finite_input() -> None:
    with pytest.raises(ValueError):
        Moments().variance()
    with pytest.raises(ValueError):
        moments([1.0]).variance(sample=True)
    assert moments([1.0]).variance() == 0.0
    m = moments([1.0, 2.0])
    with pytest.raises(ValueError):
        m.add(float("nan"))
    with pytest.raises(ValueError):
        CoMoments().add(1.0, float("inf"))
    assert m == moments([1.0, 2.0])  # the rejected sample left no trace


def test_merge_with_empty_is_identity_and_leaves_operands_alone() -> None:
    a = moments([1.0, 2.0, 4.0])
    snapshot = Moments(a.count, a.mean, a.m2)
    assert a.merge(Moments()) == a
    assert Moments().merge(a) == a
    a.merge(moments([10.0]))
    assert a == snapshot


@settings(max_examples=100, deadline=None)
@given(
    xs=st.lists(values, max_size=20),
    pairs=st.lists(st.tuples(values, values), max_size=20),
)
def test_serialization_round_trips_exactly_through_json(xs: list[float], pairs: list[tuple[float, float]]) -> None:
    m, c = moments(xs), comoments(pairs)
    assert Moments.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert CoMoments.from_dict(json.loads(json.dumps(c.to_dict()))) == c


@pytest.mark.parametrize(
    "data",
    [
        {"count": -1, "mean": 0.0, "m2": 0.0},
        {"count": 1.5, "mean": 0.0, "m2": 0.0},
        {"count": 2, "mean": float("nan"), "m2": 0.0},
        {"count": 2, "mean": 0.0, "m2": -1.0},
        {"count": 2, "mean": 0.0},
    ],
)
def test_from_dict_rejects_corrupt_state(data: dict[str, object]) -> None:
    with pytest.raises((ValueError, KeyError)):
        Moments.from_dict(data)
