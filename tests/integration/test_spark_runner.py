"""The job runner with the demo job: rescale on command, exactly-once output, rollback."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from confluent_kafka import Producer

from contracts.backends import BackendKind
from contracts.decisions import RescaleCommand, RunnerReport, RunnerStatus
from contracts.messages import MetricReport
from contracts.settings import Settings, Topics
from execute.runner import Runner, RunnerConfig, RunnerState
from infra.kafka import TopicReader, ensure_topic
from pipeline import demo
from pipeline.job import BuildFunction
from pipeline.loadgen import Constant, generate_load
from pipeline.restart import RestartFromCheckpoint, SparkJobConfig
from stack.processes import Service
from tests.integration.spark_helpers import bootstrap_of, broker

pytestmark = [pytest.mark.spark, pytest.mark.integration]
__all__ = ["broker"]  # the module-scoped fixture

JOB = "demo-job"


def send(bootstrap: str, topic: str, decision_id: str, to_parallelism: int, fencing_token: int) -> None:
    command = RescaleCommand(
        decision_id=decision_id, job_id=JOB, to_parallelism=to_parallelism, fencing_token=fencing_token
    )
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=command.job_id.encode(), value=command.to_bytes())
    assert producer.flush(10) == 0


def config_for(bootstrap: str, tmp_path: Path, retries: int = 2, listen: bool = True) -> SparkJobConfig:
    # Topics of their own per test: the broker is shared by the module.
    prefix = tmp_path.name
    topics = Topics(
        metrics=f"{prefix}.metrics", commands=f"{prefix}.commands", runner_reports=f"{prefix}.runner-reports"
    )
    settings = Settings(kafka_bootstrap=bootstrap, topic_partitions=1, topics=topics)
    return SparkJobConfig(
        job_id=JOB, entry_point="pipeline.demo:build", checkpoint_dir=tmp_path / "job", bootstrap=bootstrap,
        options={"cost_ms": "2", "input_topic": f"{tmp_path.name}.in", "output_topic": f"{tmp_path.name}.out"},
        trigger_interval_s=0.5, report_interval_s=2.0, retries=retries, settings=settings,
    )


def runner_for(job: SparkJobConfig, listen: bool = True, build: BuildFunction | None = None) -> Runner:
    """The job runner with the restart backend, as `autoscaler job run` composes them."""
    config = RunnerConfig(job_id=job.job_id, parallelism=1, state_dir=job.checkpoint_dir, bootstrap=job.bootstrap,
                          retries=job.retries, listen=listen, settings=job.settings)
    return Runner(config, RestartFromCheckpoint(job, build))


def test_runner_rescales_on_command_and_output_is_exactly_once(broker: Service, tmp_path: Path) -> None:
    bootstrap = bootstrap_of(broker)
    config = config_for(bootstrap, tmp_path)
    topics = config.settings.topics
    input_topic, output_topic = config.options["input_topic"], config.options["output_topic"]
    ensure_topic(bootstrap, input_topic, 4)
    reports = TopicReader(bootstrap, topics.runner_reports)
    metrics = TopicReader(bootstrap, topics.metrics)
    output = TopicReader(bootstrap, output_topic)

    runner = runner_for(config)
    runner.start()
    stop = threading.Event()
    loop = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    loop.start()
    produced: list[int] = []
    load = threading.Thread(
        target=lambda: produced.append(generate_load(bootstrap, input_topic, Constant(150.0), duration_s=25).produced),
        daemon=True,
    )
    load.start()
    try:
        metrics.until(lambda rs: any(r.records_in > 0 for r in rs), MetricReport.model_validate_json, timeout=60)
        send(bootstrap, topics.commands, "d1", to_parallelism=3, fencing_token=1)
        done = reports.until(
            lambda rs: any(r.status == RunnerStatus.COMPLETED for r in rs), RunnerReport.model_validate_json, 120
        )
        # A repeated decision is not applied again, only answered; a stale token is ignored.
        send(bootstrap, topics.commands, "d0", to_parallelism=2, fencing_token=0)
        send(bootstrap, topics.commands, "d1", to_parallelism=3, fencing_token=1)
        done = reports.until(
            lambda rs: sum(r.status == RunnerStatus.COMPLETED for r in rs) >= 2, RunnerReport.model_validate_json, 60
        )
        load.join(60)
        total = produced[0]
        assert total >= 3500
        batches = output.until(
            lambda rs: sum(r["count"] for r in rs) >= total, json.loads, timeout=120
        )
        metrics.poll(3.0)
    finally:
        stop.set()
        loop.join(120)
        for reader in (reports, metrics, output):
            reader.close()

    assert [(r.decision_id, r.status) for r in done] == [
        ("d1", RunnerStatus.STARTED), ("d1", RunnerStatus.COMPLETED), ("d1", RunnerStatus.COMPLETED)
    ]
    completed = done[1]
    assert (completed.from_parallelism, completed.to_parallelism, completed.running_parallelism) == (1, 3, 3)
    assert completed.downtime_s is not None and 0 < completed.downtime_s < 60
    assert all(r.backend is BackendKind.RESTART for r in done)  # the runner says how it changes the job
    assert done[2] == completed  # the recorded outcome, re-published

    ids = [i for b in batches for i in b["ids"]]
    assert sorted(ids) == list(range(total)), "every input id exactly once in the output"
    assert all(b["count"] == len(b["ids"]) for b in batches)

    parallelisms = [MetricReport.model_validate_json(v).parallelism for v in metrics.values]
    assert parallelisms[0] == 1 and parallelisms[-1] == 3

    state = RunnerState.load(runner.config.state_file)
    assert state.parallelism == 3 and "d1" in state.applied and state.max_fencing_token == 1


def build_failing_above_two(spark, ctx):
    """The demo job on a 'cluster' with room for two task slots only."""
    if ctx.parallelism > 2:
        raise RuntimeError(f"no room for {ctx.parallelism} task slots")
    return demo.build(spark, ctx)


def test_runner_rolls_back_when_the_new_parallelism_does_not_start(broker: Service, tmp_path: Path) -> None:
    bootstrap = bootstrap_of(broker)
    config = config_for(bootstrap, tmp_path, retries=1)
    ensure_topic(bootstrap, config.options["input_topic"], 2)
    reports = TopicReader(bootstrap, config.settings.topics.runner_reports)
    runner = runner_for(config, listen=False, build=build_failing_above_two)
    runner.start()
    try:
        final = runner.handle(RescaleCommand(decision_id="up", job_id=JOB, to_parallelism=3, fencing_token=1))
        assert runner.job.healthy() and runner.job.parallelism == 1
    finally:
        runner.close()
    assert final is not None
    assert final.status == RunnerStatus.FAILED
    assert (final.running_parallelism, final.rolled_back_to) == (1, 1)
    assert final.error is not None and "no room for 3" in final.error
    published = reports.until(lambda rs: len(rs) >= 2, RunnerReport.model_validate_json, 30)
    assert [r.status for r in published] == [RunnerStatus.STARTED, RunnerStatus.FAILED]
