"""`autoscaler calibrate`: measure a Spark job on this machine and write the job-model file the
evaluation replays (`autoscaler evaluate --job-model FILE`).

It starts a broker of its own for each measurement and runs the job in this process, as the runner
does (restart backend):
  warm-up           the job at one slot under a low constant load for `warm_up_s`: Spark's fixed cost
                    per micro-batch falls over its first hundred or so batches in a process (the
                    JVM compiles the driver's per-batch path; see docs/spark.md for the curve),
                    and a live job runs warm after its first minutes, restarts included
                    (the JVM outlives them). Every later measurement runs in the same, warm, JVM;
  per parallelism   a backlog of `work_s` seconds of work per slot, drained by the job: the DS2 true
                    rate per slot (records per busy second), the records per second it drains
                    (its maximum sustainable throughput), the fixed time per micro-batch beyond the
                    slots' work (Analysis.batch_overhead_s's formula), the work per slot in a full
                    batch, and the report-to-report spread of the per-slot rate (the rate noise);
  restarts          under a constant load, rescales up and down between the two smallest
                    parallelisms: the restart backend's downtime of each direction, a scale-up's
                    with the job behind (a full first batch after it), as live.
The per-slot rates are fitted to the model's knee curve (`evaluation.model_files.fit_scaling`); the
rest are medians. The file says what was measured, when and how.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyze.true_rates import fixed_batch_cost
from contracts.messages import MetricReport
from contracts.settings import Settings, Topics
from evaluation.model_files import WARM_UP_S, JobModelFile, fit_scaling
from infra.kafka import TopicReader, ensure_topic
from pipeline.loadgen import Constant, Shape, generate_load
from pipeline.restart import RestartFromCheckpoint, SparkJobConfig
from plan.batching import BatchCost, TaskCost
from plan.capacity_estimate import Measured, capacities
from stack.processes import start_broker

INPUT = "calibrate.input"
OUTPUT = "calibrate.output"
METRICS = "calibrate.metrics"
FAST_PRODUCE_RATE = 50_000.0
REPORT_S = 5.0  # the reporter's interval; the evaluation's windows are twice as long
# Before a measured scale-up, this many seconds of the larger parallelism's work are queued: twice a full
# micro-batch (about 5 s of work per slot), so the restarted job's first batch is full, as live.
BEHIND_S = 10.0
STEADY_BACKLOG_S = 3.0  # a report at the constant load with more queued than this is still draining


class Metrics:
    """The job's metric reports, read from the metrics topic."""

    def __init__(self, bootstrap: str, topic: str = METRICS):
        self.reader = TopicReader(bootstrap, topic)

    @property
    def reports(self) -> list[MetricReport]:
        return [MetricReport.model_validate_json(v) for v in self.reader.values]

    def poll(self, seconds: float) -> list[MetricReport]:
        self.reader.poll(seconds)
        return self.reports

    def close(self) -> None:
        self.reader.close()


def job_config(bootstrap: str, options: dict[str, str], directory: Path, entry_point: str = "pipeline.demo:build",
               **extra: Any) -> SparkJobConfig:
    """The job as the runner would run it, reporting to this run's metrics topic."""
    settings = Settings(kafka_bootstrap=bootstrap, topic_partitions=1, topics=Topics(metrics=METRICS))
    return SparkJobConfig(job_id="calibrate", entry_point=entry_point, checkpoint_dir=directory, bootstrap=bootstrap,
                          options={"input_topic": INPUT, "output_topic": OUTPUT, **options},
                          report_interval_s=REPORT_S, settings=settings, **extra)


