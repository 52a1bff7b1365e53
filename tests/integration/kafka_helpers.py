"""Produce to and collect from the real broker in tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import Consumer, Producer

from contracts.settings import Settings
from infra.kafka import ensure_topics, group_consumer_config, kafka_client_config

T = TypeVar("T")


def producer(settings: Settings) -> Producer:
    return Producer({**kafka_client_config(settings), "linger.ms": 2})


def send(settings: Settings, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    p = producer(settings)
    for key, value in records:
        p.produce(topic, key=key, value=value)
    assert p.flush(15) == 0


class Collector:
    """Reads a topic from the beginning; `until` polls until enough matching records arrived."""

    def __init__(self, settings: Settings, topic: str):
        ensure_topics(settings)
        self.consumer = Consumer(
            group_consumer_config(settings, f"test-{uuid.uuid4().hex[:8]}", "earliest")
        )
        self.consumer.subscribe([topic])
        self.records: list[tuple[bytes | None, bytes, float]] = []

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.1)
            if msg is not None and not msg.error():
                self.records.append((msg.key(), msg.value(), time.time()))

    def until(self, parse: Callable[[bytes], T], enough: Callable[[list[T]], bool], timeout: float) -> list[T]:
        deadline = time.monotonic() + timeout
        while True:
            parsed = [parse(value) for _, value, _ in self.records]
            if enough(parsed):
                return parsed
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s; collected {len(parsed)}: {parsed[-5:]}")
            self.poll(0.2)

    def close(self) -> None:
        self.consumer.close()
