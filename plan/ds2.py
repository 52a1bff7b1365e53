"""DS2's one-step optimal parallelism, with the bounds a production job needs.

Per operator (engines where operators scale independently), DS2's Eq. 7: walk the dataflow in
topological order, propagate the target rate from the sources through each operator's selectivity,
and give each operator the instances its true processing rate needs to carry its target input rate.
For shared-slot engines (Spark), DS2's Timely rule: the job needs the sum of its operators' needs,
which the job-level busy time already adds up, so slots = target rate / per-slot true rate.

Both size a rescale for the same target: the arrival rate plus, drained within the catch-up
duration, the backlog and what arrives while the job restarts. Staying put costs no restart, so
whether to stay (already optimal, or inside the utilization band) is judged on the steady target,
the same one without the restart's arrivals.
"""

from __future__ import annotations

import math
from graphlib import CycleError, TopologicalSorter

from contracts.analyses import Analysis, OperatorAnalysis
from contracts.decisions import Action, DecisionReason
from contracts.jobs import JobConfig
from plan.policy import Plan, direction, hold

# Guards the ceiling against floating-point noise (4.0000000001 slots is 4 slots).
EPSILON = 1e-9


def slots_for(rate: float, per_instance_rate: float, target_utilization: float) -> int:
    return max(1, math.ceil(rate / (per_instance_rate * target_utilization) - EPSILON))


def target_rate(
    arrival_rate: float, backlog: float, catch_up_duration_s: float, restart_time_s: float = 0.0
) -> float:
    """Keep up with arrivals and drain, within the catch-up duration, the current backlog plus what
    arrives while the job restarts (zero when it stays as it is)."""
    return arrival_rate + (backlog + arrival_rate * restart_time_s) / catch_up_duration_s


def topological_order(operators: list[OperatorAnalysis]) -> list[OperatorAnalysis]:
    by_id = {op.operator_id: op for op in operators}
    sorter = TopologicalSorter({op.operator_id: set(op.upstream) for op in operators})
    try:
        return [by_id[op_id] for op_id in sorter.static_order()]
    except CycleError as exc:
        raise ValueError(f"the operator graph has a cycle: {exc.args[1]}") from None


def operator_targets(
    operators: list[OperatorAnalysis], job_arrival_rate: float | None, target_utilization: float,
    backlog: int = 0, catch_up_duration_s: float = math.inf, restart_time_s: float = 0.0,
) -> tuple[dict[str, int], dict[str, float]]:
    """DS2 Eq. 7 with the catch-up: (optimal parallelism, target input rate) per operator.

    A source operator's arrival rate is its own reported one, else the job's arrival rate shared
    evenly by the sources, else what it processes now (no better signal). A source with an arrival
    rate gets `target_rate` of it: its share of the backlog (the job's backlog is at the sources,
    shared in proportion to their arrival rates, evenly when none arrives) and of what arrives
    during `restart_time_s`, drained within `catch_up_duration_s`; one without gets no catch-up term,
    as the job-level plan. Each other operator's target is what its upstream operators' targets
    emit (x their measured selectivity). That propagation is linear, so an operator's target is its
    share of the arrival rate plus (backlog + restart arrivals) x the fraction of source records
    that reach it (the product of the selectivities on the way, summed over the paths) / catch-up."""
    sources = [op for op in operators if not op.upstream]
    arrivals: dict[str, float | None] = {}
    for op in sources:
        if op.arrival_rate is not None:
            arrivals[op.operator_id] = op.arrival_rate
        elif job_arrival_rate is not None:
            arrivals[op.operator_id] = job_arrival_rate / len(sources)
        else:
            arrivals[op.operator_id] = None
    known = [rate for rate in arrivals.values() if rate is not None]
    total = sum(known)
    target_in: dict[str, float] = {}
    target_out: dict[str, float] = {}
    parallelism: dict[str, int] = {}
    for op in topological_order(operators):
        if not op.upstream:
            arrival = arrivals[op.operator_id]
            if arrival is None:
                rate_in = op.observed_processing_rate
            else:
                share = arrival / total if total > 0 else 1 / len(known)
                rate_in = target_rate(arrival, backlog * share, catch_up_duration_s, restart_time_s)
        else:
            rate_in = sum(target_out[up] for up in op.upstream)
        target_in[op.operator_id] = rate_in
        if op.true_processing_rate > 0:
            selectivity = op.true_output_rate / op.true_processing_rate
            parallelism[op.operator_id] = slots_for(rate_in, op.true_processing_rate, target_utilization)
        else:
            # Nothing processed: no rate to scale by; keep the operator as it is.
            selectivity = 0.0
            parallelism[op.operator_id] = op.parallelism
        target_out[op.operator_id] = rate_in * selectivity
    return parallelism, target_in