@dataclass(frozen=True)
class Drain:
    """What draining a backlog at one parallelism showed (the reports between the first and the last)."""

    parallelism: int
    reports: int
    records: int
    seconds: float
    slot_rate: float  # records per busy second per slot (DS2)
    throughput: float  # records per second drained
    batch_overhead_s: float | None
    batch_work_s: float | None  # busy seconds per slot in one batch
    rate_cv: float | None  # report-to-report coefficient of variation of the per-slot rate
    rates: tuple[float, ...] = ()  # the per-slot rate of each report
    tasks: tuple[tuple[float, float], ...] = ()  # each report's (records, busy seconds) per task (`task_points`)

    @classmethod
    def of(cls, parallelism: int, reports: list[MetricReport]) -> Drain:
        busy = sum(r.busy_time_s for r in reports)
        records = sum(r.records_in for r in reports)
        seconds = sum(r.interval_s for r in reports)
        batched = [r for r in reports if r.batches]
        batches = sum(r.batches or 0 for r in batched)
        batch_time = sum(r.batch_time_s or 0.0 for r in batched)
        batch_busy = sum(r.busy_time_s for r in batched)
        rates = slot_rates(reports)
        return cls(
            parallelism=parallelism, reports=len(reports), records=records, seconds=round(seconds, 2),
            slot_rate=records / busy if busy else 0.0, throughput=records / seconds if seconds else 0.0,
            batch_overhead_s=fixed_batch_cost(batch_time, batch_busy, parallelism, batches) if batches else None,
            batch_work_s=batch_busy / (parallelism * batches) if batches else None,
            rate_cv=statistics.stdev(rates) / statistics.mean(rates) if len(rates) >= 3 else None,
            rates=tuple(round(r, 2) for r in rates), tasks=tuple(task_points(reports)),
        )


def batch_overheads(reports: list[MetricReport]) -> list[float]:
    """Each report's fixed cost per micro-batch (`fixed_batch_cost`), where it ran batches."""
    return [round(fixed_batch_cost(r.batch_time_s or 0.0, r.busy_time_s, r.parallelism, r.batches), 3)
            for r in reports if r.batches and r.records_in > 0]


@dataclass
class Calibration:
    drains: list[Drain] = field(default_factory=list)
    downtimes_up: list[float] = field(default_factory=list)
    downtimes_down: list[float] = field(default_factory=list)
    steady_rates: list[list[float]] = field(default_factory=list)  # per level held between restarts
    steady_tasks: list[tuple[float, float]] = field(default_factory=list)  # `task_points` of those levels
    warm_up: list[float] = field(default_factory=list)  # each warm-up report's fixed cost per batch, in order


@contextmanager
def own_broker() -> Iterator[str]:
    """A broker of its own for one measurement (its topics start empty), stopped afterwards."""
    broker = start_broker()
    try:
        yield f"{broker.host}:{broker.port}"
    finally:
        broker.stop()


def drain(bootstrap: str, parallelism: int, options: dict[str, str], records: int, topic_partitions: int,
          timeout_s: float = 600.0) -> Drain:
    """Preload `records` and let the job at `parallelism` drain them (on a broker whose topics are empty)."""
    ensure_topic(bootstrap, INPUT, topic_partitions)
    generate_load(bootstrap, INPUT, Constant(FAST_PRODUCE_RATE), duration_s=records / FAST_PRODUCE_RATE,
                  partitions=topic_partitions)
    metrics = Metrics(bootstrap)
    with tempfile.TemporaryDirectory() as tmp:
        job = RestartFromCheckpoint(job_config(bootstrap, options, Path(tmp), trigger_interval_s=None))
        job.start(parallelism)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                last = metrics.poll(1.0)[-1:] or [None]
                if last[0] is not None and last[0].source is not None and last[0].source.backlog == 0:
                    break
        finally:
            job.stop()
            metrics.close()
    # The first report holds the start-up, the last one the backlog's tail.
    return Drain.of(parallelism, metrics.reports[1:-1])


