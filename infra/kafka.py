"""Kafka for every part of the product: client configuration, topic creation (idempotent), log-end offsets."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from contracts.settings import Settings
from infra.security import kafka_security_config

log = logging.getLogger(__name__)


class JobKafka:
    """For a configuration with `bootstrap` (a job's own Kafka, or None) and `settings`: the
    servers its clients use (the job's, else the autoscaler's) and their security (the settings')."""

    bootstrap: str | None
    settings: Settings

    @property
    def kafka_bootstrap(self) -> str:
        return self.bootstrap or self.settings.kafka_bootstrap

    @property
    def kafka_security(self) -> dict[str, str]:
        return kafka_security_config(self.settings)


def kafka_client_config(settings: Settings, bootstrap: str | None = None) -> dict[str, str]:
    """Bootstrap plus security (SASL/SSL) for any confluent-kafka client of the autoscaler;
    `bootstrap` overrides the settings' servers (a job's own Kafka), the security stays."""
    return {"bootstrap.servers": bootstrap or settings.kafka_bootstrap, **kafka_security_config(settings)}


def group_consumer_config(
    bootstrap: str | Settings,
    group_id: str,
    offset_reset: str,
    *,
    security: Mapping[str, str] | None = None,
    **extra: object,
) -> dict[str, object]:
    """A confluent-kafka consumer in a group, with short group timeouts: the embedded broker makes
    a join wait for the rebalance timeout, which clients take from the max poll interval.

    `bootstrap` is the settings (servers and security from them) or a bootstrap string, whose
    security properties then come in `security` (see `kafka_client_config`)."""
    base = kafka_client_config(bootstrap) if isinstance(bootstrap, Settings) else {
        "bootstrap.servers": bootstrap, **(security or {})
    }
    return {
        **base,
        "group.id": group_id,
        "auto.offset.reset": offset_reset,
        "enable.auto.commit": False,
        "max.poll.interval.ms": 10_000,
        "session.timeout.ms": 10_000,
        **extra,
    }


def create_topics(admin: AdminClient, names: Iterable[str], partitions: int, timeout: float = 15.0) -> list[str]:
    """Create the topics among `names` that do not exist; returns the names created. An existing
    topic keeps its partition count."""
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [name for name in dict.fromkeys(names) if name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in missing],
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def ensure_topics(
    settings: Settings, extra: list[str] | None = None, timeout: float = 15.0, admin: AdminClient | None = None
) -> list[str]:
    """Create any missing topic of the autoscaler's (and `extra`); returns the names created."""
    admin = admin or AdminClient(kafka_client_config(settings))
    return create_topics(admin, settings.topics.all() + (extra or []), settings.topic_partitions, timeout)


def ensure_topic(
    bootstrap: str, topic: str, partitions: int = 1, timeout: float = 15.0, *, security: Mapping[str, str] | None = None
) -> None:
    """Create `topic` on a job's own Kafka (`bootstrap`) unless it exists.

    `security`: SASL/SSL client properties (infra.security.kafka_security_config)."""
    create_topics(AdminClient({"bootstrap.servers": bootstrap, **(security or {})}), [topic], partitions, timeout)


class TopicKeeper:
    """Puts the autoscaler's topics back when they disappear: a broker that lost its data (the
    embedded broker keeps nothing on disk) comes back without them, and the agents would wait
    for them forever. One admin client, reused across checks."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.admin = AdminClient(kafka_client_config(settings))

    def check(self, timeout: float = 5.0) -> list[str]:
        return ensure_topics(self.settings, timeout=timeout, admin=self.admin)


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
                # A short wait per poll: consume() waits its whole timeout unless num_messages
                # arrive, and this runs at every micro-batch trigger.
                for msg in self.consumer.consume(num_messages=500, timeout=0.01):
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


class TopicReader:
    """Reads every partition of a topic from the start, without a consumer group (fast to set up)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = 1):
        ensure_topic(bootstrap, topic, partitions)
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": "topic-reader",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        })
        parts = topic_partitions(self.consumer, topic)
        self.consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        self.values: list[bytes] = []

    def poll(self, seconds: float) -> list[bytes]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in self.consumer.consume(500, 0.1):
                if msg.error() is None:
                    self.values.append(msg.value())
        return self.values

    def until(self, enough: Callable[[list[Any]], bool], parse: Callable[[bytes], Any], timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        while True:
            parsed = [parse(v) for v in self.values]
            if enough(parsed):
                return parsed
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s with {len(parsed)} records: {parsed[-3:]}")
            self.poll(0.3)

    def close(self) -> None:
        self.consumer.close()


def written_ids(bootstrap: str, topic: str, expected: int | set[int], timeout_s: float,
                late_s: float = 3.0) -> list[int]:
    """Every record id a job wrote to `topic` (records are JSON objects with an `ids` list), duplicates
    kept: read until the distinct ids cover `expected` (a count, or the ids themselves) or `timeout_s`
    passed, then `late_s` more, since a duplicate would come late. The exactly-once check of the demo,
    the benchmarks and the end-to-end tests."""
    reader = TopicReader(bootstrap, topic)
    ids: list[int] = []
    seen: set[int] = set()

    def read(seconds: float) -> None:
        """Poll, then parse only the records this poll brought."""
        start = len(reader.values)
        for value in reader.poll(seconds)[start:]:
            batch = json.loads(value)["ids"]
            ids.extend(batch)
            seen.update(batch)

    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            read(0.5)
            if (len(seen) >= expected) if isinstance(expected, int) else (seen >= expected):
                break
        read(late_s)
        return ids
    finally:
        reader.close()
