"""Pure pieces of the metrics reporter: stage accounting and interval aggregation, no I/O.

The reporter shell (pipeline.reporter) feeds these with StreamingQueryProgress events and the
driver's REST stage list, and publishes what `IntervalAggregator.report` returns.

A stateful query's progress also gives its state (`stateOperators`: rows, memory, commit time and
state partitions per operator) and its event-time watermark (`eventTime.watermark`); a report
carries the state at the interval's end and how far the watermark lags behind the interval's end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from contracts.messages import MetricReport, SourceMetrics, StateOperatorMetrics
from pipeline import offsets as off


@dataclass(frozen=True)
class StageTotals:
    run_time_s: float = 0.0
    cpu_time_s: float = 0.0
    stages: int = 0
    tasks: int = 0
    available: bool = True  # False: the stage list could not be read

    def __add__(self, other: StageTotals) -> StageTotals:
        return StageTotals(
            self.run_time_s + other.run_time_s,
            self.cpu_time_s + other.cpu_time_s,
            self.stages + other.stages,
            self.tasks + other.tasks,
            self.available and other.available,
        )


class StageTracker:
    """Sums the task time of stages as they complete, each (stageId, attemptId) once.

    Only completed stages count: a micro-batch's stages have all completed when its progress
    event is posted, so nothing is lost; a stage finishing just after a report is counted in the
    next one. Failed attempts are not useful work and are skipped.

    Memory stays bounded by Spark's own stage retention: a counted key whose stage id is below the
    lowest id the driver still lists can never be listed again, so it is forgotten.
    """

    def __init__(self) -> None:
        self._counted: set[tuple[int, int]] = set()

    def __len__(self) -> int:
        return len(self._counted)

    def prime(self, stages: Iterable[Mapping[str, Any]]) -> None:
        """Mark the stages listed now as counted: work from before the reporter attached."""
        self.new_completed(stages)

    def new_completed(self, stages: Iterable[Mapping[str, Any]]) -> StageTotals:
        listed = [s for s in stages if "stageId" in s]
        total = StageTotals()
        for stage in listed:
            if str(stage.get("status", "")).upper() != "COMPLETE":
                continue
            key = (int(stage["stageId"]), int(stage.get("attemptId", 0)))
            if key in self._counted:
                continue
            self._counted.add(key)
            total = total + StageTotals(
                run_time_s=float(stage.get("executorRunTime", 0) or 0) / 1000.0,
                cpu_time_s=float(stage.get("executorCpuTime", 0) or 0) / 1e9,
                stages=1,
                tasks=int(stage.get("numCompleteTasks", 0) or 0),
            )
        if listed:
            lowest = min(int(s["stageId"]) for s in listed)
            self._counted = {k for k in self._counted if k[0] >= lowest}
        return total


# The contract's bounds: at most this many stateful operators per report, lags of at most a year.
MAX_STATE_OPERATORS = 64
MAX_LAG_S = 31_536_000.0
_MAX_NAME = 128
_MAX_STATE_PARTITIONS = 1_000_000


@dataclass(frozen=True)
class StateSample:
    """One entry of a progress's `stateOperators`: the operator's state after the batch, and the
    milliseconds the batch spent committing it. `partitions` None: they could not be read."""

    operator: str
    rows: int
    memory_bytes: int
    commit_time_s: float
    partitions: int | None


@dataclass(frozen=True)
class ProgressSample:
    """The parts of one StreamingQueryProgress the reporter uses (of the first source)."""

    trigger_start: float  # epoch s; the source read its log-end offsets at about this time
    duration_s: float
    input_rows: int
    sink_rows: int | None  # None: the sink does not count its rows (e.g. foreachBatch)
    processed: off.OffsetMap  # end offsets of the batch
    log_end: off.OffsetMap  # log-end offsets the source reported
    state: tuple[StateSample, ...] = ()  # the stateful operators, in the progress's order
    watermark: float | None = None  # epoch s; None: no watermark (yet)

    @property
    def end(self) -> float:
        return self.trigger_start + self.duration_s


def parse_spark_timestamp(text: str) -> float:
    """Progress timestamps look like 2024-05-01T12:00:00.123Z."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _field(item: Any, name: str) -> Any:
    """A field of a progress or a part of it, whether its JSON dict or pyspark's object (None: absent)."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _count(value: Any) -> int:
    """A non-negative count from a progress field; 0 when it is missing or not a number."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return max(0, number)


