"""Tumbling windows of metric time per job: pure functions over the typed, immutable open window
(`contracts.window_state.WindowState`, which the knowledge base stores).

A window [start, start + interval) collects every report whose end timestamp falls in it. It closes
when the first report of a later window arrives, in metric time, so replayed or time-compressed
metrics close windows exactly as live ones do.

Refused reports (the monitor dead-letters them with `reason`):
- `late_report`: its window started before the open one, which may already have been closed.
- `duplicate_report`: its worker already reported an interval ending at the same timestamp in the
  open window, e.g. a reporter's retry or a replay sent twice. The first one counts; whether the
  second is identical or not, folding it would count that interval twice.

A stateful query's state in a closed window: per worker its latest report's stateful operators,
summed over the workers (rows, memory), with the commit time of every report summed and the fewest
state partitions of any operator (None when any operator's could not be read); the event-time lags
are those of the latest report that carried state or a lag.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping

from contracts.messages import MetricReport, MetricWindow, OperatorWindow, SourceWindow, StateWindow, WorkerWindow
from contracts.window_state import (
    OperatorAggregate,
    SeenKey,
    SeenReports,
    SourceAggregate,
    StateAggregate,
    WindowState,
    WorkerAggregate,
)

__all__ = ["MAX_SEEN_PER_WINDOW", "DuplicateReport", "LateReport", "RefusedReport", "WindowState", "add_report",
           "already_applied", "close_window", "new_window", "phase_for", "window_phase", "window_start_for"]


# Keys (worker, timestamp) remembered per window for duplicate detection. A window's state is read
# and written in full on every batch, so a flood of distinct timestamps must not grow it without
# bound: beyond this many reports in one window, reports are still counted but no longer remembered.
MAX_SEEN_PER_WINDOW = 4096


class RefusedReport(ValueError):
    """A valid report the open window cannot take."""

    reason = "refused"


class LateReport(RefusedReport):
    """A report for a window that is already closed."""

    reason = "late_report"


class DuplicateReport(RefusedReport):
    """A second report of the same worker and interval end in the open window."""

    reason = "duplicate_report"


def window_start_for(timestamp: float, interval_s: float, phase_s: float = 0.0) -> float:
    """The start of the window `timestamp` falls in: windows are `interval_s` long and start at
    `phase_s` plus a multiple of the interval."""
    return math.floor((timestamp - phase_s) / interval_s) * interval_s + phase_s


def phase_for(job_id: str, interval_s: float, spread: bool) -> float:
    """The job's phase where windows are spread (the setting `window_spread`), else 0."""
    return window_phase(job_id, interval_s) if spread else 0.0


def closed_window_ends(first: float, last: float, interval_s: float, phase_s: float = 0.0) -> list[float]:
    """The ends of the windows that reports stamped `first` to `last` (in order) close: every window
    from the first report's to the one before the last report's, which stays open."""
    start = window_start_for(first, interval_s, phase_s)
    count = round((window_start_for(last, interval_s, phase_s) - start) / interval_s)
    return [start + interval_s * (i + 1) for i in range(count)]


def window_phase(job_id: str, interval_s: float) -> float:
    """Where in the interval a job's windows start, spread evenly over jobs by a hash of the id (stable
    across processes and restarts): with thousands of jobs reporting in step, their windows close
    spread over the interval, not all in one second, so the stages carry an even load."""
    return zlib.crc32(job_id.encode()) % 1000 / 1000 * interval_s


def new_window(start: float) -> WindowState:
    return WindowState(start)


def already_applied(
    state: WindowState | None, partition: int, offset: int, report: MetricReport | None = None
) -> bool:
    """A redelivered record: its offset is not beyond the last one applied for its partition and,
    given its report, that report is already folded in (an older window, or seen in the open one).

    A record at an old offset whose report is new means the log started again from offset 0 (a
    broker that lost its data); skipping it would lose the report, so it is not skipped."""
    if state is None:
        return False
    last = state.offsets.get(partition)
    if last is None or offset > last:
        return False
    if report is None or report.timestamp < state.start:
        return True
    return _seen_key(report) in state.seen