@contextmanager
def background_load(bootstrap: str, shape: Shape, topic_partitions: int, duration_s: float = 7200) -> Iterator[None]:
    """The project's load generator writing `shape` into the input topic from a thread, stopped on exit."""
    ensure_topic(bootstrap, INPUT, topic_partitions)
    stop = threading.Event()
    load = threading.Thread(target=generate_load, args=(bootstrap, INPUT, shape),
                            kwargs={"duration_s": duration_s, "stop_event": stop, "partitions": topic_partitions},
                            daemon=True)
    load.start()
    try:
        yield
    finally:
        stop.set()
        load.join(30)


@contextmanager
def under_load(bootstrap: str, options: dict[str, str], parallelism: int, rate: float, topic_partitions: int
               ) -> Iterator[tuple[RestartFromCheckpoint, Metrics]]:
    """The job started at `parallelism` with its own trigger, a constant `rate` of records arriving
    from then on, and its metric reports; all stopped on exit."""
    ensure_topic(bootstrap, INPUT, topic_partitions)
    metrics = Metrics(bootstrap)
    with tempfile.TemporaryDirectory() as tmp:
        job = RestartFromCheckpoint(job_config(bootstrap, options, Path(tmp)))
        job.start(parallelism)
        try:
            with background_load(bootstrap, Constant(rate), topic_partitions):
                yield job, metrics
        finally:
            job.stop()
            metrics.close()


def warm_up(bootstrap: str, options: dict[str, str], rate: float, seconds: float, topic_partitions: int
            ) -> list[float]:
    """Run the job at one slot under a constant `rate` for `seconds` (see the module docstring), with
    its own trigger so that it runs many small batches; returns each report's fixed cost per batch."""
    with under_load(bootstrap, options, 1, rate, topic_partitions) as (_, metrics):
        return batch_overheads(metrics.poll(seconds))


def task_points(reports: list[MetricReport]) -> list[tuple[float, float]]:
    """Each report's records and busy seconds per task (one task per slot per micro-batch), where it
    ran batches: the points `plan.batching.TaskCost` fits the per-task fixed cost through."""
    return [(round(r.records_in / (r.parallelism * r.batches), 2),
             round(r.busy_time_s / (r.parallelism * r.batches), 4))
            for r in reports if r.batches and r.records_in > 0 and r.busy_time_s > 0]


def slot_rates(reports: list[MetricReport]) -> list[float]:
    """Each report's DS2 per-slot rate (records per busy second), where it read records."""
    return [r.records_in / r.busy_time_s for r in reports if r.busy_time_s > 0 and r.records_in > 0]


def restarts(bootstrap: str, low: int, high: int, options: dict[str, str], rate: float, repeat: int,
             topic_partitions: int, warmup_s: float = 20.0, behind_records: int = 0
             ) -> tuple[list[float], list[float], list[list[float]], list[tuple[float, float]]]:
    """Downtimes of `repeat` rescales low -> high and as many back, under a constant load, and the
    per-slot rates and task points the job reported at each level (the first report after a
    restart and those still draining a backlog left out): batches below full, beside the drains' full ones.

    A scale-up is decided when the job is behind, so `behind_records` are added just before each
    one: its downtime, which runs until the restarted job's first micro-batch is done, then includes
    a full first batch, as live. A scale-down is decided at a low load with no backlog, and is measured so."""
    up: list[float] = []
    down: list[float] = []
    levels: list[list[float]] = []
    tasks: list[tuple[float, float]] = []
    with under_load(bootstrap, options, low, rate, topic_partitions) as (job, metrics):
        for _ in range(repeat):
            for target, into in ((high, up), (low, down)):
                seen = len(metrics.reports)
                steady = [r for r in metrics.poll(warmup_s)[seen + 1:]
                          if r.source is None or r.source.backlog <= STEADY_BACKLOG_S * rate]
                levels.append(slot_rates(steady))
                tasks += task_points(steady)
                if target > low and behind_records > 0:
                    generate_load(bootstrap, INPUT, Constant(FAST_PRODUCE_RATE),
                                  duration_s=behind_records / FAST_PRODUCE_RATE, partitions=topic_partitions)
                outcome = job.apply(target)
                if not outcome.ok or outcome.downtime_s is None:
                    raise RuntimeError(f"the rescale to {target} failed: {outcome.errors}")
                into.append(outcome.downtime_s)
    return up, down, levels, tasks


