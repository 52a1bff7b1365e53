"""The fleet step: the slots of one cluster's budget divided among the jobs that share it. Pure.

Each job planned on a cluster bids every window (`bid_of`, `contracts.fleet.FleetBid`): the slots it
holds, the slots its own plan wants, the slots its arrivals need now, its minimum and weight, and its
cost curve: per number of slots p, what holding p over the planning horizon costs (`hold_costs`),
on the terms of the schedule search (`plan.cost_plan`): slot-seconds, the restart that reaches p, the
violation weight per second of arrivals beyond the backlog target (times the job's weight) and the
work its backlog still needs at the horizon's end. Simpler than the search in two ways: the target is
checked at each step's end only (not also at a restart's end), and an in-place scale-up's ramp at the
old capacity is not counted (its pause, zero in place, is).

`allocate` divides the budget, in this order:
1. where every job's plan fits, each gets it: the budget does not bind;
2. otherwise each job first gets what its arrivals need (at most what it wants): no job starves while
   the budget can carry every job's arrivals. Where it cannot, the budget is shared by weight
   (weighted max-min fairness: each job's share of its need grows in proportion to its weight, in
   the fewest slots that lower its cost, so no slot goes where its tasks would run in the same waves
   as before), and the price is undefined;
3. what is left goes slot by slot where it saves the most (marginal-cost exchange): each round gives
   the block of slots with the highest saving per slot on any job's curve. For convex curves this is
   the exact optimum of a separable cost under one budget (Gross 1956; Fox 1966; Ibaraki and Katoh,
   *Resource Allocation Problems*, 1988), and on a curve that is not convex the best block is a step of
   its lower convex hull: the Lagrangian relaxation's own answer. The price of a slot (the Lagrange
   multiplier of the budget) is the saving per slot of the last block given. Chosen over bisection on
   a price: slots are integers, so a price alone does not hit the budget without a rounding step,
   and the exchange gives the price as a by-product.

The jobs granted less than they want gave way, the least loss per weight first. Then `grant`: a job
takes its allocation once the others have released it (a slot moves from one job to another only
after the first released it; until the whole allocation is free the job keeps what it holds, one
restart per move), so the slots held and reserved never exceed the budget; a job allocated less
than it holds gives way only while another waits for the slots, and not within KEEP_AFTER_GROWTH_S of
being granted more (its rescale lands and drains; given way at once, it restarted twice for nothing).
The allocation is made for the plan's first step and made again at every window (receding horizon);
the curves assume the job holds p over the horizon (the plan's later steps are not allocated ahead).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from contracts.analyses import Analysis
from contracts.decisions import DecisionReason
from contracts.fleet import FleetBid, FleetGrant, FleetState, Move
from contracts.jobs import JobConfig
from knowledge.fleet_rules import FleetStep
from plan.cost_plan import EPSILON, PlanProblem
from plan.policy import Plan, direction, hold

DEFAULT_HORIZON_S = 1800.0  # a job planned without a problem of its own: its curve's horizon
DEFAULT_STEP_S = 60.0
RULE = "fleet"
CODE = "fleet_budget"  # a plan changed by the cluster's budget
MOVE = "fleet_move"  # the notice of a move: slots one job gave way with, taken by another
NAMED = 5  # jobs that gave way named in a reason
NEED_STEPS = 5  # a job's need keeps its backlog within target over this many plan steps (5 min)
KEEP_AFTER_GROWTH_S = 120.0  # a job granted more slots gives none way for this long (its rescale lands, it drains)
USEFUL = 1e-3  # a slot lowers a job's cost by more than this (its curve is rounded to 3 decimals) to count


def _held(problem: PlanProblem, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per p in 1..top, moving to p now and holding it: the backlog at the horizon's end, and per step the
    seconds of arrivals beyond the target at its end (steps x top)."""
    p = np.arange(1, top + 1, dtype=float)
    current = problem.parallelism
    capacity = np.asarray(problem.capacity[1: top + 1], dtype=float)
    down = np.where(p > current, problem.downtime_up_s, np.where(p < current, problem.downtime_down_s, 0.0))
    down = np.minimum(down, problem.step_s)
    backlog = np.full(top, problem.backlog) + np.where(p != current, problem.replay_records, 0.0)
    rates = np.asarray(problem.rates, dtype=float)
    excess = np.zeros((len(rates), top))
    for k, rate in enumerate(rates):
        pause = down if k == 0 else 0.0
        backlog = backlog + rate * pause
        backlog = np.maximum(0.0, backlog + rate * (problem.step_s - pause) - capacity * (problem.step_s - pause))
        excess[k] = np.maximum(0.0, backlog - problem.backlog_target_s * rate) / max(rate, 1.0)
    return backlog, excess, capacity