def add_report(
    state: WindowState | None,
    report: MetricReport,
    interval_s: float,
    partition: int | None = None,
    offset: int | None = None,
    phase_s: float = 0.0,
) -> tuple[WindowState, MetricWindow | None]:
    """Fold one report into the job's open window; returns (new state, the window it closed, if any).

    Windows start at `phase_s` plus a multiple of the interval. The open window keeps the span it opened
    with: a report within it belongs to it even where the phase has changed since (a window opened by a
    monitor before `window_spread`); the next window starts on the current phase.

    Pure: `state` is left as it was, so a caller may keep it (e.g. to retry from it)."""
    start = window_start_for(report.timestamp, interval_s, phase_s)
    if state is not None and state.start <= report.timestamp < state.start + interval_s:
        start = state.start
    closed: MetricWindow | None = None
    key = _seen_key(report)
    if state is None:
        reports, workers, offsets, seen = 0, {}, {}, SeenReports()
    elif start < state.start:
        raise LateReport(
            f"report at {report.timestamp:.3f} belongs to window {start:.0f}, "
            f"but window {state.start:.0f} is already open"
        )
    elif start > state.start:
        closed = close_window(state, report.job_id, interval_s)
        reports, workers, offsets, seen = 0, {}, state.offsets, SeenReports()
    elif key in state.seen:
        raise DuplicateReport(
            f"worker {report.worker_id!r} already reported the interval ending at {report.timestamp!r} "
            f"in window {state.start:.0f}; the first report counts"
        )
    else:
        reports, workers, offsets, seen = state.reports, dict(state.workers), state.offsets, state.seen
    reports += 1
    workers[report.worker_id] = _fold(workers.get(report.worker_id), report)
    # A window saved before duplicate detection existed remembers only the reports folded since.
    if reports <= MAX_SEEN_PER_WINDOW:
        seen = seen.adding(key)
    if partition is not None and offset is not None:
        offsets = {**offsets, partition: offset}
    return WindowState.built(
        {"start": start, "reports": reports, "workers": workers, "offsets": offsets, "seen": seen}
    ), closed


def _seen_key(report: MetricReport) -> SeenKey:
    return report.worker_id, repr(report.timestamp)


def _fold(worker: WorkerAggregate | None, report: MetricReport) -> WorkerAggregate:
    """The worker's aggregate with `report` added (a new one for its first report in the window)."""
    interval, end, parallelism = report.interval_s, report.timestamp, report.parallelism
    begin = end - interval
    if worker is None:
        worker = WorkerAggregate.built({
            "records_in": 0, "records_out": 0, "busy": 0.0, "observed": 0.0, "first_begin": begin, "last_end": end,
            "parallelism_first": parallelism, "parallelism_last": parallelism, "parallelism_changed": False,
            "cpu_weighted": 0.0, "cpu_time": 0.0, "operators": {}, "spans": {}, "batches": None, "batch_time": None,
            "shuffle_partitions": None, "source": None, "state": None,
        })
    batches, batch_time = worker.batches, worker.batch_time
    if report.batches is not None:
        batches = (batches or 0) + report.batches
        batch_time = (batch_time or 0.0) + (report.batch_time_s or 0.0)
    # When the reports at each parallelism begin and end: a window that spans a rescale says when
    # the old job stopped and the new one resumed (recovery timing), not only the window grid.
    span = worker.spans.get(parallelism)
    spans = {**worker.spans, parallelism: (begin, end) if span is None else (min(span[0], begin), max(span[1], end))}
    cpu_weighted, cpu_time = worker.cpu_weighted, worker.cpu_time
    if report.cpu_utilization is not None:
        cpu_weighted += report.cpu_utilization * interval
        cpu_time += interval
    operators = worker.operators
    if report.operators:
        operators = dict(operators)
        for op in report.operators:
            agg = operators.get(op.operator_id)
            old_in, old_out, old_busy, arrivals = (0, 0, 0.0, None) if agg is None else (
                agg.records_in, agg.records_out, agg.busy, agg.arrivals)
            if op.arrival_rate is not None:
                arrivals = (arrivals or 0.0) + op.arrival_rate * interval
            operators[op.operator_id] = OperatorAggregate.built({
                "records_in": old_in + op.records_in, "records_out": old_out + op.records_out,
                "busy": old_busy + op.busy_time_s, "arrivals": arrivals, "upstream": tuple(op.upstream),
                "parallelism": op.parallelism,
            })
    return WorkerAggregate.built({
        "records_in": worker.records_in + report.records_in,
        "records_out": worker.records_out + report.records_out,
        "busy": worker.busy + report.busy_time_s,
        "observed": worker.observed + interval,
        "first_begin": min(worker.first_begin, begin),
        "last_end": max(worker.last_end, end),
        "parallelism_first": worker.parallelism_first,
        "parallelism_last": parallelism,
        "parallelism_changed": worker.parallelism_changed or parallelism != worker.parallelism_first,
        "cpu_weighted": cpu_weighted,
        "cpu_time": cpu_time,
        "operators": operators,
        "spans": spans,
        "batches": batches,
        "batch_time": batch_time,
        "shuffle_partitions": worker.shuffle_partitions if report.shuffle_partitions is None
        else report.shuffle_partitions,
        "source": worker.source if report.source is None else _fold_source(worker.source, report),
        "state": _fold_state(worker.state, report) if report.state or report.watermark_lag_s is not None
        or report.output_lag_s is not None else worker.state,
    })


