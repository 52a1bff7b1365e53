"""`default`: a rescale only for a real gain, and a plan that runs short now only by the job's choice.

The schedule search (`plan.cost_plan`) charges every rescale its action penalty inside a schedule's
cost. So a rescale is worth its restart where its schedule costs less than the best schedule that holds
the current parallelism now (`holding_now`), which pays the penalties of its own later rescales: the
rescale then saves, in slot-seconds and backlog work, more than the penalties of the rescales it adds.
Where it does not, the planner holds (`no_real_gain`): on a tie the search's order of visit picked one
of two schedules of equal cost (a demo run went 6 -> 5 on "plan 5 now, 6 from +19 min ... costs 10,260
slot-s; next best (6 now) 10,260"), and the search, a heuristic, may have dropped the holding path.
Holding is an option where the current parallelism is within bounds; a hold that breaks the target more
than the plan does is none: a scale-up the target needs goes ahead at once.

Where the job allows no planned shortfall (`allow_planned_shortfall` off; on by default), a plan moves
only to a parallelism that carries the planned rate now (`plan.cost_plan.first_steps`), unless none
within bounds carries it. It may hold one that runs short while the backlog keeps its target
(measured over its first windows, a parallelism's lower quantile is wide: made to move, a planner
scaled 8 slots that carried their load up to 9 and back after 5 minutes). The reason says where a
plan's first step runs short (`shortfall_note`).

No margin beyond the penalties is asked: the best holding schedule is often the plan one step later
(6 now, 5 from +1 min), dearer by one slot for one step; against a margin of a penalty it would always
look as good, and a one-slot trim would wait for ever, one window at a time.
"""

from __future__ import annotations

from plan.cost_plan import EPSILON, PlanProblem, Schedule, carrying, describe, solve

TIE_SLOT_S = 1.0  # a gain below a slot-second (what the reason's rounded costs show) is a tie
VIOLATION_TOLERANCE_S = 1e-6


def holding_now(problem: PlanProblem) -> Schedule | None:
    """The best schedule that holds the current parallelism now; None where it is outside the bounds."""
    current = problem.parallelism
    if not problem.min_parallelism <= current <= problem.max_parallelism:
        return None
    return solve(problem, force_first=current)


def no_real_gain(problem: PlanProblem, chosen: Schedule) -> Schedule | None:
    """The holding schedule to keep instead of `chosen`, a rescale now, where the rescale gains nothing
    real: holding keeps the target as well and costs no more (within TIE_SLOT_S). None: the rescale goes
    ahead (or `chosen` holds already)."""
    if chosen.first == problem.parallelism:
        return None
    held = holding_now(problem)
    if held is None or held.violation_s > chosen.violation_s + VIOLATION_TOLERANCE_S:
        return None
    return held if held.cost - chosen.cost <= TIE_SLOT_S else None


def held_message(problem: PlanProblem, chosen: Schedule, held: Schedule, step_s: float) -> str:
    """Why a rescale with no real gain holds: the holding schedule, its cost, what the rescale saves against
    it before penalties and the penalties of the rescales it adds."""
    extra = chosen.rescales - held.rescales
    penalty = problem.action_penalty_s
    saving = held.cost - chosen.cost + extra * penalty
    penalties = (f"its penalty ({penalty:,.0f} slot-s)" if extra == 1 else
                 f"the penalties of the {extra} more rescales it takes ({penalty:,.0f} slot-s each)")
    against = (f"saves {saving:,.0f} slot-s against it, no more than {penalties}" if extra > 0 and saving > 0
               else "saves nothing against it")
    return (f"holding {problem.parallelism} now ({describe(held, step_s)}) costs {held.cost:,.0f} slot-s: "
            f"the rescale to {chosen.first} {against}, no real gain")


def shortfall_note(problem: PlanProblem, schedule: Schedule) -> str | None:
    """What the reason says where the schedule's first step runs short of the planned rate now (its
    capacity, a lower quantile, below it): by the job's choice, as a hold, or because nothing within
    bounds carries it. None where it carries the rate."""
    p = schedule.first
    capacity, rate = float(problem.capacity[min(p, problem.max_parallelism)]), float(problem.rates[0])
    if capacity >= rate - EPSILON:
        return None
    short = f"{capacity:,.0f} rec/s at {p} against the planned {rate:,.0f} rec/s now"
    if problem.allow_planned_shortfall:
        return f"it runs short on purpose ({short}), the backlog growing toward its target: the job allows it " \
               "(allow_planned_shortfall)"
    if carrying(problem).any():  # only the current parallelism may start short: a hold
        return f"the current parallelism runs short ({short}): held while the backlog keeps its target"
    return f"it runs short ({short}): no parallelism within bounds carries the rate"
