"""The load generator against a real broker: rate accuracy and sequential ids."""

from __future__ import annotations

import json
import time

import pytest

from infra.kafka import LogEndProbe, TopicReader
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
