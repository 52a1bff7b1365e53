"""Load: many jobs, each reporting every second, against the agents on their own broker and Redis.

`run` starts a broker, Redis and `workers` agent workers (all four stages, one consumer group),
registers `jobs` jobs (mode `recommend`) and sends one report per job per second of metric time,
`speedup` times faster than real time. Every `sample_s` it records the agents' consumer lag (records
published to their input topics and not yet committed by their group, summed over metrics, windows
and analyses), each worker's resident memory, Redis's used memory and the decisions made so far; after
the load stops, how long the agents take to drain what is left. Over the load it measures the CPU each
part used (the workers, the broker, Redis, and this process, the load generator with its probes) and
the machine's idle time, in cores: where the machine's cores went. At the end it reads the decisions
topic for how long each window waited from its close to its decision (`decision_latencies`). Job histories are kept at
`history_length` windows, short so that the knowledge base reaches its per-job bound within the run.
`python -m bench.load` and tests/reliability/test_load.py drive it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from subprocess import Popen

import numpy as np
import psutil
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console

from contracts.settings import Settings
from infra.kafka import ensure_topics, kafka_client_config
from monitor.windows import closed_window_ends, phase_for
from stack.processes import free_port, start_broker, start_redis, start_redis_cluster
from stack.services import AgentWorker, isolated_settings, register_jobs, start_agents


@dataclass
class Sample:
    at_s: float
    reports_sent: int
    lag: int
    lag_by_topic: dict[str, int]
    worker_rss_mb: list[float]
    redis_used_mb: float
    # What the knowledge holds: used memory less Redis's overhead (client buffers, which swing with the load).
    redis_dataset_mb: float
    decisions: int


@dataclass
class LoadResult:
    jobs: int
    minutes: float
    speedup: float
    workers: int
    history_length: int
    reports_sent: int
    window_spread: bool = True
    redis_nodes: int = 1  # more than one: a Redis Cluster
    samples: list[Sample] = field(default_factory=list)
    drain_s: float | None = None
    # After the load stops, each second: (seconds since, lag per topic, decisions so far): where a drain waits.
    drain_trace: list[tuple[float, dict[str, int], int]] = field(default_factory=list)
    # Samples taken while the workers drain (every `sample_s`): memory is judged over the decisions made,
    # and a slower run makes some of them after the load stopped.
    drain_samples: list[Sample] = field(default_factory=list)
    decisions: int = 0
    windows_expected: int = 0
    behind_s: float = 0.0  # how far the producer fell behind its schedule (the bench machine's limit)
    # With a worker killed (`kill_at_s`): when, and what the decisions topic shows.
    killed_at_s: float | None = None
    takeover: Takeover | None = None
    # Cores each part used over the load (CPU seconds / wall seconds), and the machine's idle cores;
    # without the workers' figure when one was killed (its CPU time went with it).
    cpu_cores: dict[str, float] = field(default_factory=dict)
    # From each window's close to its decision, read from the decisions topic (`decision_latencies`).
    latency_s: dict[str, float] = field(default_factory=dict)

    @property
    def max_lag(self) -> int:
        return max((s.lag for s in self.samples), default=0)

    @property
    def median_lag(self) -> float:
        return float(statistics.median(s.lag for s in self.samples)) if self.samples else 0.0

    def summary(self) -> dict[str, float | int | None]:
        half = [s for s in self.samples if s.at_s >= self.minutes * 30 / self.speedup]
        rss = [max(s.worker_rss_mb) for s in self.samples]
        return {
            "reports_sent": self.reports_sent,
            "reports_per_s": round(self.reports_sent * self.speedup / (self.minutes * 60), 1),
            "max_lag_records": self.max_lag,
            "median_lag_records": round(self.median_lag),
            "max_lag_second_half": max((s.lag for s in half), default=0),
            "drain_s": None if self.drain_s is None else round(self.drain_s, 1),
            "worker_rss_mb_max": round(max(rss, default=0.0), 1),
            "worker_rss_mb_at_half": round(half[0].worker_rss_mb[0] if half else 0.0, 1),
            "redis_mb_max": round(max((s.redis_used_mb for s in self.samples), default=0.0), 1),
            "redis_mb_at_half": round(half[0].redis_used_mb if half else 0.0, 1),
            "redis_mb_end": round(self.samples[-1].redis_used_mb if self.samples else 0.0, 1),
            "redis_dataset_mb_end": round(self.samples[-1].redis_dataset_mb if self.samples else 0.0, 1),
            "decisions": self.decisions,
            "windows_expected": self.windows_expected,
            "producer_behind_s": round(self.behind_s, 1),
            **{f"decision_latency_{q}_s": wait for q, wait in self.latency_s.items()},
            **{f"cpu_cores_{part}": cores for part, cores in self.cpu_cores.items()},
            **({} if self.takeover is None else {f"kill_{k}": v for k, v in asdict(self.takeover).items()}),
        }


@dataclass(frozen=True)
class Takeover:
    """What a worker killed under load cost, read from the decisions topic: windows never decided, windows
    decided more than once (a redelivery publishes the committed decision again, same id), and how long the
    jobs it held went without a decision (the longest gap between a job's decisions across the kill, less
    one window: the group's rebalance and the survivors' catching up)."""

    windows_lost: int
    decisions_repeated: int
    jobs_interrupted: int  # jobs whose decisions stopped for more than 1.5 windows across the kill
    longest_gap_s: float
    median_gap_s: float  # over the interrupted jobs


def takeover(decided: dict[str, list[tuple[float, float]]], expected: dict[str, list[float]], killed_at: float,
             interval_s: float) -> Takeover:
    """`decided`: per job, (window end, published at) of every decision on the topic; `expected`: per job,
    the window ends its reports closed; `killed_at`: the wall time of the kill."""
    lost = sum(len(set(ends) - {end for end, _ in decided.get(job, [])}) for job, ends in expected.items())
    repeated = sum(len(rows) - len({end for end, _ in rows}) for rows in decided.values())
    gaps = []
    for rows in decided.values():
        times = sorted(at for _, at in rows)
        spanning = [b - a for a, b in pairwise(times) if a <= killed_at < b]
        gaps += [gap - interval_s for gap in spanning if gap > 1.5 * interval_s]
    return Takeover(lost, repeated, len(gaps), round(max(gaps, default=0.0), 1),
                    round(statistics.median(gaps), 1) if gaps else 0.0)


def cpu_seconds(pids: list[int], children: bool = True) -> float | None:
    """User and system CPU seconds of the processes `pids` (and their children, unless told not to: a
    process that started the others); None if one has gone."""
    try:
        tree = [psutil.Process(pid) for pid in pids]
        if children:
            tree += [child for process in list(tree) for child in process.children(recursive=True)]
        return sum(t.user + t.system for t in (process.cpu_times() for process in tree))
    except psutil.NoSuchProcess:
        return None


class CpuMeter:
    """The CPU each part of a run uses from its creation to `stop`, in cores, and the machine's idle cores.
    A part is processes with their children; `alone` names the parts counted without theirs (the process
    that started the other parts)."""

    def __init__(self, parts: dict[str, list[int]], alone: tuple[str, ...] = ()):
        self.parts, self.alone = parts, alone
        self.started, self.idle = time.monotonic(), psutil.cpu_times().idle
        self.used = self._used()

    def _used(self) -> dict[str, float | None]:
        return {part: cpu_seconds(pids, part not in self.alone) for part, pids in self.parts.items()}

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self.started
        cores = {"idle": round((psutil.cpu_times().idle - self.idle) / wall, 2)}
        for part, after in self._used().items():
            before = self.used[part]
            if before is not None and after is not None:
                cores[part] = round((after - before) / wall, 2)
        return cores


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def prometheus_lines(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode().splitlines()


def counter_total(lines: list[str], name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))


class LagProbe:
    """Records in the agents' input topics not yet committed by their consumer group."""

    def __init__(self, settings: Settings, group: str):
        self.topics = [settings.topics.metrics, settings.topics.windows, settings.topics.analyses]
        self.partitions = [TopicPartition(t, p) for t in self.topics for p in range(settings.topic_partitions)]
        # Never subscribes: it only reads the group's committed offsets, so it does not join the group.
        self.consumer = Consumer({**kafka_client_config(settings), "group.id": group, "enable.auto.commit": False})

    def lag(self) -> dict[str, int]:
        committed = self.consumer.committed(self.partitions, timeout=10)
        by_topic = dict.fromkeys(self.topics, 0)
        for tp in committed:
            _, high = self.consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)
            done = tp.offset if tp.offset >= 0 else 0
            by_topic[tp.topic] += max(0, high - done)
        return by_topic

    def close(self) -> None:
        self.consumer.close()


