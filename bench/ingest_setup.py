"""What the ingest and dashboard benchmarks share: the services, settings per measure, the workers, the reports."""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console

from contracts.messages import MetricReport, SourceMetrics
from contracts.settings import Settings
from monitor.windows import window_start_for
from stack.processes import Service, free_port, start_broker, start_redis
from stack.services import AgentWorker, isolated_settings, start_agents

REPORT_INTERVAL_S = 1.0  # metric time one report covers, as a Spark reporter sends them
POLL_S = 0.02
ALL_STAGES = ["monitor", "analyze", "plan", "execute"]

console = Console()


@contextlib.contextmanager
def services(keep_logs: bool) -> Iterator[tuple[Service, Service, Path]]:
    """A broker and Redis on free ports and a scratch folder for the logs, kept if `keep_logs` or on failure."""
    workdir = Path(tempfile.mkdtemp(prefix="autoscaler-bench-"))
    started: list[Service] = []
    try:
        started.append(start_broker(log_path=workdir / "broker.log"))
        started.append(start_redis(log_path=workdir / "redis.log"))
        yield started[0], started[1], workdir
    except BaseException:
        keep_logs = True
        raise
    finally:
        for service in reversed(started):
            service.stop()
        if keep_logs:
            console.print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_settings(broker: Service, redis: Service, db: int, partitions: int, loop_interval_s: float) -> Settings:
    """Settings of one measure: its own topics, consumer groups and Redis database."""
    run = uuid.uuid4().hex[:6]
    return isolated_settings(broker.port, redis.port, f"bench{run}", f"bench-{run}", loop_interval_s, db).model_copy(
        update={"topic_partitions": partitions, "log_level": "info"})


def start_worker(settings: Settings, workdir: Path, stages: list[str]) -> AgentWorker:
    """An agent worker with `stages` on a free web port, logging into the scratch folder."""
    log_path = workdir / f"agents-{'-'.join(stages)}-{uuid.uuid4().hex[:4]}.log"
    return start_agents(settings, log_path, stages, web_port=free_port(),
                        env={"AUTOSCALER_LOG_LEVEL": settings.log_level})


def make_report(job: str, timestamp: float, rng: random.Random) -> bytes:
    """A valid job-level report (as Spark's reporter sends) of a job running near its 70 % target, so
    plan holds (no rescale traffic)."""
    parallelism = 4
    busy = parallelism * REPORT_INTERVAL_S * rng.uniform(0.65, 0.75)
    records = int(busy * 1000.0)
    return MetricReport(
        job_id=job, timestamp=timestamp, interval_s=REPORT_INTERVAL_S, parallelism=parallelism,
        records_in=records, records_out=records, busy_time_s=busy, cpu_utilization=busy / parallelism,
        source=SourceMetrics(arrival_rate=float(records), backlog=rng.randint(0, 50), partitions=8),
    ).to_bytes()


def aligned_base(span_s: float, loop_interval_s: float) -> float:
    """A window-aligned start far enough in the past that the last report is still not in the future."""
    return window_start_for(time.time() - span_s - 120.0, loop_interval_s)


def producer(settings: Settings, linger_ms: int) -> Producer:
    return Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": linger_ms,
                     "queue.buffering.max.messages": 1_000_000, "batch.num.messages": 10_000})


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
