"""The job runner's Kafka side: rescale commands in (polled on a thread of their own), reports out."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from contracts.decisions import RunnerReport
from contracts.settings import Settings
from infra.kafka import group_consumer_config
from infra.security import redact

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message, Producer

log = logging.getLogger(__name__)


class CommandConsumer:
    """Polls the commands topic on its own thread, so that a long rescale never exceeds the poll
    interval (which would make the broker drop the runner from its group)."""

    def __init__(self, bootstrap: str, topic: str, job_id: str, security: Mapping[str, str] | None = None):
        from confluent_kafka import Consumer

        self.topic = topic
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