def report_bytes(job: str, timestamp: float) -> bytes:
    # What a steady job at 2 slots sends each second; built by hand, 1,000 per second must be cheap.
    return (
        f'{{"job_id":"{job}","timestamp":{timestamp},"interval_s":1.0,"parallelism":2,"records_in":200,'
        f'"records_out":200,"busy_time_s":1.0,"source":{{"arrival_rate":200.0,"backlog":50,"partitions":8}}}}'
    ).encode()


def run(
    jobs: int = 1000,
    minutes: float = 10.0,
    workers: int = 2,
    history_length: int = 20,
    sample_s: float = 10.0,
    speedup: float = 1.0,
    window_spread: bool = True,
    drain_limit_s: float = 300.0,
    redis_nodes: int = 1,
    kill_at_s: float | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
) -> LoadResult:
    """See the module's docstring. With `kill_at_s`, the first worker is killed (SIGKILL) that many seconds
    into the load, and the decisions topic is read at the end for what that cost (`Takeover`)."""
    console = console or Console()
    workdir = workdir or Path(f".autoscaler/bench-load-{uuid.uuid4().hex[:6]}")
    workdir.mkdir(parents=True, exist_ok=True)
    broker = start_broker(log_path=workdir / "broker.log")
    # One redis-server, or a Redis Cluster of `redis_nodes` primaries.
    redis_servers = [start_redis(log_path=workdir / "redis.log")] if redis_nodes == 1 else \
        start_redis_cluster(redis_nodes, workdir / "redis-cluster")
    settings = isolated_settings(broker.port, redis_servers[0].port, f"load{uuid.uuid4().hex[:4]}",
                                 f"load-{uuid.uuid4().hex[:6]}", 10.0).model_copy(
        update={"topic_partitions": 8, "history_length": history_length, "window_spread": window_spread,
                "redis_cluster": redis_nodes > 1})
    names = [f"load-{i:04d}" for i in range(jobs)]
    agents: list[AgentWorker] = []
    processes: list[Popen[bytes]] = []
    result = LoadResult(jobs=jobs, minutes=minutes, speedup=speedup, workers=workers, history_length=history_length,
                        reports_sent=0, window_spread=window_spread, redis_nodes=redis_nodes)
    try:
        ensure_topics(settings)
        register_jobs(settings, names, mode="recommend")
        ports = [free_port() for _ in range(workers)]
        for port in ports:
            env = {"AUTOSCALER_HISTORY_LENGTH": str(history_length), "AUTOSCALER_LOG_LEVEL": "warning"}
            agents.append(start_agents(settings, workdir / f"agents-{port}.log", web_port=port, env=env, timeout=90))
        processes = [worker.process for worker in agents]
        time.sleep(12)  # the consumer group settles (joins wait for the rebalance timeout)
        probe = LagProbe(settings, settings.app_id)
        stores = [redis.Redis(host="127.0.0.1", port=server.port) for server in redis_servers]
        producer = Producer({**kafka_client_config(settings), "linger.ms": 20, "batch.num.messages": 2000,
                             "queue.buffering.max.messages": 2_000_000})
        topic = settings.topics.metrics
        meter = CpuMeter({"workers": [p.pid for p in processes], "broker": [broker.process.pid],
                          "redis": [server.process.pid for server in redis_servers], "generator": [os.getpid()]},
                         alone=("generator",))
        began = time.time()
        seconds = int(minutes * 60)
        # Metric time ends at the wall clock: compressed reports must not come from the future.
        first_second = int(began + seconds / speedup) - seconds
        next_sample = sample_s
        killed_wall = 0.0
        console.print(f"{jobs} jobs x 1 report/s for {minutes:g} min of metric time at {speedup:g}x, "
                      f"{workers} worker(s), history {history_length}")
        for second in range(1, seconds + 1):
            stamp = float(first_second + second)
            for job in names:
                producer.produce(topic, key=job.encode(), value=report_bytes(job, stamp))
            producer.poll(0)
            result.reports_sent += jobs
            wait = began + second / speedup - time.time()
            if wait > 0:
                time.sleep(wait)
            else:
                result.behind_s = max(result.behind_s, -wait)
            if kill_at_s is not None and result.killed_at_s is None and second / speedup >= kill_at_s:
                agents[0].process.kill()  # the others carry on: they are sampled and scraped from now on
                killed_wall, result.killed_at_s = time.time(), round(second / speedup, 1)
                processes, ports = processes[1:], ports[1:]
                console.print(f"{second:5d} s  killed worker {agents[0].process.pid}")
            if second / speedup >= next_sample:
                next_sample += sample_s
                sample = take_sample(round(second / speedup), result.reports_sent, probe, processes, stores, ports)
                result.samples.append(sample)
                console.print(f"{second:5d} s  lag {sample.lag:7d}  rss {sample.worker_rss_mb}  "
                              f"redis {sample.redis_used_mb:7.1f} MB  decisions {sample.decisions}")
        producer.flush(60)
        result.cpu_cores = meter.stop()
        stopped = time.time()
        next_sample = time.time() + sample_s
        while time.time() - stopped < drain_limit_s:
            if time.time() >= next_sample:
                next_sample += sample_s
                result.drain_samples.append(take_sample(round(time.time() - began), result.reports_sent, probe,
                                                        processes, stores, ports))
            left = probe.lag()
            result.drain_trace.append((round(time.time() - stopped, 1), short_topics(left), decisions_made(ports)))
            if sum(left.values()) == 0:
                result.drain_s = time.time() - stopped
                break
            time.sleep(1.0)
        result.decisions = settled_decisions(ports)
        # Windows the reports closed: every window from the first report's to the last one's, which stays open.
        interval = settings.loop_interval_s
        expected = {job: closed_window_ends(first_second + 1, first_second + seconds, interval,
                                            phase_for(job, interval, settings.window_spread)) for job in names}
        result.windows_expected = sum(len(ends) for ends in expected.values())
        result.samples.append(take_sample(round(seconds / speedup), result.reports_sent, probe, processes, stores,
                                          ports))
        probe.close()
        decided = decision_times(settings)
        result.latency_s = decision_latencies(decided)
        if result.killed_at_s is not None:
            result.takeover = takeover({job: [(end, at) for end, at, _ in rows] for job, rows in decided.items()},
                                       expected, killed_wall, interval)
            result.decisions = result.windows_expected - result.takeover.windows_lost
        dead = [p.pid for p in processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"agent worker(s) {dead} died under load; see {workdir}")
    finally:
        for worker in agents:
            worker.stop()
        broker.stop()
        for server in redis_servers:
            server.stop()
    return result


