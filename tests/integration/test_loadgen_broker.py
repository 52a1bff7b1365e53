"""The load generator against a real broker: rate accuracy and sequential ids."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from infra.kafka import LogEndProbe, TopicReader, ensure_topic, written_ids
from pipeline.loadgen import Steps, expected_total, generate_load
from stack.processes import Service
from tests.integration.spark_helpers import bootstrap_of, broker

pytestmark = pytest.mark.integration
__all__ = ["broker"]  # the module-scoped fixture


def test_generator_follows_the_shape_at_thousands_per_second(broker: Service) -> None:
    bootstrap = bootstrap_of(broker)
    shape = Steps(((1000.0, 1.0), (5000.0, 2.0), (500.0, 1.0)))
    before = time.time()
    result = generate_load(bootstrap, "load.accuracy", shape, start_id=100, partitions=3)
    assert before <= result.began_at <= before + 5.0  # when the first records were due (the topic made first)
    expected = expected_total(shape, shape.duration_s)
    assert result.produced == pytest.approx(expected, rel=0.01)
    assert result.seconds == pytest.approx(shape.duration_s, abs=0.5)
    assert (result.start_id, result.next_id) == (100, 100 + result.produced)
    assert sum(LogEndProbe(bootstrap, "load.accuracy").latest().values()) == result.produced

    reader = TopicReader(bootstrap, "load.accuracy")
    try:
        records = reader.until(lambda rs: len(rs) >= result.produced, json.loads, timeout=30)
    finally:
        reader.close()
    assert sorted(r["id"] for r in records) == list(range(100, 100 + result.produced))
    assert all(r["key"] == f"k{r['id'] % 16}" and r["ts"] > 0 for r in records)


def test_written_ids_reads_every_id_once_read_and_keeps_duplicates(broker: Service) -> None:
    """The exactly-once check the demo, the benchmarks and the end-to-end tests share, on a real broker."""
    bootstrap = bootstrap_of(broker)
    ensure_topic(bootstrap, "ids.out", 2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for batch in ([0, 1, 2], [3, 4], [2]):  # 2 written twice
        producer.produce("ids.out", json.dumps({"ids": batch}).encode())
    producer.flush(10)
    ids = written_ids(bootstrap, "ids.out", 5, timeout_s=30, late_s=1.0)
    assert sorted(ids) == [0, 1, 2, 2, 3, 4]
    assert sorted(written_ids(bootstrap, "ids.out", {0, 4}, timeout_s=30, late_s=1.0)) == sorted(ids)
