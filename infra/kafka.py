"""Create the autoscaler's topics (idempotent) with the Kafka admin API."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from contracts.settings import Settings
from infra.security import kafka_security_config


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


def ensure_topics(
    settings: Settings, extra: list[str] | None = None, timeout: float = 15.0, admin: AdminClient | None = None
) -> list[str]:
    """Create any missing topic; returns the names created."""
    admin = admin or AdminClient(kafka_client_config(settings))
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


class TopicKeeper:
    """Puts the autoscaler's topics back when they disappear: a broker that lost its data (the
    embedded broker keeps nothing on disk) comes back without them, and the agents would wait
    for them forever. One admin client, reused across checks."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.admin = AdminClient(kafka_client_config(settings))

    def check(self, timeout: float = 5.0) -> list[str]:
        return ensure_topics(self.settings, timeout=timeout, admin=self.admin)
