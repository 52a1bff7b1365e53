"""The production controls around the scaling policy (after the Flink autoscaler, FLIP-271).

Everything here is pure: a window's analysis, the job's configuration and the plan state kept in
knowledge go in; a plan (with its reason, the rule that fired and its numbers) and the state
updates come out. Every suppressed recommendation says what was recommended and why it was held,
so `autoscaler explain` can show it.

Order, per window: mode, rescale in flight, stale window, stabilization, invalid window, minimum
samples, scale-up effectiveness, policy (DS2 with catch-up and hysteresis, on rates averaged over
the metrics window), excluded period,
blocked scale-up, step factors, partition alignment, backlog mode, delayed scale-down. The quota
is applied by the shell, which reserves slots atomically across jobs (`apply_quota`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from contracts.jobs import JobConfig, Mode
from contracts.messages import Action, Analysis, DecisionReason
from contracts.periods import excluded_at, parse_periods
from plan.ds2 import Plan, direction, hold, plan_ds2
from plan.proactive import plan_proactive, predicted_recovery_s

# Restarts (per direction) measured by execute that the restart-time estimate looks back over.
RESTART_HISTORY = 10


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
    them, and the shuffle partitions of the job's exchanges."""
    units: list[tuple[str, int]] = []
    if analysis.partitions and not analysis.splittable:
        units.append(("source partitions", analysis.partitions))
    if analysis.shuffle_partitions:
        units.append(("shuffle partitions", analysis.shuffle_partitions))
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


def apply_delayed_scale_down(
    plan: Plan, current: int, now: float, state: dict[str, Any], config: JobConfig
) -> tuple[Plan, dict[str, Any]]:
    """Scale down only after `scale_down_delay_s`, to the largest parallelism recommended during it.

    Any window that does not recommend a scale-down (at the optimum, within the band, or a
    scale-up) cancels the pending one: the load has not stayed low for the whole delay."""
    if plan.action is not Action.SCALE_DOWN:
        cancel = {"scale_down_since": None, "scale_down_max": None} if state.get("scale_down_since") else {}
        return plan, cancel
    since = state.get("scale_down_since")
    if since is None or state.get("scale_down_from") != current:
        since, highest = now, plan.to_parallelism
    else:
        highest = max(int(state.get("scale_down_max") or plan.to_parallelism), plan.to_parallelism)
    waited = now - since
    if waited >= config.scale_down_delay_s:
        done = {"scale_down_since": None, "scale_down_max": None, "scale_down_from": None}
        message = (f"{plan.reason.message}; scale-down delayed {waited:.0f} s, to the largest parallelism "
                   f"recommended meanwhile ({highest})")
        numbers = {**plan.reason.numbers, "delayed_s": round(waited, 1), "recommended": highest}
        reason = plan.reason.model_copy(update={"message": message, "numbers": numbers})
        return replace(plan, to_parallelism=highest, reason=reason), done
    pending = {"scale_down_since": since, "scale_down_max": highest, "scale_down_from": current}
    return hold(
        current, "scale_down_delayed",
        f"scale-down to {highest} waits {config.scale_down_delay_s - waited:.0f} s more "
        f"(delay {config.scale_down_delay_s:.0f} s)",
        rule="delayed_scale_down", recommended=plan.to_parallelism, largest_recommended=highest,
        waited_s=round(waited, 1),
    ), pending


def check_scale_up_effectiveness(
    analysis: Analysis, state: dict[str, Any], config: JobConfig
) -> tuple[dict[str, Any], DecisionReason | None]:
    """After a scale-up, compare the capacity gained with the gain expected (the per-slot rate held).

    Returns state updates and, when the gain fell short of the threshold, a notice that blocks
    further scale-ups for `ineffective_block_s`."""
    pending = state.get("scale_up_check")
    if not pending or config.ineffective_scale_up_threshold <= 0:
        return ({"scale_up_check": None} if pending else {}), None
    if analysis.parallelism != pending["to"]:
        # Measured at another parallelism (stale, or the scale-up failed): wait for the new one.
        return {}, None
    before = pending["capacity_before"]
    expected_gain = pending["per_slot_before"] * (pending["to"] - pending["from"])
    gained = analysis.parallelism * analysis.true_processing_rate - before
    ratio = gained / expected_gain if expected_gain > 0 else 1.0
    updates: dict[str, Any] = {"scale_up_check": None}
    if ratio >= config.ineffective_scale_up_threshold:
        return updates, None
    updates["scale_up_blocked_until"] = analysis.window_end + config.ineffective_block_s
    notice = DecisionReason(
        code="ineffective_scale_up",
        rule="scale_up_effectiveness",
        message=(
            f"scaling up {pending['from']} -> {pending['to']} gained {gained:.1f} rec/s of the "
            f"{expected_gain:.1f} expected ({ratio:.0%} < {config.ineffective_scale_up_threshold:.0%}); "
            f"further scale-ups are blocked for {config.ineffective_block_s:.0f} s"
        ),
        numbers={"capacity_before": round(before, 3), "capacity_after": round(before + gained, 3),
                 "expected_gain": round(expected_gain, 3), "gain_ratio": round(ratio, 4)},
    )
    return updates, notice


