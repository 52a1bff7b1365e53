"""Ingest benchmark: monitor throughput and report-to-decision latency against real services.

Run `python -m bench.ingest --help`. Everything it needs (a tansu broker, redis-server and the
agents as `python -m agent agents` subprocesses) is started on free ports and stopped at the end.
See bench/README.md for what is measured and why the setups are fair.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import Consumer, TopicPartition

from bench.common import RESULTS, process_cpu_seconds, summary, table, write_result
from bench.ingest_latency import LATENCY_P99_FLOOR_MS, Latency, measure_latency
from bench.ingest_setup import (
    ALL_STAGES,
    POLL_S,
    REPORT_INTERVAL_S,
    aligned_base,
    console,
    make_report,
    produce_all,
    producer,
    run_settings,
    services,
    start_worker,
)
from contracts.settings import Settings
from infra.kafka import ensure_topics
from knowledge import RedisKnowledge
from monitor.windows import closed_window_ends, phase_for
from stack.processes import Service
from stack.services import register_jobs

THROUGHPUT_FLOOR = 5_000.0  # reports/s one monitor worker must ingest
app = typer.Typer(add_completion=False, help=__doc__)


@dataclass
class WindowAudit:
    published: int
    expected: int
    duplicates: int
    missing: list[tuple[str, float]]


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

    def json(self) -> dict[str, Any]:
        out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "windows"}
        audit = self.windows
        return out | {"meets_floor": self.reports_per_s >= THROUGHPUT_FLOOR, "windows": {
            "published": audit.published, "expected": audit.expected, "duplicates": audit.duplicates,
            "missing": len(audit.missing), "missing_sample": [list(m) for m in audit.missing[:20]]}}


def measure_throughput(
    broker: Service, redis: Service, workdir: Path, reports: int, jobs: int, partitions: int,
    loop_interval_s: float, stages: list[str], loop: asyncio.Runner, seed: int,
) -> Throughput:
    """Produce `reports` first, then time one worker with `stages` accepting them (see bench/README.md)."""
    settings = run_settings(broker, redis, db=0, partitions=partitions, loop_interval_s=loop_interval_s)
    rng = random.Random(seed)
    job_ids = [f"ingest-{j:04d}" for j in range(jobs)]
    per_job = math.ceil(reports / jobs)
    base = aligned_base(per_job * REPORT_INTERVAL_S, loop_interval_s)
    ensure_topics(settings)
    register_jobs(settings, job_ids, mode="recommend")
    console.print(f"[bold]throughput[/bold]: producing {reports:,} reports for {jobs} jobs ...")
    # Round-robin over jobs, as many live jobs interleave on the topic; each job's reports in order.
    records = [(job.encode(), make_report(job, base + (i + 1) * REPORT_INTERVAL_S, rng))
               for i in range(per_job) for job in job_ids][:reports]
    expected: set[tuple[str, float]] = set()
    for j, job in enumerate(job_ids):
        # Every window before the job's last (still open) one must be closed.
        last = base + len(range(j, reports, jobs)) * REPORT_INTERVAL_S
        phase = phase_for(job, loop_interval_s, settings.window_spread)
        expected |= {(job, round(end, 6))
                     for end in closed_window_ends(base + REPORT_INTERVAL_S, last, loop_interval_s, phase)}
    started = time.monotonic()
    produce_all(producer(settings, linger_ms=20), settings.topics.metrics, records)
    produce_s = time.monotonic() - started
    del records
    knowledge = RedisKnowledge(settings)

    def cpu() -> list[float]:  # worker, broker, Redis
        return [process_cpu_seconds(pid) for pid in (worker.process.pid, broker.pid, redis.pid)]

    spawned = time.monotonic()
    worker = start_worker(settings, workdir, stages)
    try:
        first_at: float | None = None
        first_count, cpu_first = 0, [0.0, 0.0, 0.0]
        deadline = spawned + max(180.0, reports / 500)
        while True:
            accepted = loop.run(knowledge.counters()).get("reports_accepted", 0)
            now = time.monotonic()
            if accepted and first_at is None:
                # Timing starts at the first accepted batch: startup and the group join are separate.
                first_at, first_count, cpu_first = now, accepted, cpu()
            if accepted >= reports:
                break
            if worker.process.poll() is not None or now > deadline:
                raise RuntimeError(f"{accepted:,} of {reports:,} reports accepted, the worker "
                                   f"{'exited' if worker.process.poll() is not None else 'is too slow'}:\n"
                                   f"{worker.log()[-3000:]}")
            time.sleep(POLL_S)
        assert first_at is not None
        ingest_s = max(now - first_at, 1e-9)
        used = [100 * (b - a) / ingest_s for a, b in zip(cpu_first, cpu(), strict=True)]
        counters = loop.run(knowledge.counters())
        audit = audit_windows(settings, expected)
    finally:
        worker.stop()
        loop.run(knowledge.close())
    return Throughput(
        reports=reports, jobs=jobs, stages=stages, reports_per_s=(reports - first_count) / ingest_s,
        startup_s=first_at - spawned, ingest_s=ingest_s, total_s=now - spawned, worker_cpu_pct=used[0],
        broker_cpu_pct=used[1], redis_cpu_pct=used[2], windows=audit,
        rejected={k: v for k, v in counters.items() if k.startswith("rejected:")}, produce_s=produce_s)


def audit_windows(settings: Settings, expected: set[tuple[str, float]], wait_s: float = 15.0) -> WindowAudit:
    """Read the whole windows topic: was every window closed, exactly once?"""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    seen: list[tuple[str, float]] = []
    try:
        topic = settings.topics.windows
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        deadline = time.monotonic() + wait_s
        # Until every expected window is in, or the wait is over (the last sends land late).
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


def render(throughput: Throughput | None, latency: Latency | None) -> None:
    out = table("autoscaler ingest benchmark", "measure", "value", "floor", "")
    if throughput is not None:
        t, audit = throughput, throughput.windows
        out.add_row(f"ingest, one {'+'.join(t.stages)} worker", f"{t.reports_per_s:,.0f} reports/s",
                    f">= {THROUGHPUT_FLOOR:,.0f}", "ok" if t.reports_per_s >= THROUGHPUT_FLOOR else "LOW")
        out.add_row("  reports / jobs", f"{t.reports:,} / {t.jobs}")
        out.add_row("  startup + group join", f"{t.startup_s:.1f} s")
        out.add_row("  CPU while ingesting: worker / broker / redis",
                    f"{t.worker_cpu_pct:.0f} / {t.broker_cpu_pct:.0f} / {t.redis_cpu_pct:.0f} %")
        out.add_row("  windows published / expected / missing / duplicated",
                    f"{audit.published:,} / {audit.expected:,} / {len(audit.missing)} / {audit.duplicates}",
                    "- / - / 0 / 0", "!" if audit.missing or audit.duplicates else "")
        out.add_row("  rejected", str(sum(t.rejected.values())), "0")
    if latency is not None:
        s = summary(latency.samples_ms)
        out.add_row(f"report -> decision ({latency.layout}), {len(latency.samples_ms)} samples",
                    f"p50 {s['p50']:.0f} / p95 {s['p95']:.0f} / p99 {s['p99']:.0f} / max {s['max']:.0f} ms",
                    f"p99 < {LATENCY_P99_FLOOR_MS:.0f} ms", "ok" if s["p99"] < LATENCY_P99_FLOOR_MS else "HIGH")
        for name, values in (("  report -> window closed", latency.monitor_ms),
                             ("  window closed -> decision made", latency.analyze_plan_ms),
                             ("  decision made -> received", latency.delivery_ms)):
            part = summary(values)
            out.add_row(name, f"p50 {part['p50']:.0f} / p99 {part['p99']:.0f} ms")
        out.add_row("  worker CPU during the samples", f"{latency.worker_cpu_pct:.0f} %")
        out.add_row("  CPU with no traffic: worker(s) / broker",
                    f"{latency.idle_worker_cpu_pct:.1f} / {latency.idle_broker_cpu_pct:.1f} %")
    console.print(out)


@app.command()
def main(
    reports: Annotated[int, typer.Option(help="Reports pre-produced for the throughput measure.")] = 200_000,
    jobs: Annotated[int, typer.Option(help="Registered jobs the throughput reports spread over.")] = 100,
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
    output: Annotated[Path, typer.Option(help="Where the JSON results go.")] = RESULTS / "ingest.json",
    keep_logs: Annotated[bool, typer.Option(help="Keep the broker, Redis and worker logs.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic reports and pauses.")] = 7,
) -> None:
    """Measure monitor ingest throughput and report-to-decision latency on this machine."""
    if quick:
        reports, samples = min(reports, 30_000), min(samples, 100)
    if throughput_stages not in ("monitor", "all") or layout not in ("all-in-one", "split"):
        raise typer.BadParameter("--throughput-stages is `monitor` or `all`; --layout `all-in-one` or `split`")
    if reports < jobs or samples < 1 or latency_jobs < 1:
        raise typer.BadParameter("need reports >= jobs and at least one latency sample and job")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup on SIGTERM too
    stages = ["monitor"] if throughput_stages == "monitor" else ALL_STAGES
    started = dt.datetime.now(dt.UTC)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    throughput: Throughput | None = None
    latency: Latency | None = None
    with asyncio.Runner() as loop, services(keep_logs) as (broker, redis, workdir):
        if not skip_throughput:
            throughput = measure_throughput(broker, redis, workdir, reports, jobs, partitions, loop_interval,
                                            stages, loop, seed)
        if not skip_latency:
            latency = measure_latency(broker, redis, workdir, samples, latency_jobs, partitions, loop_interval,
                                      layout, jitter_ms, stagger_ms, loop, seed)
    render(throughput, latency)
    write_result(output, {
        "benchmark": "ingest", "date": started.isoformat(timespec="seconds"),
        "duration_s": round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1),
        "load_average_at_start": load_at_start,
        "parameters": {"reports": reports, "jobs": jobs, "throughput_stages": stages, "samples": samples,
                       "latency_jobs": latency_jobs, "layout": layout, "jitter_ms": jitter_ms,
                       "stagger_ms": stagger_ms, "partitions": partitions, "loop_interval_s": loop_interval,
                       "report_interval_s": REPORT_INTERVAL_S, "seed": seed},
        "floors": {"throughput_reports_per_s": THROUGHPUT_FLOOR, "latency_p99_ms": LATENCY_P99_FLOOR_MS},
        **({"throughput": throughput.json()} if throughput else {}),
        **({"latency": latency.json()} if latency else {}),
    }, ("monitor/windows.py", "monitor/agent.py", "analyze/agent.py", "plan/agent.py", "agent/app.py"), console)


if __name__ == "__main__":
    app()