def bound(parallelism: int, config: JobConfig, analysis: Analysis) -> tuple[int, list[str]]:
    """Clamp to the job's min/max and to how finely its source can be split."""
    notes: list[str] = []
    bounded = min(max(parallelism, config.min_parallelism), config.max_parallelism)
    if bounded != parallelism:
        notes.append(f"bounded to [{config.min_parallelism}, {config.max_parallelism}]")
    if not analysis.splittable and analysis.partitions and bounded > analysis.partitions:
        notes.append(f"capped at the source's {analysis.partitions} partitions (not splittable)")
        bounded = max(analysis.partitions, config.min_parallelism)
    return bounded, notes


def plan_ds2(analysis: Analysis, config: JobConfig, restart_time_s: float = 0.0) -> Plan:
    current = analysis.parallelism
    if not analysis.valid:
        return hold(current, "invalid_window", analysis.invalid_reason or "window not usable", rule="valid_window")
    if config.per_operator and analysis.operators:
        return _plan_per_operator(analysis, config, restart_time_s)
    return _plan_job(analysis, config, restart_time_s)


def _target(analysis: Analysis, config: JobConfig, restart_time_s: float = 0.0) -> tuple[float, str]:
    if analysis.arrival_rate is None:
        return analysis.observed_processing_rate, "observed processing rate (the job reports no source)"
    restart = f" and the {restart_time_s:.0f} s restart's arrivals" if restart_time_s else ""
    return (
        target_rate(analysis.arrival_rate, analysis.backlog or 0, config.catch_up_duration_s, restart_time_s),
        f"arrival rate plus the backlog{restart} drained in {config.catch_up_duration_s:.0f} s",
    )


def _within_band(implied_utilization: float, config: JobConfig) -> bool:
    low = config.target_utilization - config.utilization_band
    high = min(config.target_utilization + config.utilization_band, 1.0)
    return low <= implied_utilization <= high


def _plan_job(analysis: Analysis, config: JobConfig, restart_time_s: float) -> Plan:
    current = analysis.parallelism
    per_slot = analysis.true_processing_rate
    # Staying put costs no restart: the band and "already optimal" are judged without one; a
    # rescale is sized to also drain what arrives while the job restarts.
    steady_rate, _ = _target(analysis, config)
    rate, rate_basis = _target(analysis, config, restart_time_s)
    steady, _ = bound(slots_for(steady_rate, per_slot, config.target_utilization), config, analysis)
    unbounded = slots_for(rate, per_slot, config.target_utilization)
    to, notes = bound(unbounded, config, analysis)
    implied = steady_rate / (current * per_slot)
    numbers: dict[str, float | int | None] = {
        "true_processing_rate_per_slot": round(per_slot, 3),
        "true_output_rate_per_slot": round(analysis.true_output_rate, 3),
        "target_rate": round(rate, 3),
        "steady_target_rate": round(steady_rate, 3),
        "restart_time_s": round(restart_time_s, 3),
        "arrival_rate": analysis.arrival_rate,
        "backlog": analysis.backlog,
        "capacity_now": round(current * per_slot, 3),
        "capacity_at_target": round(to * per_slot, 3),
        "utilization": round(analysis.utilization, 4),
        "implied_utilization": round(implied, 4),
        "optimal_unbounded": unbounded,
    }
    if steady == current or steady < current <= to:
        # Optimal as it is, or a scale-down whose restart would cost more capacity than it frees.
        return Plan(Action.NONE, current, DecisionReason(
            code="at_optimal", rule="ds2", numbers=numbers,
            message=f"{current} slots carry {steady_rate:.1f} rec/s at {implied:.0%} utilization"
            + ("" if steady == current else f"; rescaling to {steady} would not pay for its restart"),
        ))
    if _within_band(implied, config):
        return Plan(Action.NONE, current, DecisionReason(
            code="within_utilization_band", rule="utilization_band", numbers=numbers,
            message=f"{current} slots would run at {implied:.0%} utilization, inside "
            f"{config.target_utilization:.0%} +- {config.utilization_band:.0%}",
        ), recommended=to)
    action = direction(current, to)
    message = (
        f"target rate {rate:.1f} rec/s ({rate_basis}) / ({per_slot:.1f} rec/s per slot x "
        f"{config.target_utilization:.0%}) -> {unbounded} slots"
    )
    if notes:
        message += "; " + "; ".join(notes)
    return Plan(action, to, DecisionReason(code="ds2_optimal", rule="ds2", message=message, numbers=numbers),
                recommended=to)


