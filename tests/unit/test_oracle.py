"""The clairvoyant oracle (evaluation/oracle.py): exhaustive search on tiny instances, replayed schedules."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import evaluation.oracle as oracle_module
from evaluation.oracle import (
    OracleResult,
    covering_parallelism,
    oracle_with_restarts,
    oracle_without_restarts,
    useful_parallelisms,
)

DT = 10.0


@dataclass(frozen=True)
class Instance:
    rates: np.ndarray
    capacity: np.ndarray
    decision_s: float
    downtime_s: float
    replay: float
    target_s: float
    grace_s: float | None
    initial_parallelism: int
    initial_backlog: float
    ramp_s: float = 0.0  # in place: a scale-up runs at the old capacity this long after its downtime

    @property
    def grace(self) -> float:
        return self.downtime_s + self.ramp_s + self.target_s if self.grace_s is None else self.grace_s

    def kwargs(self) -> dict[str, float | int | None]:
        return dict(
            restart_downtime_s=self.downtime_s, ramp_s=self.ramp_s, replay_records=self.replay,
            backlog_target_s=self.target_s,
            grace_s=self.grace_s, decision_s=self.decision_s, initial_parallelism=self.initial_parallelism,
            initial_backlog=self.initial_backlog,
        )


@dataclass(frozen=True)
class Outcome:
    backlog: np.ndarray
    violations: int  # steps
    rescales: int
    slot_seconds: float


def useful(capacity: np.ndarray) -> set[int]:
    """Written out: p is worth paying for when it processes more than every smaller parallelism."""
    return {p for p in range(1, len(capacity)) if all(capacity[p] > capacity[s] for s in range(1, p))}


def simulate(
    inst: Instance, per_step: list[int], *, restarts: bool = True, checked: list[bool] | None = None
) -> Outcome | None:
    """Replay a per-step schedule in seconds, straight from the model's definition; None if it is not allowed
    (a change between decisions, during a restart, or to a useless parallelism). Without restarts: a free change
    at any step, no downtime, no replay, no grace; the rule only at the `checked` steps."""
    block = round(inst.decision_s / DT) if restarts else 1
    downtime, replay, grace = (inst.downtime_s, inst.replay, inst.grace) if restarts else (0.0, 0.0, -1.0)
    ramp = inst.ramp_s if restarts else 0.0
    targets = useful(inst.capacity)
    p, level, last = inst.initial_parallelism, inst.initial_backlog, -math.inf
    before, busy, ramp_end = p, 0.0, -math.inf
    backlog, violations, rescales, paid = [], 0, 0, 0.0
    for i, q in enumerate(per_step):
        start, end = i * DT, (i + 1) * DT
        if q != p:
            if i % block or start < last + busy - 1e-9 or q not in targets:
                return None
            busy = downtime + (ramp if q > p else 0.0)
            ramp_end = start + busy if q > p else -math.inf
            before, p, last, level, rescales = p, q, start, level + replay, rescales + 1
        running = min(DT, max(0.0, end - (last + downtime)))
        old = min(running, max(0.0, min(end, ramp_end) - max(start, last + downtime)))  # at the old capacity
        level = max(0.0, level + inst.rates[i] * DT - inst.capacity[p] * (running - old)
                    - inst.capacity[before] * old)
        in_grace = end - last <= grace + 1e-9
        if not in_grace and (checked is None or checked[i]) and level > inst.target_s * inst.rates[i] + 1e-6:
            violations += 1
        backlog.append(level)
        paid += p * DT
    return Outcome(np.array(backlog), violations, rescales, paid)


def all_outcomes(inst: Instance) -> list[Outcome]:
    """Every allowed schedule with restarts: one parallelism per decision block."""
    n, block = len(inst.rates), round(inst.decision_s / DT)
    blocks = -(-n // block)
    values = sorted(useful(inst.capacity) | {inst.initial_parallelism})
    outcomes = []
    for choice in itertools.product(values, repeat=blocks):
        per_step = [choice[i // block] for i in range(n)]
        outcome = simulate(inst, per_step)
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes


def relaxed_checked(inst: Instance) -> list[bool]:
    """The steps no rescale's grace can cover: ending more than grace after the last decision time."""
    block = round(inst.decision_s / DT)
    return [(i % block + 1) * DT > inst.grace + 1e-9 for i in range(len(inst.rates))]


def all_relaxed_outcomes(inst: Instance) -> list[Outcome]:
    """Every schedule without restarts: any useful parallelism at every step."""
    checked = relaxed_checked(inst)
    values = sorted(useful(inst.capacity))
    outcomes = []
    for per_step in itertools.product(values, repeat=len(inst.rates)):
        outcome = simulate(inst, list(per_step), restarts=False, checked=checked)
        assert outcome is not None
        outcomes.append(outcome)
    return outcomes