def decision_times(settings: Settings) -> dict[str, list[tuple[float, float, float]]]:
    """Per job, (window end, published at, window closed at) of every decision on the decisions topic."""
    from tests.reliability.helpers import TopicLog

    log = TopicLog(settings, settings.topics.decisions)
    try:
        log.read_all()
    finally:
        log.close()
    decided: dict[str, list[tuple[float, float]]] = {}
    for (_, value, _), at in zip(log.records, log.published, strict=True):
        decision = json.loads(value)
        decided.setdefault(decision["job_id"], []).append(
            (float(decision["window_end"]), at, float(decision["closed_at"])))
    return decided


def decision_latencies(decided: dict[str, list[tuple[float, float, float]]]) -> dict[str, float]:
    """From a window's close to its decision's first publication (a republished decision is not a later
    one), over every window decided: the median, the 99th percentile and the longest, in seconds."""
    first: dict[tuple[str, float], float] = {}
    for job, rows in decided.items():
        for end, at, closed in rows:
            first[(job, end)] = min(first.get((job, end), math.inf), at - closed)
    if not first:
        return {}
    waits = np.array(list(first.values()))
    return {"p50": round(float(np.quantile(waits, 0.5)), 2), "p99": round(float(np.quantile(waits, 0.99)), 2),
            "max": round(float(waits.max()), 2)}


