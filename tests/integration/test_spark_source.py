"""The Kafka source and the metrics reporter against a real broker and real Spark (local[N])."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from contracts.messages import MetricReport
from infra.kafka import TopicReader
from pipeline.kafka_source import read_kafka_stream
from pipeline.loadgen import Constant, generate_load
from pipeline.reporter import attach_reporter
from pipeline.session import build_session
from pipeline.source_control import clear_pause, stop_between_batches
from stack.processes import Service
from tests.integration.spark_helpers import bootstrap_of, broker, produce_demo_records

pytestmark = [pytest.mark.spark, pytest.mark.integration]
__all__ = ["broker"]  # the module-scoped fixture


class BatchFiles:
    """foreachBatch sink: each batch's rows and read-task count in a file named by batch id.

    A replayed batch overwrites its file, so duplicates can only come from the source.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def __call__(self, batch, batch_id: int) -> None:
        rows = [(r["partition"], r["offset"], json.loads(r["value"])["id"]) for r in batch.collect()]
        tasks = batch.rdd.getNumPartitions()
        (self.directory / f"{batch_id:06d}.json").write_text(json.dumps({"rows": rows, "tasks": tasks}))

    def batches(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.directory.glob("*.json"))]

    def ids(self) -> list[int]:
        return [row[2] for b in self.batches() for row in b["rows"]]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_source_reads_every_record_once_across_a_restart_with_other_parallelism(
    broker: Service, tmp_path: Path
) -> None:
    bootstrap = bootstrap_of(broker)
    topic = "source.exactly-once"
    produce_demo_records(bootstrap, topic, range(0, 3000), partitions=3)
    sink = BatchFiles(tmp_path / "out")
    checkpoint = str(tmp_path / "checkpoint")
    pause = tmp_path / "pause"

    def start(spark, min_partitions: int):
        stream = read_kafka_stream(
            spark, bootstrap, topic, max_records_per_trigger=700, min_partitions=min_partitions, pause_file=pause
        )
        return (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    spark = build_session(1)
    try:
        query = start(spark, 1)
        wait_for(lambda: len(sink.ids()) >= 1400, 90, "the first run to read two batches")
        assert stop_between_batches(query, pause, timeout=60)
    finally:
        spark.stop()
    first_run = len(sink.batches())
    assert 0 < len(sink.ids()) < 3000  # stopped part-way, with the per-trigger limit respected
    assert all(len(b["rows"]) <= 700 for b in sink.batches())

    produce_demo_records(bootstrap, topic, range(3000, 5000), partitions=3)
    clear_pause(pause)
    spark = build_session(3)
    try:
        query = start(spark, 5)
        wait_for(lambda: len(sink.ids()) >= 5000, 120, "the second run to read everything")
        time.sleep(1.0)  # a duplicate would show in a later batch
        assert stop_between_batches(query, pause, timeout=60)
    finally:
        spark.stop()

    ids = sink.ids()
    assert sorted(ids) == list(range(5000)), "every record exactly once"
    later = sink.batches()[first_run:]
    # minPartitions splits each batch into 5 read tasks, more than the topic's 3 partitions.
    assert all(b["tasks"] == 5 for b in later if len(b["rows"]) >= 5)


def test_reporter_publishes_metric_reports(broker: Service, tmp_path: Path) -> None:
    bootstrap = bootstrap_of(broker)
    topic = "source.reported"
    metrics_topic = "reporter.metrics"
    produce_demo_records(bootstrap, topic, range(0, 10), partitions=2)
    reader = TopicReader(bootstrap, metrics_topic)
    stop_load = threading.Event()
    load = threading.Thread(
        target=generate_load,
        args=(bootstrap, topic, Constant(400.0)),
        kwargs={"duration_s": 40.0, "start_id": 10, "stop_event": stop_load},
        daemon=True,
    )
    spark = build_session(2)
    try:
        stream = read_kafka_stream(spark, bootstrap, topic, min_partitions=2)
        query = (
            stream.writeStream.foreachBatch(lambda batch, _id: batch.count())
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        reporter = attach_reporter(
            spark, query, job_id="reported-job", parallelism=2, bootstrap=bootstrap, topic=metrics_topic,
            min_interval_s=2.0,
        )
        load.start()
        reports = reader.until(
            lambda rs: sum(1 for r in rs if r.records_in > 0) >= 4, MetricReport.model_validate_json, timeout=90
        )
        reporter.close()
        query.stop()
    finally:
        stop_load.set()
        if load.is_alive():
            load.join(30)
        spark.stop()
        reader.close()
    assert reporter.failures == 0
    assert all(r.job_id == "reported-job" and r.parallelism == 2 and r.worker_id == "driver" for r in reports)
    busy = [r for r in reports if r.records_in > 0]
    assert all(r.busy_time_s > 0 for r in busy)
    assert all(r.source is not None and r.source.partitions == 2 and r.source.splittable for r in reports)
    # Past the first report (which covers start-up), arrival follows the generator's 400/s.
    steady = [r.source.arrival_rate for r in busy[1:] if r.source is not None]
    assert steady and all(250 <= rate <= 550 for rate in steady), steady
    assert all(0 < r.interval_s < 30 for r in reports)
    stamps = [r.timestamp for r in reports]
    assert stamps == sorted(stamps)