def _costs(problem: PlanProblem, held: tuple[np.ndarray, np.ndarray, np.ndarray], weight: float) -> np.ndarray:
    backlog, excess, capacity = held
    p = np.arange(1, len(capacity) + 1, dtype=float)
    per_record = p / np.maximum(capacity, EPSILON)
    slots = p * problem.step_s * len(problem.rates)
    penalty = np.where(p != problem.parallelism, problem.action_penalty_s, 0.0)
    return slots + penalty + backlog * per_record + weight * problem.violation_weight * excess.sum(axis=0)


def _need(problem: PlanProblem, held: tuple[np.ndarray, np.ndarray, np.ndarray]) -> int:
    _, excess, capacity = held
    keeps = excess[:NEED_STEPS].sum(axis=0) <= EPSILON
    enough = (capacity >= float(problem.rates[0]) - EPSILON) & keeps & problem.within_bounds()
    return int(np.argmax(enough)) + 1 if enough.any() else problem.max_parallelism


def hold_costs(problem: PlanProblem, weight: float = 1.0, top: int | None = None) -> np.ndarray:
    """Per p in 1..top (default: the problem's maximum): the cost of moving to p now and holding it over
    the problem's horizon (see the module docstring); index 0 is p = 1."""
    top = problem.max_parallelism if top is None else min(top, problem.max_parallelism)
    return _costs(problem, _held(problem, top), weight)


def need_of(problem: PlanProblem) -> int:
    """What the job's arrivals need: the fewest slots (at least the minimum) whose capacity carries the planned
    rate now and which, held, keep the backlog within its target over the next NEED_STEPS steps (a backlog
    near its target needs slots to drain); the maximum where none does."""
    return _need(problem, _held(problem, problem.max_parallelism))


def plain_problem(analysis: Analysis, config: JobConfig) -> PlanProblem | None:
    """For a policy that plans without one: the problem of holding the arrival rate now over half an hour,
    at the measured rate per slot times p (DS2's linear capacity). None before a rate is measured."""
    rate, per_slot = analysis.arrival_rate, analysis.true_processing_rate
    if rate is None or not analysis.valid or per_slot <= 0:
        return None
    steps = math.ceil(DEFAULT_HORIZON_S / DEFAULT_STEP_S)
    capacity = per_slot * np.arange(config.max_parallelism + 1, dtype=float)
    return PlanProblem(
        parallelism=analysis.parallelism, backlog=float(analysis.backlog or 0.0), rates=np.full(steps, rate),
        step_s=DEFAULT_STEP_S, capacity=capacity, min_parallelism=config.min_parallelism,
        downtime_up_s=config.restart_time_s, downtime_down_s=config.restart_time_s,
        replay_records=rate * config.checkpoint_interval_s / 2, backlog_target_s=config.backlog_target_s)


def bid_of(job_id: str, problem: PlanProblem | None, holds: int, wants: int, config: JobConfig, at: float
           ) -> FleetBid:
    """The job's bid (see the module docstring). Without a problem (nothing measured yet) its curve is
    flat: it needs what it wants, and slots beyond its minimum save it nothing measurable."""
    minimum = config.min_parallelism
    wants = max(minimum, wants)
    if problem is None:
        return FleetBid(job_id=job_id, holds=holds, wants=wants, need=wants, minimum=minimum, weight=config.weight,
                        costs=[0.0] * (wants - minimum + 1), at=at)
    held = _held(problem, problem.max_parallelism)  # one replay serves the curve and the need
    costs = _costs(problem, held, config.weight)[:wants]
    if len(costs) < wants:  # wants beyond the problem's maximum: its curve held flat there
        costs = np.concatenate([costs, np.full(wants - len(costs), costs[-1])])
    return FleetBid(job_id=job_id, holds=holds, wants=wants, need=min(_need(problem, held), wants), minimum=minimum,
                    weight=config.weight, costs=[round(float(c), 3) for c in costs[minimum - 1: wants]], at=at)


