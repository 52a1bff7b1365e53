"""Analyze's output: one window's true rates, capacity model, forecast and recovery.

Topic `autoscaler.analyses`, key = job id, read by plan. Versioned like every message
(`contracts.messages.Contract`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from contracts.messages import (
    Contract,
    JobId,
    NonNegativeFloat,
    NonNegativeInt,
    OperatorId,
    Parallelism,
    PositiveFloat,
    StateWindow,
)


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
    state: StateWindow | None = Field(None, description="The query's state at the window's end (the window's).")
    watermark_lag_s: NonNegativeFloat | None = None
    output_lag_s: NonNegativeFloat | None = None
    capacity: CapacityView | None = None
    forecast: ForecastView | None = None
    recovery: RecoveryView | None = None
    closed_at: float = Field(description="Wall time the window was closed (for end-to-end latency).")


def records_beyond_target(backlog: float | None, arrival_rate: float | None, backlog_target_s: float) -> float:
    """The records a backlog holds beyond its target, `backlog_target_s` seconds of arrivals: 0 within it or
    without a backlog. The one definition of "beyond target" that measures, benchmarks and pages share
    (`evaluation.simulator.seconds_beyond_target` is its form over a run's windows)."""
    return max(0.0, float(backlog or 0) - backlog_target_s * float(arrival_rate or 0.0))
