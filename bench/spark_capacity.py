"""Capacity of the demo Spark job on this machine: drain rate, steady load, rescale downtime.

Each command starts its own Kafka-protocol broker and runs the job in this process (local[N]).

  python -m bench.spark_capacity drain --parallelism 1 --parallelism 2 --parallelism 4 --cost-ms 4
      backlog drain: max sustainable throughput and the true rate per task slot (records per busy s)
  python -m bench.spark_capacity steady --parallelism 4 --rate 650 --cost-ms 4 --seconds 90
      a constant load: whether the job keeps up, and its utilization
  python -m bench.spark_capacity rescale --start 2 --to 4 --rate 400 --cost-ms 4
      downtime of one rescale under load (stop request -> first batch of the restarted query)
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from contracts.messages import MetricReport
from evaluation.calibrate import INPUT, Metrics
from evaluation.calibrate import job_config as calibration_job
from infra.kafka import ensure_topic
from pipeline.loadgen import Constant, generate_load
from pipeline.restart import RestartFromCheckpoint, SparkJobConfig
from stack.processes import start_broker

app = typer.Typer(help=__doc__, no_args_is_help=True)


def job_config(bootstrap: str, cost_ms: float, directory: Path, **extra: Any) -> SparkJobConfig:
    return calibration_job(bootstrap, {"cost_ms": str(cost_ms)}, directory, **extra)


def summarize(reports: list[MetricReport], parallelism: int) -> dict[str, float]:
    busy = sum(r.busy_time_s for r in reports)
    records = sum(r.records_in for r in reports)
    seconds = sum(r.interval_s for r in reports)
    return {
        "reports": len(reports),
        "seconds": round(seconds, 1),
        "records": records,
        "throughput_per_s": round(records / seconds, 1) if seconds else 0.0,
        "true_rate_per_slot": round(records / busy, 1) if busy else 0.0,
        "utilization": round(busy / (seconds * parallelism), 3) if seconds else 0.0,
        "max_backlog": max((r.source.backlog for r in reports if r.source), default=0),
        "last_backlog": reports[-1].source.backlog if reports and reports[-1].source else 0,
        "arrival_rate": round(statistics.mean(r.source.arrival_rate for r in reports if r.source), 1)
        if any(r.source for r in reports)
        else 0.0,
    }


@app.command()
def drain(
    parallelism: Annotated[list[int], typer.Option("--parallelism", "-p")],
    cost_ms: Annotated[float, typer.Option("--cost-ms")] = 4.0,
    seconds: Annotated[float, typer.Option("--seconds", help="Work in the backlog, at full speed.")] = 40.0,
    partitions: Annotated[int, typer.Option("--partitions")] = 4,
) -> None:
    """Preload a backlog and let the job drain it: throughput at saturation per parallelism."""
    results = {}
    for p in parallelism:
        broker = start_broker()
        bootstrap = f"{broker.host}:{broker.port}"
        try:
            records = int(seconds * p * 1000.0 / cost_ms)
            ensure_topic(bootstrap, INPUT, partitions)
            generate_load(bootstrap, INPUT, Constant(50_000.0), duration_s=records / 50_000.0)
            metrics = Metrics(bootstrap)
            with tempfile.TemporaryDirectory() as tmp:
                job = RestartFromCheckpoint(job_config(bootstrap, cost_ms, Path(tmp), trigger_interval_s=None))
                job.start(p)
                while not metrics.reports or metrics.reports[-1].source is None or metrics.reports[-1].source.backlog:
                    metrics.poll(1.0)
                job.stop()
            # The first report holds start-up; the last one the tail of the backlog.
            results[p] = summarize(metrics.reports[1:-1], p)
            typer.echo(json.dumps({"parallelism": p, "cost_ms": cost_ms, **results[p]}))
        finally:
            broker.stop()


@app.command()
def steady(
    parallelism: Annotated[int, typer.Option("--parallelism", "-p")],
    rate: Annotated[float, typer.Option("--rate")],
    cost_ms: Annotated[float, typer.Option("--cost-ms")] = 4.0,
    seconds: Annotated[float, typer.Option("--seconds")] = 90.0,
    warmup: Annotated[float, typer.Option("--warmup", help="Reports of the first seconds do not count.")] = 30.0,
    partitions: Annotated[int, typer.Option("--partitions")] = 4,
) -> None:
    """A constant load for `seconds`; whether the job keeps up and how busy it is after `warmup`."""
    broker = start_broker()
    bootstrap = f"{broker.host}:{broker.port}"
    try:
        ensure_topic(bootstrap, INPUT, partitions)
        metrics = Metrics(bootstrap)
        with tempfile.TemporaryDirectory() as tmp:
            job = RestartFromCheckpoint(job_config(bootstrap, cost_ms, Path(tmp)))
            job.start(parallelism)
            began = time.time()
            load = threading.Thread(
                target=generate_load, args=(bootstrap, INPUT, Constant(rate)), kwargs={"duration_s": seconds}
            )
            load.start()
            load.join()
            metrics.poll(6.0)
            job.stop()
        steady_reports = [r for r in metrics.reports if r.timestamp - r.interval_s >= began + warmup and r.records_in]
        typer.echo(json.dumps({"parallelism": parallelism, "rate": rate, "cost_ms": cost_ms,
                               **summarize(steady_reports, parallelism)}))
    finally:
        broker.stop()


@app.command()
def rescale(
    start: Annotated[int, typer.Option("--start")],
    to: Annotated[int, typer.Option("--to")],
    rate: Annotated[float, typer.Option("--rate")],
    cost_ms: Annotated[float, typer.Option("--cost-ms")] = 4.0,
    warmup: Annotated[float, typer.Option("--warmup")] = 20.0,
    repeat: Annotated[int, typer.Option("--repeat", help="Rescale back and forth this many times.")] = 1,
    partitions: Annotated[int, typer.Option("--partitions")] = 4,
) -> None:
    """Downtime of rescaling under a constant load."""
    broker = start_broker()
    bootstrap = f"{broker.host}:{broker.port}"
    stop = threading.Event()
    try:
        ensure_topic(bootstrap, INPUT, partitions)
        with tempfile.TemporaryDirectory() as tmp:
            job = RestartFromCheckpoint(job_config(bootstrap, cost_ms, Path(tmp)))
            job.start(start)
            load = threading.Thread(
                target=generate_load,
                args=(bootstrap, INPUT, Constant(rate)),
                kwargs={"duration_s": 3600, "stop_event": stop},
                daemon=True,
            )
            load.start()
            targets = [to if i % 2 == 0 else start for i in range(repeat)]
            for target in targets:
                time.sleep(warmup)
                previous = job.parallelism
                outcome = job.apply(target)
                typer.echo(json.dumps({"from": previous, "to": target,
                                       "ok": outcome.ok, "downtime_s": round(outcome.downtime_s or 0, 2),
                                       "rate": rate, "cost_ms": cost_ms}))
            stop.set()
            load.join(30)
            job.stop()
    finally:
        stop.set()
        broker.stop()


if __name__ == "__main__":
    app()