def _fold_source(src: SourceAggregate | None, report: MetricReport) -> SourceAggregate:
    metrics = report.source
    assert metrics is not None
    arrivals, observed = (0.0, 0.0) if src is None else (src.arrivals, src.observed)
    return SourceAggregate.built({
        "arrivals": arrivals + metrics.arrival_rate * report.interval_s,
        "observed": observed + report.interval_s,
        "backlog_first": metrics.backlog if src is None else src.backlog_first,
        "first_at": report.timestamp if src is None else src.first_at,
        "backlog_last": metrics.backlog,
        "last_at": report.timestamp,
        "partitions": metrics.partitions,
        "splittable": (src is None or src.splittable) and metrics.splittable,
    })


def _fold_state(agg: StateAggregate | None, report: MetricReport) -> StateAggregate:
    """The worker's state with `report` (which carries state or a lag) added: its commit time
    summed in; its operators and lags kept unless a report ending later is already in."""
    commit = sum(op.commit_time_s for op in report.state)
    if agg is not None:
        commit += agg.commit_time
        if report.timestamp < agg.at:
            return StateAggregate.built({"at": agg.at, "operators": agg.operators, "commit_time": commit,
                                         "watermark_lag": agg.watermark_lag, "output_lag": agg.output_lag})
    return StateAggregate.built({
        "at": report.timestamp,
        "operators": tuple((op.operator, op.rows, op.memory_bytes, op.partitions) for op in report.state),
        "commit_time": commit, "watermark_lag": report.watermark_lag_s, "output_lag": report.output_lag_s,
    })


def close_window(state: WindowState, job_id: str, interval_s: float) -> MetricWindow:
    """The window `state` holds, as analyze reads it (`state` needs at least one report)."""
    workers = state.workers.values()
    observed = max(w.observed for w in workers)
    last_worker = max(workers, key=lambda w: w.last_end)
    parallelisms = {w.parallelism_first for w in workers} | {w.parallelism_last for w in workers}
    cpu_time = sum(w.cpu_time for w in workers)
    cpu = sum(w.cpu_weighted for w in workers) / cpu_time if cpu_time else None
    batched = [w for w in workers if w.batches is not None]
    return MetricWindow(
        job_id=job_id,
        window_start=state.start,
        window_end=state.start + interval_s,
        observed_s=observed,
        report_count=state.reports,
        workers=len(state.workers),
        parallelism=last_worker.parallelism_last,
        parallelism_changed=len(parallelisms) > 1 or any(w.parallelism_changed for w in workers),
        records_in=sum(w.records_in for w in workers),
        records_out=sum(w.records_out for w in workers),
        busy_time_s=sum(w.busy for w in workers),
        cpu_utilization=cpu,
        batches=sum(w.batches or 0 for w in batched) if batched else None,
        batch_time_s=sum(w.batch_time or 0.0 for w in batched) if batched else None,
        source=_source_window(workers),
        shuffle_partitions=last_worker.shuffle_partitions,
        operators=_operator_windows(workers, observed),
        worker_loads=_worker_loads(state.workers, last_worker.parallelism_last),
        **_report_times(workers, last_worker.parallelism_last),
        **_state_fields(workers),
    )