def apply_quota(plan: Plan, current: int, granted: int, quota: int) -> tuple[Plan, DecisionReason | None]:
    """Trim a scale-up to the slots the quota grants (granted >= current: a job keeps what it has)."""
    if plan.action is not Action.SCALE_UP or granted >= plan.to_parallelism:
        return plan, None
    numbers = {"quota": quota, "granted": granted, "recommended": plan.to_parallelism}
    notice = DecisionReason(
        code="quota_bound", rule="slot_quota",
        message=f"the slot quota ({quota} across all jobs) trims the scale-up to {granted} of "
                f"{plan.to_parallelism} recommended", numbers=numbers,
    )
    if granted <= current:
        return hold(current, "quota_exhausted", notice.message, rule="slot_quota", **numbers), notice
    reason = plan.reason.model_copy(update={
        "message": f"{plan.reason.message}; {notice.message}", "numbers": {**plan.reason.numbers, **numbers},
    })
    return replace(plan, to_parallelism=granted, reason=reason), notice


SMOOTHED_FIELDS = ("arrival_rate", "true_processing_rate", "true_output_rate", "utilization")


def smoothing_samples(
    previous: list[dict[str, Any]] | None, analysis: Analysis, window_s: float
) -> list[dict[str, Any]]:
    """The valid windows at the current parallelism within the metrics window, this one included."""
    sample = {"window_end": analysis.window_end, **{f: getattr(analysis, f) for f in SMOOTHED_FIELDS}}
    kept = [s for s in previous or [] if s["window_end"] > analysis.window_end - window_s]
    return [*kept, sample]


def smoothed(analysis: Analysis, samples: list[dict[str, Any]]) -> Analysis:
    """The analysis with its rates averaged over the samples: one window can split a burst of
    arrivals with its neighbour, and a decision must not follow it. The backlog stays the latest."""
    if len(samples) <= 1:
        return analysis
    averages: dict[str, float | None] = {}
    for name in SMOOTHED_FIELDS:
        values = [s[name] for s in samples if s[name] is not None]
        averages[name] = sum(values) / len(values) if values else getattr(analysis, name)
    return analysis.model_copy(update=averages)


def policy_plan(
    analysis: Analysis, config: JobConfig, state: Mapping[str, Any], restart_time_s: float,
    downtimes: Mapping[str, Sequence[float]],
) -> Plan:
    """The job's policy; a proactive one that cannot decide yet falls back to DS2 and says why."""
    if not config.policy.proactive:
        return plan_ds2(analysis, config, restart_time_s=restart_time_s)
    # Metric time of plan's own last rescale decision: execute's `last_rescale_at` is wall time.
    last = state.get("rescale_decided_at")
    since = None if last is None else analysis.window_end - float(last)
    plan, why_not = plan_proactive(analysis, config, downtimes, since)
    if plan is not None:
        return plan
    fallback = plan_ds2(analysis, config, restart_time_s=restart_time_s)
    message = f"{config.policy.value} cannot decide yet ({why_not}); DS2: {fallback.reason.message}"
    return replace(fallback, reason=fallback.reason.model_copy(update={"message": message}))


