"""Versioned message contracts of every topic.

Each model carries `schema_version`; a consumer rejects a version it does not know (dead letter)
instead of guessing. Times are epoch seconds (float, UTC) so that any engine can produce them.
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.backends import BackendKind

JobId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
OperatorId = Annotated[str, Field(min_length=1, max_length=128)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Parallelism = Annotated[int, Field(ge=1, le=100_000)]

METRIC_REPORT_VERSION = 1


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()


def new_id() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------- input: metric reports


class SourceMetrics(Contract):
    """What the job's source sees in the interval, for the partitions this worker reads."""

    arrival_rate: NonNegativeFloat = Field(description="Records per second arriving at the source (log growth).")
    backlog: NonNegativeInt = Field(description="Records waiting in the source, not yet read (lag).")
    partitions: Annotated[int, Field(ge=1)] = Field(description="Partitions of the source (the whole job's).")
    splittable: bool = Field(
        True,
        description="Whether one partition can be read by several tasks (offset ranges split, as Spark's "
        "minPartitions does); if false, parallelism beyond the partition count is useless.",
    )


class OperatorMetrics(Contract):
    """One logical operator's instances on this worker, for engines with per-operator parallelism."""

    operator_id: OperatorId
    upstream: list[OperatorId] = Field(default_factory=list, max_length=64)
    parallelism: Parallelism = Field(description="The operator's total parallelism in the job.")
    records_in: NonNegativeInt
    records_out: NonNegativeInt
    busy_time_s: NonNegativeFloat = Field(description="Useful time of this worker's instances, summed.")
    arrival_rate: NonNegativeFloat | None = Field(
        None, description="For source operators: the external arrival rate they must keep up with."
    )


class MetricReport(Contract):
    """A worker's metrics for one interval. Topic `autoscaler.metrics`, key = job id."""

    schema_version: Literal[1] = 1
    job_id: JobId
    timestamp: PositiveFloat = Field(description="End of the interval, epoch seconds.")
    interval_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]
    worker_id: Annotated[str, Field(min_length=1, max_length=128)] = "driver"
    parallelism: Parallelism = Field(
        description="The job's current parallelism (task slots for Spark). A job whose operators scale "
        "independently reports its largest operator parallelism: the slots it holds when a slot runs one "
        "instance of each operator (Flink's slot sharing)."
    )
    records_in: NonNegativeInt
    records_out: NonNegativeInt
    busy_time_s: NonNegativeFloat = Field(
        description="Useful (busy) time in the interval summed over this worker's slots or tasks."
    )
    cpu_utilization: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    batches: NonNegativeInt | None = Field(
        None, description="Micro-batches that read records in the interval (Spark); None for an engine without "
        "micro-batches. With `batch_time_s`, it measures the fixed cost per batch (see Analysis.batch_overhead_s)."
    )
    batch_time_s: Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False)] | None = Field(
        None, description="Those micro-batches' summed wall time (Spark: durationMs.triggerExecution)."
    )
    source: SourceMetrics | None = None
    shuffle_partitions: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="Partitions of the job's shuffles (Spark: spark.sql.shuffle.partitions), so the "
        "parallelism can be aligned to spread them evenly."
    )
    operators: list[OperatorMetrics] = Field(default_factory=list, max_length=256)

    @model_validator(mode="after")
    def _operators_are_a_dag(self) -> MetricReport:
        if (self.batches is None) != (self.batch_time_s is None):
            raise ValueError("batches and batch_time_s come together (both or neither)")
        ids = [op.operator_id for op in self.operators]
        if len(set(ids)) != len(ids):
            raise ValueError("operator ids must be unique")
        known = set(ids)
        for op in self.operators:
            missing = [u for u in op.upstream if u not in known]
            if missing:
                raise ValueError(f"operator {op.operator_id!r} names unknown upstream {missing}")
        return self


# ---------------------------------------------------------------- internal: monitor -> analyze


class SourceWindow(Contract):
    arrival_rate: NonNegativeFloat
    backlog: NonNegativeInt
    backlog_growth_rate: float = Field(description="Change of the backlog per second over the window.")
    partitions: int
    splittable: bool


class OperatorWindow(Contract):
    operator_id: OperatorId
    upstream: list[OperatorId]
    parallelism: Parallelism
    records_in: NonNegativeInt
    records_out: NonNegativeInt
    busy_time_s: NonNegativeFloat
    arrival_rate: NonNegativeFloat | None = None


class WorkerWindow(Contract):
    """One worker's load in a window: the sample of its CPU-throughput regression (capacity model)."""

    worker_id: str
    throughput: NonNegativeFloat = Field(description="Records in per second of observed time.")
    utilization: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = Field(
        description="Busy fraction of the worker's slots when busy time is reported, else its CPU utilization."
    )
    utilization_source: Literal["busy", "cpu"]


