"""Versioned message contracts: the base of every topic's message, and the input side.

Each model carries `schema_version`; a consumer rejects a version it does not know (dead letter)
instead of guessing. Times are epoch seconds (float, UTC) so that any engine can produce them.
This module holds the shared field types and `Contract`, a job's metric reports (topic
`autoscaler.metrics`) and monitor's windows (`autoscaler.windows`); analyze's output is in
`contracts.analyses`, plan's decisions, execute's commands and events in `contracts.decisions`.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


class StateOperatorMetrics(Contract):
    """One stateful operator of the query at the interval's end (Spark: an entry of the progress's
    `stateOperators`: a windowed aggregation, a deduplication, one side pair of a stream-stream join)."""

    operator: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        description="The operator's name (Spark: operatorName, e.g. stateStoreSave, dedupeWithinWatermark, "
        "symmetricHashJoin).")
    rows: NonNegativeInt = Field(description="Rows in its state at the interval's end (Spark: numRowsTotal).")
    memory_bytes: NonNegativeInt = Field(description="Memory its state uses at the interval's end "
                                                     "(Spark: memoryUsedBytes).")
    commit_time_s: NonNegativeFloat = Field(0.0, description="Seconds spent committing its state in the interval's "
                                                              "batches, summed (Spark: commitTimeMs).")
    partitions: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="Its state partitions (Spark: numShufflePartitions), fixed when the query first started "
        "(stored in the checkpoint): more task slots than these buy nothing. None: they could not be read.")


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
    state: list[StateOperatorMetrics] = Field(
        default_factory=list, max_length=64, description="The query's stateful operators; empty for a stateless job.")
    watermark_lag_s: Annotated[float, Field(ge=0, le=31_536_000, allow_inf_nan=False)] | None = Field(
        None, description="How far the event-time watermark lags behind the interval's end, seconds; None when the "
        "query has no watermark.")
    output_lag_s: Annotated[float, Field(ge=0, le=31_536_000, allow_inf_nan=False)] | None = Field(
        None, description="Event-time latency of the output: the interval's end minus the newest event time the "
        "sink wrote, seconds; None when the job does not report it.")

    @model_validator(mode="after")
    def _operators_are_a_dag(self) -> MetricReport:
        if (self.batches is None) != (self.batch_time_s is None):
            raise ValueError("batches and batch_time_s come together (both or neither)")
        for op in self.state:
            if op.partitions is not None and self.shuffle_partitions is not None \
                    and op.partitions > self.shuffle_partitions:
                raise ValueError(f"state operator {op.operator!r} has {op.partitions} state partitions, more than the "
                                 f"{self.shuffle_partitions} shuffle partitions (the tasks of its stage)")
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


class StateWindow(Contract):
    """The query's state at the window's end, over all its stateful operators (and workers)."""

    operators: Annotated[int, Field(ge=1)] = Field(description="Stateful operators reported.")
    rows: NonNegativeInt = Field(description="Rows in state, summed over the operators.")
    memory_bytes: NonNegativeInt = Field(description="Memory the state uses, summed over the operators.")
    commit_time_s: NonNegativeFloat = Field(description="Seconds spent committing state in the window, summed.")
    partitions: int | None = Field(
        description="The fewest state partitions of any operator: the most task slots the stateful stages can use. "
        "None when an operator's could not be read.")


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
    state: StateWindow | None = Field(None, description="None: no report in the window carried stateful operators.")
    watermark_lag_s: NonNegativeFloat | None = Field(None, description="The last report's watermark lag.")
    output_lag_s: NonNegativeFloat | None = Field(None, description="The last report's output event-time lag.")
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