def best(outcomes: list[Outcome]) -> tuple[int, float]:
    return min((o.violations, o.slot_seconds) for o in outcomes)


def check_schedule(inst: Instance, result: OracleResult, *, restarts: bool = True) -> Outcome:
    """The returned schedule is allowed, and replaying it independently gives back every reported number."""
    outcome = simulate(inst, result.parallelism.tolist(), restarts=restarts,
                       checked=None if restarts else relaxed_checked(inst))
    assert outcome is not None, "the oracle returned a schedule the model does not allow"
    np.testing.assert_allclose(result.backlog, outcome.backlog, rtol=1e-9, atol=1e-6)
    assert result.violation_s == outcome.violations * DT
    assert result.feasible == (outcome.violations == 0)
    assert result.rescales == outcome.rescales
    assert result.slot_seconds == pytest.approx(outcome.slot_seconds)
    assert result.lower_bound_slot_seconds <= result.slot_seconds + 1e-9
    assert result.gap_slot_seconds >= -1e-9
    if result.certified_optimal:
        assert result.gap_slot_seconds == pytest.approx(0.0)
    return outcome


@st.composite
def instances(draw: st.DrawFn, max_steps: int = 5, max_parallelism: int = 4, decisions: tuple[int, ...] = (1, 2),
              rate_max: int = 40) -> Instance:
    """Small integers throughout (tens of records/s, dt = 10 s), so every backlog is exact in floating point."""
    n = draw(st.integers(1, max_steps))
    top = draw(st.integers(1, max_parallelism))
    increments = draw(st.lists(st.sampled_from([0, 50, 100, 150]), min_size=top, max_size=top))
    return Instance(
        rates=np.array(draw(st.lists(st.integers(0, rate_max), min_size=n, max_size=n)), dtype=float) * 10,
        capacity=np.r_[0.0, np.cumsum(increments)].astype(float),
        decision_s=DT * draw(st.sampled_from(decisions)),
        downtime_s=draw(st.sampled_from([0.0, 5.0, 10.0, 20.0, 30.0])),
        replay=draw(st.sampled_from([0.0, 50.0])),
        target_s=draw(st.sampled_from([0.0, 5.0, 10.0])),
        grace_s=draw(st.sampled_from([None, 0.0, 10.0, 35.0])),
        initial_parallelism=draw(st.integers(1, top)),
        initial_backlog=draw(st.sampled_from([0.0, 300.0])),
        ramp_s=draw(st.sampled_from([0.0, 0.0, 5.0, 15.0, 25.0])),
    )


@settings(max_examples=60, deadline=None)
@given(instances())
def test_equals_exhaustive_search_on_tiny_instances(inst: Instance) -> None:
    """No front is cut on instances this small (a front holds one state per cost, and there are at most 24
    costs), so the DP is exact: the same fewest violations and the same least slot-seconds as trying every
    schedule, including when no schedule meets the rule (the fallback front is widened so it is not cut)."""
    with patch.object(oracle_module, "FALLBACK_FRONT", 128):
        result = oracle_with_restarts(inst.rates, inst.capacity, DT, **inst.kwargs())
    outcome = check_schedule(inst, result)
    assert (outcome.violations, outcome.slot_seconds) == best(all_outcomes(inst))
    assert result.certified_optimal
    assert result.feasible == (best(all_outcomes(inst))[0] == 0)


@settings(max_examples=60, deadline=None)
@given(instances(max_steps=6))
def test_cut_fronts_stay_within_the_reported_bounds(inst: Instance) -> None:
    """With fronts cut to a single state the schedule may cost more than the optimum, never less, and the lower
    bound stays below the cost of every schedule with no more violations."""
    result = oracle_with_restarts(inst.rates, inst.capacity, DT, max_front=1, **inst.kwargs())
    outcome = check_schedule(inst, result)
    outcomes = all_outcomes(inst)
    assert (outcome.violations, outcome.slot_seconds) >= best(outcomes)
    as_good = [o.slot_seconds for o in outcomes if o.violations <= outcome.violations]
    assert result.lower_bound_slot_seconds <= min(as_good) + 1e-9
    if result.certified_optimal:
        assert (outcome.violations, outcome.slot_seconds) == best(outcomes)


