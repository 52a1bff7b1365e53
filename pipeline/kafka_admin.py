"""Small Kafka helpers shared by the Spark side (topics, log-end offsets)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

log = logging.getLogger(__name__)


def ensure_topic(
    bootstrap: str, topic: str, partitions: int = 1, timeout: float = 15.0, *, security: Mapping[str, str] | None = None
) -> None:
    """Create `topic` unless it exists; an existing topic keeps its partition count.

    `security`: SASL/SSL client properties (infra.security.kafka_security_config)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def topic_partitions(consumer: Consumer, topic: str, timeout: float = 10.0) -> list[int]:
    """Partition ids of `topic`; empty if the topic does not exist (yet)."""
    meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None:
        return []
    return sorted(meta.partitions)


class LogEndProbe:
    """Finds the log-end offset (high watermark) of each partition of a topic.

    Why not just ListOffsets(latest)? Some Kafka-protocol brokers (tansu 0.6) answer it with the
    base offset of the last record batch plus one, which is short by the batch's size whenever the
    producer batches. A Fetch response's high watermark is right everywhere, so we fetch the last
    batch (from the ListOffsets answer minus one) and take the larger of the two numbers.
    """

    def __init__(
        self, bootstrap: str, topic: str, timeout: float = 10.0, *, security: Mapping[str, str] | None = None
    ):
        self.topic = topic
        self.timeout = timeout
        self.admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            **(security or {}),
            "group.id": "autoscaler-log-end-probe",  # never joins: we only assign()
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 20,
            "max.partition.fetch.bytes": 65536,
        })

    def partitions(self) -> list[int]:
        return topic_partitions(self.consumer, self.topic, self.timeout)

    def earliest(self, partitions: Iterable[int]) -> dict[int, int]:
        return self._list_offsets(partitions, OffsetSpec.earliest())

    def latest(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        parts = list(self.partitions() if partitions is None else partitions)
        if not parts:
            return {}
        listed = self._list_offsets(parts, OffsetSpec.latest())
        probe = [p for p in parts if listed.get(p, 0) > 0]
        fetched = self._fetch_high_watermarks({p: listed[p] - 1 for p in probe}) if probe else {}
        return {p: max(listed.get(p, 0), fetched.get(p, 0)) for p in parts}

    def _list_offsets(self, partitions: Iterable[int], spec: OffsetSpec) -> dict[int, int]:
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        if not request:
            return {}
        futures = self.admin.list_offsets(request, request_timeout=self.timeout)
        return {tp.partition: max(0, f.result().offset) for tp, f in futures.items()}

    def _fetch_high_watermarks(self, positions: dict[int, int]) -> dict[int, int]:
        self.consumer.assign([TopicPartition(self.topic, p, o) for p, o in positions.items()])
        try:
            pending = set(positions)
            deadline = time.monotonic() + self.timeout
            while pending and time.monotonic() < deadline:
                for msg in self.consumer.consume(num_messages=500, timeout=0.2):
                    err = msg.error()
                    if err is None or err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    else:
                        log.warning("log-end probe of %s: %s", self.topic, err)
            result = {}
            for p in positions:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                if high is not None and high >= 0:
                    result[p] = high
            return result
        finally:
            # Unassigned, the consumer stops long-polling, which would delay its other requests.
            self.consumer.unassign()

    def close(self) -> None:
        self.consumer.close()