def _plan_per_operator(analysis: Analysis, config: JobConfig, restart_time_s: float) -> Plan:
    """Each operator at DS2's parallelism for the job-level target (`operator_targets`), as the
    job-level plan: a rescale is sized with the restart's arrivals, staying put is judged without
    them. The plan's parallelism is the largest operator's (the slots the job holds when a slot runs
    one instance of each operator), `operator_targets` each one's."""
    def targets(restart_s: float) -> tuple[dict[str, int], dict[str, float]]:
        parallelism, target_in = operator_targets(
            analysis.operators, analysis.arrival_rate, config.target_utilization,
            analysis.backlog or 0, config.catch_up_duration_s, restart_s)
        return {op_id: bound(p, config, analysis)[0] for op_id, p in parallelism.items()}, target_in

    steady, steady_in = targets(0.0)
    bounded, target_in = targets(restart_time_s)
    current = {op.operator_id: op.parallelism for op in analysis.operators}
    numbers: dict[str, float | int | None] = {
        "arrival_rate": analysis.arrival_rate, "backlog": analysis.backlog,
        "restart_time_s": round(restart_time_s, 3),
    }
    implied: dict[str, float] = {}
    for op in analysis.operators:
        op_id = op.operator_id
        numbers[f"{op_id}.true_processing_rate"] = round(op.true_processing_rate, 3)
        numbers[f"{op_id}.true_output_rate"] = round(op.true_output_rate, 3)
        numbers[f"{op_id}.target_rate"] = round(target_in[op_id], 3)
        numbers[f"{op_id}.steady_target_rate"] = round(steady_in[op_id], 3)
        if op.true_processing_rate > 0:
            implied[op_id] = steady_in[op_id] / (op.parallelism * op.true_processing_rate)
            numbers[f"{op_id}.implied_utilization"] = round(implied[op_id], 4)
    to = max(bounded.values())
    if all(steady[k] <= current[k] <= bounded[k] for k in current):
        # Every operator optimal as it is, or a scale-down whose restart would cost more than it frees.
        unpaid = ", ".join(f"{k} {current[k]}->{steady[k]}" for k in current if steady[k] != current[k])
        return Plan(
            Action.NONE, analysis.parallelism,
            DecisionReason(code="at_optimal", rule="ds2", numbers=numbers,
                           message="every operator runs at its DS2 parallelism"
                           + (f"; rescaling ({unpaid}) would not pay for its restart" if unpaid else "")),
            operator_targets=current,
        )
    if all(_within_band(u, config) for u in implied.values()):
        return Plan(
            Action.NONE, analysis.parallelism,
            DecisionReason(
                code="within_utilization_band", rule="utilization_band",
                message="every operator's implied utilization is inside the target band",
                numbers=numbers,
            ),
            operator_targets=current, recommended=to,
        )
    grows = any(bounded[k] > current[k] for k in bounded)
    action = Action.SCALE_UP if grows else Action.SCALE_DOWN
    changes = ", ".join(f"{k} {current[k]}->{bounded[k]}" for k in bounded if bounded[k] != current[k])
    return Plan(
        action, to,
        DecisionReason(code="ds2_optimal", rule="ds2", message=f"DS2 per-operator targets: {changes}", numbers=numbers),
        operator_targets=bounded, recommended=to,
    )
