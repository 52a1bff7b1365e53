"""What both measures of the ingest benchmark share: settings per measure, the workers, the reports."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Producer
from rich.console import Console

from bench.common import process_cpu_seconds
from contracts.messages import MetricReport, OperatorMetrics, SourceMetrics
from contracts.settings import Settings, Topics
from monitor.windows import window_start_for
from stack.processes import Service, free_port
from stack.services import AgentWorker, start_agents

T = TypeVar("T")

REPORT_INTERVAL_S = 1.0  # metric time one report covers, as a Spark reporter sends them
POLL_S = 0.02
IDLE_S = 5.0
WARMUP_ROUNDS = 2

console = Console()


def start_worker(settings: Settings, workdir: Path, stages: list[str]) -> AgentWorker:
    """An agent worker with `stages` on a free web port, logging into the scratch folder."""
    log_path = workdir / f"agents-{'-'.join(stages)}-{uuid.uuid4().hex[:4]}.log"
    return start_agents(settings, log_path, stages, web_port=free_port(),
                        env={"AUTOSCALER_LOG_LEVEL": settings.log_level})


def cpu_seconds(worker: AgentWorker) -> float:
    return process_cpu_seconds(worker.process.pid)


# ---------------------------------------------------------------- services and workers


def run_settings(broker: Service, redis: Service, db: int, partitions: int, loop_interval_s: float) -> Settings:
    """Settings of one measure: its own topics, consumer groups and Redis database."""
    run = uuid.uuid4().hex[:6]
    return Settings(
        kafka_bootstrap=f"127.0.0.1:{broker.port}",
        redis_url=f"redis://127.0.0.1:{redis.port}/{db}",
        topics=Topics(**{name: f"bench{run}.{topic}" for name, topic in Topics().model_dump().items()}),
        topic_partitions=partitions,
        app_id=f"bench-{run}",
        loop_interval_s=loop_interval_s,
        log_level="info",
    )


class Loop:
    """One event loop for the benchmark's own Redis calls (Knowledge is async)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()


# ---------------------------------------------------------------- reports


def make_report(job: str, timestamp: float, rng: random.Random, operators: int) -> bytes:
    """A valid report of a job running near its 70 % target, so plan holds (no rescale traffic)."""
    parallelism = 4
    per_slot = 1000.0
    busy = parallelism * REPORT_INTERVAL_S * rng.uniform(0.65, 0.75)
    records = int(busy * per_slot)
    ops = []
    upstream: list[str] = []
    for k in range(operators):
        op_id = f"op{k}"
        ops.append(OperatorMetrics(
            operator_id=op_id, upstream=upstream, parallelism=parallelism, records_in=records,
            records_out=records, busy_time_s=busy / max(operators, 1),
            arrival_rate=float(records) if k == 0 else None,
        ))
        upstream = [op_id]
    return MetricReport(
        job_id=job, timestamp=timestamp, interval_s=REPORT_INTERVAL_S, parallelism=parallelism,
        records_in=records, records_out=records, busy_time_s=busy, cpu_utilization=busy / parallelism,
        source=SourceMetrics(arrival_rate=float(records), backlog=rng.randint(0, 50), partitions=8),
        operators=ops,
    ).to_bytes()


def aligned_base(span_s: float, loop_interval_s: float) -> float:
    """A window-aligned start far enough in the past that the last report is still not in the future."""
    return window_start_for(time.time() - span_s - 120.0, loop_interval_s)


def producer(settings: Settings, linger_ms: int) -> Producer:
    return Producer({
        "bootstrap.servers": settings.kafka_bootstrap,
        "linger.ms": linger_ms,
        "queue.buffering.max.messages": 1_000_000,
        "batch.num.messages": 10_000,
    })


def produce_all(p: Producer, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    for key, value in records:
        while True:
            try:
                p.produce(topic, key=key, value=value)
                break
            except BufferError:
                p.poll(0.05)  # local queue full: let deliveries drain
    if p.flush(60) != 0:
        raise RuntimeError("the producer could not deliver every record within 60 s")