def guarded_plan(
    analysis: Analysis,
    config: JobConfig,
    state: dict[str, Any],
    rescaling: bool,
    restart_time_s: float | None = None,
    downtimes: Mapping[str, Sequence[float]] | None = None,
) -> tuple[Plan, dict[str, Any]]:
    """The policy inside its controls. Returns the plan and the plan-state fields to store.

    `restart_time_s` is the expected restart time (see `expected_restart_time`); None means none
    has been measured, so the configured default applies. `downtimes` are the measured ones per
    direction ("up", "down"), for the proactive policies' recovery predictions."""
    current = analysis.parallelism
    now = analysis.window_end
    updates: dict[str, Any] = {}
    if config.mode is Mode.OFF:
        return hold(current, "mode_off", "autoscaling is off for this job", rule="mode"), updates
    if rescaling:
        return hold(current, "rescale_in_progress", "a rescale of this job is in progress", rule="one_rescale"), updates
    expected = state.get("expected_parallelism")
    if expected is not None:
        # Windows measured before a rescale still arrive after it; a few are dropped, but a job
        # restarted by other means must not be ignored forever.
        budget = state.get("stale_budget", 0)
        if current != expected and budget > 0:
            return hold(
                current, "stale_window",
                f"the window was measured at parallelism {current}, but the job was rescaled to {expected}",
                rule="stale_window", expected_parallelism=expected,
            ), {"stale_budget": budget - 1}
        updates["expected_parallelism"] = None
    # Windows seen at this parallelism, counting this one: a (re)started job spends its first
    # window starting workers, which understates its true rate.
    same = state.get("window_parallelism") == current
    seen = state.get("windows_at_parallelism", 0) + 1 if same else 1
    samples = state.get("samples_at_parallelism", 0) if same else 0
    updates |= {"window_parallelism": current, "windows_at_parallelism": seen, "samples_at_parallelism": samples}
    if seen <= config.stabilization_windows:
        return hold(
            current, "stabilizing",
            f"window {seen} of {config.stabilization_windows} ignored after a (re)start while the job settles",
            rule="stabilization",
        ), updates
    if not analysis.valid:
        return hold(current, "invalid_window", analysis.invalid_reason or "window not usable",
                    rule="valid_window"), updates
    samples += 1
    recent = smoothing_samples(state.get("samples") if same else None, analysis, config.metrics_window_s)
    updates |= {"samples_at_parallelism": samples, "samples": recent}
    if samples < config.min_samples:
        return hold(current, "collecting_samples",
                    f"sample {samples} of the {config.min_samples} needed at parallelism {current}",
                    rule="min_samples"), updates
    check_updates, notice = check_scale_up_effectiveness(analysis, state, config)
    updates |= check_updates
    notices = [notice] if notice else []
    state = {**state, **updates}

    restart = config.restart_time_s if restart_time_s is None else min(restart_time_s, config.restart_time_cap_s)
    rates = smoothed(analysis, recent)
    plan = policy_plan(rates, config, state, restart, downtimes or {})
    plan = replace(plan, notices=notices)
    if plan.action is Action.NONE:
        plan, delay_updates = apply_delayed_scale_down(plan, current, now, state, config)
        return plan, updates | delay_updates
    recommended = plan.to_parallelism

    def held(code: str, message: str, rule: str, **numbers: float | int | None) -> Plan:
        return replace(hold(current, code, message, rule=rule, recommended=recommended, **numbers),
                       notices=notices, recommended=recommended)

    period = excluded_at(now, parse_periods(config.excluded_periods))
    if period is not None:
        return held("excluded_period", f"no rescaling during the excluded period {period.text!r}",
                    "excluded_periods"), updates
    blocked_until = state.get("scale_up_blocked_until")
    if plan.action is Action.SCALE_UP and blocked_until and now < blocked_until:
        return held("scale_up_blocked",
                    f"scale-ups are blocked for {blocked_until - now:.0f} s more after an ineffective one",
                    "scale_up_effectiveness", blocked_until=blocked_until), updates
    notes: list[str] = []
    to, note = limit_step(current, plan.to_parallelism, config)
    notes += [note] if note else []
    if config.align_to_partitions:
        to, note = align_to_partitions(current, to, analysis, config)
        notes += [note] if note else []
    if to != plan.to_parallelism or notes:
        reason = plan.reason.model_copy(update={"message": "; ".join([plan.reason.message, *notes])})
        plan = replace(plan, action=direction(current, to), to_parallelism=to, reason=reason)
    if plan.action is Action.SCALE_DOWN:
        backlog, arrival = analysis.backlog or 0, analysis.arrival_rate or 0.0
        if backlog > arrival * config.backlog_tolerance_s:
            return held(
                "backlog_draining",
                f"no scale-down to {plan.to_parallelism} while the backlog ({backlog} records) exceeds "
                f"{config.backlog_tolerance_s:.0f} s of arrivals",
                "backlog_mode", backlog=backlog, arrival_rate=arrival,
            ), updates | {"scale_down_since": None, "scale_down_max": None}
    plan, delay_updates = apply_delayed_scale_down(plan, current, now, state, config)
    updates |= delay_updates
    if plan.action is not Action.NONE:
        # The recovery to expect for the parallelism that will run, ending where the detector will
        # call it over (the backlog tolerance). A proactive policy plans with a worst case (drained
        # to zero): kept beside it as `planned_recovery_s`.
        planned = plan.reason.numbers.get("predicted_recovery_s")
        predicted = predicted_recovery_s(rates, config, plan.to_parallelism, downtimes or {})
        if predicted is None and plan.reason.numbers.get("chosen") == plan.to_parallelism:
            predicted = planned
        numbers = {**plan.reason.numbers, "predicted_recovery_s": predicted}
        if planned is not None:
            numbers["planned_recovery_s"] = planned
        reason = plan.reason.model_copy(update={"numbers": numbers})
        plan = replace(plan, reason=reason)
        updates["pending_recovery"] = {"from": current, "to": plan.to_parallelism, "predicted_s": predicted,
                                       "window_end": now}
        if config.mode is Mode.AUTO:  # a recommendation does not restart the job
            updates["rescale_decided_at"] = now
    if plan.action is Action.SCALE_UP:
        # Judge the scale-up by the first settled window at the new parallelism.
        updates["scale_up_check"] = {"from": current, "to": plan.to_parallelism,
                                     "per_slot_before": analysis.true_processing_rate,
                                     "capacity_before": current * analysis.true_processing_rate}
    return replace(plan, recommended=recommended), updates
