"""Capacity-model measurement from a job's reports: load levels, which windows are learned, errors, batches.

The pieces of the retired capacity-model benchmark (docs/results.md, "Retired benchmarks") that the
tests still check."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from analyze.capacity import CapacityModel, UnknownCapacity
from analyze.welford import CoMoments
from contracts.analyses import Analysis
from contracts.messages import MetricReport, MetricWindow
from monitor.windows import add_report


def load_rates(parallelism: int, per_slot: float, fractions: Sequence[float]) -> list[float]:
    """The constant loads (records/s) of the learning phase at `parallelism`."""
    return [round(f * per_slot * parallelism, 1) for f in fractions]


def error_pct(estimate: float | None, measured: float) -> float | None:
    """Signed relative error in percent (positive: the estimate is too high)."""
    if estimate is None or measured <= 0:
        return None
    return (estimate - measured) / measured * 100.0


def skip_reason(
    window: MetricWindow,
    analysis: Analysis,
    *,
    learn_from: float,
    backlog_tolerance_s: float,
    max_utilization: float,
    min_backlog: int = 50,
) -> str | None:
    """Why a window must not be learned from (None: it is an unsaturated, steady window)."""
    if window.window_start < learn_from:
        return "warm-up"
    if not analysis.valid:
        return f"invalid: {analysis.invalid_reason}"
    if not window.worker_loads:
        return "no worker loads"
    source = window.source
    if source is None:
        return "no source metrics"
    allowed = max(min_backlog, source.arrival_rate * backlog_tolerance_s)
    if source.backlog > allowed:
        return f"saturated: backlog {source.backlog} > {allowed:.0f}"
    if analysis.utilization > max_utilization:
        return f"saturated: utilization {analysis.utilization:.2f} > {max_utilization:.2f}"
    return None


def drain_reports(reports: Iterable[MetricReport], backlog_written_at: float) -> list[MetricReport]:
    """Reports wholly inside the drain: begun after the backlog was written, with a backlog left at
    their end (so the job had work all through them)."""
    return [r for r in reports
            if r.timestamp - r.interval_s >= backlog_written_at and r.source is not None and r.source.backlog > 0
            and r.records_in > 0]


def windows_of(reports: Iterable[MetricReport], window_s: float) -> list[MetricWindow]:
    """The windows these reports close, in order (the last, still open window is left out)."""
    state = None
    closed = []
    for report in reports:
        state, window = add_report(state, report, window_s)
        if window is not None:
            closed.append(window)
    return closed


@dataclass(frozen=True)
class Batch:
    batch_id: int
    start: float  # epoch s
    duration_s: float
    rows: int


def batch_of(progress: Any) -> Batch | None:
    """A micro-batch from a StreamingQueryProgress (object or dict); None for an empty one."""
    from pipeline.metrics import parse_spark_timestamp

    get = progress.get if isinstance(progress, dict) else lambda k, d=None: getattr(progress, k, d)
    rows = int(get("numInputRows") or 0)
    if rows <= 0:
        return None
    durations = get("durationMs") or {}
    return Batch(int(get("batchId")), parse_spark_timestamp(str(get("timestamp"))),
                 float(durations.get("triggerExecution", 0) or 0) / 1000.0, rows)


def batch_capacity(batches: Iterable[Batch], batch_cap: int) -> dict[str, float] | None:
    """Diagnostic, not the model: the least-squares line of batch duration on batch size,
    duration = overhead + rows x per_row, gives the throughput of back-to-back full batches,
    batch_cap / (overhead + batch_cap x per_row). Linear by construction: a batch's duration does
    not depend on how often the trigger fires, where busy time per second does."""
    fit = CoMoments()
    for b in batches:
        fit.add(float(b.rows), b.duration_s)
    if fit.count < 3 or fit.m2x <= 0:
        return None
    line = fit.line()
    full = line(float(batch_cap))
    if full <= 0 or line.slope <= 0:
        return None
    return {"overhead_s": line.intercept, "per_row_ms": line.slope * 1000.0, "batches": fit.count,
            "batch_cap": batch_cap, "full_batch_s": full, "capacity": batch_cap / full}


def leave_one_out(observed: dict[int, float], parallelism: int) -> dict[str, Any] | None:
    """The model's estimate at `parallelism` from the other scale-outs only (its scaling curve)."""
    others = {p: c for p, c in observed.items() if p != parallelism}
    if not others:
        return None
    try:
        estimate = CapacityModel(observed=others).estimate(parallelism)
    except UnknownCapacity:
        return None
    return {"from": sorted(others), "value": estimate.value, "basis": estimate.basis, "exponent": estimate.exponent}
