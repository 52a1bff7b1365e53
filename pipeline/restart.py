"""The restart backend: the Spark query stopped between micro-batches and started again from its
checkpoint at the new parallelism (`execute.backend.ScalingBackend` of kind `restart`).

A rescale is:
  1. graceful stop: create the pause file (the source admits no more data), wait until a trigger
     has acknowledged the pause and none is active, then stop the query and the session;
  2. start a new session with the new parallelism (local[N], or N one-core executors on a
     standalone cluster) and restart the query from the same checkpoint;
  3. downtime = from the stop request until the restarted query completed its first micro-batch;
  4. if the new parallelism does not start (retried `retries` times), start the last good one again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.backends import ActionCost, BackendKind, restart_cost
from contracts.plan_state import Downtimes
from contracts.settings import Settings, get_settings
from execute.backend import BackendOutcome, StartError, rescale_with_rollback
from infra.kafka import JobKafka
from infra.security import check_entry_point
from pipeline import offsets as off
from pipeline.job import BuildFunction, JobContext, load_entry_point
from pipeline.metrics import sample_from_progress
from pipeline.reporter import MetricsReporter, OutputCounter, attach_reporter
from pipeline.source_control import clear_pause, stop_between_batches

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

QUERY_DIR = "query"
PAUSE_FILE = "pause"
# A restart's expected pause until one is measured and before the job first started.
DEFAULT_RESTART_S = 30.0


@dataclass
class SparkJobConfig(JobKafka):
    """What the restart backend needs to run one Spark streaming query."""

    job_id: str
    entry_point: str
    checkpoint_dir: Path
    master: str | None = None  # None: local[N]; or spark://host:port
    bootstrap: str | None = None  # None: the autoscaler settings
    options: dict[str, str] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)
    trigger_interval_s: float | None = 1.0  # None: micro-batches back to back
    report_interval_s: float = 5.0
    stop_timeout_s: float = 60.0  # for the in-flight batch to finish
    start_timeout_s: float = 120.0  # for the first micro-batch after a (re)start
    retries: int = 2  # start attempts beyond the first, at the target and then at the last good one
    settings: Settings = field(default_factory=get_settings)

    @property
    def query_dir(self) -> Path:
        return Path(self.checkpoint_dir) / QUERY_DIR

    @property
    def pause_file(self) -> Path:
        return Path(self.checkpoint_dir) / PAUSE_FILE


def query_name(job_id: str) -> str:
    return "job_" + re.sub(r"[^A-Za-z0-9_]", "_", job_id)


def first_batch_done(progress: Mapping[str, Any] | Any | None) -> bool:
    """Whether a restarted query is processing again: it read records, or had none to read."""
    if progress is None:
        return False
    sample = sample_from_progress(progress)
    if sample.input_rows > 0:
        return True
    return bool(sample.log_end) and off.backlog(sample.log_end, sample.processed) == 0


class RestartFromCheckpoint:
    """Starts, stops and rescales one streaming query by restarting it from its checkpoint (the
    `execute.backend.ScalingBackend` of kind `restart`). Not thread-safe: drive it from one thread."""

    kind = BackendKind.RESTART
    # The query's task count when it stays the same whatever the parallelism (in place: the maximum),
    # reported as its shuffle partitions so that the planner knows a batch runs in ceil(tasks / p) waves.
    fixed_tasks: int | None = None

    def __init__(self, config: SparkJobConfig, build: BuildFunction | None = None):
        self.config = config
        # Only entry points the configuration lists are imported (AUTOSCALER_JOB_ENTRY_POINTS).
        self.build = build or load_entry_point(check_entry_point(config.entry_point, config.settings))
        self.spark: SparkSession | None = None
        self.query: StreamingQuery | None = None
        self.reporter: MetricsReporter | None = None
        self._parallelism: int | None = None
        self._on_stop: list[Callable[[], None]] = []  # the job's own clients to close (JobContext.on_stop)
        self.pausable = True
        self.started_in_s: float | None = None  # the first start's time, a restart's first estimate
        Path(config.checkpoint_dir).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ start

    def start(self, parallelism: int) -> float:
        """Start the job at `parallelism`; return the seconds until its first micro-batch was done."""
        began = time.monotonic()
        self._clear_pause()
        try:
            self._start_session(parallelism)
            self._start_query(parallelism)
            self._wait_first_batch(began + self.config.start_timeout_s)
        except Exception as exc:
            self._teardown()
            if isinstance(exc, StartError):
                raise
            raise StartError(f"{type(exc).__name__}: {exc}") from exc
        self._parallelism = parallelism
        took = time.monotonic() - began
        log.info("job %s runs at parallelism %d (started in %.1f s)", self.config.job_id, parallelism, took)
        if self.started_in_s is None:
            self.started_in_s = took
        return took

    def _start_session(self, parallelism: int) -> None:
        from pipeline.session import build_session, task_slots

        self.spark = build_session(
            parallelism,
            self.config.master,
            app_name=f"autoscaler-{self.config.job_id}",
            extra_conf=self.config.spark_conf,
        )
        self.spark.sparkContext.setLogLevel("WARN")
        dynamic = self.config.spark_conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true"
        if self.spark.sparkContext.master.startswith("spark://") and not dynamic:
            # A cluster may grant fewer cores than asked; that parallelism did not start (under Spark's own
            # dynamic allocation, Spark decides how many executors run: nothing to wait for). The session
            # already waited for the executors (maxRegisteredResourcesWaitingTime); a short grace.
            deadline = time.monotonic() + min(10.0, self.config.start_timeout_s)
            slots = task_slots(self.spark)
            while slots < parallelism and time.monotonic() < deadline:
                time.sleep(0.5)
                slots = task_slots(self.spark)
            if slots < parallelism:
                raise StartError(f"the cluster granted {slots} of {parallelism} task slots")

    def _start_query(self, parallelism: int) -> None:
        assert self.spark is not None
        options = {"minPartitions": str(parallelism), **self.config.options}
        ctx = JobContext(
            job_id=self.config.job_id,
            parallelism=parallelism,
            checkpoint_dir=str(self.config.checkpoint_dir),
            pause_file=str(self.config.pause_file),
            bootstrap=self.config.kafka_bootstrap,
            options=options,
            output=OutputCounter(),
            kafka_security=self.config.kafka_security,
        )
        writer = self.build(self.spark, ctx)
        self._on_stop = ctx.on_stop
        writer = writer.option("checkpointLocation", str(self.config.query_dir)).queryName(
            query_name(self.config.job_id)
        )
        if self.config.trigger_interval_s:
            writer = writer.trigger(processingTime=f"{int(self.config.trigger_interval_s * 1000)} milliseconds")
        self.query = writer.start()
        self.pausable = ctx.pausable
        self.reporter = attach_reporter(
            self.spark,
            self.query,
            job_id=self.config.job_id,
            parallelism=parallelism,
            bootstrap=self.config.kafka_bootstrap,
            topic=self.config.settings.topics.metrics,
            min_interval_s=self.config.report_interval_s,
            output_counter=ctx.output,
            security=self.config.kafka_security,
            shuffle_partitions=self.fixed_tasks,
        )

    def _wait_first_batch(self, deadline: float) -> None:
        assert self.query is not None
        while time.monotonic() < deadline:
            if not self.query.isActive:
                raise StartError(f"the query stopped: {self._query_error() or 'no error given'}")
            if first_batch_done(self.query.lastProgress):
                return
            time.sleep(0.1)
        raise StartError(f"no micro-batch completed within {self.config.start_timeout_s:.0f} s")

    def _query_error(self) -> str | None:
        if self.query is None:
            return None
        with contextlib.suppress(Exception):
            exc = self.query.exception()
            if exc is not None:
                return str(exc).splitlines()[0][:500]
        return None

    # ------------------------------------------------------------ stop

    def stop(self) -> None:
        """Stop the query between micro-batches, then the session."""
        began = time.monotonic()
        if self.query is not None and self.query.isActive:
            self._graceful_stop(self.query)
        stopped = time.monotonic()
        self._teardown()
        self._clear_pause()
        log.info("job %s stopped: query in %.1f s, session in %.1f s",
                 self.config.job_id, stopped - began, time.monotonic() - stopped)

    def _graceful_stop(self, query: StreamingQuery) -> None:
        if self.pausable:
            if not stop_between_batches(query, self.config.pause_file, self.config.stop_timeout_s):
                log.warning("no trigger acknowledged the pause in %.0f s; stopped anyway",
                            self.config.stop_timeout_s)
            return
        # A source that cannot pause: stop while no trigger runs; an interrupted batch is redone.
        deadline = time.monotonic() + self.config.stop_timeout_s
        while time.monotonic() < deadline and query.isActive and query.status.get("isTriggerActive", False):
            time.sleep(0.05)
        query.stop()

    def _teardown(self) -> None:
        if self.query is not None:
            with contextlib.suppress(Exception):
                if self.query.isActive:
                    self.query.stop()
        if self.reporter is not None:
            with contextlib.suppress(Exception):
                self.reporter.close()
        for hook in self._on_stop:
            try:
                hook()
            except Exception as exc:
                log.warning("job %s: closing its clients: %s", self.config.job_id, exc)
        self._on_stop = []
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()
        self.query = None
        self.reporter = None
        self.spark = None

    def _clear_pause(self) -> None:
        clear_pause(self.config.pause_file)

    # ------------------------------------------------------------ rescale

    @property
    def parallelism(self) -> int | None:
        return self._parallelism

    def apply(self, target: int) -> BackendOutcome:
        """Stop gracefully and restart at `target` from the checkpoint, rolling back on failure.

        The downtime runs from the stop request until the restarted query completed its first
        micro-batch."""
        previous = self._parallelism
        if previous is None:
            raise RuntimeError("the job is not running")
        requested = time.monotonic()
        self.stop()
        outcome = rescale_with_rollback(self.start, target, previous, self.config.retries)
        return replace(outcome, downtime_s=time.monotonic() - requested)

    def expected_cost(self, current: int, target: int, measured: Downtimes) -> ActionCost:
        """A restart: the longest recent one measured in that direction; until one is measured, the
        start-up time of the job's first start (or `DEFAULT_RESTART_S`); a trigger interval replayed."""
        default = self.started_in_s if self.started_in_s is not None else DEFAULT_RESTART_S
        return restart_cost(current, target, measured, default, self.config.trigger_interval_s or 0.0)

    def healthy(self) -> bool:
        return self.query is not None and self.query.isActive

    def failure(self) -> str | None:
        return self._query_error()
