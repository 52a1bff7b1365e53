"""What the production controls compute (after the Flink autoscaler, FLIP-271): the step factors,
partition alignment, the scale-up effectiveness check, the backlog heading beyond its target, and
rates averaged over the metrics window.

Each is pure: numbers, the window's analysis, the job's configuration and the plan state go in.
The gates that hold or trim a plan with them are `plan.gates`; `plan.guarded` and the default
planner apply those in order.
"""

from __future__ import annotations

import math
from typing import Any

from contracts.analyses import Analysis
from contracts.decisions import DecisionReason
from contracts.jobs import JobConfig
from contracts.plan_state import PlanState, RateSample


def limit_step(current: int, to: int, config: JobConfig) -> tuple[int, str | None]:
    """Bound one step by the maximum scale-up and scale-down factors."""
    if to > current:
        ceiling = max(current + 1, math.ceil(current * (1 + config.max_scale_up_factor)))
        if to > ceiling:
            return ceiling, f"scale-up limited to {ceiling} by max_scale_up_factor {config.max_scale_up_factor:g}"
    elif to < current:
        floor = max(1, min(current - 1, math.floor(current * (1 - config.max_scale_down_factor))))
        if to < floor:
            return floor, f"scale-down limited to {floor} by max_scale_down_factor {config.max_scale_down_factor:g}"
    return to, None


def even_parallelism(units: int, wanted: int, upper: int) -> int | None:
    """The smallest parallelism >= wanted (<= upper) at which `units` partitions spread evenly.

    With `units` partitions over p tasks the busiest task carries ceil(units / p) of them, so a
    job runs as fast as units / ceil(units / p) evenly loaded tasks; the aligned parallelism gives
    at least the wanted capacity without idle slots."""
    if wanted >= units:
        return wanted if wanted <= upper else None
    per_task = units // wanted  # most partitions a task may carry to reach the wanted capacity
    aligned = math.ceil(units / per_task)
    return aligned if aligned <= upper else None


def align(current: int, to: int, units: int, lower: int, upper: int) -> int:
    """Align `to` to `units` partitions within [lower, upper], never reversing the scaling direction
    (a scale-down that alignment would round up to the current parallelism or beyond stays unaligned)."""
    aligned = even_parallelism(units, to, upper)
    if aligned is None or aligned < lower:
        return to
    if to < current <= aligned:
        return to
    return aligned


def partition_units(analysis: Analysis) -> list[tuple[str, int]]:
    """What must spread evenly over the slots: the source partitions when the source cannot split
    them, the shuffle partitions of the job's exchanges, and a stateful query's state partitions
    (fixed at its first start) when the shuffle partitions are not reported as the same."""
    units: list[tuple[str, int]] = []
    if analysis.partitions and not analysis.splittable:
        units.append(("source partitions", analysis.partitions))
    if analysis.shuffle_partitions:
        units.append(("shuffle partitions", analysis.shuffle_partitions))
    state = analysis.state.partitions if analysis.state is not None else None
    if state and state != analysis.shuffle_partitions:
        units.append(("state partitions", state))
    return units


def align_to_partitions(current: int, to: int, analysis: Analysis, config: JobConfig) -> tuple[int, str | None]:
    units = partition_units(analysis)
    if not units or to == current:
        return to, None
    upper = config.max_parallelism
    if analysis.partitions and not analysis.splittable:
        upper = min(upper, max(analysis.partitions, config.min_parallelism))
    aligned = to
    for _, count in units:  # source first: it bounds the parallelism that can be used at all
        aligned = align(current, aligned, count, config.min_parallelism, upper)
    if aligned == to:
        return to, None
    names = " and ".join(f"{count} {name}" for name, count in units)
    return aligned, f"aligned {to} -> {aligned} to spread {names} evenly"


JUDGED_WINDOWS = 3  # windows at the new parallelism a scale-up is judged on
FIRST_BLOCK_S = 300.0  # the first block after an ineffective scale-up; it doubles with each one in a row
CONFIDENCE_Z = 2.0  # the gain's upper confidence bound: the mean plus two standard errors