@dataclass(frozen=True)
class Allocation:
    """Every job's slots, whether the budget binds, the price of a slot (None: shared by weight), the
    jobs that gave way (granted less than they want, the least loss per weight first) and those
    granted less than their arrivals need."""

    slots: dict[str, int]
    binds: bool
    price: float | None
    gave_way: tuple[str, ...]
    short: tuple[str, ...]


class BudgetError(ValueError):
    """The budget cannot give every job its minimum (registration refuses such a fleet)."""


def allocate(bids: Mapping[str, FleetBid], budget: int) -> Allocation:
    """The budget divided among the bids (see the module docstring)."""
    if sum(b.minimum for b in bids.values()) > budget:
        raise BudgetError(f"a budget of {budget} slots is below the jobs' minimums "
                          f"({sum(b.minimum for b in bids.values())})")
    wants = {job: b.wants for job, b in bids.items()}
    if sum(wants.values()) <= budget:
        return Allocation(dict(wants), False, 0.0, (), ())
    floors = {job: max(b.minimum, min(b.need, b.wants)) for job, b in bids.items()}
    price: float | None = None
    if sum(floors.values()) > budget:
        slots = weighted_share({job: b.minimum for job, b in bids.items()}, floors,
                               {job: b.weight for job, b in bids.items()}, budget, bids)
    else:
        slots, price = _exchange(bids, dict(floors), budget - sum(floors.values()))
    loss = {job: (b.cost(slots[job]) - b.cost(b.wants)) / b.weight for job, b in bids.items()}
    gave_way = tuple(sorted((job for job in bids if slots[job] < wants[job]), key=lambda job: (loss[job], job)))
    short = tuple(sorted(job for job, b in bids.items() if slots[job] < min(b.need, b.wants)))
    return Allocation(slots, True, price, gave_way, short)


def weighted_share(minimums: Mapping[str, int], floors: Mapping[str, int], weights: Mapping[str, float], budget: int,
                   bids: Mapping[str, FleetBid] | None = None) -> dict[str, int]:
    """Weighted max-min fair shares of `floors`: every job its minimum, then slot by slot to the job with the
    smallest share per weight still below its floor (the heavier, then the name, on a tie). A heap: each slot
    given costs log(jobs). With `bids`, a job takes the fewest slots that lower its cost (`useful_block`):
    a job whose fixed tasks run in waves (4 tasks on 3 slots take two waves, as on 2) is given no slot
    that buys it nothing; one whose next useful block is more than is left takes no more, and slots no job
    can use are left unallocated."""
    slots = dict(minimums)
    left = budget - sum(slots.values())
    heap = [(slots[j] / weights[j], -weights[j], j) for j in slots if slots[j] < floors[j]]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, _, job = heapq.heappop(heap)
        k = 1 if bids is None else useful_block(bids[job], slots[job], floors[job])
        if k is None or k > left:
            continue
        slots[job] += k
        left -= k
        if slots[job] < floors[job]:
            heapq.heappush(heap, (slots[job] / weights[job], -weights[job], job))
    return slots


def useful_block(bid: FleetBid, at: int, upto: int) -> int | None:
    """The fewest slots beyond `at` (to at most `upto`) that lower the job's cost; None where none does. A
    curve flat throughout (nothing measured yet) counts every slot as useful."""
    if upto <= at:
        return None
    if max(bid.costs) - min(bid.costs) <= USEFUL:
        return 1
    here = bid.cost(at)
    return next((k for k in range(1, upto - at + 1) if bid.cost(at + k) < here - USEFUL), None)


def _best_block(bid: FleetBid, at: int, left: int) -> tuple[float, int] | None:
    """The block of k <= min(wants - at, left) slots with the highest saving per slot from `at`, and k (the
    smallest on a tie); None where no slot is left to give."""
    room = min(bid.wants - at, left)
    if room <= 0:
        return None
    here = bid.cost(at)
    best = max(((here - bid.cost(at + k)) / k, -k) for k in range(1, room + 1))
    return best[0], -best[1]


