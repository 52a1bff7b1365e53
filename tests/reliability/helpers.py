"""Pieces the fault tests share: a stream of metric reports in a thread, the ledger
of what the agents published (decisions, commands, events) and the checks on it."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from contracts.decisions import EventType, RescaleCommand, ScalingDecision, ScalingEvent
from contracts.messages import MetricReport, SourceMetrics
from contracts.settings import Settings
from infra.kafka import ensure_topics, kafka_client_config
from monitor.windows import closed_window_ends, phase_for
from stack.services import isolated_settings

# Tuned so that every window yields a decision and an overloaded job asks for more slots at once.
# DS2 inside its controls (the reactive policy), made eager so that the tests see many rescales.
EAGER = {"policy": "reactive", "target_utilization": "1.0", "utilization_band": "0", "stabilization_windows": "0",
         "min_samples": "1", "catch_up_duration_s": "1e9"}


def settings_for(broker_port: int, redis_port: int) -> Settings:
    """Settings for a test's own broker and Redis, with topics and a consumer group of its own."""
    run = uuid.uuid4().hex[:6]
    return isolated_settings(broker_port, redis_port, f"t{run}", f"autoscaler-{run}", loop_interval_s=10.0)


def overloaded_report(job: str, timestamp: float, parallelism: int = 2) -> MetricReport:
    """A job whose slots are all busy at 100 rec/s each while 400 rec/s arrive: DS2 wants 4."""
    return MetricReport(
        job_id=job, timestamp=timestamp, interval_s=1.0, parallelism=parallelism, records_in=100 * parallelism,
        records_out=100 * parallelism, busy_time_s=float(parallelism),
        source=SourceMetrics(arrival_rate=400.0, backlog=1000, partitions=8),
    )


@dataclass
class ReportStream:
    """Sends one report per job per second of metric time, `speedup` times faster than real time,
    from a thread, until stopped. The producer keeps what it cannot send yet (broker away) and
    retries; `sent` holds the timestamps handed to it, per job."""

    settings: Settings
    jobs: list[str]
    speedup: float = 10.0
    start: float = field(default_factory=lambda: math.floor(time.time() / 10) * 10 - 1500)
    sent: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.failed: list[str] = []
        self.delivered_at: list[float] = []  # wall time of each delivery the broker acknowledged

    def __enter__(self) -> ReportStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self.settings.kafka_bootstrap, "linger.ms": 5,
                             "message.timeout.ms": 120_000})
        second = 0
        began = time.monotonic()
        while not self._stop.is_set():
            second += 1
            for job in self.jobs:
                report = overloaded_report(job, self.start + second)
                producer.produce(self.settings.topics.metrics, key=job.encode(), value=report.to_bytes(),
                                 on_delivery=self._delivered)
                self.sent[job].append(report.timestamp)
            producer.poll(0)
            self._stop.wait(max(0.0, began + second / self.speedup - time.monotonic()))
        if producer.flush(120) != 0:
            self.failed.append("reports still unsent after 120 s")

    def _delivered(self, err: object, msg: object) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.delivered_at.append(time.time())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def closed_windows(self, job: str, settings: Settings) -> list[float]:
        """Ends of the windows the monitor must have closed: every window before the last report's."""
        stamps, interval_s = self.sent[job], settings.loop_interval_s
        return closed_window_ends(stamps[0], stamps[-1], interval_s, phase_for(job, interval_s, settings.window_spread))