@settings(max_examples=60, deadline=None)
@given(instances(max_steps=5))
def test_without_restarts_equals_exhaustive_search_and_is_below_with_restarts(inst: Instance) -> None:
    with patch.object(oracle_module, "FALLBACK_FRONT", 128):
        free = oracle_without_restarts(inst.rates, inst.capacity, DT, **inst.kwargs())
        paid = oracle_with_restarts(inst.rates, inst.capacity, DT, **inst.kwargs())
    outcome = check_schedule(inst, free, restarts=False)
    assert (outcome.violations, outcome.slot_seconds) == best(all_relaxed_outcomes(inst))
    assert free.certified_optimal and paid.certified_optimal
    # The relaxation: never more violations, and never more slot-seconds for as few violations.
    assert (free.violation_s, free.slot_seconds) <= (paid.violation_s, paid.slot_seconds)


@st.composite
def longer_instances(draw: st.DrawFn) -> Instance:
    """Minutes of load with decisions every 60 s, up to 8 slots, restarts that may outlast a decision."""
    n = draw(st.integers(6, 60))
    top = draw(st.integers(1, 8))
    increments = draw(st.lists(st.sampled_from([0, 50, 100, 150]), min_size=top, max_size=top))
    start = draw(st.integers(0, 60))
    steps = draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n))
    rates = np.maximum(0, start + np.cumsum(steps)) * 10.0
    return Instance(
        rates=rates, capacity=np.r_[0.0, np.cumsum(increments)].astype(float), decision_s=60.0,
        downtime_s=draw(st.sampled_from([0.0, 20.0, 70.0])), replay=draw(st.sampled_from([0.0, 500.0])),
        target_s=draw(st.sampled_from([5.0, 10.0])), grace_s=draw(st.sampled_from([None, 0.0, 30.0, 90.0])),
        initial_parallelism=draw(st.integers(1, top)), initial_backlog=0.0,
    )


@settings(max_examples=40, deadline=None)
@given(longer_instances())
def test_longer_schedules_are_valid_and_without_restarts_is_a_lower_bound(inst: Instance) -> None:
    paid = oracle_with_restarts(inst.rates, inst.capacity, DT, **inst.kwargs())
    free = oracle_without_restarts(inst.rates, inst.capacity, DT, **inst.kwargs())
    paid_outcome = check_schedule(inst, paid)
    check_schedule(inst, free, restarts=False)
    changes = np.flatnonzero(np.diff(np.r_[inst.initial_parallelism, paid.parallelism]))
    assert (changes % 6 == 0).all()  # only at multiples of decision_s
    if paid.feasible:
        assert paid_outcome.violations == 0
        assert free.feasible
        assert free.lower_bound_slot_seconds <= paid.slot_seconds + 1e-9
    if free.certified_optimal:
        assert (free.violation_s, free.slot_seconds) <= (paid.violation_s, paid.slot_seconds)
    # The cut can only make the schedule dearer, and its bound stays below what the full fronts found.
    cut = oracle_with_restarts(inst.rates, inst.capacity, DT, max_front=1, **inst.kwargs())
    check_schedule(inst, cut)
    if paid.certified_optimal and paid.feasible:
        assert cut.lower_bound_slot_seconds <= paid.slot_seconds + 1e-9
        assert (cut.violation_s, cut.slot_seconds) >= (paid.violation_s, paid.slot_seconds)


def linear(per_slot: float, top: int) -> np.ndarray:
    return per_slot * np.arange(top + 1, dtype=float)


def test_constant_load_holds_the_smallest_sufficient_parallelism() -> None:
    capacity = linear(100.0, 8)
    rates = np.full(60, 350.0)
    result = oracle_with_restarts(rates, capacity, DT, initial_parallelism=4)
    assert (result.parallelism == 4).all()
    assert result.rescales == 0
    assert result.feasible and result.certified_optimal
    assert result.slot_seconds == 4 * 600.0
    assert (result.backlog == 0).all()


def test_a_step_up_is_anticipated_so_the_downtime_falls_before_it() -> None:
    """At 500 records/s a rescale cannot catch up within the grace with at most 600 records/s of capacity, so
    the oracle must rescale at the last decision before the step, while the load is still 200 records/s."""
    capacity = linear(100.0, 6)
    rates = np.r_[np.full(18, 200.0), np.full(18, 500.0)]  # the step at 180 s
    result = oracle_with_restarts(rates, capacity, DT, initial_parallelism=2)
    check_schedule(Instance(rates, capacity, 60.0, 20.0, 0.0, 10.0, None, 2, 0.0), result)
    assert result.feasible and result.certified_optimal
    assert result.rescales == 1
    assert (result.parallelism[:12] == 2).all()
    assert (result.parallelism[12:] == 5).all()  # from 120 s: before the step
    # A rescale at the step itself breaks the target.
    late = np.r_[np.full(18, 2), np.full(18, 6)]
    late_outcome = simulate(Instance(rates, capacity, 60.0, 20.0, 0.0, 10.0, None, 2, 0.0), late.tolist())
    assert late_outcome is not None and late_outcome.violations > 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=6, max_size=36), st.integers(1, 5))