def _exchange(bids: Mapping[str, FleetBid], slots: dict[str, int], left: int) -> tuple[dict[str, int], float]:
    """Marginal-cost exchange from `slots` up to each job's wants with `left` slots: each round the block
    with the highest saving per slot (on a tie, the heavier job, then the name); the price is the last
    block's saving per slot (0 where the last slots save nothing). Lazy greedy on a heap: a job's best block
    only gets worse as fewer slots are left, so a popped entry is re-evaluated and taken if it still holds."""
    price = 0.0
    heap = []
    for job, b in bids.items():
        block = _best_block(b, slots[job], left)
        if block is not None:
            heap.append((-block[0], -b.weight, job, block[1]))
    heapq.heapify(heap)
    while left > 0 and heap:
        negative, weight, job, k = heapq.heappop(heap)
        block = _best_block(bids[job], slots[job], left)
        if block is None:
            continue
        if (-block[0], block[1]) != (negative, k):  # stale: fewer slots are left than when it was pushed
            heapq.heappush(heap, (-block[0], weight, job, block[1]))
            continue
        slots[job] += k
        left -= k
        price = max(0.0, -negative)
        following = _best_block(bids[job], slots[job], left)
        if following is not None:
            heapq.heappush(heap, (-following[0], weight, job, following[1]))
    return slots, price


def grant(state: FleetState, bid: FleetBid, cluster: str, budget: int, commit: bool) -> tuple[FleetState, FleetGrant]:
    """The fleet step for one job's window: its bid joins the cluster's, the budget is allocated, and the job
    is granted its allocation, with two exceptions that each save a restart:
    - a scale-up waits until its whole allocation is free (the others give way at their next window): a
      job that took what is free now would restart again for the rest, and the wait runs it at what it holds;
    - a job allocated less than it holds and its plan gives way only while other jobs wait for more slots
      than are free; until then it keeps them (released, they would sit idle). Nor within
      KEEP_AFTER_GROWTH_S of its last grant of more slots (`FleetState.grown_at`).
    A job that gives way opens a move per job it gives the slots to (the most waiting first); the
    receiver's grant of them closes it: one coordinated action over the two jobs' decisions, both of which
    name it (`within_grant`). A receiver that no longer waits lets its open moves lapse.
    With `commit` (the job's decisions are carried out), what it holds becomes the larger of what it runs
    and what it was granted, and moves open and close; the state returned is the cluster's, to store. The
    slots a job ran before its first bid are not known to the others' grants: a fleet starts from what each
    job runs (`FleetState.held`), or from jobs that do not run yet."""
    job = bid.job_id
    bids = {**state.bids, job: bid}
    allocation = allocate(bids, budget)
    allocated = allocation.slots[job]
    now = {**state.held, job: bid.holds}  # what every job holds as this one bids
    free = budget - sum(now.values())
    mine = [m for m in state.moves if m.receiver == job]
    kept = [m for m in state.moves if m.receiver != job]
    moves: list[Move] = []
    if allocated > bid.holds:
        granted = allocated if allocated - bid.holds <= free else bid.holds
        if granted > bid.holds:
            moves = mine  # taken: the moves close
        else:
            kept += mine  # still waiting
    elif allocated >= min(bid.wants, bid.holds):
        granted = allocated  # the job's own plan (a hold, or a scale-down to what it wants)
    else:
        waiting = {j: max(0, allocation.slots[j] - now.get(j, 0)) for j in bids if j != job}
        settling = bid.at - state.grown_at.get(job, -math.inf) < KEEP_AFTER_GROWTH_S
        granted = allocated if sum(waiting.values()) > free and not settling else min(bid.wants, bid.holds)
        moves = _opened(job, bid.holds - granted, waiting, kept, bid.at)
        kept += moves
    given = FleetGrant(
        cluster=cluster, budget=budget, granted=granted, allocated=allocated, binds=allocation.binds,
        price=None if allocation.price is None else round(allocation.price, 1), gave_way=list(allocation.gave_way),
        short=list(allocation.short), moves=moves if commit else [])
    if not commit:  # a recommendation: nothing is held, no move opens or closes
        return state.model_copy(update={"bids": bids}), given
    grown = {**state.grown_at, job: bid.at} if granted > bid.holds else state.grown_at
    return FleetState(bids=bids, held={**now, job: max(bid.holds, granted)}, moves=kept, grown_at=grown), given


