"""The monitor's loop kernel: metric reports in, closed windows and dead letters out. Pure.

One batch of records goes through two steps, with the reads the shell makes in between:

1. `parse` validates each record (`monitor.validation.parse_report`); what fails becomes a dead
   letter with its reason. The shell then reads which of the reporting jobs are registered and
   loads the open windows of those it does not hold.
2. `fold` folds each accepted report into its job's open window (`monitor.windows.add_report`,
   DS2's per-window aggregation of the instances' counters): a report of a later window closes the
   open one. A record already folded in (a redelivery after a restart or rebalance) is skipped; a
   report of an unregistered job, a late or a duplicate report is dead-lettered.

The result (`Folded`) declares what the shell must do, in this order: publish `closed` to `windows`
(acknowledged by the broker), publish `rejected` to `dead_letter`, save the `changed` windows, add
`counters`. Windows before state: a crash in between closes a window again (analyze and plan drop
the duplicate by its end) instead of losing it.

The simulator (`evaluation.loop`) calls `fold` with the reports its job model sends, and `close`
at a window's end, where a live monitor closes it on the first report of the next window (the same
`close_window`; only the moment differs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from contracts.dead_letters import DeadLetter, Rejection, dead_letter
from contracts.messages import MetricReport, MetricWindow
from contracts.stage import Incoming
from monitor.validation import parse_report
from monitor.windows import RefusedReport, WindowState, add_report, already_applied, close_window, phase_for

STAGE = "monitor"


@dataclass(frozen=True)
class Parsed:
    """The records of a batch that are valid reports, in order, and the dead letters of the others."""

    accepted: list[tuple[MetricReport, Incoming]]
    rejected: list[DeadLetter]

    def job_ids(self) -> set[str]:
        return {report.job_id for report, _ in self.accepted}


@dataclass(frozen=True)
class Folded:
    """What one batch did: windows closed, dead letters, the open windows that changed, counts."""

    closed: list[MetricWindow] = field(default_factory=list)
    rejected: list[DeadLetter] = field(default_factory=list)
    changed: dict[str, WindowState] = field(default_factory=dict)
    accepted: Counter[str] = field(default_factory=Counter)
    redelivered: int = 0

    def counters(self) -> dict[str, int]:
        """The knowledge counters this batch adds to (none that are zero)."""
        counts = {"reports_accepted": sum(self.accepted.values()), "reports_redelivered": self.redelivered}
        counts.update(Counter(f"rejected:{letter.reason}" for letter in self.rejected))
        return {k: v for k, v in counts.items() if v}


def parse(records: Sequence[Incoming], topic: str, max_bytes: int, now: float, max_skew_s: float) -> Parsed:
    """Step 1: validate every record read from `topic` (its name, for the dead letters)."""
    accepted: list[tuple[MetricReport, Incoming]] = []
    rejected: list[DeadLetter] = []
    for record in records:
        result = parse_report(record.value, record.key, max_bytes, now, max_skew_s)
        if isinstance(result, Rejection):
            rejected.append(rejected_record(topic, record, result))
        else:
            accepted.append((result, record))
    return Parsed(accepted, rejected)


def missing_windows(parsed: Parsed, held: Iterable[str], unknown: set[str]) -> set[str]:
    """The registered jobs whose open windows the shell must load before `fold`."""
    held = set(held)
    return {job for job in parsed.job_ids() if job not in held and job not in unknown}


def fold(
    windows: Mapping[str, WindowState],
    parsed: Parsed,
    unknown: set[str],
    interval_s: float,
    topic: str,
    orphaned: Mapping[str, str] | None = None,
    spread: bool = False,
) -> Folded:
    """Step 2: fold the accepted reports into `windows` (every registered job's open window, or none
    yet); `unknown` are the reporting jobs that are not registered, `orphaned` the registered jobs whose
    cluster was removed (job -> cluster): the reports of both are dead-lettered with the reason. `windows`
    is not changed: the jobs whose windows changed are in the result's `changed`. With `spread`, each job's
    windows start at its own phase (`monitor.windows.window_phase`), else on multiples of the interval."""
    out = Folded(rejected=list(parsed.rejected))
    current = dict(windows)
    redelivered = 0
    for report, record in parsed.accepted:
        job = report.job_id
        if job in unknown:
            out.rejected.append(rejected_record(topic, record, Rejection(
                "unknown_job", f"job {job!r} is not registered (autoscaler jobs register {job})")))
            continue
        if orphaned and job in orphaned:
            out.rejected.append(rejected_record(topic, record, Rejection(
                "unknown_cluster", f"job {job!r} names cluster {orphaned[job]!r}, which was removed "
                f"(autoscaler cluster add {orphaned[job]} ..., or autoscaler config unset {job} cluster)")))
            continue
        state = current.get(job)
        if record.partition is not None and record.offset is not None and already_applied(
                state, record.partition, record.offset, report):
            redelivered += 1  # after a restart or rebalance: already in the window, counted once
            continue
        try:
            state, window = add_report(state, report, interval_s, record.partition, record.offset,
                                       phase_for(job, interval_s, spread))
        except RefusedReport as exc:  # late_report, duplicate_report
            out.rejected.append(rejected_record(topic, record, Rejection(exc.reason, str(exc))))
            continue
        current[job] = out.changed[job] = state
        out.accepted[job] += 1
        if window is not None:
            out.closed.append(window)
    return Folded(out.closed, out.rejected, out.changed, out.accepted, redelivered)


def close(state: WindowState, job_id: str, interval_s: float) -> MetricWindow:
    """The open window as it closes (what `fold` publishes when the next window's first report comes)."""
    return close_window(state, job_id, interval_s)


def rejected_record(topic: str, record: Incoming, rejection: Rejection) -> DeadLetter:
    return dead_letter(topic, record.value, record.key, rejection, STAGE, record.partition, record.offset)
