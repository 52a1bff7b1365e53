"""The window-agg workload on the job runner, rescaled once by a restart from its checkpoint: its RocksDB
state carries over (a window spanning the restart has its full count), the state partitions stay those of
the first start, and every input record is counted exactly once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from contracts.decisions import RescaleCommand, RunnerStatus
from contracts.messages import MetricReport
from contracts.settings import Settings, Topics
from execute.runner import Runner, RunnerConfig
from infra.kafka import TopicReader, ensure_topic
from pipeline.restart import RestartFromCheckpoint, SparkJobConfig
from pipeline.workloads import entry_points, workload
from pipeline.workloads.check import check
from stack.processes import Service
from tests.integration.spark_helpers import bootstrap_of, broker

pytestmark = [pytest.mark.spark, pytest.mark.integration]
__all__ = ["broker"]  # the module-scoped fixture

JOB = "window-agg-job"
KEYS = 8
BASE = float(int(time.time()) // 10 * 10 - 600)  # event time of record 0: on a window boundary, in the past
PER_SECOND = 80.0  # event-time spacing: record i at BASE + i / PER_SECOND
PHASE = 2000  # records per phase: 25 s of event time each, so the window [20, 30) spans the restart
OPTIONS = {"cost_ms": "1", "window_s": "10", "watermark_s": "30", "statePartitions": "8"}


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for record in records:
        producer.produce(topic, key=record["key"], value=json.dumps(record))
    assert producer.flush(30) == 0


def records(ids: range, base: float = BASE) -> list[dict[str, Any]]:
    return [{"id": i, "key": f"k{i % KEYS}", "ts": base + i / PER_SECOND} for i in ids]


def wait_processed(job: RestartFromCheckpoint, rows: int, timeout: float = 60.0) -> dict[str, Any]:
    """The query's last progress once its batches since its start read `rows` records."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert job.query is not None and job.query.isActive
        if sum(p["numInputRows"] for p in job.query.recentProgress) >= rows and job.query.lastProgress:
            return job.query.lastProgress
        time.sleep(0.2)
    raise TimeoutError(f"the query did not read {rows} records within {timeout:.0f} s")


def test_window_agg_state_survives_a_rescale_exactly_once(broker: Service, tmp_path: Path) -> None:
    began = time.monotonic()
    bootstrap = bootstrap_of(broker)
    prefix = tmp_path.name
    input_topic, output_topic = f"{prefix}.in", f"{prefix}.out"
    settings = Settings(kafka_bootstrap=bootstrap, topic_partitions=1, job_entry_points=entry_points(), topics=Topics(
        metrics=f"{prefix}.metrics", commands=f"{prefix}.commands", runner_reports=f"{prefix}.runner-reports"))
    options = {**OPTIONS, "input_topic": input_topic, "output_topic": output_topic}
    config = SparkJobConfig(job_id=JOB, entry_point=workload("window-agg").entry_point,
                            checkpoint_dir=tmp_path / "job", bootstrap=bootstrap, options=options,
                            trigger_interval_s=0.5, report_interval_s=2.0, settings=settings)
    ensure_topic(bootstrap, input_topic, 3)
    # Phase 1 is in the topic before the query starts: its first batch reads every partition to the end, so
    # no record is behind the watermark when it is read.
    phase1, phase2 = records(range(PHASE)), records(range(PHASE, 2 * PHASE))
    produce(bootstrap, input_topic, phase1)
    backend = RestartFromCheckpoint(config)
    runner = Runner(RunnerConfig(job_id=JOB, parallelism=1, state_dir=config.checkpoint_dir, bootstrap=bootstrap,
                                 listen=False, settings=settings), backend)
    metrics = TopicReader(bootstrap, settings.topics.metrics)
    runner.start()
    try:
        before = wait_processed(backend, PHASE)
        outcome = runner.handle(RescaleCommand(decision_id="up", job_id=JOB, to_parallelism=2, fencing_token=1))
        assert outcome is not None and outcome.status == RunnerStatus.COMPLETED, outcome
        # Phase 2 starts 25 s of event time after phase 1 and spans 25 s, less than the watermark's 30-s
        # delay: however the batches split it, none of it falls behind the watermark.
        produce(bootstrap, input_topic, phase2)
        after = wait_processed(backend, PHASE)
        # Records far ahead in event time move the watermark past every window of the two phases.
        closers = records(range(2 * PHASE, 2 * PHASE + KEYS), BASE + 200 - 2 * PHASE / PER_SECOND)
        produce(bootstrap, input_topic, closers)
        reader = TopicReader(bootstrap, output_topic)
        try:
            written = reader.until(lambda rs: sum(len(r["rows"]) for r in rs) >= 5 * KEYS, json.loads, timeout=60)
            written = [json.loads(v) for v in reader.poll(2.0)]  # a duplicate would come late
        finally:
            reader.close()
        reports = [MetricReport.model_validate_json(v) for v in metrics.poll(1.0)]
    finally:
        runner.close()
        metrics.close()

    # State before the restart: the three windows of phase 1, one row per key each, in 8 partitions.
    (op,) = before["stateOperators"]
    assert op["numRowsTotal"] == 3 * KEYS and op["numShufflePartitions"] == 8
    assert op["customMetrics"].get("rocksdbCommitCheckpointLatency") is not None, "RocksDB keeps the state"
    # After it, at parallelism 2: the state partitions come from the checkpoint; the state holds the five
    # windows until the watermark (phase 2's newest event time less 30 s) closes the first two.
    (op,) = after["stateOperators"]
    assert op["numShufflePartitions"] == 8 and 3 * KEYS <= op["numRowsTotal"] <= 5 * KEYS

    # The reports carry the state, its partitions and the event-time lags.
    stateful = [r for r in reports if r.state]
    assert stateful and {op.partitions for r in stateful for op in r.state} == {8}
    assert max(op.rows for r in stateful for op in r.state) >= 3 * KEYS
    assert {r.parallelism for r in stateful} == {1, 2}
    assert any(r.output_lag_s is not None for r in reports) and any(r.watermark_lag_s is not None for r in reports)

    result = check("window-agg", phase1 + phase2 + closers, written, options, closed_before=BASE + 100)
    assert result.expected == 2 * PHASE
    assert result.ok, result
    spanning = [row for record in written for row in record["rows"] if row["window_start"] == BASE + 20]
    assert sum(row["count"] for row in spanning) == 10 * PER_SECOND, "the window across the restart is whole"
    print(f"window-agg live test: {time.monotonic() - began:.0f} s")
