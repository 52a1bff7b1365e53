"""Several Spark jobs live at once under one set of agents: a fleet sharing one cluster.

What `python -m bench.fleet_live` runs. Each `Member` is a job with its own runner, checkpoint, topics
and load (`<run>.<job>.input` / `.output`); one agent worker (all four stages) serves them all, as it
would a platform's jobs. The broker and Redis of the settings (and the standalone cluster the members'
runner arguments name) must be running; the agents, the runners and the loads are started here and
stopped at the end. Each job's published analyses, decisions and events are kept in its own `LiveRun`
(`stack.live.Keeper`), so every single-job measure (`evaluation.live.live_measures`) applies per job.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

from confluent_kafka import Consumer

from contracts.analyses import records_beyond_target
from contracts.fleet import ClusterConfig
from contracts.settings import Settings
from infra.kafka import ensure_topics, group_consumer_config
from stack.live import Keeper, LiveRun, load_summary, report_interval, warm_up_load
from stack.processes import stop_pid
from stack.services import (
    register_cluster,
    register_jobs,
    start_agents,
    start_job_runner,
    start_load,
    wait_until_running,
)


@dataclass(frozen=True)
class Member:
    """One job of the fleet: its id, its load (the load generator's shape arguments), its registration
    (job settings), the job runner's arguments (`--master`, `--backend`, `--conf`s) and the parallelism it
    starts at."""

    job: str
    load_args: tuple[str, ...]
    registration: dict[str, str] = field(default_factory=dict)
    runner_args: tuple[str, ...] = ()
    parallelism: int = 1


def run_fleet_live(settings: Settings, workdir: Path, members: list[Member], *, max_parallelism: int,
                   cost_ms: float = 4.0, drain_s: float = 20.0, warm_up_s: float = 45.0, warm_up_rate: float = 100.0,
                   watched_s: float = 20.0, cluster: ClusterConfig | None = None, drain_max_s: float = 0.0,
                   backlog_target_s: float | None = None) -> dict[str, LiveRun]:
    """Run every member's job under its load until the last load ends plus `drain_s`, and then, up to
    `drain_max_s` in all, while any job's latest window has a backlog beyond `backlog_target_s` seconds of
    its arrivals (a run that ends first leaves that lateness unmeasured); per job, what the agents
    published about it. Every job first runs `warm_up_s` at `warm_up_rate` records/s (the load's
    start-up is not the measure; `stack.live.run_live` says why) and is registered `watched_s` before the
    warm-up ends (with `cluster`, registered first: the cluster they share); then every load starts at once.
    The runs' `started` is that moment for all of them."""
    if not 0 <= watched_s <= warm_up_s:
        raise ValueError(f"watched_s must be within 0..warm_up_s ({warm_up_s:g}), not {watched_s:g}")
    run = settings.topics.metrics.split(".")[0]
    topics = {m.job: (f"{run}.{m.job}.input", f"{run}.{m.job}.output") for m in members}
    ensure_topics(settings, extra=[t for pair in topics.values() for t in pair])
    follow = Consumer(group_consumer_config(settings.kafka_bootstrap, f"bench-{uuid.uuid4().hex[:8]}", "earliest"))
    follow.subscribe([settings.topics.analyses, settings.topics.decisions, settings.topics.scaling_events])
    agents = start_agents(settings, workdir / "agents.log", timeout=90)
    processes: list[Popen[bytes]] = []
    runs = {m.job: LiveRun(started=time.time(), input_topic=topics[m.job][0], output_topic=topics[m.job][1])
            for m in members}
    try:
        for m in members:
            log = workdir / f"runner-{m.job}.log"
            runner = start_job_runner(
                settings, m.job, workdir / f"job-{m.job}", log, max_parallelism=max_parallelism,
                parallelism=m.parallelism, args=[*m.runner_args, *report_interval(settings)],
                options={"cost_ms": str(cost_ms), "input_topic": topics[m.job][0], "output_topic": topics[m.job][1]})
            processes.append(runner)
            wait_until_running(runner, log)
        keepers = [Keeper(settings, m.job, runs[m.job]) for m in members]

        def keep(seconds: float) -> None:
            msg = follow.poll(seconds)
            for keeper in keepers:
                keeper(msg)

        warm = [start_load(settings, topics[m.job][0], workdir / f"warm-up-{m.job}.log",
                           warm_up_load(warm_up_s, warm_up_rate)) for m in members]
        processes += warm
        began, registered = time.time(), False
        while any(w.poll() is None for w in warm):
            if time.time() > began + warm_up_s + 120:
                raise TimeoutError(f"the warm-up loads did not end within {warm_up_s + 120:.0f} s; see {workdir}")
            if not registered and time.time() >= began + warm_up_s - watched_s:
                if cluster is not None:
                    register_cluster(settings, cluster)
                for m in members:
                    register_jobs(settings, [m.job], max_parallelism=str(max_parallelism), **m.registration)
                registered = True
            keep(0.2)
        loads = {m.job: start_load(settings, topics[m.job][0], workdir / f"load-{m.job}.log", list(m.load_args))
                 for m in members}
        processes += loads.values()
        started = time.time()
        for r in runs.values():
            r.started, r.watched_s = started, watched_s
        while True:
            keep(0.2)
            now = time.time()
            for job, load in loads.items():
                if runs[job].load_ended is None and load.poll() is not None:
                    runs[job].load_ended = now
            ended = [r.load_ended for r in runs.values()]
            if all(e is not None for e in ended):
                since = now - max(e for e in ended if e is not None)
                if since >= max(drain_s, drain_max_s) or (since >= drain_s and not _late(runs, backlog_target_s)):
                    break
        for job in loads:
            runs[job].load_summary = load_summary(workdir / f"load-{job}.log")
    finally:
        for process in reversed(processes):
            stop_pid(process.pid, timeout=60, process=process)
        agents.stop()
        follow.close()
    return runs


def _late(runs: dict[str, LiveRun], backlog_target_s: float | None) -> bool:
    """Whether any job's latest window has a backlog beyond `backlog_target_s` seconds of its arrivals."""
    if backlog_target_s is None:
        return False
    for run in runs.values():
        latest = max((a for a in run.analyses if a.arrival_rate is not None), key=lambda a: a.window_end, default=None)
        if latest is not None and records_beyond_target(latest.backlog, latest.arrival_rate, backlog_target_s) > 0:
            return True
    return False
