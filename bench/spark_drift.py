"""`python -m bench.spark_drift`: does the demo Spark job slow down over a long run, and where does the time go?

    python -m bench.spark_drift --minutes 60 --span 10
    python -m bench.spark_drift --minutes 14 --linger-ms 5      # the load generator's old batching

Runs the job at a fixed parallelism (its own broker, the load generator as its own process, the job in
this process as the runner runs it) and prints one row per minute: records produced (from the input's
log end) and processed, the micro-batches and their mean duration split into Spark's phases
(`durationMs`), records per slot per second of batch time, the driver's completed-stage list that the
metrics reporter reads (its length, the reporter's reads and their seconds), CPU seconds per process
(the Spark JVM, its Python workers, this driver, the broker, the load generator), the JVM's and the
broker's memory, the checkpoint's size and the backlog. Then the first `--span` minutes after
`--warmup` against the last. Writes the rows and that summary as JSON.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console

from bench.common import RESULTS, process_cpu_seconds, table, write_result
from contracts.settings import Settings
from evaluation.calibrate import INPUT, job_config
from infra.kafka import ensure_topic
from pipeline import offsets as off
from pipeline.loadgen import LINGER_MS
from pipeline.reporter import SparkStages
from pipeline.restart import RestartFromCheckpoint
from stack.processes import start_broker, stop_pid
from stack.services import start_load

PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
GROUPS = ("jvm", "python_workers", "driver", "broker", "load")
app = typer.Typer(add_completion=False, help=__doc__)


class TimedStages:
    """The reporter's stage reader, counting its reads and their time."""

    def __init__(self, inner: SparkStages):
        self.inner, self.reads, self.seconds = inner, 0, 0.0

    def list(self) -> list[dict[str, Any]]:
        began = time.perf_counter()
        try:
            return self.inner.list()
        finally:
            self.reads += 1
            self.seconds += time.perf_counter() - began


def processes(load: int, broker: int) -> dict[str, list[psutil.Process]]:
    me = psutil.Process()
    jvms = [c for c in me.children(recursive=True) if c.name() == "java"]
    return {"jvm": jvms, "python_workers": [c for j in jvms for c in j.children(recursive=True)], "driver": [me],
            "broker": [psutil.Process(broker)], "load": [psutil.Process(load)]}


def cpu_seconds(group: list[psutil.Process]) -> float:
    return sum(s for s in (process_cpu_seconds(p.pid) for p in group) if s == s)  # NaN: the process ended


def rss_mb(group: list[psutil.Process]) -> float:
    total = 0
    for p in group:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return round(total / 2**20, 1)


def minute_row(minute: int, progress: list[dict[str, Any]], produced: int, parallelism: int) -> dict[str, Any]:
    """What one minute's micro-batches (`progress`) did, beside what the load produced."""
    records = sum(int(p.get("numInputRows") or 0) for p in progress)
    batch_s = sum(float(p["durationMs"].get("triggerExecution", 0)) for p in progress) / 1000.0
    return {"minute": minute, "produced": produced, "processed": records, "batches": len(progress),
            "batch_ms": round(1000 * batch_s / len(progress), 1) if progress else 0.0,
            "per_slot_per_batch_s": round(records / batch_s / parallelism, 1) if batch_s else 0.0,
            "phases_ms": {k: round(statistics.mean(float(p["durationMs"].get(k, 0)) for p in progress), 1)
                          if progress else 0.0 for k in PHASES}}


def summary(rows: list[dict[str, Any]], warmup: int, span: int) -> dict[str, Any]:
    """The means of the first and the last `span` minutes after `warmup`, and the relative changes."""
    steady = [r for r in rows if r["minute"] > warmup]
    out = {f"{k}_{which}": round(statistics.mean(r[k] for r in sel), 1) if sel else 0.0
           for which, sel in (("first", steady[:span]), ("last", steady[-span:]))
           for k in ("produced", "processed", "batch_ms", "per_slot_per_batch_s", "stage_read_s")}
    for key, name in (("per_slot_per_batch_s", "per_slot_change"), ("produced", "produced_change")):
        if out[f"{key}_first"]:
            out[name] = round(out[f"{key}_last"] / out[f"{key}_first"] - 1, 3)
    return out