class TopicLog:
    """Every record of a topic from its beginning, read without a consumer group: nothing to
    rejoin (or hang on close) when the broker goes away, and a broker that comes back empty is
    simply read from its start again."""

    def __init__(self, settings: Settings, topic: str):
        ensure_topics(settings)
        self.consumer = Consumer({
            **kafka_client_config(settings), "group.id": f"ledger-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
        })
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(settings.topic_partitions)])
        self.records: list[tuple[bytes | None, bytes, float]] = []  # key, value, when read
        self.published: list[float] = []  # beside each record: its timestamp on the broker (s)

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in self.consumer.consume(500, 0.1):
                if msg.error() is None:
                    self.records.append((msg.key(), msg.value(), time.time()))
                    self.published.append(msg.timestamp()[1] / 1000)

    def read_all(self, quiet_s: float = 3.0, limit_s: float = 120.0) -> None:
        """Read until nothing new has come for `quiet_s` (at most `limit_s`)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            before = len(self.records)
            self.poll(quiet_s)
            if len(self.records) == before:
                return

    def close(self) -> None:
        self.consumer.close()


class Ledger:
    """Everything the agents published on decisions, commands and scaling events."""

    def __init__(self, settings: Settings):
        self.collectors = {
            "decisions": TopicLog(settings, settings.topics.decisions),
            "commands": TopicLog(settings, settings.topics.commands),
            "events": TopicLog(settings, settings.topics.scaling_events),
        }

    def poll(self, seconds: float = 0.5) -> None:
        for collector in self.collectors.values():
            collector.poll(seconds / len(self.collectors))

    def watch(self, seconds: float) -> None:
        """Keep reading for `seconds` (a consumer that stops polling leaves its group and re-reads)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll(0.5)

    def decisions(self) -> list[ScalingDecision]:
        return [ScalingDecision.model_validate_json(v) for _, v, _ in self.collectors["decisions"].records]

    def decisions_received(self) -> list[tuple[float, ScalingDecision]]:
        return [(at, ScalingDecision.model_validate_json(v)) for _, v, at in self.collectors["decisions"].records]

    def commands(self) -> list[RescaleCommand]:
        return [RescaleCommand.model_validate_json(v) for _, v, _ in self.collectors["commands"].records]

    def events(self) -> list[ScalingEvent]:
        return [ScalingEvent.model_validate_json(v) for _, v, _ in self.collectors["events"].records]

    def close(self) -> None:
        for collector in self.collectors.values():
            collector.close()


def missing_decisions(ledger: Ledger, stream: ReportStream, settings: Settings) -> dict[str, list[float]]:
    """Closed windows without a decision, per job."""
    decided: dict[str, set[float]] = defaultdict(set)
    for decision in ledger.decisions():
        decided[decision.job_id].add(decision.window_end)
    return {
        job: missing
        for job in stream.jobs
        if (missing := [end for end in stream.closed_windows(job, settings) if end not in decided[job]])
    }


@dataclass
class Audit:
    decisions: int = 0
    windows_with_two_decisions: list[tuple[str, float]] = field(default_factory=list)
    rescales: int = 0
    executed_twice: list[str] = field(default_factory=list)
    duplicate_event_ids: int = 0
    unanswered: list[str] = field(default_factory=list)


def audit(ledger: Ledger) -> Audit:
    """What the exactly-once checks need.

    - one decision id per job and window (a republished decision keeps its id);
    - every rescale command of a decision carries the same fencing token (one execution), and two
      decisions never share a token;
    - every auto decision to rescale got its `started` or `skipped` event (none lost);
    - events published again after a crash keep their event id."""
    result = Audit()
    ids: dict[tuple[str, float], set[str]] = defaultdict(set)
    decisions = ledger.decisions()
    for decision in decisions:
        ids[(decision.job_id, decision.window_end)].add(decision.decision_id)
    result.decisions = len(ids)
    result.windows_with_two_decisions = [key for key, found in ids.items() if len(found) > 1]

    tokens: dict[str, set[int]] = defaultdict(set)
    for command in ledger.commands():
        tokens[command.decision_id].add(command.fencing_token)
    result.rescales = len(tokens)
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    by_id = {d.decision_id: d for d in decisions}
    for decision_id, found in tokens.items():
        if len(found) > 1:
            result.executed_twice.append(decision_id)
        for token in found:
            owners[(by_id[decision_id].job_id if decision_id in by_id else "?", token)].add(decision_id)
    result.executed_twice += [f"token {key}" for key, found in owners.items() if len(found) > 1]

    events = ledger.events()
    seen_ids = [e.event_id for e in events]
    result.duplicate_event_ids = len(seen_ids) - len(set(seen_ids))
    answered = {e.decision_id for e in events if e.type in (EventType.STARTED, EventType.SKIPPED)}
    result.unanswered = [
        d.decision_id for d in by_id.values()
        if d.action.value != "none" and d.mode == "auto" and d.decision_id not in answered
    ]
    return result
