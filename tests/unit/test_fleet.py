"""The fleet step (`plan.fleet`): the budget divided, never exceeded, no job starved while the budget
carries every job's arrivals, weights honoured, the exchange optimal on convex curves, and the plan
kept within its grant."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.decisions import Action, DecisionReason
from contracts.fleet import ClusterConfig, FleetBid, FleetGrant, FleetState, Move
from contracts.jobs import ConfigError, JobConfig
from contracts.settings import Settings
from contracts.stage import Incoming
from evaluation.loop import JobLoop, Loops
from knowledge.memory import MemoryKnowledge, run_now
from plan.cost_plan import PlanProblem
from plan.fleet import (
    KEEP_AFTER_GROWTH_S,
    USEFUL,
    BudgetError,
    allocate,
    bid_of,
    grant,
    hold_costs,
    need_of,
    within_grant,
)
from plan.policy import Plan, hold


def convex_bid(job: str, minimum: int, wants: int, need: int, weight: float, slopes: list[float]) -> FleetBid:
    """A bid whose curve falls by `slopes` (sorted to decreasing savings: convex) from its minimum."""
    savings = sorted(slopes, reverse=True)[: wants - minimum]
    costs = [1000.0]
    for s in savings:
        costs.append(costs[-1] - s)
    return FleetBid(job_id=job, holds=minimum, wants=wants, need=min(need, wants), minimum=minimum, weight=weight,
                    costs=costs)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[dict[str, FleetBid], int]:
    n = draw(st.integers(1, 5))
    bids = {}
    for i in range(n):
        minimum = draw(st.integers(1, 3))
        wants = draw(st.integers(minimum, minimum + 6))
        need = draw(st.integers(1, wants + 2))
        weight = draw(st.sampled_from([0.5, 1.0, 2.0]))
        slopes = draw(st.lists(st.floats(0, 500, allow_nan=False), min_size=wants - minimum, max_size=wants - minimum))
        bids[f"j{i}"] = convex_bid(f"j{i}", minimum, wants, need, weight, slopes)
    budget = draw(st.integers(sum(b.minimum for b in bids.values()), sum(b.wants for b in bids.values()) + 3))
    return bids, budget


@given(fleets())
def test_the_budget_is_never_exceeded_and_every_job_keeps_its_bounds(fleet: tuple[dict[str, FleetBid], int]) -> None:
    bids, budget = fleet
    out = allocate(bids, budget)
    assert sum(out.slots.values()) <= budget
    for job, b in bids.items():
        assert b.minimum <= out.slots[job] <= b.wants
    if sum(b.wants for b in bids.values()) <= budget:
        assert out.slots == {job: b.wants for job, b in bids.items()} and not out.binds and not out.gave_way
    else:
        assert out.binds and set(out.gave_way) == {job for job, b in bids.items() if out.slots[job] < b.wants}


@given(fleets())
def test_no_job_starves_while_the_budget_carries_every_jobs_arrivals(fleet: tuple[dict[str, FleetBid], int]) -> None:
    bids, budget = fleet
    out = allocate(bids, budget)
    floors = {job: max(b.minimum, min(b.need, b.wants)) for job, b in bids.items()}
    if sum(floors.values()) <= budget:
        assert all(out.slots[job] >= floors[job] for job in bids) and not out.short
    else:  # shared by weight: every slot given lowers its job's cost; on curves that fall at every slot, all
        # of the budget, and no job's share per weight exceeds another's by a slot
        assert out.price is None
        for job, b in bids.items():
            flat = max(b.costs) - min(b.costs) <= USEFUL  # nothing measured: every slot counts
            assert out.slots[job] == b.minimum or flat or b.cost(out.slots[job]) < b.cost(b.minimum)
        # (a slot counts where it saves more than USEFUL, as the fleet step counts it)
        if not all(b.cost(p + 1) < b.cost(p) - USEFUL for b in bids.values() for p in range(b.minimum, b.wants)):
            return
        assert sum(out.slots.values()) == budget
        below = [job for job in bids if out.slots[job] < floors[job]]
        for a in below:
            for b in bids:
                if out.slots[b] > bids[b].minimum:
                    assert (out.slots[b] - 1) / bids[b].weight <= out.slots[a] / bids[a].weight + 1e-9


@settings(max_examples=60)
@given(fleets())
def test_the_exchange_is_optimal_on_convex_curves(fleet: tuple[dict[str, FleetBid], int]) -> None:
    bids, budget = fleet
    floors = {job: max(b.minimum, min(b.need, b.wants)) for job, b in bids.items()}
    if sum(floors.values()) > budget or sum(b.wants for b in bids.values()) <= budget:
        return
    out = allocate(bids, budget)
    jobs = list(bids)
    best = min(
        sum(bids[j].cost(p) for j, p in zip(jobs, combo, strict=True))
        for combo in itertools.product(*(range(floors[j], bids[j].wants + 1) for j in jobs))
        if sum(combo) <= budget
    )
    assert sum(bids[j].cost(out.slots[j]) for j in jobs) == pytest.approx(best, abs=1e-6)


def test_the_lighter_job_gives_way_first() -> None:
    same = [300.0, 200.0, 100.0]
    light = convex_bid("light", 1, 4, 1, 1.0, same)
    heavy = convex_bid("heavy", 1, 4, 1, 1.0, [2 * s for s in same]).model_copy(update={"weight": 2.0})
    out = allocate({"light": light, "heavy": heavy}, 6)
    assert out.slots == {"heavy": 4, "light": 2} and out.gave_way == ("light",) and out.price == 200.0


def test_a_budget_below_the_minimums_is_refused() -> None:
    with pytest.raises(BudgetError):
        allocate({"a": convex_bid("a", 3, 3, 3, 1.0, []), "b": convex_bid("b", 3, 3, 3, 1.0, [])}, 5)


def problem(parallelism: int = 2, rate: float = 500.0, backlog: float = 0.0) -> PlanProblem:
    return PlanProblem(parallelism=parallelism, backlog=backlog, rates=np.full(30, rate), step_s=60.0,
                       capacity=np.arange(9) * 200.0, min_parallelism=1, downtime_up_s=20.0, downtime_down_s=20.0,
                       replay_records=0.0, backlog_target_s=60.0, action_penalty_s=300.0)


def test_holding_too_few_slots_costs_the_violation_and_the_need_is_the_fewest_that_carry() -> None:
    costs = hold_costs(problem())
    assert need_of(problem()) == 3  # 600 >= 500
    assert costs[0] > costs[1] > costs[2]  # 1 and 2 slots fall behind, 3 keeps up
    assert costs[3] - costs[2] == pytest.approx(60 * 30, rel=1e-6)  # beyond: a slot's seconds
    heavier = hold_costs(problem(), weight=2.0)
    assert heavier[0] > costs[0] and heavier[2] == pytest.approx(costs[2])


def test_a_bid_covers_minimum_to_wants_and_never_needs_more_than_it_wants() -> None:
    config = JobConfig(max_parallelism=8, min_parallelism=2, cluster="c", weight=1.5)
    bid = bid_of("j", problem(), 2, 5, config, 0.0)
    assert (bid.minimum, bid.wants, bid.need, bid.weight, len(bid.costs)) == (2, 5, 3, 1.5, 4)
    assert bid_of("j", problem(rate=1500.0), 2, 5, config, 0.0).need == 5
    flat = bid_of("j", None, 2, 4, config, 0.0)
    assert flat.need == 4 and flat.costs == [0.0, 0.0, 0.0]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.integers(1, 8)), min_size=1, max_size=40))
def test_held_and_granted_slots_never_exceed_the_budget(steps: list[tuple[int, int, int]]) -> None:
    """Jobs bid in any order, each from what it holds (after its last grant, or a release): what the fleet
    state holds never sums beyond the budget (given that what the jobs ran as they joined fits in it)."""
    holds = {f"j{i}": 1 for i in range(4)}
    budget, state = 10, FleetState(held=dict(holds))  # what each job runs as it joins
    for i, wants, need in steps:
        job = f"j{i}"
        bid = FleetBid(job_id=job, holds=holds[job], wants=wants, need=min(need, wants), minimum=1, weight=1.0,
                       costs=[100.0 * (wants - k) for k in range(wants)])
        state, given_ = grant(state, bid, "c", budget, commit=True)
        assert sum(state.held.values()) <= budget
        # All of its allocation, what it holds, or (nobody waiting) what it holds within what it wants.
        assert given_.granted in (bid.holds, given_.allocated, min(bid.wants, bid.holds))
        holds[job] = given_.granted  # the job moves to its grant (a release frees slots at its next bid)


def reason(message: str = "plan") -> DecisionReason:
    return DecisionReason(code="cost_plan", rule="default", message=message)


def given_grant(granted: int, allocated: int | None = None, price: float | None = 250.0) -> FleetGrant:
    return FleetGrant(cluster="c", budget=10, granted=granted, allocated=allocated or granted, binds=True,
                      price=price, gave_way=["b", "a"])


def test_the_plan_is_kept_within_its_grant() -> None:
    up = Plan(Action.SCALE_UP, 6, reason(), recommended=6)
    trimmed = within_grant(up, 3, given_grant(5))
    assert (trimmed.action, trimmed.to_parallelism, trimmed.reason.code) == (Action.SCALE_UP, 5, "fleet_budget")
    assert "budget of 10 slots binds" in trimmed.reason.message and "gave way: b, a" in trimmed.reason.message
    held = within_grant(up, 3, given_grant(3))
    assert (held.action, held.to_parallelism, held.reason.code) == (Action.NONE, 3, "fleet_budget")
    stay = hold(4, "planned_hold", "plan")
    gives = within_grant(stay, 4, given_grant(2, price=None))
    assert (gives.action, gives.to_parallelism) == (Action.SCALE_DOWN, 2)
    assert "shared by weight" in gives.reason.message
    assert within_grant(up, 3, given_grant(6)) is up
    down = Plan(Action.SCALE_DOWN, 1, reason())
    assert within_grant(down, 4, given_grant(2)) is down


def test_clusters_are_checked_at_registration() -> None:
    k = MemoryKnowledge(Settings())
    with pytest.raises(ConfigError, match="unknown cluster 'c'"):
        run_now(k.register_job("a", {"cluster": "c"}))
    run_now(k.register_cluster(ClusterConfig(name="c", workers=2, slots_per_worker=2)))
    run_now(k.register_job("a", {"cluster": "c", "min_parallelism": "3"}))
    with pytest.raises(ConfigError, match="below the minimums"):
        run_now(k.register_job("b", {"cluster": "c", "min_parallelism": "2"}))
    with pytest.raises(ConfigError, match="below the minimums"):
        run_now(k.register_cluster(ClusterConfig(name="c", workers=1, slots_per_worker=2)))
    with pytest.raises(ConfigError, match="weight"):
        run_now(k.register_job("b", {"weight": "0"}))
    with pytest.raises(ValueError):
        ClusterConfig(name="Bad Name", workers=1, slots_per_worker=1)


def test_a_job_gives_way_only_while_another_waits_for_the_slots() -> None:
    def bid(job: str, holds: int, wants: int, need: int, savings: float) -> FleetBid:
        return FleetBid(job_id=job, holds=holds, wants=wants, need=need, minimum=1, weight=1.0,
                        costs=[1000.0 - savings * k for k in range(wants)], at=2.0)

    state = FleetState(held={"a": 6, "b": 4})
    # b wants 6 and saves more per slot than a: the allocation moves 2 of a's slots to b (budget 10).
    state, b_first = grant(state, bid("b", 4, 6, 4, 500.0), "c", 10, commit=True)
    assert (b_first.allocated, b_first.granted) == (6, 4)  # b waits: the slots are a's until a releases them
    state, a_turn = grant(state, bid("a", 6, 6, 4, 100.0), "c", 10, commit=True)
    assert (a_turn.allocated, a_turn.granted) == (4, 4)  # b waits for them: a gives way
    # a's giving way opened a move of its 2 slots to b; b's grant of them, once a runs 4, closes it.
    assert a_turn.moves == [Move(giver="a", receiver="b", slots=2, at=2.0)] and state.moves == a_turn.moves
    state, still = grant(state, bid("b", 4, 6, 4, 500.0), "c", 10, commit=True)
    assert still.granted == 4 and still.moves == [] and state.moves == a_turn.moves  # a has not released yet
    state, _ = grant(state, bid("a", 4, 6, 4, 100.0), "c", 10, commit=True)
    state, b_takes = grant(state, bid("b", 4, 6, 4, 500.0), "c", 10, commit=True)
    assert b_takes.granted == 6 and b_takes.moves == a_turn.moves and state.moves == []
    # Both sides' decisions carry the move as a notice with the same `move_at`.
    gives = within_grant(hold(6, "planned_hold", "plan"), 6, a_turn)
    takes = within_grant(Plan(Action.SCALE_UP, 6, reason(), recommended=6), 4, b_takes)
    notes = [next(n for n in p.notices if n.code == "fleet_move") for p in (gives, takes)]
    assert gives.to_parallelism == 4 and takes.to_parallelism == 6
    assert notes[0].numbers == notes[1].numbers == {"move_at": 2.0, "slots": 2}
    assert "a gives 2 slots to b" in notes[0].message == notes[1].message
    state = FleetState(held={"a": 6, "b": 4}, bids={"b": bid("b", 4, 4, 4, 500.0)})
    _, alone = grant(state, bid("a", 6, 7, 4, 100.0), "c", 10, commit=True)
    assert alone.granted == 6  # nobody waits: a keeps what it holds (released, the slots would sit idle)


def test_a_report_of_a_job_whose_cluster_was_removed_is_dead_lettered_with_the_reason() -> None:
    loops = Loops({}, Settings())
    run_now(loops.knowledge.register_cluster(ClusterConfig(name="c", workers=1, slots_per_worker=4)))
    config = run_now(loops.knowledge.register_job("j", {"cluster": "c"}))
    loops.jobs["j"] = JobLoop("j", config, knowledge=loops.knowledge)
    run_now(loops.knowledge.remove_cluster("c"))
    report = (b'{"schema_version": 1, "job_id": "j", "timestamp": 1795000010.0, "interval_s": 5.0, '
              b'"parallelism": 1, "records_in": 10, "records_out": 10, "busy_time_s": 1.0}')
    loops.records([Incoming(value=report, key=b"j", partition=0, offset=1)], now=1795000011.0)
    assert [(d.reason, "cluster 'c'" in d.detail) for d in loops.dead_letters] == [("unknown_cluster", True)]
    assert loops.jobs["j"].open is None  # nothing folded


def test_shared_by_weight_no_job_is_given_a_slot_that_buys_it_nothing() -> None:
    """Seen live: a job of 4 fixed tasks was given 3 slots, which run them in two waves as 2 do, while
    another waited at 1. Its third slot lowers no cost, so it takes 2 or 4, and a slot no job can use is
    left free."""
    waves = [100.0, 50.0, 60.0, 10.0]  # 1..4 slots: 3 costs more than 2 (the same capacity, one slot more)
    bids = {job: FleetBid(job_id=job, holds=1, wants=4, need=4, minimum=1, weight=1.0, costs=waves)
            for job in ("a", "b")}
    bids["c"] = FleetBid(job_id="c", holds=1, wants=1, need=1, minimum=1, weight=1.0, costs=[0.0])
    out = allocate(bids, 6)
    assert out.slots == {"a": 2, "b": 2, "c": 1} and out.price is None and set(out.short) == {"a", "b"}
    assert allocate(bids, 7).slots == {"a": 4, "b": 2, "c": 1}  # 4 where a block of 2 is left
    flat = {job: b.model_copy(update={"costs": [0.0] * 4}) for job, b in bids.items() if job != "c"}
    assert allocate(flat, 5).slots == {"a": 3, "b": 2}  # nothing measured: every slot counts


def test_a_job_just_granted_more_slots_does_not_give_them_way_while_its_rescale_lands() -> None:
    """Seen in the simulated fleet (8 jobs, seed 2): a job granted its 8th slot gave it way at its next
    window, a restart each, and spent 840 s beyond its target. A job granted more keeps what it holds for
    KEEP_AFTER_GROWTH_S; then it gives way to a job that waits, as before."""
    def bid(job: str, holds: int, wants: int, savings: float, at: float) -> FleetBid:
        return FleetBid(job_id=job, holds=holds, wants=wants, need=wants, minimum=1, weight=1.0,
                        costs=[1000.0 - savings * k for k in range(wants)], at=at)

    state = FleetState(held={"a": 4, "b": 4})
    state, up = grant(state, bid("a", 4, 6, 100.0, 0.0), "c", 10, commit=True)
    assert up.granted == 6 and state.grown_at == {"a": 0.0}  # 2 slots free: a scales up to 6
    state, _ = grant(state, bid("b", 4, 7, 100.0, 10.0), "c", 10, commit=True)  # now b wants 7, a 6: 10 slots
    state, settling = grant(state, bid("a", 6, 6, 100.0, 30.0), "c", 10, commit=True)
    assert settling.allocated < 6 and settling.granted == 6 and settling.moves == []  # b waits; a keeps them
    state, later = grant(state, bid("a", 6, 6, 100.0, KEEP_AFTER_GROWTH_S), "c", 10, commit=True)
    assert later.granted == later.allocated < 6 and later.moves  # the delay passed: a gives way to b