def _opened(giver: str, released: int, waiting: Mapping[str, int], open_moves: list[Move], at: float) -> list[Move]:
    """The moves a job giving way `released` slots opens: to the jobs waiting for the most slots not yet
    given way for them first (then by name)."""
    promised: dict[str, int] = {}
    for m in open_moves:
        promised[m.receiver] = promised.get(m.receiver, 0) + m.slots
    short = sorted(((w - promised.get(j, 0), j) for j, w in waiting.items() if w > promised.get(j, 0)),
                   key=lambda x: (-x[0], x[1]))
    out = []
    for lacking, receiver in short:
        if released <= 0:
            break
        slots = min(lacking, released)
        out.append(Move(giver=giver, receiver=receiver, slots=slots, at=at))
        released -= slots
    return out


def join(job_id: str, holds: int, cluster: str) -> FleetStep:
    """The fleet step of a job that joins the cluster running `holds` slots: the fleet counts them as its."""
    def step(state: FleetState, budget: int) -> tuple[FleetState, FleetGrant]:
        return (state.model_copy(update={"held": {**state.held, job_id: holds}}),
                FleetGrant(cluster=cluster, budget=budget, granted=holds, allocated=holds, binds=False))
    return step


def within_grant(plan: Plan, current: int, given: FleetGrant) -> Plan:
    """The plan within the slots granted: a job granted less than it holds gives way (scales down to its
    grant), a scale-up beyond the grant is trimmed to it, or held where nothing is free yet; the reason
    (`fleet_budget`) says so, with the budget, the price of a slot and who gave way. A plan within its
    grant passes as it is. The moves the grant opened or closed come with it as a `fleet_move` notice
    (both sides' decisions carry one, with the same `move_at`; execute publishes each as an event)."""
    fitted = _fitted(plan, current, given)
    if not given.moves:
        return fitted
    text = "; ".join(f"{m.giver} gives {m.slots} slot{'s' if m.slots > 1 else ''} to {m.receiver}"
                     for m in given.moves)
    notice = DecisionReason(code=MOVE, rule=RULE, message=f"a move on cluster {given.cluster!r}: {text}",
                            numbers={"move_at": min(m.at for m in given.moves),
                                     "slots": sum(m.slots for m in given.moves)})
    return replace(fitted, notices=[*fitted.notices, notice])


def _fitted(plan: Plan, current: int, given: FleetGrant) -> Plan:
    target = plan.to_parallelism
    if target <= given.granted and given.granted >= current:
        return plan
    if target <= given.granted < current:  # the plan already goes at least as low as the grant
        return plan
    why = (f"cluster {given.cluster!r}: its budget of {given.budget} slots binds; granted {given.granted} "
           f"of {target} planned")
    if given.price is None:
        why += "; its jobs' arrivals alone exceed it: slots shared by weight"
    else:
        why += f"; a slot is worth {given.price:,.0f} slot-s over the horizon"
    if given.gave_way:
        named = ", ".join(given.gave_way[:NAMED]) + (f" and {len(given.gave_way) - NAMED} more"
                                                     if len(given.gave_way) > NAMED else "")
        why += f"; gave way: {named}"
    numbers = {"budget": given.budget, "granted": given.granted, "allocated": given.allocated, "planned": target,
               "price_slot_s": given.price, "gave_way": len(given.gave_way)}
    if given.granted == current:
        return hold(current, CODE, f"{plan.reason.message}; {why}", rule=RULE, proposed=plan, cite=False,
                    **numbers)
    reason = DecisionReason(code=CODE, rule=RULE, message=f"{plan.reason.message}; {why}",
                            numbers={**plan.reason.numbers, **numbers})
    return Plan(direction(current, given.granted), given.granted, reason, recommended=plan.recommended or target,
                notices=list(plan.notices))
