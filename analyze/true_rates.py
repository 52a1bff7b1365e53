"""DS2 true processing and output rates: records per unit of useful (busy) time.

Observed rates fall when an operator waits for input; true rates do not, so they estimate what an
instance could sustain. Busy time arrives summed over instances (or task slots), so records divided
by busy time is already the per-instance (per-slot) rate.
"""

from __future__ import annotations

from typing import Any

from contracts.analyses import Analysis, OperatorAnalysis
from contracts.messages import MetricWindow, OperatorWindow

# Below this much useful time a window's rates are mostly noise (one task's scheduling jitter).
MIN_BUSY_TIME_S = 0.05


def rate(records: int, seconds: float) -> float:
    return records / seconds if seconds > 0 else 0.0


def analyze_operator(op: OperatorWindow, observed_s: float) -> OperatorAnalysis:
    return OperatorAnalysis(
        operator_id=op.operator_id,
        upstream=op.upstream,
        parallelism=op.parallelism,
        true_processing_rate=rate(op.records_in, op.busy_time_s),
        true_output_rate=rate(op.records_out, op.busy_time_s),
        observed_processing_rate=rate(op.records_in, observed_s),
        utilization=op.busy_time_s / (observed_s * op.parallelism),
        arrival_rate=op.arrival_rate,
    )


def fixed_batch_cost(batch_time_s: float, busy_time_s: float, parallelism: int, batches: int) -> float:
    """Seconds per micro-batch that the slots' work does not explain: (batch time - busy time /
    parallelism) / batches. Busy time is the tasks' work summed over the slots, so busy / parallelism
    is the wall time that work takes when spread evenly; the rest of a batch's time is a fixed cost
    per batch (offsets, planning, commits, the driver's part), paid however few records it has."""
    return max(0.0, (batch_time_s - busy_time_s / parallelism) / batches)


def batch_overhead(window: MetricWindow) -> float | None:
    """The window's `fixed_batch_cost`; None without micro-batch metrics or while the parallelism
    changed within the window."""
    if window.batches is None or window.batch_time_s is None or window.batches == 0 or window.parallelism_changed:
        return None
    return fixed_batch_cost(window.batch_time_s, window.busy_time_s, window.parallelism, window.batches)


def batch_work(window: MetricWindow) -> float | None:
    """Busy seconds per slot in one micro-batch (None where `batch_overhead` is)."""
    if batch_overhead(window) is None or not window.batches:
        return None
    return window.busy_time_s / (window.parallelism * window.batches)


def invalid_reason(window: MetricWindow) -> str | None:
    if window.parallelism_changed:
        return "parallelism changed within the window (a rescale); its rates mix two configurations"
    if window.records_in == 0:
        return "no records processed in the window"
    if window.busy_time_s < MIN_BUSY_TIME_S:
        return f"busy time {window.busy_time_s:.3f} s is too short to measure a true rate"
    return None


def analyze_window(window: MetricWindow, fallback: dict[str, Any] | None = None) -> Analysis:
    """True rates of one window. An idle window (no records) borrows the last valid true rates,
    so that an idle job can still be scaled in; a window spanning a rescale stays invalid. The
    window's state and event-time lags are copied, whether its rates are valid or not."""
    reason = invalid_reason(window)
    source = window.source
    common: dict[str, Any] = {
        "job_id": window.job_id,
        "window_end": window.window_end,
        "parallelism": window.parallelism,
        "observed_processing_rate": rate(window.records_in, window.observed_s),
        "utilization": window.busy_time_s / (window.observed_s * window.parallelism),
        "batch_overhead_s": batch_overhead(window),
        "batch_work_s": batch_work(window),
        "arrival_rate": source.arrival_rate if source else None,
        "backlog": source.backlog if source else None,
        "backlog_growth_rate": source.backlog_growth_rate if source else None,
        "partitions": source.partitions if source else None,
        "splittable": source.splittable if source else True,
        "shuffle_partitions": window.shuffle_partitions,
        "state": window.state,
        "watermark_lag_s": window.watermark_lag_s,
        "output_lag_s": window.output_lag_s,
        "closed_at": window.closed_at,
    }
    if reason is None:
        return Analysis(
            valid=True,
            true_processing_rate=rate(window.records_in, window.busy_time_s),
            true_output_rate=rate(window.records_out, window.busy_time_s),
            operators=[analyze_operator(op, window.observed_s) for op in window.operators],
            **common,
        )
    idle = window.records_in == 0 and not window.parallelism_changed
    if idle and fallback is not None and fallback.get("true_processing_rate", 0) > 0:
        return Analysis(
            valid=True,
            invalid_reason=None,
            true_processing_rate=fallback["true_processing_rate"],
            true_output_rate=fallback["true_output_rate"],
            operators=[OperatorAnalysis.model_validate(op) for op in fallback.get("operators", [])],
            **common,
        )
    return Analysis(
        valid=False,
        invalid_reason=reason,
        true_processing_rate=0.0,
        true_output_rate=0.0,
        **common,
    )
