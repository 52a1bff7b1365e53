"""The job runner: runs one Spark Structured Streaming job and rescales it on command.

The runner owns a job's SparkSession. It starts the user's query from an entry point
(`module:function`, see pipeline.job), attaches the metrics reporter, and listens on the commands
topic for RescaleCommands addressed to its job. A rescale is:

  1. graceful stop: create the pause file (the source admits no more data), wait until a trigger
     has acknowledged the pause and none is active, then stop the query and the session;
  2. start a new session with the new parallelism (local[N], or N one-core executors on a
     standalone cluster) and restart the query from the same checkpoint;
  3. downtime = from the stop request until the restarted query completed its first micro-batch;
  4. if the new parallelism does not start (retried `retries` times), start the last good one again
     and report the failure with `rolled_back_to`.

Every command gets a RunnerReport `started`, then `completed` or `failed`. Commands with a fencing
token lower than one already seen, older than `command_max_age_s`, or whose decision id was
already applied are not executed; the applied decision ids live in the job's directory, so a
restarted runner does not apply a decision twice (it re-publishes the recorded outcome instead).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from contracts.messages import RescaleCommand, RunnerReport, RunnerStatus
from contracts.settings import Settings, get_settings
from infra.security import check_entry_point, kafka_security_config, redact
from pipeline import offsets as off
from pipeline.job import BuildFunction, JobContext, load_entry_point
from pipeline.kafka_source import clear_pause, stop_between_batches
from pipeline.metrics import sample_from_progress
from pipeline.reporter import MetricsReporter, OutputCounter, attach_reporter

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message, Producer
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

STATE_FILE = "runner-state.json"
QUERY_DIR = "query"
PAUSE_FILE = "pause"
APPLIED_KEPT = 256


class StartError(RuntimeError):
    """The job did not start at the requested parallelism."""


class RunnerFatal(RuntimeError):
    """The job runs at no parallelism: even the rollback failed."""


# ---------------------------------------------------------------- configuration


@dataclass
class RunnerConfig:
    job_id: str
    entry_point: str
    parallelism: int
    checkpoint_dir: Path
    master: str | None = None  # None: local[N]; or spark://host:port
    bootstrap: str | None = None  # None: the autoscaler settings
    options: dict[str, str] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)
    trigger_interval_s: float | None = 1.0  # None: micro-batches back to back
    report_interval_s: float = 5.0
    stop_timeout_s: float = 60.0  # for the in-flight batch to finish
    start_timeout_s: float = 120.0  # for the first micro-batch after a (re)start
    retries: int = 2
    max_parallelism: int | None = None  # commands above it fail without touching the job
    command_max_age_s: float | None = None  # None: the settings' rescale_timeout_s
    listen: bool = True  # consume RescaleCommands
    settings: Settings = field(default_factory=get_settings)

    @property
    def kafka_bootstrap(self) -> str:
        return self.bootstrap or self.settings.kafka_bootstrap

    @property
    def kafka_security(self) -> dict[str, str]:
        """SASL/SSL properties of the runner's and the job's Kafka clients, from the settings."""
        return kafka_security_config(self.settings)

    @property
    def max_command_age_s(self) -> float:
        return self.command_max_age_s if self.command_max_age_s is not None else self.settings.rescale_timeout_s

    @property
    def query_dir(self) -> Path:
        return Path(self.checkpoint_dir) / QUERY_DIR

    @property
    def pause_file(self) -> Path:
        return Path(self.checkpoint_dir) / PAUSE_FILE

    @property
    def state_file(self) -> Path:
        return Path(self.checkpoint_dir) / STATE_FILE


def query_name(job_id: str) -> str:
    return "job_" + re.sub(r"[^A-Za-z0-9_]", "_", job_id)


# ---------------------------------------------------------------- pure policy


def first_batch_done(progress: Mapping[str, Any] | Any | None) -> bool:
    """Whether a restarted query is processing again: it read records, or had none to read."""
    if progress is None:
        return False
    sample = sample_from_progress(progress)
    if sample.input_rows > 0:
        return True
    return bool(sample.log_end) and off.backlog(sample.log_end, sample.processed) == 0


@dataclass(frozen=True)
class RescaleOutcome:
    ok: bool
    parallelism: int  # what runs now
    attempts: int
    errors: tuple[str, ...] = ()
    rolled_back_to: int | None = None
    downtime_s: float | None = None


def rescale_with_rollback(
    start: Callable[[int], object], target: int, last_good: int, retries: int
) -> RescaleOutcome:
    """Start `target`, trying 1 + retries times; failing that, start `last_good` the same way.

    `start` raises StartError when a parallelism does not come up. Raises RunnerFatal when neither
    starts.
    """
    errors: list[str] = []
    attempts = 0
    for candidate, is_target in ((target, True), (last_good, False)):
        if not is_target and candidate == target:
            break
        for _ in range(1 + max(0, retries)):
            attempts += 1
            try:
                start(candidate)
            except StartError as exc:
                errors.append(f"parallelism {candidate}: {exc}")
                log.warning("start at parallelism %d failed: %s", candidate, exc)
                continue
            if is_target:
                return RescaleOutcome(True, candidate, attempts, tuple(errors))
            return RescaleOutcome(False, candidate, attempts, tuple(errors), rolled_back_to=candidate)
    raise RunnerFatal("; ".join(errors))


class Verdict(StrEnum):
    APPLY = "apply"
    NOOP = "noop"  # already at the requested parallelism
    OTHER_JOB = "other_job"
    DUPLICATE = "duplicate"
    STALE_TOKEN = "stale_token"
    EXPIRED = "expired"
    OUT_OF_BOUNDS = "out_of_bounds"


@dataclass
class RunnerState:
    """What must survive a runner restart, kept in the job's directory."""

    parallelism: int | None = None
    max_fencing_token: int | None = None
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)  # decision id -> final report

    def classify(
        self,
        command: RescaleCommand,
        job_id: str,
        running: int,
        now: float,
        max_age_s: float,
        max_parallelism: int | None = None,
    ) -> Verdict:
        if command.job_id != job_id:
            return Verdict.OTHER_JOB
        if command.decision_id in self.applied:
            return Verdict.DUPLICATE
        if self.max_fencing_token is not None and command.fencing_token < self.max_fencing_token:
            return Verdict.STALE_TOKEN
        if now - command.issued_at > max_age_s:
            return Verdict.EXPIRED
        if max_parallelism is not None and command.to_parallelism > max_parallelism:
            return Verdict.OUT_OF_BOUNDS
        if command.to_parallelism == running:
            return Verdict.NOOP
        return Verdict.APPLY

    def accept_token(self, token: int) -> None:
        self.max_fencing_token = token if self.max_fencing_token is None else max(self.max_fencing_token, token)

    def record(self, report: RunnerReport) -> None:
        self.applied[report.decision_id] = json.loads(report.model_dump_json())
        while len(self.applied) > APPLIED_KEPT:
            self.applied.pop(next(iter(self.applied)))

    def to_json(self) -> str:
        return json.dumps(
            {"parallelism": self.parallelism, "max_fencing_token": self.max_fencing_token, "applied": self.applied}
        )

    @classmethod
    def from_json(cls, text: str) -> RunnerState:
        data = json.loads(text)
        return cls(
            parallelism=data.get("parallelism"),
            max_fencing_token=data.get("max_fencing_token"),
            applied=dict(data.get("applied") or {}),
        )

    @classmethod
    def load(cls, path: Path) -> RunnerState:
        try:
            return cls.from_json(path.read_text())
        except FileNotFoundError:
            return cls()
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable runner state %s: %s", path, exc)
            return cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)


