"""The oracle's rescale pruning (`rescale_candidates`) is exact: on random small problems with unequal up and down
pauses, set up as the evaluation suite sets them (half-window steps, a decision and a check at each window's end,
the first decision after one window, no grace, no replay), the pruned search finds the same optimum as the search
that simulates every (source, target) pair."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evaluation.oracle import _build
from evaluation.oracle_search import OracleModel, replay, rescale_candidates, solve

WINDOW_S = 10.0
STEPS_PER_WINDOW = 2  # the suite: the reporter's interval is half a window, the rule checked at the window's end
UNCUT = 10**6  # fronts never cut: both searches are exact


def suite_like(rates: list[float], capacity: list[float], *, up_s: float, down_s: float, start: int,
               backlog: float = 0.0, target_s: float = 10.0, factors: list[float] | None = None) -> OracleModel:
    """A problem as `evaluation.suite.oracle_for` poses it, one rate (and noise factor) per window."""
    return _build(
        np.repeat(np.asarray(rates, dtype=float), STEPS_PER_WINDOW), np.array([0.0, *capacity]),
        WINDOW_S / STEPS_PER_WINDOW, restart_downtime_s=up_s, downtime_down_s=down_s, ramp_s=0.0,
        rate_factors=None if factors is None else np.repeat(factors, STEPS_PER_WINDOW), replay_records=0.0,
        backlog_target_s=target_s, grace_s=0.0, decision_s=WINDOW_S, initial_parallelism=start,
        initial_backlog=backlog, max_front=UNCUT, check_every=STEPS_PER_WINDOW, first_decision_s=WINDOW_S,
        free_rescales=False,
    )


# Found by the property below: the cheapest schedule (4, 4, 1, 3, 4) rescales down to 1, then up to 3 without a
# pause, from a state that states at 4 and 2 dominate but whose rescale to 3 goes the quicker way (up).
QUICKER_UP = suite_like([10, 100, 70, 100, 10], [20, 60, 80, 120], up_s=0.0, down_s=10.0, start=4)


@st.composite
def problems(draw: st.DrawFn) -> OracleModel:
    slots = draw(st.integers(3, 6))
    capacity = sorted(draw(st.lists(st.integers(1, 12), min_size=slots, max_size=slots)))
    windows = draw(st.integers(3, 8))
    rates = draw(st.lists(st.integers(0, 13), min_size=windows, max_size=windows))
    factors = draw(st.lists(st.sampled_from([0.9, 1.0, 1.0, 1.1]), min_size=windows, max_size=windows))
    up_s, down_s = draw(st.lists(st.sampled_from([0.0, 2.5, 5.0, 10.0, 15.0, 20.0]), min_size=2, max_size=2,
                                 unique=True))
    return suite_like([10.0 * r for r in rates], [10.0 * c for c in capacity], up_s=up_s, down_s=down_s,
                      start=draw(st.integers(1, slots)), backlog=draw(st.sampled_from([0.0, 50.0, 300.0])),
                      target_s=draw(st.sampled_from([0.0, 5.0, 10.0, 30.0])), factors=factors)


@settings(max_examples=800, deadline=None)
@given(problems())
@example(QUICKER_UP)
def test_pruned_rescales_find_the_all_pairs_optimum(model: OracleModel) -> None:
    for feasible_only in (True, False):
        pruned = solve(model, UNCUT, optimistic=False, feasible_only=feasible_only)
        every = solve(model, UNCUT, optimistic=False, feasible_only=feasible_only, all_pairs=True)
        assert (pruned is None) == (every is None)
        if pruned is None or every is None:
            continue
        assert pruned[1:] == every[1:], (  # (violating steps, slot-steps)
            f"pruned {pruned[1:]} != all pairs {every[1:]}, up pause {model.downtime_s} s, "
            f"down pause {model.downtime_down_s} s")
        replayed = replay(model, pruned[0])
        assert (replayed.violations, replayed.cost) == pruned[1:]


def test_the_quicker_direction_is_searched() -> None:
    """Every schedule of `QUICKER_UP`, replayed: the least slot-steps that meet the rule is 32, and so is the
    pruned search's (it was 34 when the pruning ignored the direction)."""
    allowed = []
    for schedule in itertools.product(range(1, 5), repeat=5):
        try:
            run = replay(QUICKER_UP, np.array(schedule))
        except AssertionError:  # a rescale the model does not allow (before the first decision, during a pause)
            continue
        allowed.append((run.violations, run.cost))
    assert min(allowed) == (0, 32)
    found = solve(QUICKER_UP, UNCUT, optimistic=False, feasible_only=True)
    assert found is not None and found[1:] == (0, 32)


def test_a_source_dominated_in_the_slower_direction_is_kept() -> None:
    """Sources at 1 and 2 beat the source at 4 on objective and backlog, but a rescale to 3 goes up from them and
    down from 4: with a shorter down pause the source at 4 may be the better start, so it is kept for 3."""
    can = np.arange(3)
    obj = np.array([0, 0, 5])
    backlog = np.array([0.0, 0.0, 10.0])
    par = np.array([1, 2, 4])
    targets = np.array([1, 2, 3, 4])
    src, q = rescale_candidates(can, obj, backlog, par, targets, up_s=20.0, down_s=5.0)
    assert (2, 3) in set(zip(src.tolist(), q.tolist(), strict=True))
    src, q = rescale_candidates(can, obj, backlog, par, targets, up_s=5.0, down_s=5.0)
    assert 2 not in src.tolist()  # equal pauses: dominated for every target
