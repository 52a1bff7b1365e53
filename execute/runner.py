"""The job runner: applies the rescale commands addressed to one job through its scaling backend.

It keeps what does not depend on how the job is scaled (`execute.backend.ScalingBackend`): every
command gets a RunnerReport `started`, then `completed` or `failed`. Commands with a fencing token
lower than one already seen, older than `command_max_age_s`, or whose decision id was already
applied are not executed; the applied decision ids live in the job's directory, so a restarted
runner does not apply a decision twice (it re-publishes the recorded outcome instead). A job that
dies is started again at its parallelism, a bounded number of times. The backend's measured
downtimes are kept there too, so its expected costs survive a restart.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from contracts.backends import ActionCost
from contracts.decisions import RescaleCommand, RunnerReport, RunnerStatus, went_part_way
from contracts.plan_state import Direction, Downtimes
from contracts.settings import Settings, get_settings
from execute.backend import RunnerFatal, ScalingBackend, StartError
from execute.commands import CommandConsumer, ReportPublisher
from infra.kafka import JobKafka, ensure_topic

if TYPE_CHECKING:
    from confluent_kafka import Message

log = logging.getLogger(__name__)

STATE_FILE = "runner-state.json"
APPLIED_KEPT = 256


@dataclass
class RunnerConfig(JobKafka):
    job_id: str
    parallelism: int  # the first start's; a restarted runner resumes at the last it applied
    state_dir: Path  # where the runner keeps its state (the job's directory)
    bootstrap: str | None = None  # None: the autoscaler settings
    retries: int = 2  # start attempts beyond the first
    max_parallelism: int | None = None  # commands above it fail without touching the job
    command_max_age_s: float | None = None  # None: the settings' rescale_timeout_s
    listen: bool = True  # consume RescaleCommands
    settings: Settings = field(default_factory=get_settings)

    @property
    def max_command_age_s(self) -> float:
        return self.command_max_age_s if self.command_max_age_s is not None else self.settings.rescale_timeout_s

    @property
    def state_file(self) -> Path:
        return Path(self.state_dir) / STATE_FILE


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
    downtimes: Downtimes = field(default_factory=Downtimes)  # what the backend measured, per direction

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
        return json.dumps({"parallelism": self.parallelism, "max_fencing_token": self.max_fencing_token,
                           "applied": self.applied, "downtimes": self.downtimes.model_dump()})

    @classmethod
    def from_json(cls, text: str) -> RunnerState:
        data = json.loads(text)
        return cls(
            parallelism=data.get("parallelism"),
            max_fencing_token=data.get("max_fencing_token"),
            applied=dict(data.get("applied") or {}),
            downtimes=Downtimes.model_validate(data.get("downtimes") or {}),
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


def partial_note(before: int, running: int, target: int) -> str:
    """The head of a failed change's error when it went part of the way (`RunnerReport.partially_applied`)."""
    if went_part_way(before, running, target):
        return f"partially applied: the job runs at {running} of {target} (from {before}); "
    return ""


class Runner:
    """A job's scaling backend plus the command loop; `run()` blocks until `stop_event` is set."""

    def __init__(self, config: RunnerConfig, backend: ScalingBackend):
        self.config = config
        self.job = backend
        self.state = RunnerState.load(config.state_file)
        self.publisher = ReportPublisher(
            config.kafka_bootstrap, config.settings.topics.runner_reports, config.kafka_security, config.settings
        )
        self.commands: CommandConsumer | None = None
        self.restarts: list[float] = []

    def start(self) -> None:
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
            outcome = self.job.apply(command.to_parallelism)
        except RunnerFatal as exc:
            report = self._report(command, RunnerStatus.FAILED, running, running, error=f"job not running: {exc}")
            self.state.record(report)
            self.state.save(self.config.state_file)
            self.publisher.publish(report)
            raise
        if outcome.ok and outcome.downtime_s is not None:
            direction = Direction.of(running, outcome.parallelism)
            self.state.downtimes = self.state.downtimes.add(direction, outcome.downtime_s)
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
            error=(partial_note(running, outcome.parallelism, command.to_parallelism)
                   + "; ".join(outcome.errors))[:2000] or "the new parallelism did not start",
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
            backend=self.job.kind,
        )

    def expected_cost(self, target: int) -> ActionCost:
        """What rescaling the running job to `target` is expected to cost, from what was measured."""
        running = self.job.parallelism or self.config.parallelism
        return self.job.expected_cost(running, target, self.state.downtimes)

    def close(self) -> None:
        if self.commands is not None:
            self.commands.close()
            self.commands = None
        self.job.stop()
        self.publisher.producer.flush(10)


def run_job(config: RunnerConfig, backend: ScalingBackend, stop_event: threading.Event | None = None) -> None:
    """Run a job's backend and its command loop until `stop_event` is set (or forever)."""
    Runner(config, backend).run(stop_event or threading.Event())