# ---------------------------------------------------------------- the job


class JobRunner:
    """Starts, stops and rescales one streaming query. Not thread-safe: drive it from one thread."""

    def __init__(self, config: RunnerConfig, build: BuildFunction | None = None):
        self.config = config
        # Only entry points the configuration lists are imported (AUTOSCALER_JOB_ENTRY_POINTS).
        self.build = build or load_entry_point(check_entry_point(config.entry_point, config.settings))
        self.spark: SparkSession | None = None
        self.query: StreamingQuery | None = None
        self.reporter: MetricsReporter | None = None
        self.parallelism: int | None = None
        self.pausable = True
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
        self.parallelism = parallelism
        took = time.monotonic() - began
        log.info("job %s runs at parallelism %d (started in %.1f s)", self.config.job_id, parallelism, took)
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
        if self.spark.sparkContext.master.startswith("spark://"):
            # A cluster may grant fewer cores than asked; that parallelism did not start. The session
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
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()
        self.query = None
        self.reporter = None
        self.spark = None

    def _clear_pause(self) -> None:
        clear_pause(self.config.pause_file)

    # ------------------------------------------------------------ rescale

    def rescale(self, target: int) -> RescaleOutcome:
        """Stop gracefully and restart at `target` from the checkpoint, rolling back on failure."""
        previous = self.parallelism
        if previous is None:
            raise RuntimeError("the job is not running")
        requested = time.monotonic()
        self.stop()
        outcome = rescale_with_rollback(self.start, target, previous, self.config.retries)
        downtime = time.monotonic() - requested
        return RescaleOutcome(
            outcome.ok, outcome.parallelism, outcome.attempts, outcome.errors, outcome.rolled_back_to, downtime
        )

    def healthy(self) -> bool:
        return self.query is not None and self.query.isActive

    def failure(self) -> str | None:
        return self._query_error()


