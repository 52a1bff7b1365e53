"""Does the demo Spark job slow down over a long run, and where does the time go?

    python -m bench.spark_drift --minutes 12 --parallelism 2 --rate 300
    python -m bench.spark_drift --minutes 12 --conf spark.ui.retainedStages=1000 --label spark-defaults

Runs the job at a fixed parallelism (its own broker, the load generator as its own process, the
job in this process as the runner runs it) and prints one row per minute:
  produced   records the load generator added to the input topic (its rate, from the log end);
  processed  records the job read, and per slot per second of micro-batch time (its capacity);
  batches    micro-batches and their mean duration, split into Spark's phases (`durationMs`);
  stages     the driver's completed-stage list that the metrics reporter reads: its length, the
             reporter's reads and the seconds they took;
  cpu        CPU seconds per process (the Spark JVM, its Python workers, this driver process, the
             broker, the load generator) and the JVM's and broker's memory;
  checkpoint the query's checkpoint size.
The rows and a summary (first against last minutes) go to a JSON file (`--json`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.table import Table

from bench.common import code_version, machine_info, process_cpu_seconds
from bench.spark_capacity import job_config
from evaluation.calibrate import INPUT
from infra.kafka import ensure_topic
from pipeline import offsets as off
from pipeline.loadgen import LINGER_MS
from pipeline.reporter import SparkStages
from pipeline.restart import RestartFromCheckpoint
from stack.processes import start_broker

PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


class TimedStages:
    """The reporter's stage reader, counting its reads and their time."""

    def __init__(self, inner: SparkStages):
        self.inner = inner
        self.reads = 0
        self.seconds = 0.0
        self.length = 0

    def list(self) -> list[dict[str, Any]]:
        began = time.perf_counter()
        try:
            stages = self.inner.list()
        finally:
            self.reads += 1
            self.seconds += time.perf_counter() - began
        self.length = len(stages)
        return stages


def log_end(consumer: Consumer, topic: str, partitions: int) -> int:
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(partitions))


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def processes(load: psutil.Process, broker: psutil.Process) -> dict[str, list[psutil.Process]]:
    me = psutil.Process()
    jvms = [c for c in me.children(recursive=True) if c.name() == "java"]
    workers = [c for j in jvms for c in j.children(recursive=True)]
    return {"jvm": jvms, "python_workers": workers, "driver": [me], "broker": [broker], "load": [load]}


def cpu_seconds(group: list[psutil.Process]) -> float:
    return sum(s for s in (process_cpu_seconds(p.pid) for p in group) if s == s)  # NaN: the process ended


def rss_mb(group: list[psutil.Process]) -> float:
    total = 0
    for p in group:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return round(total / 2**20, 1)


def minute_row(minute: int, progress: list[dict[str, Any]], produced: int, parallelism: int) -> dict[str, Any]:
    records = sum(int(p.get("numInputRows") or 0) for p in progress)
    batch_s = sum(float(p["durationMs"].get("triggerExecution", 0)) for p in progress) / 1000.0
    phases = {
        k: round(statistics.mean(float(p["durationMs"].get(k, 0)) for p in progress), 1) if progress else 0.0
        for k in PHASES
    }
    return {
        "minute": minute,
        "produced": produced,
        "processed": records,
        "batches": len(progress),
        "batch_ms": round(1000 * batch_s / len(progress), 1) if progress else 0.0,
        "per_slot_per_batch_s": round(records / batch_s / parallelism, 1) if batch_s else 0.0,
        "phases_ms": phases,
    }


def summary(rows: list[dict[str, Any]], warmup: int, span: int) -> dict[str, Any]:
    steady = [r for r in rows if r["minute"] > warmup]
    first, last = steady[:span], steady[-span:]

    def mean(sel: list[dict[str, Any]], key: str) -> float:
        return round(statistics.mean(r[key] for r in sel), 1) if sel else 0.0

    out = {
        f"{k}_{which}": mean(sel, k)
        for which, sel in (("first", first), ("last", last))
        for k in ("produced", "processed", "batch_ms", "per_slot_per_batch_s", "stage_read_s")
    }
    if out["per_slot_per_batch_s_first"]:
        out["per_slot_change"] = round(out["per_slot_per_batch_s_last"] / out["per_slot_per_batch_s_first"] - 1, 3)
    if out["produced_first"]:
        out["produced_change"] = round(out["produced_last"] / out["produced_first"] - 1, 3)
    return out