def _state_partitions(value: Any) -> int | None:
    """A state operator's partitions, None when they cannot be read (missing, not a whole number,
    below 1 or beyond the contract's bound)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    number = int(value)
    return number if number == value and 1 <= number <= _MAX_STATE_PARTITIONS else None


def _seconds_from_ms(value: Any) -> float:
    """Milliseconds as seconds; 0 when missing, negative or not a finite number."""
    try:
        ms = float(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return ms / 1000.0 if math.isfinite(ms) and ms > 0 else 0.0


def state_from_progress(operators: Any) -> tuple[StateSample, ...]:
    """The progress's `stateOperators` (JSON dicts or pyspark objects) as StateSamples. A field that
    cannot be read is 0, or None for the partitions; the first MAX_STATE_OPERATORS are kept."""
    if not isinstance(operators, list | tuple):
        return ()
    return tuple(
        StateSample(
            operator=str(_field(op, "operatorName") or "state")[:_MAX_NAME],
            rows=_count(_field(op, "numRowsTotal")),
            memory_bytes=_count(_field(op, "memoryUsedBytes")),
            commit_time_s=_seconds_from_ms(_field(op, "commitTimeMs")),
            partitions=_state_partitions(_field(op, "numShufflePartitions")),
        )
        for op in operators[:MAX_STATE_OPERATORS] if op is not None
    )


def watermark_from_progress(event_time: Any) -> float | None:
    """The progress's `eventTime.watermark` in epoch seconds; None without one. Before the query
    has seen any event Spark reports the watermark as epoch 0: that is no watermark yet."""
    text = _field(event_time, "watermark")
    if not text:
        return None
    try:
        watermark = parse_spark_timestamp(str(text))
    except (ValueError, OverflowError):
        return None
    return watermark if watermark > 0 else None


def lag(end: float, event_time: float | None) -> float | None:
    """`end` minus an event time, in [0, MAX_LAG_S]; None without an event time."""
    if event_time is None:
        return None
    return min(MAX_LAG_S, max(0.0, end - event_time))


def sample_from_progress(progress: Mapping[str, Any] | Any) -> ProgressSample:
    """Convert a StreamingQueryProgress (object or its JSON dict) into a ProgressSample."""
    def get(name: str) -> Any:
        return _field(progress, name)

    durations = get("durationMs") or {}
    sources = get("sources") or []
    source = sources[0] if sources else None
    rows = _field(get("sink"), "numOutputRows")
    sink_rows = int(rows) if rows is not None and int(rows) >= 0 else None  # None: the sink does not count
    processed = off.parse_progress_offsets(_field(source, "endOffset"))
    input_rows, read = int(get("numInputRows") or 0), rows_read(sources, processed)
    return ProgressSample(
        trigger_start=parse_spark_timestamp(str(get("timestamp"))),
        duration_s=float(durations.get("triggerExecution", 0) or 0) / 1000.0,
        input_rows=input_rows if read is None else min(input_rows, read),
        sink_rows=sink_rows,
        processed=processed,
        log_end=off.parse_progress_offsets(_field(source, "latestOffset")),
        state=state_from_progress(get("stateOperators")),
        watermark=watermark_from_progress(get("eventTime")),
    )


def rows_read(sources: Sequence[Any], end: off.OffsetMap) -> int | None:
    """At most the records a batch read from its one source: its end offsets (`end`) less its start offsets (a
    query's first batch has no start: from 0, so at most); None without end offsets or with several
    sources. Spark's numInputRows counts each scan of a source: a query that reads its source twice (a
    stream-stream self-join, as Nexmark's Q8 splits one event stream into two sides) counts each record
    twice (live: 2,000 records, numInputRows 4,000), and a DS2 rate per record on it is twice the query's
    capacity. Both are bounds from above, so a batch counts the smaller."""
    if len(sources) != 1 or not end:
        return None
    return off.count_records(off.parse_progress_offsets(_field(sources[0], "startOffset")), end)


def backlog_at_end(sample: ProgressSample, arrival_rate: float) -> int:
    """Records waiting when the batch ended.

    The source read the log end when the batch started, so "log end minus processed end" misses
    what arrived while the batch ran; that part is estimated as arrival rate x batch duration.
    """
    return off.backlog(sample.log_end, sample.processed) + round(arrival_rate * sample.duration_s)


@dataclass
class IntervalAggregator:
    """Accumulates progress samples into one MetricReport per interval.

    records_out: what the job says it wrote (`job_output`), else the sink's row count when every
    batch of the interval reported one, else records_in (a job that emits one record per input).
    Arrival rate: growth of the log-end offsets between the last sample of the previous report and
    the last sample of this one, over the time between those samples' triggers. Backlog: see
    `backlog_at_end`.

    State: the last sample's stateful operators, each with its commit time summed over the
    interval's samples (matched by position and name). Watermark lag: the interval's end minus the
    last sample's watermark. Output lag: the interval's end minus the newest event time the job's
    sink wrote (`report`'s `newest_output_event_time`). Both lags lie in [0, MAX_LAG_S].
    """

    job_id: str
    started_at: float  # epoch s; the first interval starts here
    splittable: bool = True
    shuffle_partitions: int | None = None  # reported when fixed whatever the parallelism (in place)
    _interval_start: float = field(init=False)
    _records_in: int = field(default=0, init=False)
    _batches: int = field(default=0, init=False)
    _batch_time_s: float = field(default=0.0, init=False)
    _sink_rows: int | None = field(default=0, init=False)
    _baseline: ProgressSample | None = field(default=None, init=False)
    _last: ProgressSample | None = field(default=None, init=False)
    _samples: int = field(default=0, init=False)
    _commit_s: dict[tuple[int, str], float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._interval_start = self.started_at

    @property
    def pending_samples(self) -> int:
        return self._samples

    @property
    def last_sample(self) -> ProgressSample | None:
        return self._last

    def add(self, sample: ProgressSample) -> None:
        self._records_in += sample.input_rows
        if sample.input_rows > 0:  # a trigger that found no records is not a batch's cost
            self._batches += 1
            self._batch_time_s += sample.duration_s
        if self._sink_rows is not None:
            self._sink_rows = None if sample.sink_rows is None else self._sink_rows + sample.sink_rows
        if self._baseline is None and sample.log_end:
            self._baseline = sample
        for i, op in enumerate(sample.state):
            if op.commit_time_s:
                key = (i, op.operator)
                self._commit_s[key] = self._commit_s.get(key, 0.0) + op.commit_time_s
        self._last = sample
        self._samples += 1

    def due(self, now: float, min_interval_s: float) -> bool:
        """Whether to close the interval now.

        The first report waits for a second sample with log-end offsets: one sample alone cannot
        show an arrival rate, and a report of 0 would read as "no load".
        """
        if self._last is None or self._samples == 0 or now - self._interval_start < min_interval_s:
            return False
        if not self._last.log_end:
            return True
        return self._baseline is not None and self._baseline is not self._last

    def report(
        self,
        parallelism: int,
        stages: StageTotals,
        job_output: int | None = None,
        newest_output_event_time: float | None = None,
    ) -> MetricReport | None:
        """Close the interval; None when no progress arrived since the last report.

        A state operator with more partitions than `shuffle_partitions` was started with another
        setting, which its checkpoint keeps: Spark runs its stage with the checkpoint's, so that
        count is reported as the shuffle partitions."""
        if self._last is None or self._samples == 0:
            return None
        # The interval ends with the last batch it covers, not when the listener got around to it.
        end = max(self._last.end, self._interval_start + 1e-3)
        if job_output is not None:
            records_out = job_output
        elif self._sink_rows is not None:
            records_out = self._sink_rows
        else:
            records_out = self._records_in
        source = None
        if self._last.log_end:
            base = self._baseline if self._baseline is not None else self._last
            rate = off.arrival_rate(base.log_end, self._last.log_end, self._last.trigger_start - base.trigger_start)
            source = SourceMetrics(
                arrival_rate=rate,
                backlog=backlog_at_end(self._last, rate),
                partitions=max(1, len(self._last.log_end)),
                splittable=self.splittable,
            )
        state = [
            StateOperatorMetrics(operator=op.operator, rows=op.rows, memory_bytes=op.memory_bytes,
                                 commit_time_s=self._commit_s.get((i, op.operator), 0.0), partitions=op.partitions)
            for i, op in enumerate(self._last.state)
        ]
        shuffle = self.shuffle_partitions
        if shuffle is not None:
            shuffle = max([shuffle, *(op.partitions for op in state if op.partitions is not None)])
        report = build_metric_report(
            job_id=self.job_id,
            end=end,
            interval_s=end - self._interval_start,
            parallelism=parallelism,
            records_in=self._records_in,
            records_out=records_out,
            busy_time_s=stages.run_time_s,
            cpu_time_s=stages.cpu_time_s if stages.available else None,
            source=source,
            batches=self._batches,
            batch_time_s=self._batch_time_s,
            shuffle_partitions=shuffle,
            state=state,
            watermark_lag_s=lag(end, self._last.watermark),
            output_lag_s=lag(end, newest_output_event_time),
        )
        self._interval_start = end
        self._records_in = 0
        self._batches = 0
        self._batch_time_s = 0.0
        self._sink_rows = 0
        self._samples = 0
        self._commit_s = {}
        if self._last.log_end:
            self._baseline = self._last
        return report


def build_metric_report(
    *,
    job_id: str,
    end: float,
    interval_s: float,
    parallelism: int,
    records_in: int,
    records_out: int,
    busy_time_s: float,
    cpu_time_s: float | None = None,
    source: SourceMetrics | None = None,
    worker_id: str = "driver",
    batches: int | None = None,
    batch_time_s: float | None = None,
    shuffle_partitions: int | None = None,
    state: Sequence[StateOperatorMetrics] = (),
    watermark_lag_s: float | None = None,
    output_lag_s: float | None = None,
) -> MetricReport:
    """A MetricReport from plain numbers; CPU utilisation is CPU time over the slots' time."""
    interval_s = min(max(interval_s, 1e-3), 3600.0)
    cpu = None
    if cpu_time_s is not None:
        cpu = min(1.0, max(0.0, cpu_time_s / (interval_s * parallelism)))
    return MetricReport(
        job_id=job_id,
        timestamp=end,
        interval_s=interval_s,
        worker_id=worker_id,
        parallelism=parallelism,
        records_in=max(0, records_in),
        records_out=max(0, records_out),
        busy_time_s=max(0.0, busy_time_s),
        cpu_utilization=cpu,
        source=source,
        batches=None if batches is None else max(0, batches),
        batch_time_s=None if batches is None else min(86_400.0, max(0.0, batch_time_s or 0.0)),
        shuffle_partitions=shuffle_partitions,
        state=list(state),
        watermark_lag_s=watermark_lag_s,
        output_lag_s=output_lag_s,
    )