def test_capacity_that_stops_growing_is_never_paid_beyond_the_plateau(loads: list[int], initial: int) -> None:
    capacity = np.array([0, 100, 200, 300, 400, 450, 450, 450, 450], dtype=float)
    rates = np.array(loads, dtype=float) * 10  # up to 500: sometimes beyond any capacity
    for result in (oracle_with_restarts(rates, capacity, DT, initial_parallelism=initial),
                   oracle_without_restarts(rates, capacity, DT, initial_parallelism=initial)):
        assert result.parallelism.max() <= 5


def test_capacity_that_falls_is_never_paid_for_and_the_plateau_is_used_when_needed() -> None:
    falling = np.array([0, 100, 200, 300, 280, 250], dtype=float)
    result = oracle_with_restarts(np.full(30, 290.0), falling, DT, initial_parallelism=3)
    assert (result.parallelism == 3).all() and result.rescales == 0 and result.feasible
    plateau = np.array([0, 100, 200, 300, 400, 450, 450, 450, 450], dtype=float)
    result = oracle_with_restarts(np.full(30, 440.0), plateau, DT, initial_parallelism=5)
    assert (result.parallelism == 5).all() and result.feasible


def test_load_beyond_any_capacity_is_reported_infeasible() -> None:
    """No parallelism keeps up with 500 records/s: the pass that keeps only rule-abiding states runs dry, which
    proves it, and the schedule returned is the cheapest with the fewest violating steps."""
    capacity = linear(100.0, 4)
    rates = np.r_[np.full(12, 200.0), np.full(24, 500.0)]
    result = oracle_with_restarts(rates, capacity, DT, initial_parallelism=2)
    check_schedule(Instance(rates, capacity, 60.0, 20.0, 0.0, 10.0, None, 2, 0.0), result)
    assert not result.feasible and result.violation_s > 0
    assert result.certified_optimal  # the fewest violations, proven with this small trace's uncut fronts


def test_without_restarts_and_no_backlog_is_the_covering_bound() -> None:
    capacity = np.array([0, 100, 180, 180, 330, 400], dtype=float)
    rates = np.array([0, 50, 100, 101, 180, 181, 330, 400, 20], dtype=float)
    cover = covering_parallelism(rates, capacity)
    assert cover.tolist() == [1, 1, 1, 2, 2, 4, 4, 5, 1]
    result = oracle_without_restarts(rates, capacity, DT, backlog_target_s=0.0, grace_s=0.0, decision_s=DT)
    assert result.parallelism.tolist() == cover.tolist()
    assert result.slot_seconds == cover.sum() * DT and result.feasible and (result.backlog == 0).all()


def test_the_covering_bound_is_not_a_lower_bound_when_backlog_is_allowed() -> None:
    """Why the relaxation keeps the backlog allowance: a one-step spike fits in the backlog, no slot needed."""
    capacity = linear(100.0, 4)
    rates = np.r_[np.full(6, 100.0), 150.0, np.full(11, 100.0)]
    paid = oracle_with_restarts(rates, capacity, DT, initial_parallelism=1)
    free = oracle_without_restarts(rates, capacity, DT, initial_parallelism=1)
    assert paid.feasible and (paid.parallelism == 1).all()
    assert paid.slot_seconds < covering_parallelism(rates, capacity).sum() * DT
    assert free.slot_seconds <= paid.slot_seconds


def test_useful_parallelisms() -> None:
    assert useful_parallelisms(np.array([0, 100, 200, 200, 250, 240, 300.0])).tolist() == [1, 2, 4, 6]
    assert useful_parallelisms(np.array([0, 0.0, 0.0])).tolist() == [1]


def test_empty_trace_and_invalid_arguments() -> None:
    empty = oracle_with_restarts(np.zeros(0), linear(100.0, 2), DT)
    assert empty.slot_seconds == 0 and empty.feasible and len(empty.parallelism) == 0
    capacity = linear(100.0, 2)
    rates = np.full(6, 50.0)
    for kwargs in (dict(decision_s=15.0), dict(initial_parallelism=3), dict(initial_parallelism=0),
                   dict(grace_s=-1.0), dict(restart_downtime_s=-1.0), dict(max_front=0)):
        with pytest.raises(ValueError):
            oracle_with_restarts(rates, capacity, DT, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        oracle_with_restarts(-rates, capacity, DT)
    with pytest.raises(ValueError):
        oracle_without_restarts(rates, np.array([0.0]), DT)
