"""Create the autoscaler's topics (idempotent) with the Kafka admin API."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from agent.settings import Settings


def kafka_client_config(settings: Settings) -> dict[str, str]:
    return {"bootstrap.servers": settings.kafka_bootstrap}


def group_consumer_config(bootstrap: str, group_id: str, offset_reset: str, **extra: object) -> dict[str, object]:
    """A confluent-kafka consumer in a group, with short group timeouts: the embedded broker makes
    a join wait for the rebalance timeout, which clients take from the max poll interval."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "auto.offset.reset": offset_reset,
        "enable.auto.commit": False,
        "max.poll.interval.ms": 10_000,
        "session.timeout.ms": 10_000,
        **extra,
    }


def ensure_topics(settings: Settings, extra: list[str] | None = None, timeout: float = 15.0) -> list[str]:
    """Create any missing topic; returns the names created."""
    admin = AdminClient(kafka_client_config(settings))
    wanted = settings.topics.all() + (extra or [])
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [name for name in wanted if name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=settings.topic_partitions, replication_factor=1) for name in missing],
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return created