def calibrate(parallelisms: list[int], options: dict[str, str], *, work_s: float = 40.0, nominal_slot_rate: float,
              restart_repeat: int = 2, topic_partitions: int = 4, name: str = "demo", warm_up_s: float = WARM_UP_S,
              say: Callable[[str], None] = print) -> tuple[JobModelFile, Calibration]:
    """Measure the job and return its model file (see the module docstring). `nominal_slot_rate`
    sizes the backlogs and the restart load; it is not written into the model."""
    if not parallelisms or min(parallelisms) < 1:
        raise ValueError("give at least one parallelism >= 1")
    parallelisms = sorted(set(parallelisms))
    result = Calibration()
    if warm_up_s > 0:
        with own_broker() as bootstrap:
            result.warm_up = warm_up(bootstrap, options, 0.4 * nominal_slot_rate, warm_up_s, topic_partitions)
        shown = result.warm_up[1:] or [math.nan]
        say(f"warm-up {warm_up_s:g} s at one slot: fixed cost per batch {shown[0]:.2f} s at first, "
            f"{statistics.median(shown[-4:]):.2f} s at the end")
    for p in parallelisms:
        with own_broker() as bootstrap:
            d = drain(bootstrap, p, options, math.ceil(work_s * p * nominal_slot_rate), topic_partitions)
        result.drains.append(d)
        say(f"parallelism {p}: {d.slot_rate:.0f} rec/s per busy slot-second, drained {d.throughput:.0f} rec/s, "
            f"batch overhead {d.batch_overhead_s if d.batch_overhead_s is not None else float('nan'):.2f} s")
    low = parallelisms[0]
    high = parallelisms[1] if len(parallelisms) > 1 else low + 1
    with own_broker() as bootstrap:
        result.downtimes_up, result.downtimes_down, result.steady_rates, result.steady_tasks = restarts(
            bootstrap, low, high, options, 0.5 * low * nominal_slot_rate, restart_repeat, topic_partitions,
            behind_records=math.ceil(BEHIND_S * high * nominal_slot_rate))
    say(f"restarts {low} -> {high}: {[round(x, 1) for x in result.downtimes_up]} s; back: "
        f"{[round(x, 1) for x in result.downtimes_down]} s; "
        f"{sum(len(level) for level in result.steady_rates)} reports between them")
    return model_file(result, name, options, work_s), result


def unseen_capacities(drains: list[Drain], seen: int = 2) -> list[dict[str, float]]:
    """What the default planner would predict for the parallelisms drained beyond the `seen`
    smallest, from those alone, against what the job then drained there; pure.

    The planner's own model (`plan.capacity_estimate`): DS2 capacities measured at each parallelism,
    extrapolated by a fitted power law (`capacities`, point estimate), times the share of a full
    batch its slots work (`BatchCost`). The measured maximum sustainable throughput is the drained rate."""
    ordered = sorted((d for d in drains if d.slot_rate > 0), key=lambda d: d.parallelism)
    learned, unseen = ordered[:seen], ordered[seen:]
    if not learned or not unseen:
        return []
    known = {str(d.parallelism): Measured(capacity=d.parallelism * d.slot_rate, n=max(1, d.reports))
             for d in learned}
    overheads = [d.batch_overhead_s for d in learned if d.batch_overhead_s is not None]
    works = [d.batch_work_s for d in learned if d.batch_work_s]
    batch = BatchCost(overhead_s=statistics.median(overheads), full_work_s=statistics.median(works) if works else None,
                      full_n=len(works)) if overheads else None
    top = max(d.parallelism for d in unseen)
    predicted = capacities(known, top, 0.0, 0.0) * (batch.efficiency if batch is not None else 1.0)
    return [{"parallelism": d.parallelism, "predicted": round(float(predicted[d.parallelism]), 1),
             "measured": round(d.throughput, 1),
             "error": round(float(predicted[d.parallelism]) / d.throughput - 1, 4) if d.throughput else float("nan")}
            for d in unseen]


