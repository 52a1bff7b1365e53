"""Gates: the rules between what a policy proposes and what the job is told to do, as data.

A gate is pure. It is given the proposed plan (None before a policy proposes one: the default
planner's measuring hold stands before its search), the plan state, the window's analysis and the
job's configuration, plus whatever it alone needs at construction (the slots the quota granted, the
windows of the arrival level measured), and answers with a `Verdict`: the plan passes, is trimmed to
another parallelism (with a note on why, appended to the plan's message), or is held (a reason code
and the gate's rule, `reason.rule`), with plan-state changes either way. A plan with no action
passes every gate but `DelayedScaleDown`, which cancels a pending scale-down then.

`apply_gates` runs an ordered list and stops at the first hold, built by `plan.policy.hold`, the one
way to make a held decision: it keeps what the policy recommended and its notices. The orders in use:

- `default` (`plan.policies.default`): `MeasuringHold` before the search; after it, when the plan moves
  the job: `LevelHold`, `ScaleDownAfterScaleUp`, `ExcludedPeriods`, `StepBounds`,
  `PartitionAlignment` (holds cite the plan: its message and numbers first).
- `reactive`, `daedalus`, `hybrid` (`plan.guarded`): `MinimumSamples` before the core; after it:
  `ExcludedPeriods`, `ScaleUpEffectiveness`, `StepBounds`, `PartitionAlignment`, `BacklogMode`,
  `DelayedScaleDown`.
- every policy, in the plan agent: `SlotQuota` (`with_quota`), after the policy.

docs/policies.md ("Gates") lists each gate's reason codes and its policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from contracts.analyses import Analysis
from contracts.decisions import Action, DecisionReason
from contracts.jobs import JobConfig
from contracts.periods import excluded_at, parse_periods
from contracts.plan_state import PlanState
from plan.capacity_estimate import FIT_MIN_WINDOWS
from plan.controls import JUDGED_WINDOWS, align_to_partitions, heading_beyond_target, limit_step
from plan.policy import Plan, direction, hold

LEVEL_WINDOWS = 2  # windows of a new arrival level measured before a rescale (unless the backlog presses)
Numbers = Mapping[str, float | int | None]


@dataclass(frozen=True)
class Verdict:
    """A gate's answer. Passes when neither `to` nor `code` is set; trims to `to` (saying `note`);
    holds with `code` under `rule`, saying `message`. `numbers` join the reason either way;
    `updates` are plan-state changes; `notice` is told beside the decision."""

    to: int | None = None
    note: str = ""
    code: str | None = None
    rule: str = ""
    message: str = ""
    numbers: Numbers = field(default_factory=dict)
    updates: Mapping[str, Any] = field(default_factory=dict)
    notice: DecisionReason | None = None


PASS = Verdict()


class Gate(Protocol):
    """One rule between a proposal and the decision (see the module docstring)."""

    rule: ClassVar[str]  # `reason.rule` of its holds and trims
    codes: ClassVar[tuple[str, ...]]  # the reason codes it holds with

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        ...


def moves(plan: Plan | None) -> bool:
    """Whether the plan rescales the job (only such plans are trimmed or held, but by the measuring holds)."""
    return plan is not None and plan.action is not Action.NONE


@dataclass(frozen=True)
class Gated:
    """What a list of gates made of a proposal: the plan, the plan-state changes, the rule that held it."""

    plan: Plan | None
    updates: dict[str, Any]
    held_by: str | None = None


def settle(plan: Plan | None, current: int, verdict: Verdict, cite: bool = False) -> Plan | None:
    """The plan after one verdict (`cite`: a hold cites the proposal's reason, see `plan.policy.hold`)."""
    if verdict.notice is not None and plan is not None:
        plan = replace(plan, notices=[*plan.notices, verdict.notice])
    if verdict.code is not None:
        return hold(current, verdict.code, verdict.message, verdict.rule, proposed=plan, cite=cite, **verdict.numbers)
    if verdict.to is None or plan is None:
        return plan
    reason = plan.reason.model_copy(update={"message": "; ".join([plan.reason.message, verdict.note]),
                                            "numbers": {**plan.reason.numbers, **verdict.numbers}})
    # The plan's parallelism is its largest operator's: a trim below it caps every operator's target.
    targets = {op: min(p, verdict.to) for op, p in plan.operator_targets.items()}
    return replace(plan, action=direction(current, verdict.to), to_parallelism=verdict.to, reason=reason,
                   operator_targets=targets)


def apply_gates(gates: Sequence[Gate], plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig,
                cite: bool = False) -> Gated:
    """The gates in order on the proposal, each given the plan the previous ones left and the same plan
    state; the first hold ends it."""
    updates: dict[str, Any] = {}
    for gate in gates:
        verdict = gate(plan, state, analysis, config)
        updates |= verdict.updates
        plan = settle(plan, analysis.parallelism, verdict, cite)
        if verdict.code is not None:
            return Gated(plan, updates, gate.rule)
    return Gated(plan, updates)


# ---------------------------------------------------------------- measuring holds


@dataclass(frozen=True)
class MeasuringHold:
    """`default`: no plan until the current parallelism's capacity was measured over FIT_MIN_WINDOWS
    windows (`plan.capacity_estimate`), unless the backlog heads beyond its target. Holds any proposal."""

    measured: int  # windows measured at the current parallelism
    rule: ClassVar[str] = "default"
    codes: ClassVar[tuple[str, ...]] = ("measuring",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if self.measured >= FIT_MIN_WINDOWS or heading_beyond_target(analysis, config):
            return PASS
        return Verdict(code="measuring", rule=self.rule, message=(
            f"window {self.measured} of {FIT_MIN_WINDOWS} measured at parallelism {analysis.parallelism} "
            "before the next plan (sooner if the backlog heads beyond its target)"))


@dataclass(frozen=True)
class MinimumSamples:
    """Guarded policies: no decision before `min_samples` valid windows at the current parallelism
    (after the Flink autoscaler's metrics window, FLIP-271). Holds any proposal."""

    samples: int  # valid windows at the current parallelism, this one included
    rule: ClassVar[str] = "min_samples"
    codes: ClassVar[tuple[str, ...]] = ("collecting_samples",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if self.samples >= config.min_samples:
            return PASS
        return Verdict(code="collecting_samples", rule=self.rule, message=(
            f"sample {self.samples} of the {config.min_samples} needed at parallelism {analysis.parallelism}"))


@dataclass(frozen=True)
class LevelHold:
    """`default`: a rescale waits for LEVEL_WINDOWS windows of a new arrival level (`plan.level`, Page's
    CUSUM): its first window may straddle the change. A scale-up waits only while the backlog can."""

    windows: int  # windows of the current arrival level
    rule: ClassVar[str] = "default"
    codes: ClassVar[tuple[str, ...]] = ("measuring_level",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or not moves(plan) or self.windows >= LEVEL_WINDOWS:
            return PASS
        if plan.action is Action.SCALE_UP and heading_beyond_target(analysis, config):
            return PASS
        return Verdict(code="measuring_level", rule=self.rule, message=(
            f"the arrival level changed {self.windows} window ago: a rescale waits for {LEVEL_WINDOWS} windows of it"))


# ---------------------------------------------------------------- the job's limits


@dataclass(frozen=True)
class ExcludedPeriods:
    """No rescaling inside the job's `excluded_periods` (UTC, metric time; `contracts.periods`), after the
    Flink autoscaler's excluded periods (FLIP-271)."""

    rule: ClassVar[str] = "excluded_periods"
    codes: ClassVar[tuple[str, ...]] = ("excluded_period",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if not moves(plan):
            return PASS
        period = excluded_at(analysis.window_end, parse_periods(config.excluded_periods))
        if period is None:
            return PASS
        return Verdict(code="excluded_period", rule=self.rule,
                       message=f"no rescaling during the excluded period {period.text!r}")


@dataclass(frozen=True)
class StepBounds:
    """Trims a rescale to [`min_parallelism`, `max_parallelism`] (never reversing its direction: a job
    already beyond a bound is not moved across it), then one step to the maximum scale-up and scale-down
    factors (`plan.controls.limit_step`, FLIP-271's max scale-up/down factors)."""

    rule: ClassVar[str] = "step_bounds"
    codes: ClassVar[tuple[str, ...]] = ()

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or not moves(plan):
            return PASS
        current, to = analysis.parallelism, plan.to_parallelism
        notes = []
        if to > current and to > config.max_parallelism:
            to = max(current, config.max_parallelism)
            notes.append(f"scale-up limited to {to} by max_parallelism {config.max_parallelism}")
        elif to < current and to < config.min_parallelism:
            to = min(current, config.min_parallelism)
            notes.append(f"scale-down limited to {to} by min_parallelism {config.min_parallelism}")
        to, note = limit_step(current, to, config)
        notes += [note] if note else []
        return Verdict(to=to, note="; ".join(notes)) if notes else PASS


@dataclass(frozen=True)
class PartitionAlignment:
    """With `align_to_partitions`, aligns a rescale so unsplittable source partitions and shuffle
    partitions spread evenly, never reversing its direction (`plan.controls.align_to_partitions`; the
    Flink autoscaler's even spread, FLIP-271)."""

    rule: ClassVar[str] = "partition_alignment"
    codes: ClassVar[tuple[str, ...]] = ()

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or not moves(plan) or not config.align_to_partitions:
            return PASS
        to, note = align_to_partitions(analysis.parallelism, plan.to_parallelism, analysis, config)
        return Verdict(to=to, note=note) if note else PASS


# ---------------------------------------------------------------- guarded controls


@dataclass(frozen=True)
class ScaleUpEffectiveness:
    """After a scale-up, no other while it is judged (JUDGED_WINDOWS windows) or blocked after an
    ineffective one (`plan.controls.check_scale_up_effectiveness`, FLIP-271's scaling effectiveness
    detection), unless the backlog heads beyond its target. docs/policies.md."""

    rule: ClassVar[str] = "scale_up_effectiveness"
    codes: ClassVar[tuple[str, ...]] = ("judging_scale_up", "scale_up_blocked")

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or plan.action is not Action.SCALE_UP or heading_beyond_target(analysis, config):
            return PASS
        current, now = analysis.parallelism, analysis.window_end
        judging = state.scale_up_check
        if judging is not None and judging.to == current:
            return Verdict(code="judging_scale_up", rule=self.rule, message=(
                f"the scale-up to {current} is judged on {len(judging.per_slot_after)} of {JUDGED_WINDOWS} "
                "windows before another"))
        blocked_until = state.scale_up_blocked_until
        if blocked_until and now < blocked_until:
            return Verdict(code="scale_up_blocked", rule=self.rule, numbers={"blocked_until": blocked_until}, message=(
                f"scale-ups are blocked for {blocked_until - now:.0f} s more after an ineffective one"))
        return PASS


@dataclass(frozen=True)
class BacklogMode:
    """No scale-down while the backlog exceeds `backlog_tolerance_s` of arrivals; a pending delayed
    scale-down is cancelled (docs/policies.md, the production controls)."""

    rule: ClassVar[str] = "backlog_mode"
    codes: ClassVar[tuple[str, ...]] = ("backlog_draining",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or plan.action is not Action.SCALE_DOWN:
            return PASS
        backlog, arrival = analysis.backlog or 0, analysis.arrival_rate or 0.0
        if backlog <= arrival * config.backlog_tolerance_s:
            return PASS
        return Verdict(code="backlog_draining", rule=self.rule, numbers={"backlog": backlog, "arrival_rate": arrival},
                       updates={"scale_down_since": None, "scale_down_max": None}, message=(
                           f"no scale-down to {plan.to_parallelism} while the backlog ({backlog} records) exceeds "
                           f"{config.backlog_tolerance_s:.0f} s of arrivals"))


@dataclass(frozen=True)
class DelayedScaleDown:
    """Guarded policies: scale down only after `scale_down_delay_s`, to the largest parallelism
    recommended during it (FLIP-271's scale-down interval). Any window that does not recommend a
    scale-down (a plan with no action included) cancels the pending one."""

    rule: ClassVar[str] = "delayed_scale_down"
    codes: ClassVar[tuple[str, ...]] = ("scale_down_delayed",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or plan.action is not Action.SCALE_DOWN:
            cancel = {"scale_down_since": None, "scale_down_max": None} if state.scale_down_since else {}
            return Verdict(updates=cancel)
        current, now = analysis.parallelism, analysis.window_end
        since = state.scale_down_since
        if since is None or state.scale_down_from != current:
            since, highest = now, plan.to_parallelism
        else:
            highest = max(int(state.scale_down_max or plan.to_parallelism), plan.to_parallelism)
        waited = now - since
        if waited >= config.scale_down_delay_s:
            return Verdict(
                to=highest, numbers={"delayed_s": round(waited, 1), "recommended": highest},
                note=f"scale-down delayed {waited:.0f} s, to the largest parallelism recommended meanwhile ({highest})",
                updates={"scale_down_since": None, "scale_down_max": None, "scale_down_from": None})
        return Verdict(
            code="scale_down_delayed", rule=self.rule,
            message=(f"scale-down to {highest} waits {config.scale_down_delay_s - waited:.0f} s more "
                     f"(delay {config.scale_down_delay_s:.0f} s)"),
            numbers={"recommended": plan.to_parallelism, "largest_recommended": highest, "waited_s": round(waited, 1)},
            updates={"scale_down_since": since, "scale_down_max": highest, "scale_down_from": current})


@dataclass(frozen=True)
class ScaleDownAfterScaleUp:
    """`default`: a scale-down within `scale_down_delay_s` of its last scale-up waits unless the arrival
    level has shifted since (the load dropped): the planner corrects its own safe-side estimate at most
    once per delay, one action per load change (docs/policies.md, the default)."""

    last_up_at: float | None  # metric time of the last scale-up decided
    shifted_at: float | None  # metric time of the arrival level's last shift
    rule: ClassVar[str] = "default"
    codes: ClassVar[tuple[str, ...]] = ("scale_down_delayed",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        if plan is None or plan.action is not Action.SCALE_DOWN or self.last_up_at is None:
            return PASS
        since = analysis.window_end - self.last_up_at
        shifted = self.shifted_at is not None and self.shifted_at > self.last_up_at
        if since >= config.scale_down_delay_s or shifted:
            return PASS
        return Verdict(code="scale_down_delayed", rule=self.rule, message=(
            f"scaled up {since:.0f} s ago: a scale-down waits for the load to drop or "
            f"{config.scale_down_delay_s - since:.0f} s more"))


# ---------------------------------------------------------------- the slot quota


@dataclass(frozen=True)
class SlotQuota:
    """Trims a scale-up to the slots the quota granted (`granted` >= the current parallelism: a job keeps
    what it has; the plan agent reserves them atomically across jobs), holding when none are left. A
    `quota_bound` notice when the quota starts to bind, not at every window it keeps binding."""

    granted: int
    quota: int  # slots across all jobs (AUTOSCALER_SLOT_QUOTA)
    rule: ClassVar[str] = "slot_quota"
    codes: ClassVar[tuple[str, ...]] = ("quota_exhausted",)

    def __call__(self, plan: Plan | None, state: PlanState, analysis: Analysis, config: JobConfig) -> Verdict:
        return self.check(plan, state, analysis.parallelism)

    def check(self, plan: Plan | None, state: PlanState, current: int) -> Verdict:
        """The verdict for a job at `current` (what the gate needs of the analysis)."""
        if plan is None or plan.action is not Action.SCALE_UP or self.granted >= plan.to_parallelism:
            return Verdict(updates={"quota_bound": False}) if state.quota_bound else PASS
        numbers = {"quota": self.quota, "granted": self.granted, "recommended": plan.to_parallelism}
        message = (f"the slot quota ({self.quota} across all jobs) trims the scale-up to {self.granted} of "
                   f"{plan.to_parallelism} recommended")
        notice = None if state.quota_bound else DecisionReason(code="quota_bound", rule=self.rule, message=message,
                                                                numbers=numbers)
        bound = {"quota_bound": True}
        if self.granted <= current:
            return Verdict(code="quota_exhausted", rule=self.rule, message=message, numbers=numbers, updates=bound,
                           notice=notice)
        return Verdict(to=self.granted, note=message, numbers=numbers, updates=bound, notice=notice)


def with_quota(state: PlanState, plan: Plan, current: int, granted: int, quota: int) -> tuple[PlanState, Plan]:
    """The plan within the slots granted (the `SlotQuota` gate), and the plan state that remembers
    whether the quota binds."""
    verdict = SlotQuota(granted, quota).check(plan, state, current)
    settled = settle(plan, current, verdict)
    assert settled is not None
    return (state.updated(dict(verdict.updates)) if verdict.updates else state), settled