def decisions_made(ports: list[int]) -> int:
    """Decisions the workers on `ports` have made so far (their Prometheus counters)."""
    return int(sum(counter_total(prometheus_lines(port), "autoscaler_decisions_total") for port in ports))


def settled_decisions(ports: list[int], quiet_s: float = 3.0, limit_s: float = 30.0) -> int:
    """The decisions made once the count has not moved for `quiet_s` (at most `limit_s`): the lag is read
    from committed offsets, and the workers' decision counters need not have caught up with them the moment
    it reads 0. A decision that never comes still leaves the count short."""
    count, since, began = decisions_made(ports), time.time(), time.time()
    while time.time() - since < quiet_s and time.time() - began < limit_s:
        time.sleep(0.5)
        now = decisions_made(ports)
        if now != count:
            count, since = now, time.time()
    return count


def short_topics(by_topic: dict[str, int]) -> dict[str, int]:
    """Lag per topic by its short name (`metrics`, `windows`, `analyses`)."""
    return {k.rsplit(".", 1)[-1]: v for k, v in by_topic.items()}


def take_sample(second: int, sent: int, probe: LagProbe, processes: list,
                stores: list[redis.Redis], ports: list[int]) -> Sample:  # type: ignore[type-arg]
    """The lag, the workers' memory, Redis's (summed over a cluster's nodes) and the decisions so far."""
    by_topic = probe.lag()
    nodes = [store.info("memory") for store in stores]
    memory = {name: sum(int(node[name]) for node in nodes) for name in ("used_memory", "used_memory_dataset")}
    return Sample(
        at_s=float(second), reports_sent=sent, lag=sum(by_topic.values()),
        lag_by_topic=short_topics(by_topic),
        worker_rss_mb=[round(rss_mb(p.pid), 1) for p in processes],
        redis_used_mb=round(int(memory["used_memory"]) / 2**20, 1),
        redis_dataset_mb=round(int(memory["used_memory_dataset"]) / 2**20, 1),
        decisions=decisions_made(ports),
    )
