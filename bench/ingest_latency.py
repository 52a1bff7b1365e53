"""The ingest benchmark's second measure: wall time from the report that closes a window to its decision."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.common import percentile, process_cpu_seconds, summary
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
    start_worker,
)
from contracts.decisions import ScalingDecision
from contracts.settings import Settings
from infra.kafka import ensure_topics
from knowledge import Knowledge, RedisKnowledge
from monitor.windows import phase_for, window_start_for
from stack.processes import Service
from stack.services import AgentWorker, register_jobs

IDLE_S = 5.0
LATENCY_P99_FLOOR_MS = 250.0
WARMUP_ROUNDS = 2


class DecisionCollector:
    """Reads the decisions topic in a thread and notes when each (job, window end) arrived."""

    def __init__(self, settings: Settings):
        # The observer must not add latency of its own: tansu answers an empty fetch only after
        # fetch.wait.max.ms, not when data arrives.
        self.consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "enable.auto.commit": False,
                                  "group.id": f"bench-{uuid.uuid4().hex}", "fetch.wait.max.ms": 5,
                                  "fetch.min.bytes": 1})
        topic = settings.topics.decisions
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.partitions = [TopicPartition(topic, p, 0) for p in partitions]
        self.consumer.assign(self.partitions)
        self.arrived: dict[tuple[str, float], tuple[float, ScalingDecision]] = {}
        self.cond = threading.Condition()
        self.stopping, self.pause_wanted, self.pause_done = threading.Event(), threading.Event(), threading.Event()
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
    phase_s: float = 0.0  # where the job's windows start (`monitor.windows.phase_for`)
    index: int = 0

    def timestamp(self, i: int) -> float:
        return self.base + i * REPORT_INTERVAL_S

    def until_closer(self) -> tuple[list[float], float, float]:
        """(filler timestamps, the closer's timestamp, end of the window the closer closes)."""
        current = window_start_for(self.timestamp(self.index + 1), self.loop_interval_s, self.phase_s)
        fillers = []
        while True:
            self.index += 1
            ts = self.timestamp(self.index)
            if window_start_for(ts, self.loop_interval_s, self.phase_s) > current:
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

    def parts(self) -> dict[str, list[float]]:
        """The samples and their breakdown by the decision's own timestamps, ms."""
        return {"report_to_decision_ms": self.samples_ms, "report_to_window_closed_ms": self.monitor_ms,
                "window_closed_to_decision_ms": self.analyze_plan_ms, "decision_to_received_ms": self.delivery_ms}

    def json(self) -> dict[str, Any]:
        """The summaries, and every sample in the order taken: [total, monitor, analyze+plan, delivery]."""
        out: dict[str, Any] = {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()
                               if not k.endswith("_ms")}
        for name, values in self.parts().items():
            out[name] = {k: round(v, 2) for k, v in summary(values).items()}
        out["meets_floor"] = summary(self.samples_ms)["p99"] < LATENCY_P99_FLOOR_MS
        out["samples_ms"] = [[round(x, 1) for x in sample] for sample in zip(*self.parts().values(), strict=True)]
        return out


def measure_latency(
    broker: Service, redis: Service, workdir: Path, samples: int, jobs: int, partitions: int,
    loop_interval_s: float, layout: str, jitter_ms: float, stagger_ms: float, loop: asyncio.Runner, seed: int,
) -> Latency:
    settings = run_settings(broker, redis, db=1, partitions=partitions, loop_interval_s=loop_interval_s)
    rng = random.Random(seed)
    job_ids = [f"latency-{j:03d}" for j in range(jobs)]
    rounds = math.ceil(samples / jobs)
    reports_per_window = math.ceil(loop_interval_s / REPORT_INTERVAL_S)
    base = aligned_base((rounds + WARMUP_ROUNDS + 1) * reports_per_window * REPORT_INTERVAL_S, loop_interval_s)
    clocks = [JobClock(job, base, loop_interval_s, phase_for(job, loop_interval_s, settings.window_spread))
              for job in job_ids]
    ensure_topics(settings)
    register_jobs(settings, job_ids, mode="recommend")
    knowledge = RedisKnowledge(settings)
    collector = DecisionCollector(settings)
    p = producer(settings, linger_ms=0)
    groups = [ALL_STAGES] if layout == "all-in-one" else [[stage] for stage in ALL_STAGES]
    workers = [start_worker(settings, workdir, stages) for stages in groups]
    result = Latency(samples_ms=[], layout=layout, workers=groups)
    sent_total = 0
    try:
        console.print(f"[bold]latency[/bold]: {layout} worker(s) up; {rounds} rounds x {jobs} jobs "
                      f"after {WARMUP_ROUNDS} warm-up rounds")
        cpu_start = wall_start = 0.0
        for round_no in range(rounds + WARMUP_ROUNDS):
            plan = [(clock.job, *clock.until_closer()) for clock in clocks]
            fillers = [(job.encode(), make_report(job, ts, rng)) for job, fill, _, _ in plan for ts in fill]
            produce_all(p, settings.topics.metrics, fillers)
            sent_total += len(fillers)
            wait_accepted(loop, knowledge, sent_total, workers, timeout=120 if round_no == 0 else 30)
            # A random pause so closers arrive at random phases of the agents' fetch cycle.
            time.sleep(rng.uniform(0, jitter_ms / 1000))
            sent_at: dict[tuple[str, float], float] = {}
            for job, _, closer_ts, window_end in plan:
                value = make_report(job, closer_ts, rng)
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
                cpu_start, wall_start = workers_cpu(workers), time.monotonic()
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
        result.worker_cpu_pct = 100 * (workers_cpu(workers) - cpu_start) / max(elapsed, 1e-9)
    finally:
        for worker in workers:
            worker.stop()
        collector.close()
        loop.run(knowledge.close())
    return result


def workers_cpu(workers: list[AgentWorker]) -> float:
    return sum(process_cpu_seconds(w.process.pid) for w in workers)


def idle_cpu(workers: list[AgentWorker], broker: Service, seconds: float) -> tuple[float, float]:
    """CPU % of the workers and the broker with no traffic: the price of short fetch waits."""
    workers_before, broker_before = workers_cpu(workers), process_cpu_seconds(broker.pid)
    time.sleep(seconds)
    return (100 * (workers_cpu(workers) - workers_before) / seconds,
            100 * (process_cpu_seconds(broker.pid) - broker_before) / seconds)


def wait_accepted(loop: asyncio.Runner, knowledge: Knowledge, target: int, workers: list[AgentWorker],
                  timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while loop.run(knowledge.counters()).get("reports_accepted", 0) < target:
        for worker in workers:
            if worker.process.poll() is not None:
                raise RuntimeError(f"a worker exited early:\n{worker.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the monitor did not accept {target} reports within {timeout:.0f} s")
        time.sleep(POLL_S)