def model_file(result: Calibration, name: str, options: dict[str, str], work_s: float) -> JobModelFile:
    """The job model the measurements give; pure."""
    usable = [d for d in result.drains if d.slot_rate > 0]
    if not usable:
        raise RuntimeError("no drain measured a per-slot rate")
    slot_rate, knee, efficiency = fit_scaling({d.parallelism: d.slot_rate for d in usable})
    overheads = [d.batch_overhead_s for d in usable if d.batch_overhead_s is not None]
    works = [d.batch_work_s for d in usable if d.batch_work_s]
    # Each report's per-slot rate relative to the mean of its drain or of its level between restarts,
    # pooled. Reports are REPORT_S long and the evaluation's windows hold two: independent noise
    # halves its variance.
    groups = [list(d.rates) for d in usable] + result.steady_rates
    relative = [r / statistics.mean(g) for g in groups if len(g) >= 2 for r in g]
    if len(relative) < 3:
        raise RuntimeError(f"only {len(relative)} reports to measure the rate noise from: drain more work "
                           "(--work-s) or hold each level longer")
    noise = statistics.stdev(relative) / math.sqrt(2)
    # The fixed busy time per task: the drains' full batches against the smaller ones between restarts.
    tasks = TaskCost()
    for records, busy in [*(point for d in usable for point in d.tasks), *result.steady_tasks]:
        tasks = tasks.add(records, busy)
    fit = tasks.fit()
    return JobModelFile(
        name=name, slot_rate=round(slot_rate, 2), knee=knee, efficiency_beyond_knee=efficiency,
        batch_overhead_s=round(statistics.median(overheads), 3) if overheads else 0.0,
        batch_work_s=round(statistics.median(works), 3) if works else 5.0,
        task_overhead_s=round(fit[0], 3) if fit else 0.0,
        downtime_up_s=round(statistics.median(result.downtimes_up), 2),
        downtime_down_s=round(statistics.median(result.downtimes_down), 2),
        rate_noise=round(noise, 4),
        # The trigger the runner gives jobs (the calibration's own drains run back to back): with it a
        # job with little to do runs one batch per interval, so DS2's rate at low load is as live.
        trigger_interval_s=SparkJobConfig.trigger_interval_s or 0.0,
        measured={
            "how": "autoscaler calibrate: after a warm-up at one slot (warm_up_overheads_s), backlogs drained at each "
                   "parallelism, then restarts under load (each "
                   f"scale-up with {BEHIND_S:g} s of the larger parallelism's work queued), on this machine with "
                   "its own broker",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "job_options": options, "work_s_per_slot": work_s,
            "warm_up_overheads_s": result.warm_up,
            "drains": [d.__dict__ for d in result.drains],
            "unseen_capacity": unseen_capacities(result.drains),
            "downtimes_up_s": [round(x, 2) for x in result.downtimes_up],
            "downtimes_down_s": [round(x, 2) for x in result.downtimes_down],
            "steady_rates": [[round(r, 2) for r in level] for level in result.steady_rates],
            "steady_tasks": [list(point) for point in result.steady_tasks],
            "task_overhead_s": "least squares of busy seconds on records per task over the drains' reports (full "
                               "batches) and those between restarts (smaller ones)" if fit else
                               "not measured: too few reports or batch sizes too alike (0 assumed)",
            "rate_noise": "report-to-report CV of the per-slot rate (5-s reports, each relative to the mean of its "
                          "drain or of its level between restarts, pooled) / sqrt(2), for 10-s windows",
        },
    )