class MetricWindow(Contract):
    """All reports of one job in one loop interval of metric time. Topic `autoscaler.windows`."""

    schema_version: Literal[1] = 1
    job_id: JobId
    window_start: float
    window_end: float
    observed_s: PositiveFloat = Field(description="Metric time the reports cover.")
    report_count: int
    workers: int
    parallelism: Parallelism = Field(description="Parallelism in the last report of the window.")
    parallelism_changed: bool = Field(description="Reports in the window disagree on the parallelism.")
    records_in: NonNegativeInt
    records_out: NonNegativeInt
    busy_time_s: NonNegativeFloat
    cpu_utilization: float | None = None
    batches: NonNegativeInt | None = Field(None, description="Micro-batches with records; None: not reported.")
    batch_time_s: NonNegativeFloat | None = None
    source: SourceWindow | None = None
    shuffle_partitions: int | None = None
    operators: list[OperatorWindow] = Field(default_factory=list)
    worker_loads: list[WorkerWindow] = Field(
        default_factory=list, description="Per worker, when the reports say how busy it was."
    )
    closed_at: float = Field(default_factory=time.time, description="Wall time the window was closed.")
    first_report_at: float | None = Field(
        None, description="Metric time the first report at the window's parallelism began (a restarted job's "
                          "resumption, in the first window after a rescale)."
    )
    last_report_at: float | None = Field(None, description="Metric time the last report ended.")
    stopped_at: float | None = Field(
        None, description="When the window spans a rescale: metric time the last report at another "
                          "parallelism ended (the old job's stop)."
    )


# ---------------------------------------------------------------- internal: analyze -> plan


class OperatorAnalysis(Contract):
    operator_id: OperatorId
    upstream: list[OperatorId]
    parallelism: Parallelism
    true_processing_rate: NonNegativeFloat = Field(description="Records in per useful second, per instance.")
    true_output_rate: NonNegativeFloat = Field(description="Records out per useful second, per instance.")
    observed_processing_rate: NonNegativeFloat = Field(description="Records in per second, all instances.")
    utilization: NonNegativeFloat
    arrival_rate: NonNegativeFloat | None = None


class CapacityCurve(Contract):
    """Capacity at an unseen scale-out p: coefficient x p^exponent, fitted through the scale-outs seen."""

    coefficient: float
    exponent: float


class CapacityView(Contract):
    """What the capacity model knows (Daedalus): records/s the job can process per scale-out."""

    observed: dict[str, NonNegativeFloat] = Field(
        default_factory=dict, description="Scale-out -> decaying average of the capacity measured there."
    )
    current: NonNegativeFloat | None = Field(None, description="Capacity at the current scale-out, if known.")
    source: Literal["ds2", "regression"] | None = Field(
        None, description="Which estimate the hybrid policy uses at the current scale-out."
    )
    why: str = ""
    regression_samples: NonNegativeInt = Field(0, description="Samples in the current scale-out's regressions.")
    curve: CapacityCurve | None = Field(None, description="The scaling curve through `observed`, for other scale-outs.")


class ForecastView(Contract):
    """The arrival-rate forecast of this window: rates at start, start + step_s, ..."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    values: list[float] = Field(max_length=10_000)
    upper: list[float] | None = Field(
        None, max_length=10_000, description="An upper quantile (90 %) of each value: pmdarima's prediction "
        "interval for ARIMA, the recent forecast errors for a fallback.")
    start: float
    step_s: PositiveFloat
    method: Literal["arima", "linear_trend", "last_value"]
    wape: float | None = Field(None, description="The previous published forecast's WAPE on the points that arrived.")
    reason: str = ""


class RecoveryView(Contract):
    """A recovery after a rescale that ended in this window (anomaly detection, Daedalus 3.5)."""

    started_at: float = Field(description="When processing stopped (the last window at the old parallelism).")
    observed_s: NonNegativeFloat = Field(description="Seconds from the stop until the sustained return to normal.")
    judge: Literal["statistical", "fallback", "backlog"] = Field(
        description="What ended it: the backlog back within tolerance, or (no backlog reported) the lag rate "
        "within the band (`statistical`) or keeping up before the band is known (`fallback`).")
    from_parallelism: Parallelism
    to_parallelism: Parallelism


class Analysis(Contract):
    """DS2 true rates of one window. Topic `autoscaler.analyses`."""

    schema_version: Literal[1] = 1
    job_id: JobId
    window_end: float
    parallelism: Parallelism
    valid: bool = Field(description="False when the window cannot support a decision; see `invalid_reason`.")
    invalid_reason: str | None = None
    true_processing_rate: NonNegativeFloat = Field(description="Job level: records in per busy second per slot.")
    true_output_rate: NonNegativeFloat
    observed_processing_rate: NonNegativeFloat
    utilization: NonNegativeFloat = Field(description="Busy time / (observed time x parallelism).")
    batch_overhead_s: NonNegativeFloat | None = Field(
        None, description="Wall time per micro-batch that the slots' work does not explain: (batch time - busy "
        "time / parallelism) / batches. A fixed cost per batch (planning, offsets, the driver's share); None "
        "when the window has no micro-batch metrics."
    )
    batch_work_s: NonNegativeFloat | None = Field(
        None, description="Busy seconds per slot per micro-batch: busy time / (parallelism x batches)."
    )
    arrival_rate: NonNegativeFloat | None = None
    backlog: NonNegativeInt | None = None
    backlog_growth_rate: float | None = None
    partitions: int | None = None
    splittable: bool = True
    shuffle_partitions: int | None = None
    operators: list[OperatorAnalysis] = Field(default_factory=list)
    capacity: CapacityView | None = None
    forecast: ForecastView | None = None
    recovery: RecoveryView | None = None
    closed_at: float = Field(description="Wall time the window was closed (for end-to-end latency).")


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
        "(`per_operator`): each operator's planned parallelism, its current one when the plan holds. The "
        "controls (step bounds, partition alignment, the slot quota) change `to_parallelism` only, and the "
        "rescale command carries `to_parallelism` only. DS2's `action` is `scale_up` when any operator grows, "
        "else `scale_down`: with operators moving both ways, `to_parallelism` can be below `from_parallelism`."
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
    mode: str = Field("auto", description="`auto`: executed; `recommend`: published only.")
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
        "`partially_applied` failure: `running_parallelism`."
    )