def run(
    minutes: int,
    parallelism: int,
    rate: float,
    cost_ms: float,
    partitions: int,
    conf: dict[str, str],
    console: Console,
    linger_ms: float,
) -> list[dict[str, Any]]:
    broker = start_broker()
    bootstrap = f"{broker.host}:{broker.port}"
    rows: list[dict[str, Any]] = []
    load = None
    try:
        ensure_topic(bootstrap, INPUT, partitions)
        watch = Consumer({"bootstrap.servers": bootstrap, "group.id": "drift"})
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent",
                "load",
                "run",
                "--shape",
                f"constant:{rate}",
                "--duration",
                str(minutes * 60 + 120),
                "--topic",
                INPUT,
                "--bootstrap",
                bootstrap,
                "--quiet",
                "--linger-ms",
                str(linger_ms),
            ],
            stdout=subprocess.DEVNULL,
        )
        with tempfile.TemporaryDirectory() as tmp:
            job = RestartFromCheckpoint(job_config(bootstrap, cost_ms, Path(tmp), spark_conf=conf))
            job.start(parallelism)
            assert job.reporter is not None and job.query is not None
            timed = TimedStages(job.reporter._stages)
            job.reporter._stages = timed  # type: ignore[assignment]
            groups = processes(psutil.Process(load.pid), psutil.Process(broker.process.pid))
            cpu_before = {k: cpu_seconds(v) for k, v in groups.items()}
            end_before, last_batch = log_end(watch, INPUT, partitions), -1
            reads_before, read_s_before = timed.reads, timed.seconds
            for minute in range(1, minutes + 1):
                time.sleep(60)
                groups = processes(psutil.Process(load.pid), psutil.Process(broker.process.pid))
                progress = [
                    p for p in (json.loads(p.json) for p in job.query.recentProgress) if p["batchId"] > last_batch
                ]
                last_batch = max((p["batchId"] for p in progress), default=last_batch)
                end_now = log_end(watch, INPUT, partitions)
                cpu_now = {k: cpu_seconds(v) for k, v in groups.items()}
                row = minute_row(minute, progress, end_now - end_before, parallelism)
                stage_probe = time.perf_counter()
                listed = len(SparkStages(job.spark).list())  # type: ignore[arg-type]
                row.update(
                    {
                        "stages_listed": listed,
                        "stage_probe_s": round(time.perf_counter() - stage_probe, 3),
                        "stage_reads": timed.reads - reads_before,
                        "stage_read_s": round(timed.seconds - read_s_before, 2),
                        "cpu_s": {k: round(cpu_now[k] - cpu_before.get(k, 0.0), 1) for k in cpu_now},
                        "rss_mb": {"jvm": rss_mb(groups["jvm"]), "broker": rss_mb(groups["broker"])},
                        "checkpoint_kb": directory_bytes(job.config.query_dir) // 1024,
                        "backlog": end_now
                        - sum(
                            sum(off.parse_progress_offsets(src.get("endOffset")).values())
                            for s in progress[-1:]
                            for src in s.get("sources", [])
                        ),
                    }
                )
                rows.append(row)
                console.print(_line(row))
                end_before, cpu_before = end_now, cpu_now
                reads_before, read_s_before = timed.reads, timed.seconds
            job.stop()
        watch.close()
    finally:
        if load is not None:
            load.terminate()
            load.wait(30)
        broker.stop()
    return rows


def _line(row: dict[str, Any]) -> str:
    return (
        f"min {row['minute']:3d} produced {row['produced']:6d} processed {row['processed']:6d} "
        f"batches {row['batches']:3d} batch {row['batch_ms']:6.0f} ms per-slot {row['per_slot_per_batch_s']:6.1f} "
        f"stages {row['stages_listed']:5d} reads {row['stage_read_s']:5.2f} s cpu {row['cpu_s']} "
        f"backlog {row['backlog']}"
    )


def table(rows: list[dict[str, Any]]) -> Table:
    t = Table(
        "min",
        "produced/s",
        "processed/s",
        "batches",
        "batch ms",
        *PHASES,
        "per slot/s",
        "stages",
        "stage reads s",
        "cpu jvm",
        "cpu py",
        "cpu driver",
        "cpu broker",
        "cpu load",
        "ckpt KB",
        "backlog",
    )
    for r in rows:
        c = r["cpu_s"]
        t.add_row(
            str(r["minute"]),
            f"{r['produced'] / 60:.0f}",
            f"{r['processed'] / 60:.0f}",
            str(r["batches"]),
            f"{r['batch_ms']:.0f}",
            *(f"{r['phases_ms'][k]:.0f}" for k in PHASES),
            f"{r['per_slot_per_batch_s']:.0f}",
            str(r["stages_listed"]),
            f"{r['stage_read_s']:.2f}",
            *(f"{c[k]:.0f}" for k in ("jvm", "python_workers", "driver", "broker", "load")),
            str(r["checkpoint_kb"]),
            str(r["backlog"]),
        )
    return t


def main(
    minutes: Annotated[int, typer.Option(min=2)] = 12,
    parallelism: Annotated[int, typer.Option("--parallelism", "-p", min=1)] = 2,
    rate: Annotated[float, typer.Option(help="Records per second, constant.")] = 300.0,
    cost_ms: Annotated[float, typer.Option("--cost-ms")] = 4.0,
    partitions: Annotated[int, typer.Option(min=1)] = 4,
    conf: Annotated[list[str] | None, typer.Option("--conf", help="Extra Spark configuration, key=value.")] = None,
    warmup: Annotated[int, typer.Option(help="Minutes left out of the first/last comparison.")] = 1,
    span: Annotated[int, typer.Option(help="Minutes compared at the start and at the end.")] = 3,
    label: Annotated[str, typer.Option()] = "run",
    linger_ms: Annotated[float, typer.Option(help="The load generator's batching delay.")] = LINGER_MS,
    json_path: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    extra = dict(item.split("=", 1) for item in conf or [])
    console = Console(width=220)
    rows = run(minutes, parallelism, rate, cost_ms, partitions, extra, console, linger_ms)
    console.print(table(rows))
    result = {
        "label": label,
        "minutes": minutes,
        "parallelism": parallelism,
        "rate": rate,
        "cost_ms": cost_ms,
        "linger_ms": linger_ms,
        "spark_conf": extra,
        "summary": summary(rows, warmup, span),
        "rows": rows,
    }
    console.print_json(json.dumps(result["summary"]))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {
                    **result,
                    "machine": machine_info(),
                    "code": code_version(("pipeline/reporter.py", "pipeline/session.py")),
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    typer.run(main)
