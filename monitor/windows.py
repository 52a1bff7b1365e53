"""Tumbling windows of metric time per job: pure logic, state as plain dicts (JSON-serializable).

A window [start, start + interval) collects every report whose end timestamp falls in it. It closes
when the first report of a later window arrives, in metric time, so replayed or time-compressed
metrics close windows exactly as live ones do.

Refused reports (the monitor dead-letters them with `reason`):
- `late_report`: its window started before the open one, which may already have been closed.
- `duplicate_report`: its worker already reported an interval ending at the same timestamp in the
  open window, e.g. a reporter's retry or a replay sent twice. The first one counts; whether the
  second is identical or not, folding it would count that interval twice.
"""

from __future__ import annotations

import math
from typing import Any

from contracts.messages import MetricReport, MetricWindow, OperatorWindow, SourceWindow, WorkerWindow

WindowState = dict[str, Any]


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


def window_start_for(timestamp: float, interval_s: float) -> float:
    return math.floor(timestamp / interval_s) * interval_s


def new_window(start: float) -> WindowState:
    return {"start": start, "reports": 0, "workers": {}, "offsets": {}, "seen": {}}


def already_applied(
    state: WindowState | None, partition: int, offset: int, report: MetricReport | None = None
) -> bool:
    """A redelivered record: its offset is not beyond the last one applied for its partition and,
    given its report, that report is already folded in (an older window, or seen in the open one).

    A record at an old offset whose report is new means the log started again from offset 0 (a
    broker that lost its data); skipping it would lose the report, so it is not skipped."""
    if state is None:
        return False
    last = state["offsets"].get(str(partition))
    if last is None or offset > last:
        return False
    if report is None or report.timestamp < state["start"]:
        return True
    return _seen_key(report) in state.get("seen", {}).get(report.worker_id, {})


def add_report(
    state: WindowState | None,
    report: MetricReport,
    interval_s: float,
    partition: int | None = None,
    offset: int | None = None,
) -> tuple[WindowState, MetricWindow | None]:
    """Fold one report into the job's open window; returns (new state, the window it closed, if any)."""
    start = window_start_for(report.timestamp, interval_s)
    closed: MetricWindow | None = None
    if state is None:
        state = new_window(start)
    elif start < state["start"]:
        raise LateReport(
            f"report at {report.timestamp:.3f} belongs to window {start:.0f}, "
            f"but window {state['start']:.0f} is already open"
        )
    elif start > state["start"]:
        closed = close_window(state, report.job_id, interval_s)
        state = new_window(start) | {"offsets": state["offsets"]}
    elif _seen_key(report) in state.get("seen", {}).get(report.worker_id, {}):
        # Windows saved before duplicate detection existed have no "seen": nothing to compare.
        raise DuplicateReport(
            f"worker {report.worker_id!r} already reported the interval ending at {report.timestamp!r} "
            f"in window {state['start']:.0f}; the first report counts"
        )
    _fold(state, report)
    if state["reports"] <= MAX_SEEN_PER_WINDOW:
        state.setdefault("seen", {}).setdefault(report.worker_id, {})[_seen_key(report)] = 1
    if partition is not None and offset is not None:
        state["offsets"][str(partition)] = offset
    return state, closed


def _seen_key(report: MetricReport) -> str:
    # repr is the shortest exact form of a float: a dict key that survives knowledge's JSON and is
    # found in constant time, where a list of floats would be scanned for every report.
    return repr(report.timestamp)


def _fold(state: WindowState, report: MetricReport) -> None:
    state["reports"] += 1
    worker = state["workers"].setdefault(
        report.worker_id,
        {
            "records_in": 0,
            "records_out": 0,
            "busy": 0.0,
            "observed": 0.0,
            "first_begin": report.timestamp - report.interval_s,
            "last_end": report.timestamp,
            "parallelism_first": report.parallelism,
            "cpu_weighted": 0.0,
            "cpu_time": 0.0,
            "operators": {},
        },
    )
    worker["records_in"] += report.records_in
    worker["records_out"] += report.records_out
    worker["busy"] += report.busy_time_s
    worker["observed"] += report.interval_s
    if report.batches is not None:
        worker["batches"] = worker.get("batches", 0) + report.batches
        worker["batch_time"] = worker.get("batch_time", 0.0) + (report.batch_time_s or 0.0)
    begin = report.timestamp - report.interval_s
    worker["first_begin"] = min(worker["first_begin"], begin)
    worker["last_end"] = max(worker["last_end"], report.timestamp)
    # When the reports at each parallelism begin and end: a window that spans a rescale says when
    # the old job stopped and the new one resumed (recovery timing), not only the window grid.
    span = worker.setdefault("spans", {}).setdefault(str(report.parallelism), [begin, report.timestamp])
    span[0], span[1] = min(span[0], begin), max(span[1], report.timestamp)
    worker["parallelism_last"] = report.parallelism
    if report.shuffle_partitions is not None:
        worker["shuffle_partitions"] = report.shuffle_partitions
    worker["parallelism_changed"] = worker.get("parallelism_changed", False) or (
        report.parallelism != worker["parallelism_first"]
    )
    if report.cpu_utilization is not None:
        worker["cpu_weighted"] += report.cpu_utilization * report.interval_s
        worker["cpu_time"] += report.interval_s
    if report.source is not None:
        src = worker.setdefault(
            "source", {"arrivals": 0.0, "observed": 0.0, "backlog_first": report.source.backlog,
                       "first_at": report.timestamp, "splittable": True}
        )
        src["arrivals"] += report.source.arrival_rate * report.interval_s
        src["observed"] += report.interval_s
        src["backlog_last"] = report.source.backlog
        src["last_at"] = report.timestamp
        src["partitions"] = report.source.partitions
        src["splittable"] = src["splittable"] and report.source.splittable
    for op in report.operators:
        agg = worker["operators"].setdefault(
            op.operator_id, {"records_in": 0, "records_out": 0, "busy": 0.0, "arrivals": None}
        )
        agg["records_in"] += op.records_in
        agg["records_out"] += op.records_out
        agg["busy"] += op.busy_time_s
        agg["upstream"] = list(op.upstream)
        agg["parallelism"] = op.parallelism
        if op.arrival_rate is not None:
            agg["arrivals"] = (agg["arrivals"] or 0.0) + op.arrival_rate * report.interval_s


