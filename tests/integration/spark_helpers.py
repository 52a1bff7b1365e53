"""Shared pieces of the Spark integration tests: a broker per module, topic readers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from infra.kafka import ensure_topic, topic_partitions
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


class TopicReader:
    """Reads every partition of a topic from the start, without a consumer group (fast to set up)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = 1):
        ensure_topic(bootstrap, topic, partitions)
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": "test-reader",
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
                raise AssertionError(f"timed out after {timeout:.0f} s with {len(parsed)} records: {parsed[-3:]}")
            self.poll(0.3)

    def close(self) -> None:
        self.consumer.close()
