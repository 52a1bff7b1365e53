"""Shared pieces of the Spark integration tests: a broker per module, topic readers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from infra.kafka import ensure_topic
from stack.processes import Service, start_broker


@pytest.fixture(scope="module")
def broker() -> Iterator[Service]:
    service = start_broker()
    try:
        yield service
    finally:
        service.stop()


def bootstrap_of(service: Service) -> str:
    return f"{service.host}:{service.port}"


def produce_demo_records(bootstrap: str, topic: str, ids: range, keys: int = 8, partitions: int = 3) -> None:
    """Demo records, sent in batches (the way real producers send them)."""
    ensure_topic(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in ids:
        key = f"k{i % keys}"
        producer.produce(topic, key=key, value=json.dumps({"id": i, "key": key, "ts": time.time()}))
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