# ---------------------------------------------------------------- Kafka plumbing


class CommandConsumer:
    """Polls the commands topic on its own thread, so that a long rescale never exceeds the poll
    interval (which would make the broker drop the runner from its group)."""

    def __init__(self, bootstrap: str, topic: str, job_id: str, security: Mapping[str, str] | None = None):
        from confluent_kafka import Consumer

        self.topic = topic
        from infra.kafka import group_consumer_config

        # Commands older than the runner's max age are dropped anyway; reading from the start
        # means a command sent while the runner was (re)joining is not lost.
        self.consumer: Consumer = Consumer(group_consumer_config(
            bootstrap, f"autoscaler-runner-{job_id}", "earliest", security=security,
            **{"heartbeat.interval.ms": 1_000},
        ))
        self.messages: queue.Queue[Message] = queue.Queue()
        self._commits: queue.Queue[Message] = queue.Queue()
        self._stop = threading.Event()
        self.assigned = threading.Event()
        self.consumer.subscribe([topic], on_assign=lambda c, parts: self.assigned.set())
        self._thread = threading.Thread(target=self._run, name="runner-commands", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.consumer.poll(0.2)
                if msg is not None:
                    if msg.error() is None:
                        self.messages.put(msg)
                    else:
                        log.warning("commands topic: %s", msg.error())
                while not self._commits.empty():
                    self.consumer.commit(message=self._commits.get_nowait(), asynchronous=False)
            except Exception:
                log.exception("commands consumer")
                time.sleep(0.5)

    def get(self, timeout: float) -> Message | None:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            return None

    def done(self, msg: Message) -> None:
        self._commits.put(msg)

    def close(self) -> None:
        deadline = time.monotonic() + 5
        while not self._commits.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self.consumer.close()


class ReportPublisher:
    def __init__(
        self, bootstrap: str, topic: str, security: Mapping[str, str] | None = None, settings: Settings | None = None
    ):
        from confluent_kafka import Producer

        self.topic = topic
        self.settings = settings
        self.producer: Producer = Producer(
            {"bootstrap.servers": bootstrap, **(security or {}), "acks": "all", "linger.ms": 0}
        )

    def publish(self, report: RunnerReport) -> None:
        if report.error:
            # A report's error becomes a scaling event's: no secret may ride along.
            report = report.model_copy(update={"error": redact(report.error, self.settings)})
        self.producer.produce(self.topic, key=report.job_id.encode(), value=report.to_bytes())
        if self.producer.flush(10):
            log.error("runner report %s/%s not delivered", report.decision_id, report.status)


# ---------------------------------------------------------------- the command loop


class Runner:
    """The job plus its command loop; `run()` blocks until `stop_event` is set."""

    def __init__(self, config: RunnerConfig, build: BuildFunction | None = None):
        self.config = config
        self.job = JobRunner(config, build)
        self.state = RunnerState.load(config.state_file)
        self.publisher = ReportPublisher(
            config.kafka_bootstrap, config.settings.topics.runner_reports, config.kafka_security, config.settings
        )
        self.commands: CommandConsumer | None = None
        self.restarts: list[float] = []

    def start(self) -> None:
        from infra.kafka import ensure_topic

        topics = self.config.settings.topics
        for topic in (topics.metrics, topics.commands, topics.runner_reports):
            ensure_topic(self.config.kafka_bootstrap, topic, self.config.settings.topic_partitions,
                         security=self.config.kafka_security)
        # A decision applied before a runner restart still holds: resume at its parallelism.
        initial = self.state.parallelism or self.config.parallelism
        try:
            self._start_with_retries(initial)
        except StartError:
            if initial == self.config.parallelism:
                raise
            self._start_with_retries(self.config.parallelism)
        self._save_parallelism()
        if self.config.listen:
            self.commands = CommandConsumer(
                self.config.kafka_bootstrap, self.config.settings.topics.commands, self.config.job_id,
                self.config.kafka_security,
            )

    def _start_with_retries(self, parallelism: int) -> None:
        errors = []
        for _ in range(1 + self.config.retries):
            try:
                self.job.start(parallelism)
                return
            except StartError as exc:
                errors.append(str(exc))
        raise StartError(f"parallelism {parallelism} did not start: {'; '.join(errors)}")

    def _save_parallelism(self) -> None:
        self.state.parallelism = self.job.parallelism
        self.state.save(self.config.state_file)

    def run(self, stop_event: threading.Event) -> None:
        if self.job.parallelism is None:
            self.start()
        try:
            while not stop_event.is_set():
                msg = self.commands.get(0.5) if self.commands is not None else None
                if msg is None and self.commands is None:
                    stop_event.wait(0.5)
                if msg is not None:
                    self.handle_message(msg)
                    assert self.commands is not None
                    self.commands.done(msg)
                if not self.job.healthy():
                    self._recover()
        finally:
            self.close()

    def _recover(self) -> None:
        """The query died: restart it at its parallelism, a bounded number of times."""
        error = self.job.failure()
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < 600] + [now]
        if len(self.restarts) > 3:
            raise RunnerFatal(f"the query failed {len(self.restarts)} times in 10 minutes; last: {error}")
        log.error("the query stopped (%s); restarting it", error)
        parallelism = self.job.parallelism or self.config.parallelism
        self.job.stop()
        self._start_with_retries(parallelism)

    def handle_message(self, msg: Message) -> None:
        try:
            command = RescaleCommand.model_validate_json(msg.value() or b"")
        except ValidationError as exc:
            log.warning("ignoring an invalid command: %s", exc.errors()[:2])
            return
        self.handle(command)

    def handle(self, command: RescaleCommand) -> RunnerReport | None:
        running = self.job.parallelism or self.config.parallelism
        verdict = self.state.classify(
            command,
            self.config.job_id,
            running,
            time.time(),
            self.config.max_command_age_s,
            self.config.max_parallelism,
        )
        if verdict == Verdict.OTHER_JOB:
            return None
        if verdict == Verdict.DUPLICATE:
            # The earlier answer may have been lost with a previous runner: say it again.
            recorded = RunnerReport.model_validate(self.state.applied[command.decision_id])
            log.info("decision %s was already applied; re-publishing its outcome", command.decision_id)
            self.publisher.publish(recorded)
            return recorded
        if verdict in (Verdict.STALE_TOKEN, Verdict.EXPIRED):
            log.warning("ignoring command %s: %s", command.decision_id, verdict.value)
            return None
        self.state.accept_token(command.fencing_token)
        self.publisher.publish(self._report(command, RunnerStatus.STARTED, running, running))
        if verdict == Verdict.OUT_OF_BOUNDS:
            final = self._report(
                command, RunnerStatus.FAILED, running, running,
                error=f"parallelism {command.to_parallelism} is above the runner's maximum "
                      f"{self.config.max_parallelism}",
            )
        elif verdict == Verdict.NOOP:
            final = self._report(command, RunnerStatus.COMPLETED, running, running, downtime_s=0.0)
        else:
            final = self._rescale(command, running)
        self.state.record(final)
        self._save_parallelism()
        self.publisher.publish(final)
        return final

    def _rescale(self, command: RescaleCommand, running: int) -> RunnerReport:
        log.info("rescaling %s from %d to %d (decision %s)",
                 self.config.job_id, running, command.to_parallelism, command.decision_id)
        try:
            outcome = self.job.rescale(command.to_parallelism)
        except RunnerFatal as exc:
            report = self._report(command, RunnerStatus.FAILED, running, running, error=f"job not running: {exc}")
            self.state.record(report)
            self.state.save(self.config.state_file)
            self.publisher.publish(report)
            raise
        if outcome.ok:
            log.info("rescaled to %d; downtime %.2f s", outcome.parallelism, outcome.downtime_s or 0.0)
            return self._report(
                command, RunnerStatus.COMPLETED, running, outcome.parallelism, downtime_s=outcome.downtime_s
            )
        return self._report(
            command,
            RunnerStatus.FAILED,
            running,
            outcome.parallelism,
            downtime_s=outcome.downtime_s,
            error="; ".join(outcome.errors)[:2000] or "the new parallelism did not start",
            rolled_back_to=outcome.rolled_back_to,
        )

    def _report(
        self,
        command: RescaleCommand,
        status: RunnerStatus,
        from_parallelism: int,
        running: int,
        downtime_s: float | None = None,
        error: str | None = None,
        rolled_back_to: int | None = None,
    ) -> RunnerReport:
        return RunnerReport(
            decision_id=command.decision_id,
            job_id=self.config.job_id,
            status=status,
            from_parallelism=from_parallelism,
            to_parallelism=command.to_parallelism,
            running_parallelism=running,
            fencing_token=command.fencing_token,
            downtime_s=downtime_s,
            error=error,
            rolled_back_to=rolled_back_to,
        )

    def close(self) -> None:
        if self.commands is not None:
            self.commands.close()
            self.commands = None
        self.job.stop()
        self.publisher.producer.flush(10)


def run_job(config: RunnerConfig, stop_event: threading.Event | None = None) -> None:
    """Run a job and its command loop until `stop_event` is set (or forever)."""
    Runner(config).run(stop_event or threading.Event())