def _state_fields(workers: Iterable[WorkerAggregate]) -> dict[str, StateWindow | float | None]:
    """The window's state, watermark_lag_s and output_lag_s (none of them when no report carried any)."""
    states = [w.state for w in workers if w.state is not None]
    if not states:
        return {}
    latest = max(states, key=lambda s: s.at)
    operators = [op for s in states for op in s.operators]
    window = None
    if operators:
        known = [op[3] for op in operators if op[3] is not None]
        window = StateWindow(
            operators=max(len(s.operators) for s in states),
            rows=sum(op[1] for op in operators),
            memory_bytes=sum(op[2] for op in operators),
            commit_time_s=sum(s.commit_time for s in states),
            partitions=min(known) if len(known) == len(operators) else None,
        )
    return {"state": window, "watermark_lag_s": latest.watermark_lag, "output_lag_s": latest.output_lag}


def _report_times(workers: Iterable[WorkerAggregate], parallelism: int) -> dict[str, float | None]:
    """first_report_at, last_report_at and stopped_at of the window (see MetricWindow); a state
    folded before spans were kept gives only the last report's end."""
    spans = [w.spans for w in workers]
    current = [s[parallelism] for s in spans if parallelism in s]
    others = [span[1] for s in spans for p, span in s.items() if p != parallelism]
    return {"first_report_at": min(span[0] for span in current) if current else None,
            "last_report_at": max(w.last_end for w in workers),
            "stopped_at": max(others) if others else None}


def _worker_loads(workers: Mapping[str, WorkerAggregate], parallelism: int) -> list[WorkerWindow]:
    """Each worker's (utilization, throughput), the capacity model's samples.

    Busy time is preferred to CPU: it counts all of a task's work, where an engine's CPU figure
    may miss some (Spark's executorCpuTime leaves out its Python workers). Reports do not say how
    many slots a worker has, so the job's slots are taken as spread evenly over its workers."""
    slots = parallelism / len(workers)
    loads = []
    for worker_id, w in sorted(workers.items()):
        if w.observed <= 0:
            continue
        if w.busy > 0:
            utilization, source = w.busy / (w.observed * slots), "busy"
        elif w.cpu_time > 0:
            utilization, source = w.cpu_weighted / w.cpu_time, "cpu"
        else:
            continue
        loads.append(WorkerWindow(worker_id=worker_id, throughput=w.records_in / w.observed,
                                  utilization=min(1.0, max(0.0, utilization)), utilization_source=source))
    return loads


def _source_window(workers: Iterable[WorkerAggregate]) -> SourceWindow | None:
    sources = [w.source for w in workers if w.source is not None]
    if not sources:
        return None
    growth = 0.0
    for src in sources:
        span = src.last_at - src.first_at
        if span > 0:
            growth += (src.backlog_last - src.backlog_first) / span
    return SourceWindow(
        arrival_rate=sum(s.arrivals / s.observed for s in sources),
        backlog=sum(s.backlog_last for s in sources),
        backlog_growth_rate=growth,
        partitions=max(s.partitions for s in sources),
        splittable=all(s.splittable for s in sources),
    )


def _operator_windows(workers: Iterable[WorkerAggregate], observed: float) -> list[OperatorWindow]:
    """The workers' operators merged by id, in order of first appearance; an operator's upstream
    and parallelism are the last worker's."""
    merged: dict[str, OperatorAggregate] = {}
    for worker in workers:
        for op_id, agg in worker.operators.items():
            into = merged.get(op_id)
            if into is None:
                merged[op_id] = agg
                continue
            arrivals = into.arrivals if agg.arrivals is None else (into.arrivals or 0.0) + agg.arrivals
            merged[op_id] = OperatorAggregate.built({
                "records_in": into.records_in + agg.records_in, "records_out": into.records_out + agg.records_out,
                "busy": into.busy + agg.busy, "arrivals": arrivals, "upstream": agg.upstream,
                "parallelism": agg.parallelism,
            })
    return [
        OperatorWindow(
            operator_id=op_id,
            upstream=list(agg.upstream),
            parallelism=agg.parallelism,
            records_in=agg.records_in,
            records_out=agg.records_out,
            busy_time_s=agg.busy,
            arrival_rate=None if agg.arrivals is None else agg.arrivals / observed,
        )
        for op_id, agg in merged.items()
    ]
