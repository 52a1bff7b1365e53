"""Ingest benchmark: monitor throughput and report-to-decision latency against real services.

Run `python -m bench.ingest --help`. Everything it needs (a tansu broker, redis-server and the
agents as `python -m agent agents` subprocesses) is started on free ports and stopped at the end.
See bench/README.md for what is measured and why the setups are fair.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import Consumer, TopicPartition
from rich.table import Table

from bench.common import machine_info, process_cpu_seconds, summary
from bench.ingest_latency import Latency, measure_latency
from bench.ingest_setup import (
    POLL_S,
    REPORT_INTERVAL_S,
    Loop,
    aligned_base,
    console,
    cpu_seconds,
    make_report,
    produce_all,
    producer,
    run_settings,
    start_worker,
)
from contracts.settings import Settings
from infra.kafka import ensure_topics
from knowledge import RedisKnowledge
from monitor.windows import window_start_for
from stack.processes import Service, start_broker, start_redis
from stack.services import register_jobs

RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"
THROUGHPUT_FLOOR = 5_000.0  # reports/s one monitor worker must ingest
LATENCY_P99_FLOOR_MS = 250.0
app = typer.Typer(add_completion=False, help=__doc__)


# ---------------------------------------------------------------- measure 1: ingest throughput


@dataclass
class Throughput:
    reports: int
    jobs: int
    stages: list[str]
    reports_per_s: float
    startup_s: float
    ingest_s: float
    total_s: float
    worker_cpu_pct: float
    broker_cpu_pct: float
    redis_cpu_pct: float
    windows: WindowAudit
    rejected: dict[str, int]
    produce_s: float


def measure_throughput(
    broker: Service, redis: Service, workdir: Path, reports: int, jobs: int, partitions: int,
    loop_interval_s: float, operators: int, stages: list[str], loop: Loop, seed: int,
) -> Throughput:
    settings = run_settings(broker, redis, db=0, partitions=partitions, loop_interval_s=loop_interval_s)
    rng = random.Random(seed)
    job_ids = [f"ingest-{j:04d}" for j in range(jobs)]
    per_job = math.ceil(reports / jobs)
    base = aligned_base(per_job * REPORT_INTERVAL_S, loop_interval_s)
    ensure_topics(settings)
    register_jobs(settings, job_ids, mode="recommend")

    console.print(f"[bold]throughput[/bold]: producing {reports:,} reports for {jobs} jobs ...")
    records: list[tuple[bytes, bytes]] = []
    expected_windows: set[tuple[str, float]] = set()
    # Round-robin over jobs, as many live jobs interleave on the topic; each job's reports in order.
    for i in range(per_job):
        for job in job_ids:
            if len(records) == reports:
                break
            records.append((job.encode(), make_report(job, base + (i + 1) * REPORT_INTERVAL_S, rng, operators)))
    for j, job in enumerate(job_ids):
        sent = len(range(j, reports, jobs))
        first = window_start_for(base + REPORT_INTERVAL_S, loop_interval_s)
        last = window_start_for(base + sent * REPORT_INTERVAL_S, loop_interval_s)
        # Every window before the job's last (still open) one must be closed.
        for k in range(round((last - first) / loop_interval_s)):
            expected_windows.add((job, round(first + (k + 1) * loop_interval_s, 6)))
    started = time.monotonic()
    produce_all(producer(settings, linger_ms=20), settings.topics.metrics, records)
    produce_s = time.monotonic() - started
    del records

    knowledge = RedisKnowledge(settings)
    cpu_before = {"broker": process_cpu_seconds(broker.pid), "redis": process_cpu_seconds(redis.pid)}
    spawned = time.monotonic()
    worker = start_worker(settings, workdir, stages)
    try:
        first_at: float | None = None
        first_count = 0
        worker_cpu_first = 0.0
        deadline = spawned + max(180.0, reports / 500)
        while True:
            accepted = loop.run(knowledge.counters()).get("reports_accepted", 0)
            now = time.monotonic()
            if accepted and first_at is None:
                # Timing starts at the first accepted batch: startup and the group join are separate.
                first_at, first_count, worker_cpu_first = now, accepted, cpu_seconds(worker)
                cpu_before = {"broker": process_cpu_seconds(broker.pid), "redis": process_cpu_seconds(redis.pid)}
            if accepted >= reports:
                done_at = now
                break
            if worker.process.poll() is not None:
                raise RuntimeError(f"the worker exited early:\n{worker.log()[-3000:]}")
            if now > deadline:
                raise RuntimeError(f"only {accepted:,} of {reports:,} reports accepted in time:\n"
                                   f"{worker.log()[-3000:]}")
            time.sleep(POLL_S)
        assert first_at is not None
        ingest_s = max(done_at - first_at, 1e-9)
        worker_cpu = cpu_seconds(worker) - worker_cpu_first
        broker_cpu = process_cpu_seconds(broker.pid) - cpu_before["broker"]
        redis_cpu = process_cpu_seconds(redis.pid) - cpu_before["redis"]
        counters = loop.run(knowledge.counters())
        audit_started = time.monotonic()
        audit = audit_windows(settings, expected_windows)
        console.print(f"  window audit took {time.monotonic() - audit_started:.1f} s")
    finally:
        worker.stop()
        loop.run(knowledge.close())
    return Throughput(
        reports=reports, jobs=jobs, stages=stages,
        reports_per_s=(reports - first_count) / ingest_s,
        startup_s=first_at - spawned, ingest_s=ingest_s, total_s=done_at - spawned,
        worker_cpu_pct=100 * worker_cpu / ingest_s, broker_cpu_pct=100 * broker_cpu / ingest_s,
        redis_cpu_pct=100 * redis_cpu / ingest_s,
        windows=audit,
        rejected={k: v for k, v in counters.items() if k.startswith("rejected:")},
        produce_s=produce_s,
    )


@dataclass
class WindowAudit:
    published: int
    expected: int
    duplicates: int
    missing: list[tuple[str, float]]


def audit_windows(settings: Settings, expected: set[tuple[str, float]], wait_s: float = 15.0) -> WindowAudit:
    """Read the whole windows topic: was every window closed, exactly once?"""
    consumer = Consumer({
        "bootstrap.servers": settings.kafka_bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "fetch.wait.max.ms": 50,
    })
    seen: list[tuple[str, float]] = []
    try:
        topic = settings.topics.windows
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        deadline = time.monotonic() + wait_s
        # Until every expected window is in, or nothing new came for a while (the last sends land late).
        while time.monotonic() < deadline and len(set(seen) & expected) < len(expected):
            for msg in consumer.consume(10_000, timeout=0.5):
                if msg.error() is None:
                    window = json.loads(msg.value())
                    seen.append((window["job_id"], round(window["window_end"], 6)))
    finally:
        consumer.close()
    distinct = set(seen)
    return WindowAudit(published=len(seen), expected=len(expected), duplicates=len(seen) - len(distinct),
                       missing=sorted(expected - distinct))


# ---------------------------------------------------------------- machine info and output


def render(throughput: Throughput | None, latency: Latency | None) -> None:
    table = Table(title="autoscaler ingest benchmark", show_lines=False)
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("floor", justify="right")
    table.add_column("", justify="center")
    if throughput is not None:
        ok = throughput.reports_per_s >= THROUGHPUT_FLOOR
        table.add_row(f"ingest, one {'+'.join(throughput.stages)} worker", f"{throughput.reports_per_s:,.0f} reports/s",
                      f">= {THROUGHPUT_FLOOR:,.0f}", "[green]ok[/green]" if ok else "[red]LOW[/red]")
        table.add_row("  reports / jobs", f"{throughput.reports:,} / {throughput.jobs}", "", "")
        table.add_row("  startup + group join", f"{throughput.startup_s:.1f} s", "", "")
        table.add_row("  CPU while ingesting: worker / broker / redis",
                      f"{throughput.worker_cpu_pct:.0f} / {throughput.broker_cpu_pct:.0f} / "
                      f"{throughput.redis_cpu_pct:.0f} %", "", "")
        audit = throughput.windows
        table.add_row("  windows published / expected / missing / duplicated",
                      f"{audit.published:,} / {audit.expected:,} / {len(audit.missing)} / {audit.duplicates}",
                      "- / - / 0 / 0", "" if not audit.missing and not audit.duplicates else "[red]![/red]")
        table.add_row("  rejected", str(sum(throughput.rejected.values())), "0", "")
    if latency is not None:
        s = summary(latency.samples_ms)
        ok = s["p99"] < LATENCY_P99_FLOOR_MS
        table.add_row(f"report -> decision ({latency.layout}), {len(latency.samples_ms)} samples",
                      f"p50 {s['p50']:.0f} ms", "", "")
        table.add_row("", f"p95 {s['p95']:.0f} ms", "", "")
        table.add_row("", f"p99 {s['p99']:.0f} ms", f"< {LATENCY_P99_FLOOR_MS:.0f} ms",
                      "[green]ok[/green]" if ok else "[red]HIGH[/red]")
        table.add_row("", f"max {s['max']:.0f} ms", "", "")
        for name, values in (("  report -> window closed", latency.monitor_ms),
                             ("  window closed -> decision made", latency.analyze_plan_ms),
                             ("  decision made -> received", latency.delivery_ms)):
            part = summary(values)
            table.add_row(name, f"p50 {part['p50']:.0f} / p99 {part['p99']:.0f} ms", "", "")
        table.add_row("  worker CPU during the samples", f"{latency.worker_cpu_pct:.0f} %", "", "")
        table.add_row("  CPU with no traffic: worker(s) / broker",
                      f"{latency.idle_worker_cpu_pct:.1f} / {latency.idle_broker_cpu_pct:.1f} %", "", "")
    console.print(table)


@contextlib.contextmanager
def services(keep_logs: bool) -> Iterator[tuple[Service, Service, Path]]:
    workdir = Path(tempfile.mkdtemp(prefix="autoscaler-bench-"))
    broker = redis = None
    failed = False
    try:
        broker = start_broker(log_path=workdir / "broker.log")
        redis = start_redis(log_path=workdir / "redis.log")
        yield broker, redis, workdir
    except BaseException:
        failed = True
        raise
    finally:
        for service in (redis, broker):
            if service is not None:
                service.stop()
        if keep_logs or failed:
            console.print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@app.command()
def main(
    reports: Annotated[int, typer.Option(help="Reports pre-produced for the throughput measure.")] = 200_000,
    jobs: Annotated[int, typer.Option(help="Registered jobs the throughput reports spread over.")] = 100,
    operators: Annotated[int, typer.Option(help="Operators per report (0: job-level metrics, as Spark).")] = 0,
    throughput_stages: Annotated[
        str, typer.Option(help="Worker of the throughput measure: `monitor` (fair, default) or `all`.")
    ] = "monitor",
    samples: Annotated[int, typer.Option(help="Latency samples (closed windows) to time.")] = 400,
    latency_jobs: Annotated[int, typer.Option(help="Jobs whose windows close in each latency round.")] = 10,
    layout: Annotated[
        str, typer.Option(help="Latency setup: `all-in-one` (one worker, default) or `split` (one per stage).")
    ] = "all-in-one",
    jitter_ms: Annotated[float, typer.Option(help="Random pause before each round's closers (phase).")] = 500.0,
    stagger_ms: Annotated[float, typer.Option(help="Random gap between the closers of one round.")] = 20.0,
    partitions: Annotated[int, typer.Option(help="Partitions of every topic.")] = 8,
    loop_interval: Annotated[float, typer.Option(help="Window length in metric time (s).")] = 10.0,
    quick: Annotated[bool, typer.Option(help="Small sizes: 30k reports, 100 latency samples (< 2 min).")] = False,
    skip_throughput: Annotated[bool, typer.Option(help="Only measure latency.")] = False,
    skip_latency: Annotated[bool, typer.Option(help="Only measure throughput.")] = False,
    output: Annotated[Path, typer.Option(help="Where the JSON results go.")] = RESULTS,
    keep_logs: Annotated[bool, typer.Option(help="Keep the broker, Redis and worker logs.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic reports and pauses.")] = 7,
) -> None:
    """Measure monitor ingest throughput and report-to-decision latency on this machine."""
    if quick:
        reports, samples = min(reports, 30_000), min(samples, 100)
    if throughput_stages not in ("monitor", "all"):
        raise typer.BadParameter("--throughput-stages is `monitor` or `all`")
    if layout not in ("all-in-one", "split"):
        raise typer.BadParameter("--layout is `all-in-one` or `split`")
    if reports < jobs or samples < 1 or latency_jobs < 1:
        raise typer.BadParameter("need reports >= jobs and at least one latency sample and job")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup on SIGTERM too
    stages = ["monitor"] if throughput_stages == "monitor" else ["monitor", "analyze", "plan", "execute"]
    started = dt.datetime.now(dt.UTC)
    load_at_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    loop = Loop()
    throughput: Throughput | None = None
    latency: Latency | None = None
    try:
        with services(keep_logs) as (broker, redis, workdir):
            if not skip_throughput:
                throughput = measure_throughput(broker, redis, workdir, reports, jobs, partitions, loop_interval,
                                                operators, stages, loop, seed)
            if not skip_latency:
                latency = measure_latency(broker, redis, workdir, samples, latency_jobs, partitions, loop_interval,
                                          layout, jitter_ms, stagger_ms, loop, seed)
    finally:
        loop.close()
    render(throughput, latency)
    results: dict[str, Any] = {
        "benchmark": "ingest",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1),
        "machine": machine_info() | {"load_average_at_start": load_at_start and [round(x, 2) for x in load_at_start]},
        "parameters": {
            "reports": reports, "jobs": jobs, "operators": operators, "throughput_stages": stages,
            "samples": samples, "latency_jobs": latency_jobs, "layout": layout, "jitter_ms": jitter_ms,
            "stagger_ms": stagger_ms, "partitions": partitions, "loop_interval_s": loop_interval,
            "report_interval_s": REPORT_INTERVAL_S, "seed": seed,
        },
        "floors": {"throughput_reports_per_s": THROUGHPUT_FLOOR, "latency_p99_ms": LATENCY_P99_FLOOR_MS},
    }
    if throughput is not None:
        results["throughput"] = {k: (round(v, 3) if isinstance(v, float) else v)
                                 for k, v in throughput.__dict__.items() if k != "windows"}
        audit = throughput.windows
        results["throughput"]["windows"] = {
            "published": audit.published, "expected": audit.expected, "duplicates": audit.duplicates,
            "missing": len(audit.missing), "missing_sample": [list(m) for m in audit.missing[:20]],
        }
        results["throughput"]["meets_floor"] = throughput.reports_per_s >= THROUGHPUT_FLOOR
    if latency is not None:
        results["latency"] = {
            "layout": latency.layout, "workers": latency.workers, "samples": len(latency.samples_ms),
            "warmup_s": round(latency.warmup_s, 3), "worker_cpu_pct": round(latency.worker_cpu_pct, 1),
            "idle_worker_cpu_pct": round(latency.idle_worker_cpu_pct, 2),
            "idle_broker_cpu_pct": round(latency.idle_broker_cpu_pct, 2),
            "report_to_decision_ms": {k: round(v, 2) for k, v in summary(latency.samples_ms).items()},
            "report_to_window_closed_ms": {k: round(v, 2) for k, v in summary(latency.monitor_ms).items()},
            "window_closed_to_decision_ms": {k: round(v, 2) for k, v in summary(latency.analyze_plan_ms).items()},
            "decision_to_received_ms": {k: round(v, 2) for k, v in summary(latency.delivery_ms).items()},
            "meets_floor": summary(latency.samples_ms)["p99"] < LATENCY_P99_FLOOR_MS,
            # Every sample, in the order taken, for looking at tails: [total, monitor, analyze+plan, delivery].
            "samples_ms": [[round(x, 1) for x in sample] for sample in zip(
                latency.samples_ms, latency.monitor_ms, latency.analyze_plan_ms, latency.delivery_ms, strict=True)],
        }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"results written to {output}")


if __name__ == "__main__":
    app()
