"""What the loop tells the job and its users: plan's decisions, execute's commands to the job
runner and the runner's answers, and the scaling events of each decision.

Topics `autoscaler.decisions`, `autoscaler.commands`, `autoscaler.runner-reports` and
`autoscaler.scaling-events`, key = job id. Versioned like every message
(`contracts.messages.Contract`).
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Literal

from pydantic import Field

from contracts.backends import BackendKind
from contracts.jobs import Mode
from contracts.messages import Contract, JobId, NonNegativeFloat, Parallelism, new_id

# ---------------------------------------------------------------- output: decisions


class Action(StrEnum):
    NONE = "none"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"


class DecisionReason(Contract):
    code: str = Field(description="Machine-readable reason code, e.g. `ds2_optimal`, `rescale_in_progress`.")
    rule: str = Field("", description="The policy or control that decided, e.g. `ds2`, `delayed_scale_down`.")
    message: str
    numbers: dict[str, float | int | None] = Field(default_factory=dict)


class ScalingDecision(Contract):
    """Plan's verdict for one window. Topic `autoscaler.decisions`, key = job id. Published at least
    once: a plan worker that dies after committing a decision publishes it again on redelivery, the
    same message with the same `decision_id` (`infra.subscribe` and `autoscaler watch` drop repeats)."""

    schema_version: Literal[1] = 1
    decision_id: str = Field(
        default_factory=new_id,
        description="Unique per window; the idempotency key of execution, and of subscribers: a repeat has the same.")
    job_id: JobId
    timestamp: float = Field(default_factory=time.time)
    window_end: float
    action: Action
    from_parallelism: Parallelism = Field(
        description="The analysed window's parallelism (its last report's); for a job planned per operator, "
        "the largest operator parallelism."
    )
    to_parallelism: Parallelism = Field(
        description="The parallelism decided (for a rescale, what execute asks the job runner for); for a job "
        "planned per operator, the largest of `operator_targets` unless a control changed it."
    )
    operator_targets: dict[str, int] = Field(
        default_factory=dict, description="Per-operator parallelism where operators scale independently "
        "(`per_operator`): each operator's planned parallelism, its current one when the plan holds. A "
        "control that trims `to_parallelism` (step bounds, partition alignment, the state partitions, the "
        "slot quota) caps every target at it; the rescale command carries `to_parallelism` only. DS2's "
        "`action` is `scale_up` when any operator grows, else `scale_down`: with operators moving both ways, "
        "`to_parallelism` can be below `from_parallelism`."
    )
    policy: str
    target_utilization: float
    reason: DecisionReason
    recommended_parallelism: Parallelism | None = Field(
        None, description="What the policy recommended before a control held or changed it."
    )
    notices: list[DecisionReason] = Field(
        default_factory=list, description="Findings execute publishes as `notice` events (e.g. `quota_bound`, "
        "`ineffective_scale_up`)."
    )
    mode: Mode = Field(Mode.AUTO, description="`auto`: executed; `recommend`: published only.")
    closed_at: float = Field(description="Wall time the window behind this decision was closed.")


# ---------------------------------------------------------------- execute <-> job runner


class RescaleCommand(Contract):
    """Execute asks a job runner to rescale. Topic `autoscaler.commands`, key = job id."""

    schema_version: Literal[1] = 1
    decision_id: str
    job_id: JobId
    to_parallelism: Parallelism
    fencing_token: int = Field(description="Execution-lock token; runners ignore stale tokens.")
    issued_at: float = Field(default_factory=time.time)


class RunnerStatus(StrEnum):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"


class RunnerReport(Contract):
    """A job runner's answer to a command. Topic `autoscaler.runner-reports`, key = job id."""

    schema_version: Literal[1] = 1
    decision_id: str
    job_id: JobId
    status: RunnerStatus
    from_parallelism: Parallelism
    to_parallelism: Parallelism
    running_parallelism: Parallelism = Field(description="What the job runs at now.")
    fencing_token: int
    downtime_s: NonNegativeFloat | None = None
    error: str | None = None
    rolled_back_to: Parallelism | None = None
    timestamp: float = Field(default_factory=time.time)
    backend: BackendKind | None = Field(
        None, description="How the runner changes the job: `restart` (from the checkpoint) or `in_place` (executors).")

    @property
    def partially_applied(self) -> bool:
        """A failed change that went part of the way (`went_part_way`)."""
        return self.status is RunnerStatus.FAILED and went_part_way(
            self.from_parallelism, self.running_parallelism, self.to_parallelism)


def went_part_way(before: int, running: int, target: int) -> bool:
    """Whether a change from `before` to `target` stopped strictly between them, at `running` (a cluster
    that granted some of the executors asked for)."""
    return min(before, target) < running < max(before, target)


# ---------------------------------------------------------------- output: scaling events


class EventType(StrEnum):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOTICE = "notice"
    RECOVERED = "recovered"


class ScalingEvent(Contract):
    """The lifecycle of one decision. Topic `autoscaler.scaling-events`, key = job id. Published at
    least once: after a crash execute may publish an event again, with the same `event_id`
    (`infra.subscribe` and `autoscaler watch` drop repeats)."""

    schema_version: Literal[1] = 1
    event_id: str = Field(
        default_factory=new_id,
        description="Stable for one step of one decision: an event published again after a crash keeps its id.",
    )
    decision_id: str
    job_id: JobId
    type: EventType = Field(description=(
        "`started`, then `completed` or `failed`: a rescale of an `auto` decision; `skipped`: superseded by "
        "a rescale in flight; `notice`: a finding of plan; `recovered`: the job back to normal after a rescale "
        "this autoscaler executed, carried by the decision of the window that saw it. A parallelism change "
        "it did not make (a `recommend` job, where nothing is executed; an operator's restart) gets no "
        "`recovered` event."))
    timestamp: float = Field(default_factory=time.time)
    from_parallelism: Parallelism
    to_parallelism: Parallelism
    downtime_s: NonNegativeFloat | None = None
    error: str | None = None
    rolled_back_to: Parallelism | None = None
    detail: str | None = None
    code: str | None = Field(
        None,
        description="For `notice` events: what was found, e.g. `quota_bound`; for `skipped`: `superseded`; for "
        "`failed`: `partially_applied` when the job runs between the two parallelisms (the cluster granted part).",
    )
    numbers: dict[str, float | int | None] = Field(
        default_factory=dict, description="For `recovered` events: `observed_s`, `predicted_s`, `error_s`; for a "
        "`partially_applied` failure: `running_parallelism`; for `notice` events, the notice's (a `fleet_move`: "
        "`move_at`, the window end that names the move on both jobs' events, and `slots`)."
    )