def run(minutes: int, parallelism: int, rate: float, cost_ms: float, partitions: int, conf: dict[str, str],
        linger_ms: float, console: Console) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(log_path=Path(tmp) / "broker.log")
        bootstrap = f"{broker.host}:{broker.port}"
        load = None
        try:
            ensure_topic(bootstrap, INPUT, partitions)
            watch = Consumer({"bootstrap.servers": bootstrap, "group.id": "drift"})
            load = start_load(Settings(kafka_bootstrap=bootstrap), INPUT, Path(tmp) / "load.log",
                              ["--shape", f"constant:{rate}", "--duration", str(minutes * 60 + 120),
                               "--linger-ms", str(linger_ms)], partitions=partitions)
            job = RestartFromCheckpoint(job_config(bootstrap, {"cost_ms": str(cost_ms)}, Path(tmp) / "job",
                                                   spark_conf=conf))
            job.start(parallelism)
            assert job.reporter is not None and job.query is not None
            timed = job.reporter._stages = TimedStages(job.reporter._stages)  # type: ignore[assignment]

            def log_end() -> int:
                return sum(watch.get_watermark_offsets(TopicPartition(INPUT, p), timeout=5)[1]
                           for p in range(partitions))

            groups = processes(load.pid, broker.pid)
            cpu_before = {k: cpu_seconds(v) for k, v in groups.items()}
            end_before, last_batch, reads_before, read_s_before = log_end(), -1, 0, 0.0
            for minute in range(1, minutes + 1):
                time.sleep(60)
                groups = processes(load.pid, broker.pid)
                progress = [p for p in (json.loads(p.json) for p in job.query.recentProgress)
                            if p["batchId"] > last_batch]
                last_batch = max((p["batchId"] for p in progress), default=last_batch)
                end_now, cpu_now = log_end(), {k: cpu_seconds(v) for k, v in groups.items()}
                row = minute_row(minute, progress, end_now - end_before, parallelism)
                probe = time.perf_counter()
                listed = len(SparkStages(job.spark).list())  # type: ignore[arg-type]
                consumed = sum(sum(off.parse_progress_offsets(source.get("endOffset")).values())
                               for p in progress[-1:] for source in p.get("sources", []))
                row |= {"stages_listed": listed, "stage_probe_s": round(time.perf_counter() - probe, 3),
                        "stage_reads": timed.reads - reads_before,
                        "stage_read_s": round(timed.seconds - read_s_before, 2),
                        "cpu_s": {k: round(cpu_now[k] - cpu_before.get(k, 0.0), 1) for k in cpu_now},
                        "rss_mb": {"jvm": rss_mb(groups["jvm"]), "broker": rss_mb(groups["broker"])},
                        "checkpoint_kb": sum(f.stat().st_size for f in job.config.query_dir.rglob("*")
                                             if f.is_file()) // 1024,
                        "backlog": end_now - consumed}
                rows.append(row)
                console.print(f"min {minute:3d} produced {row['produced']:6d} processed {row['processed']:6d} "
                              f"batches {row['batches']:3d} batch {row['batch_ms']:6.0f} ms per-slot "
                              f"{row['per_slot_per_batch_s']:6.1f} backlog {row['backlog']}")
                end_before, cpu_before, reads_before, read_s_before = end_now, cpu_now, timed.reads, timed.seconds
            job.stop()
            watch.close()
        finally:
            if load is not None:
                stop_pid(load.pid, process=load)
            broker.stop()
    return rows


@app.command()
def main(
    minutes: Annotated[int, typer.Option(min=2)] = 12,
    parallelism: Annotated[int, typer.Option("--parallelism", "-p", min=1)] = 2,
    rate: Annotated[float, typer.Option(help="Records per second, constant.")] = 300.0,
    cost_ms: Annotated[float, typer.Option("--cost-ms")] = 4.0,
    partitions: Annotated[int, typer.Option(min=1)] = 4,
    conf: Annotated[list[str] | None, typer.Option("--conf", help="Extra Spark configuration, key=value.")] = None,
    warmup: Annotated[int, typer.Option(help="Minutes left out of the first/last comparison.")] = 1,
    span: Annotated[int, typer.Option(help="Minutes compared at the start and at the end.")] = 3,
    linger_ms: Annotated[float, typer.Option(help="The load generator's batching delay.")] = LINGER_MS,
    json_path: Annotated[Path, typer.Option("--json", help="Where the JSON goes.")] = RESULTS / "spark_drift.json",
) -> None:
    """Run the job for `minutes`; print a row per minute and the first minutes against the last."""
    extra = dict(item.split("=", 1) for item in conf or [])
    console = Console(width=220)
    rows = run(minutes, parallelism, rate, cost_ms, partitions, extra, linger_ms, console)
    out = table(f"the demo job at {parallelism} slots, {rate:g} rec/s, {cost_ms:g} ms per record", "min",
                "produced/s", "processed/s", "batches", "batch ms", *PHASES, "per slot/s", "stages",
                "stage reads s", *(f"cpu {g}" for g in GROUPS), "ckpt KB", "backlog")
    for r in rows:
        out.add_row(str(r["minute"]), f"{r['produced'] / 60:.0f}", f"{r['processed'] / 60:.0f}", str(r["batches"]),
                    f"{r['batch_ms']:.0f}", *(f"{r['phases_ms'][k]:.0f}" for k in PHASES),
                    f"{r['per_slot_per_batch_s']:.0f}", str(r["stages_listed"]), f"{r['stage_read_s']:.2f}",
                    *(f"{r['cpu_s'][g]:.0f}" for g in GROUPS), str(r["checkpoint_kb"]), str(r["backlog"]))
    console.print(out)
    result = {"minutes": minutes, "parallelism": parallelism, "rate": rate, "cost_ms": cost_ms,
              "linger_ms": linger_ms, "spark_conf": extra, "summary": summary(rows, warmup, span), "rows": rows}
    console.print_json(json.dumps(result["summary"]))
    write_result(json_path, result, ("pipeline/reporter.py", "pipeline/session.py"), console)


if __name__ == "__main__":
    app()
