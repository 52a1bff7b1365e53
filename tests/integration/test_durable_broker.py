"""A broker on `s3://` storage (the local S3 emulator) keeps records and group offsets across a kill.

Real processes: moto's S3 server and tansu, started here and stopped at the end of each test.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from contracts.decisions import Action, DecisionReason, ScalingDecision
from contracts.messages import MetricReport
from contracts.settings import Settings
from infra.kafka import LogEndProbe, ensure_topics, group_consumer_config, kafka_client_config
from stack.embedded import Stack
from stack.processes import Service, free_port, start_broker
from stack.s3 import RECORDING, s3_storage, start_s3
from tests.conftest import unique_topics
from tests.integration.kafka_helpers import Collector, send

pytestmark = pytest.mark.integration

N = 300  # records per topic
PARTITIONS = 4
CONSUMED_BEFORE_KILL = 120

# (partition, offset) -> (key, value)
Log = dict[tuple[int, int], tuple[bytes | None, bytes]]


def metric_reports(n: int) -> list[MetricReport]:
    start = time.time() - n
    return [MetricReport(job_id=f"job-{i % 5}", timestamp=start + i, interval_s=1.0, parallelism=1 + i % 3,
                         records_in=1000 + i, records_out=900 + i, busy_time_s=0.5) for i in range(n)]


def decisions(n: int) -> list[ScalingDecision]:
    now = time.time()
    return [ScalingDecision(job_id=f"job-{i % 5}", window_end=now - n + i, action=Action.SCALE_UP,
                            from_parallelism=1, to_parallelism=2 + i % 4, policy="ds2", target_utilization=0.7,
                            reason=DecisionReason(code="test", message=f"decision {i}"), closed_at=now)
            for i in range(n)]


def read_log(settings: Settings, topic: str, timeout: float = 20.0) -> tuple[Log, dict[int, int]]:
    """Every record of `topic` by (partition, offset), read with an assigned consumer (no group),
    and each partition's high watermark from the fetch responses."""
    consumer = Consumer({**kafka_client_config(settings), "group.id": f"reader-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    log: Log = {}
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            log[(msg.partition(), msg.offset())] = (msg.key(), msg.value())
        assert len(at_end) == PARTITIONS, f"read {len(log)} records of {topic}, end of {sorted(at_end)} only"
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
                 for p in range(PARTITIONS)}
        return log, highs
    finally:
        consumer.close()


def consume_in_group(settings: Settings, group: str, topic: str, count: int, timeout: float = 30.0) -> Log:
    """`count` records of `topic` read by a member of `group`; their offsets committed."""
    consumer = Consumer(group_consumer_config(settings, group, "earliest"))
    consumer.subscribe([topic])
    log: Log = {}
    deadline = time.monotonic() + timeout
    try:
        while len(log) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                log[(msg.partition(), msg.offset())] = (msg.key(), msg.value())
        if log:
            consumer.commit(asynchronous=False)
        return log
    finally:
        consumer.close()


def committed(settings: Settings, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer(group_consumer_config(settings, group, "earliest"))
    try:
        return {tp.partition: tp.offset
                for tp in consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)}
    finally:
        consumer.close()


def test_records_and_group_offsets_survive_a_broker_kill(tmp_path: Path) -> None:
    s3 = start_s3(log_path=tmp_path / "s3.log")
    storage = s3_storage(s3.port)
    broker: Service | None = None
    try:
        broker = start_broker(log_path=tmp_path / "broker.log", storage=storage)
        settings = Settings(kafka_bootstrap=f"127.0.0.1:{broker.port}", topics=unique_topics(),
                            topic_partitions=PARTITIONS)
        ensure_topics(settings)
        topics = (settings.topics.metrics, settings.topics.decisions)
        reports, verdicts = metric_reports(N), decisions(N)
        send(settings, topics[0], [(r.job_id.encode(), r.to_bytes()) for r in reports])
        send(settings, topics[1], [(d.job_id.encode(), d.to_bytes()) for d in verdicts])

        group = f"durable-{uuid.uuid4().hex[:6]}"
        first = consume_in_group(settings, group, topics[0], CONSUMED_BEFORE_KILL)
        assert len(first) >= CONSUMED_BEFORE_KILL
        offsets = committed(settings, group, topics[0])
        # A committed offset is the next record to read: one past the last one consumed (a partition
        # the member read nothing from has none).
        assert {p: o for p, o in offsets.items() if o >= 0} == {
            p: max(o for q, o in first if q == p) + 1 for p in {q for q, _ in first}}
        before = {topic: read_log(settings, topic) for topic in topics}
        for log, highs in before.values():
            assert len(log) == N
            # Offsets are per record, from 0 with no gap, and the fetch high watermark is the next one.
            for p in range(PARTITIONS):
                assert sorted(o for q, o in log if q == p) == list(range(highs[p]))

        os.killpg(broker.pid, signal.SIGKILL)
        broker.process.wait(timeout=10)
        broker = start_broker(broker.port, log_path=tmp_path / "broker.log", storage=storage)

        after = {topic: read_log(settings, topic) for topic in topics}
        assert after == before  # every record, at the same partition and offset, and the same high watermarks
        assert sorted((MetricReport.model_validate_json(v) for _, v in after[topics[0]][0].values()),
                      key=lambda r: r.timestamp) == reports
        assert committed(settings, group, topics[0]) == offsets

        probe = LogEndProbe(settings.kafka_bootstrap, topics[0])
        try:  # what the Spark source takes as the log end
            assert probe.latest() == before[topics[0]][1]
        finally:
            probe.close()

        # The group goes on where it committed: the rest of the records, none of the first ones again.
        rest = consume_in_group(settings, group, topics[0], N - len(first))
        assert set(rest) | set(first) == set(before[topics[0]][0]) and not set(rest) & set(first)
        # A new group reads every decision from the beginning.
        collector = Collector(settings, topics[1])
        try:
            seen = collector.until(ScalingDecision.model_validate_json, lambda got: len(got) >= N, timeout=30)
        finally:
            collector.close()
        assert sorted(seen, key=lambda d: d.window_end) == verdicts
    finally:
        if broker is not None:
            broker.stop()
        s3.stop()


def test_durable_stack_keeps_topics_and_records_across_down_and_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Stack.up(durable=True)`, `down`, `up` again: the emulator replays its recorded requests
    (compacted by `down` to one PUT per object), so even the emulator's restart keeps the broker's data."""
    monkeypatch.setenv("AUTOSCALER_STATE_DIR", str(tmp_path / "state"))
    settings = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}", redis_url=f"redis://127.0.0.1:{free_port()}/0",
                        topics=unique_topics(), topic_partitions=PARTITIONS)
    stack = Stack(settings)
    try:
        state = stack.up(with_agents=False, durable=True)
        assert state["broker"]["storage"] == "s3://tansu/" and stack.status()["s3"]
        topic = settings.topics.metrics
        send(settings, topic, [(r.job_id.encode(), r.to_bytes()) for r in metric_reports(N)])
        before = read_log(settings, topic)
        recording = tmp_path / "state" / "s3" / RECORDING
        recorded = len(recording.read_text().splitlines())
        stack.down()
        assert not any(stack.status().values())
        compacted = len(recording.read_text().splitlines())
        assert compacted < recorded

        stack.up(with_agents=False, durable=True)
        assert read_log(settings, topic) == before
    finally:
        stack.down()