def check_scale_up_effectiveness(
    analysis: Analysis, state: PlanState, config: JobConfig
) -> tuple[dict[str, Any], DecisionReason | None]:
    """After a scale-up, compare the capacity gained with the gain expected (the per-slot rate held), on
    evidence: `JUDGED_WINDOWS` valid windows at the new parallelism, and only when even the upper
    confidence bound of the gain (mean plus `CONFIDENCE_Z` standard errors of the per-slot rate) falls
    short of the threshold is it ineffective. Then scale-ups are blocked for `FIRST_BLOCK_S`, doubled
    for each ineffective one in a row, at most `ineffective_block_s`; an effective one resets that.

    Returns state updates and, when the gain fell short, a notice."""
    pending = state.scale_up_check
    if not pending or config.ineffective_scale_up_threshold <= 0:
        return ({"scale_up_check": None} if pending else {}), None
    if analysis.parallelism != pending.to:
        # Measured at another parallelism (stale, or the scale-up failed): wait for the new one.
        return {}, None
    seen = [*pending.per_slot_after, analysis.true_processing_rate]
    if len(seen) < JUDGED_WINDOWS:
        return {"scale_up_check": pending.model_copy(update={"per_slot_after": seen})}, None
    mean = sum(seen) / len(seen)
    sd = math.sqrt(sum((x - mean) ** 2 for x in seen) / (len(seen) - 1))
    upper = mean + CONFIDENCE_Z * sd / math.sqrt(len(seen))
    before = pending.capacity_before
    expected_gain = pending.per_slot_before * (pending.to - pending.from_parallelism)
    gained = analysis.parallelism * mean - before
    ratio = gained / expected_gain if expected_gain > 0 else 1.0
    ratio_upper = (analysis.parallelism * upper - before) / expected_gain if expected_gain > 0 else 1.0
    updates: dict[str, Any] = {"scale_up_check": None}
    if ratio_upper >= config.ineffective_scale_up_threshold:
        return updates | {"ineffective_streak": 0}, None
    block = min(config.ineffective_block_s, FIRST_BLOCK_S * 2**state.ineffective_streak)
    updates |= {"scale_up_blocked_until": analysis.window_end + block,
                "ineffective_streak": state.ineffective_streak + 1}
    notice = DecisionReason(
        code="ineffective_scale_up",
        rule="scale_up_effectiveness",
        message=(
            f"scaling up {pending.from_parallelism} -> {pending.to} gained {gained:.1f} rec/s of the "
            f"{expected_gain:.1f} expected over {len(seen)} windows (at most {ratio_upper:.0%} at "
            f"{CONFIDENCE_Z:g} standard errors < {config.ineffective_scale_up_threshold:.0%}); further scale-ups "
            f"are blocked for {block:.0f} s unless the backlog heads beyond its target"
        ),
        numbers={"capacity_before": round(before, 3), "capacity_after": round(before + gained, 3),
                 "expected_gain": round(expected_gain, 3), "gain_ratio": round(ratio, 4),
                 "gain_ratio_upper": round(ratio_upper, 4), "blocked_s": block},
    )
    return updates, notice


def heading_beyond_target(analysis: Analysis, config: JobConfig) -> bool:
    """Whether the backlog, growing as it does, passes its target within the target's own time. It grows
    at least by the arrivals beyond the job's capacity (its slots times DS2's true rate): the growth the
    monitor measured between a window's reports is 0 when the window holds one (a job whose micro-batches
    outlast the report interval reports once per batch, exactly when it falls behind)."""
    backlog, arrival = float(analysis.backlog or 0), analysis.arrival_rate or 0.0
    shortfall = arrival - analysis.parallelism * analysis.true_processing_rate
    growth = max(0.0, analysis.backlog_growth_rate or 0.0, shortfall)
    return backlog + growth * config.backlog_target_s > config.backlog_target_s * arrival


SMOOTHED_FIELDS = ("arrival_rate", "true_processing_rate", "true_output_rate", "utilization")


def smoothing_samples(previous: list[RateSample] | None, analysis: Analysis, window_s: float) -> list[RateSample]:
    """The valid windows at the current parallelism within the metrics window, this one included."""
    sample = RateSample(window_end=analysis.window_end, **{f: getattr(analysis, f) for f in SMOOTHED_FIELDS})
    kept = [s for s in previous or [] if s.window_end > analysis.window_end - window_s]
    return [*kept, sample]


def smoothed(analysis: Analysis, samples: list[RateSample]) -> Analysis:
    """The analysis with its rates averaged over the samples: one window can split a burst of
    arrivals with its neighbour, and a decision must not follow it. The backlog stays the latest."""
    if len(samples) <= 1:
        return analysis
    averages: dict[str, float | None] = {}
    for name in SMOOTHED_FIELDS:
        values = [value for s in samples if (value := getattr(s, name)) is not None]
        averages[name] = sum(values) / len(values) if values else getattr(analysis, name)
    return analysis.model_copy(update=averages)