def close_window(state: WindowState, job_id: str, interval_s: float) -> MetricWindow:
    workers = state["workers"].values()
    observed = max(w["observed"] for w in workers)
    last_worker = max(workers, key=lambda w: w["last_end"])
    parallelisms = {w["parallelism_first"] for w in workers} | {w["parallelism_last"] for w in workers}
    cpu_time = sum(w["cpu_time"] for w in workers)
    cpu = sum(w["cpu_weighted"] for w in workers) / cpu_time if cpu_time else None
    batched = [w for w in workers if "batches" in w]
    return MetricWindow(
        job_id=job_id,
        window_start=state["start"],
        window_end=state["start"] + interval_s,
        observed_s=observed,
        report_count=state["reports"],
        workers=len(state["workers"]),
        parallelism=last_worker["parallelism_last"],
        parallelism_changed=len(parallelisms) > 1 or any(w["parallelism_changed"] for w in workers),
        records_in=sum(w["records_in"] for w in workers),
        records_out=sum(w["records_out"] for w in workers),
        busy_time_s=sum(w["busy"] for w in workers),
        cpu_utilization=cpu,
        batches=sum(w["batches"] for w in batched) if batched else None,
        batch_time_s=sum(w["batch_time"] for w in batched) if batched else None,
        source=_source_window(workers),
        shuffle_partitions=last_worker.get("shuffle_partitions"),
        operators=_operator_windows(workers, observed),
        worker_loads=_worker_loads(state["workers"], last_worker["parallelism_last"]),
        **_report_times(workers, last_worker["parallelism_last"]),
    )


def _report_times(workers: Any, parallelism: int) -> dict[str, float | None]:
    """first_report_at, last_report_at and stopped_at of the window (see MetricWindow); a state
    folded before spans were kept gives only the last report's end."""
    spans = [w.get("spans", {}) for w in workers]
    current = [s[str(parallelism)] for s in spans if str(parallelism) in s]
    others = [span[1] for s in spans for p, span in s.items() if p != str(parallelism)]
    return {"first_report_at": min(span[0] for span in current) if current else None,
            "last_report_at": max(w["last_end"] for w in workers),
            "stopped_at": max(others) if others else None}


def _worker_loads(workers: dict[str, Any], parallelism: int) -> list[WorkerWindow]:
    """Each worker's (utilization, throughput), the capacity model's samples.

    Busy time is preferred to CPU: it counts all of a task's work, where an engine's CPU figure
    may miss some (Spark's executorCpuTime leaves out its Python workers). Reports do not say how
    many slots a worker has, so the job's slots are taken as spread evenly over its workers."""
    slots = parallelism / len(workers)
    loads = []
    for worker_id, w in sorted(workers.items()):
        if w["observed"] <= 0:
            continue
        if w["busy"] > 0:
            utilization, source = w["busy"] / (w["observed"] * slots), "busy"
        elif w["cpu_time"] > 0:
            utilization, source = w["cpu_weighted"] / w["cpu_time"], "cpu"
        else:
            continue
        loads.append(WorkerWindow(worker_id=worker_id, throughput=w["records_in"] / w["observed"],
                                  utilization=min(1.0, max(0.0, utilization)), utilization_source=source))
    return loads


def _source_window(workers: Any) -> SourceWindow | None:
    sources = [w["source"] for w in workers if "source" in w]
    if not sources:
        return None
    growth = 0.0
    for src in sources:
        span = src["last_at"] - src["first_at"]
        if span > 0:
            growth += (src["backlog_last"] - src["backlog_first"]) / span
    return SourceWindow(
        arrival_rate=sum(s["arrivals"] / s["observed"] for s in sources),
        backlog=sum(s["backlog_last"] for s in sources),
        backlog_growth_rate=growth,
        partitions=max(s["partitions"] for s in sources),
        splittable=all(s["splittable"] for s in sources),
    )


def _operator_windows(workers: Any, observed: float) -> list[OperatorWindow]:
    merged: dict[str, dict[str, Any]] = {}
    for worker in workers:
        for op_id, agg in worker["operators"].items():
            into = merged.setdefault(
                op_id, {"records_in": 0, "records_out": 0, "busy": 0.0, "arrivals": None}
            )
            into["records_in"] += agg["records_in"]
            into["records_out"] += agg["records_out"]
            into["busy"] += agg["busy"]
            into["upstream"] = agg["upstream"]
            into["parallelism"] = agg["parallelism"]
            if agg["arrivals"] is not None:
                into["arrivals"] = (into["arrivals"] or 0.0) + agg["arrivals"]
    return [
        OperatorWindow(
            operator_id=op_id,
            upstream=agg["upstream"],
            parallelism=agg["parallelism"],
            records_in=agg["records_in"],
            records_out=agg["records_out"],
            busy_time_s=agg["busy"],
            arrival_rate=None if agg["arrivals"] is None else agg["arrivals"] / observed,
        )
        for op_id, agg in merged.items()
    ]
