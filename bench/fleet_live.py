"""`python -m bench.fleet_live`: three jobs sharing one standalone cluster, under three ways of sizing them.

Starts a broker and Redis of its own and a standalone cluster from the pyspark wheel (two workers of
`--slots-per-worker` cores each: the cluster's budget), then, per round (`--repeats`) and per arm (`--arm`,
each round starting one arm later), runs three demo jobs (`--cost-ms` of waiting per record) at once under
one set of agents (`stack.live_fleet.run_fleet_live`). The loads are steps from `--base` to `--peak` records/s
whose peaks overlap in turn (`LOADS`): the jobs' peaks together need more slots than the cluster has.

- `fleet`: the default policy, executors changed in place, every job on one registered cluster of the
  budget: the fleet step shares it (docs/architecture.md, "The fleet step");
- `dynamic`: each job on Spark's dynamic allocation (from one executor up to `--max-parallelism`), the
  agents in recommend mode (they measure, never act): the cluster's master grants executors as they free up;
- `static`: the budget split evenly, fixed, the agents in recommend mode.

The jobs' time constants are compressed by COMPRESSION (their scale-down delay and catch-up duration).
Per job: time beyond the backlog target and the lag's p95 as the agents measured them
(`evaluation.live.live_measures`), executor-seconds (the cores the master granted its application, sampled
every second, from the loads' start to the end of the drain) and completed rescales. Per run: the fleet's
executor-seconds, the worst job's time beyond target, the most cores in use, and starvation
(`evaluation.fleet.starvation_s` on the agents' windows: a job whose executors carry less than its
arrivals at `--slot-rate` records/s per executor, while its backlog is beyond target, for `--starved-after-s`
or more, while another job holds more than its own arrivals need). Prints a table (median [worst] of the
runs) and writes JSON after every run.
"""

from __future__ import annotations

import json
import math
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from bench.backends_live import CoreSampler
from bench.common import RESULTS, table, write_result
from contracts.analyses import records_beyond_target
from contracts.decisions import EventType
from contracts.fleet import ClusterConfig
from evaluation.fleet import starvation_s
from evaluation.live import first_window_s, live_measures
from evaluation.simulator import seconds_beyond_target
from plan.fleet import MOVE
from stack.cluster import StandaloneCluster, start_cluster
from stack.live import LiveRun
from stack.live_fleet import Member, run_fleet_live
from stack.processes import start_broker, start_redis
from stack.services import isolated_settings
from tests.support.backends import dynamic_conf, executor_seconds, median_worst, rotated

WINDOW_S = 5.0
COMPRESSION = 10.0
JOB_TIMES = {"scale_down_delay_s": f"{300 / COMPRESSION:g}", "catch_up_duration_s": f"{300 / COMPRESSION:g}",
             "metrics_window_s": f"{2 * WINDOW_S:g}"}
ARMS = ("fleet", "dynamic", "static")
STALE_WINDOWS = 3  # a job's latest window counts for starvation this many windows long
# Per job, (seconds at the base before its peak, seconds at the peak, seconds at the base after): the peaks
# overlap pairwise for 80 s and all three for 20 s.
LOADS = ((20, 140, 140), (80, 140, 80), (140, 140, 20))
MEASURES = {"fleet_executor_seconds": ".0f", "worst_beyond_target_s": ".0f", "total_beyond_target_s": ".0f",
            "left_beyond_target": ".0f", "starved_s": ".0f", "worst_lag_p95_s": ".1f", "actions": ".0f",
            "moves": ".0f", "move_s_median": ".0f", "max_cores": ".0f"}
app = typer.Typer(add_completion=False, help=__doc__)


def beyond_target(windows: Sequence[Sequence[float]], target_s: float) -> tuple[float, float]:
    """A job's seconds beyond its backlog target and the records beyond it in its last window, from its
    windows (time from the load's start, arrival rate, backlog), counted as every live measure counts them
    (`evaluation.simulator.seconds_beyond_target`, the first window as long as the median between them)."""
    if not windows:
        return 0.0, 0.0
    ends, arrival, backlog = (np.array(column, dtype=float) for column in zip(*windows, strict=True))
    seconds = seconds_beyond_target(ends, np.nan_to_num(arrival), backlog, target_s, first_window_s(ends, WINDOW_S))
    return seconds, records_beyond_target(windows[-1][2], windows[-1][1], target_s)


def held_at(samples: list[list[float]], at: float) -> int:
    """The last sampled count at or before `at` (0 before the first); samples are (time, count)."""
    before = [int(c) for t, c in samples if t <= at]
    return before[-1] if before else 0


def starvation(jobs: dict[str, dict[str, Any]], span_s: float, slot_rate: float, target_s: float, after_s: float
               ) -> dict[str, float]:
    """Per job, the seconds it starved (`evaluation.fleet.starvation_s`) on a grid of WINDOW_S over the run's
    span, from what a run keeps per job (`run_arm`): its sampled cores and the agents' windows (time from the
    load's start, arrival rate, backlog). Each grid point takes the job's latest window if it is at most
    STALE_WINDOWS old (a busy job's windows arrive late or are skipped), else counts the job as not starving."""
    grid = np.arange(WINDOW_S, span_s + 1e-9, WINDOW_S)
    names = list(jobs)
    held = np.zeros((len(grid), len(names)), dtype=int)
    needs, late = np.zeros_like(held), np.zeros(held.shape, dtype=bool)
    for j, job in enumerate(names):
        windows = sorted(jobs[job]["windows"])
        for i, t in enumerate(grid):
            held[i, j] = held_at(jobs[job]["cores"], t)
            seen = [w for w in windows if t - STALE_WINDOWS * WINDOW_S < w[0] <= t]
            if seen:
                _, arrival, backlog = seen[-1]
                needs[i, j] = math.ceil(arrival / slot_rate - 1e-9)
                late[i, j] = records_beyond_target(backlog, arrival, target_s) > 0
    alone = np.eye(len(names), dtype=bool)  # job j's lateness only: its own starvation
    return {job: starvation_s(held, needs, late & alone[j], WINDOW_S, after_s) for j, job in enumerate(names)}


def move_sides(run: LiveRun, began: float) -> list[tuple[float, float, int, float | None]]:
    """A job's sides of fleet moves (`plan.fleet.MOVE` notices): (move_at, when its decision's notice was
    published, from the load's start; +1 giving, -1 taking; when its rescale completed, None if it did not)."""
    completed = {e.decision_id: e.timestamp for e in run.of(EventType.COMPLETED)}
    return [(float(e.numbers.get("move_at") or 0.0), round(e.timestamp - began, 1),
             1 if e.to_parallelism < e.from_parallelism else -1,
             round(completed[e.decision_id] - began, 1) if e.decision_id in completed else None)
            for e in run.of(EventType.NOTICE) if e.code == MOVE]


def move_times(jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The moves of a run: how many opened, how many the receiver took, and the median and longest time
    from the giver's decision to the receiver's executors running (its rescale completed)."""
    sides = [side for j in jobs.values() for side in j.get("move_sides", [])]
    opened = {at: t for at, t, role, _ in sides if role > 0}
    taken = [done - opened[at] for at, _, role, done in sides if role < 0 and at in opened and done is not None]
    return {"moves": len(opened), "moves_taken": len(taken),
            "move_s_median": round(float(np.median(taken)), 1) if taken else None,
            "move_s_max": round(max(taken), 1) if taken else None}


def members(arm: str, run_id: str, cluster_url: str, cluster_name: str, budget: int, max_parallelism: int,
            base: float, peak: float, target_s: float) -> list[Member]:
    """The three jobs of an arm: their loads, registrations, runner arguments and starting parallelism."""
    common = {**JOB_TIMES, "backlog_target_s": f"{target_s:g}"}
    out = []
    for i, (before, at_peak, after) in enumerate(LOADS):
        shape = f"steps:{base:g}:{before},{peak:g}:{at_peak},{base:g}:{after}"
        job = f"{run_id}-{'abc'[i]}"
        if arm == "fleet":
            member = Member(job, ("--shape", shape), {**common, "scaling_backend": "in_place", "cluster": cluster_name},
                            ("--master", cluster_url, "--backend", "inplace"), 1)
        elif arm == "dynamic":
            member = Member(job, ("--shape", shape), {**common, "mode": "recommend"},
                            ("--master", cluster_url, "--backend", "restart", *dynamic_conf(max_parallelism)),
                            max_parallelism)
        elif arm == "static":
            member = Member(job, ("--shape", shape), {**common, "mode": "recommend"},
                            ("--master", cluster_url, "--backend", "restart"), max(1, budget // len(LOADS)))
        else:
            raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")
        out.append(member)
    return out


def run_arm(arm: str, cluster: StandaloneCluster, budget: int, ports: tuple[int, int], knobs: dict[str, Any],
            workdir: Path) -> dict[str, Any]:
    """One run of an arm: its measures per job and over the fleet (the module doc)."""
    run_id = uuid.uuid4().hex[:6]
    settings = isolated_settings(*ports, f"f{run_id}", f"fleet-{run_id}", loop_interval_s=WINDOW_S)
    name = f"fleet-{run_id}"
    workers = len(cluster.workers)
    fleet = members(arm, run_id, cluster.url, name, budget, knobs["max_parallelism"], knobs["base"], knobs["peak"],
                    knobs["backlog_target_s"])
    sampler = CoreSampler(cluster)
    sampler.start()
    try:
        runs = run_fleet_live(
            settings, workdir, fleet, max_parallelism=knobs["max_parallelism"], cost_ms=knobs["cost_ms"],
            drain_s=knobs["drain_s"], warm_up_s=knobs["warm_up_s"], warm_up_rate=knobs["base"],
            watched_s=knobs["watched_s"], drain_max_s=knobs["drain_max_s"], backlog_target_s=knobs["backlog_target_s"],
            cluster=ClusterConfig(name=name, workers=workers, slots_per_worker=budget // workers))
    finally:
        sampler.done.set()
        sampler.join(5)
    began = next(iter(runs.values())).started
    end = max([began + max(sum(load) for load in LOADS) + knobs["drain_s"],
               *(a.window_end for r in runs.values() for a in r.analyses)])  # the drain ends when every job is back
    jobs: dict[str, dict[str, Any]] = {}
    for m in fleet:
        measured = live_measures(runs[m.job], knobs["backlog_target_s"], initial_parallelism=m.parallelism)
        cores = sampler.of(f"autoscaler-{m.job}")
        windows = [(round(a.window_end - began, 1), a.arrival_rate, a.backlog or 0) for a in runs[m.job].analyses
                   if a.arrival_rate is not None and a.window_end >= began]
        late_s, left = beyond_target(windows, knobs["backlog_target_s"])
        jobs[m.job] = {"executor_seconds": round(executor_seconds(cores, began, end), 1),
                       "beyond_target_s": late_s, "beyond_at_end": round(left),
                       "lag_p95_s": round(measured["lag_p95_s"], 1),
                       "peak_backlog": measured["peak_backlog"], "actions": measured["actions"],
                       "failed": measured["failed"],
                       "cores": [(round(t - began, 1), c) for t, c in cores if began - 60 <= t <= end],
                       "windows": windows, "load": runs[m.job].load_summary, "timeline": runs[m.job].timeline()}
        jobs[m.job]["move_sides"] = move_sides(runs[m.job], began)
    starved = starvation(jobs, end - began, knobs["slot_rate"], knobs["backlog_target_s"], knobs["starved_after_s"])
    for job, seconds in starved.items():
        jobs[job]["starved_s"] = seconds
    return {"arm": arm, "jobs": jobs, "span_s": round(end - began, 1),
            "fleet_executor_seconds": round(sum(j["executor_seconds"] for j in jobs.values()), 1),
            **lateness(jobs), "starved_s": sum(j["starved_s"] for j in jobs.values()),
            "worst_lag_p95_s": max(j["lag_p95_s"] for j in jobs.values()),
            "actions": sum(j["actions"] for j in jobs.values()),
            "max_cores": max((c for t, c in sampler.samples if began <= t <= end), default=None),
            **move_times(jobs)}


def summary_table(rows: list[dict[str, Any]], arms: list[str], settings: dict[str, Any]) -> Table:
    """Median [worst] of the runs per arm."""
    result = table(f"three jobs, one cluster of {settings['budget']} cores (2 workers); loads {settings['base']:g} -> "
                   f"{settings['peak']:g} rec/s, peaks overlapping; time constants compressed "
                   f"{settings['compression']:g}x; median \\[worst] of the runs", "arm", "runs", "fleet executor-s",
                   "worst job beyond target s", "all jobs beyond target s", "records beyond target at the end",
                   "starved s", "worst job lag p95 s",
                   "actions", "moves", "move s (median)", "most cores in use")
    for arm in arms:
        runs = [r for r in rows if r["arm"] == arm]
        result.add_row(arm, str(len(runs)), *(median_worst((r[k] for r in runs), fmt) for k, fmt in MEASURES.items()))
    return result


def lateness(jobs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """A run's worst job's and all jobs' seconds beyond target, and the records beyond it at the end."""
    return {"worst_beyond_target_s": max(j["beyond_target_s"] for j in jobs.values()),
            "total_beyond_target_s": sum(j["beyond_target_s"] for j in jobs.values()),
            "left_beyond_target": sum(j["beyond_at_end"] for j in jobs.values())}


def restarve(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a written result with starvation and the time beyond target counted again (`starvation`,
    `beyond_target`) from what each run kept."""
    rows = result["rows"]
    for row in rows:
        for job in row["jobs"].values():
            late_s, left = beyond_target(job["windows"], result["backlog_target_s"])
            job["beyond_target_s"], job["beyond_at_end"] = late_s, round(left)
        row |= lateness(row["jobs"])
        starved = starvation(row["jobs"], row["span_s"], result["slot_rate"], result["backlog_target_s"],
                             result["starved_after_s"])
        for job, seconds in starved.items():
            row["jobs"][job]["starved_s"] = seconds
        row["starved_s"] = sum(starved.values())
        row |= move_times(row["jobs"])
    return rows


@app.command()
def main(
    arms: Annotated[list[str] | None, typer.Option("--arm", help=f"Which ({', '.join(ARMS)}); default all.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Rounds of every arm; each round starts one arm later.")] = 1,
    slots_per_worker: Annotated[int, typer.Option(min=1, help="Cores per worker (two workers: the budget).")] = 3,
    max_parallelism: Annotated[int, typer.Option(help="Executors one job may hold at most.")] = 4,
    base: Annotated[float, typer.Option(help="Records/s per job off its peak (and during the warm-up).")] = 50.0,
    peak: Annotated[float, typer.Option(help="Records/s per job at its peak.")] = 300.0,
    cost_ms: Annotated[float, typer.Option(help="Waiting per record (the job's cost_ms): 8 ms at 300 rec/s keeps the "
                                                "executors, not this machine's 2 cores, the limit.")] = 8.0,
    slot_rate: Annotated[float, typer.Option(help="Records/s one executor carries at full use (what a job's "
                                                  "arrivals need, for starvation).")] = 105.0,
    backlog_target_s: Annotated[float, typer.Option(help="Each job's backlog target, seconds of arrivals.")] = 20.0,
    starved_after_s: Annotated[float, typer.Option(help="Starving counts from this long in a row (60 s "
                                                        "compressed, rounded up to two windows).")] = 10.0,
    warm_up_s: Annotated[float, typer.Option(help="Seconds at --base before the loads' steps.")] = 45.0,
    watched_s: Annotated[float, typer.Option(help="The warm-up's last seconds, with the agents watching.")] = 20.0,
    drain_s: Annotated[float, typer.Option(help="Seconds after the loads (measured).")] = 20.0,
    drain_max_s: Annotated[float, typer.Option(help="Then, up to this long after the loads, the run goes on while "
                                                    "any job is beyond its target (measured).")] = 300.0,
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "fleet_live.json",
    summarize: Annotated[Path | None, typer.Option(help="Only print the table of a JSON written before (its "
                                                       "starvation counted again); runs nothing.")] = None,
) -> None:
    """Run each arm in turn on one cluster; print the table and write JSON."""
    console = Console(width=160)
    if summarize is not None:
        result = json.loads(summarize.read_text())
        rows = restarve(result)
        console.print(summary_table(rows, list(dict.fromkeys(r["arm"] for r in rows)), result))
        return
    chosen = arms or list(ARMS)
    for arm in chosen:
        members(arm, "x", "spark://x:1", "x", 2 * slots_per_worker, max_parallelism, base, peak, 1.0)
    budget = 2 * slots_per_worker
    knobs = {"max_parallelism": max_parallelism, "base": base, "peak": peak, "cost_ms": cost_ms,
             "slot_rate": slot_rate, "backlog_target_s": backlog_target_s, "starved_after_s": starved_after_s,
             "warm_up_s": warm_up_s, "watched_s": watched_s, "drain_s": drain_s, "drain_max_s": drain_max_s}
    settings = {**knobs, "budget": budget, "workers": 2, "loads": LOADS, "window_s": WINDOW_S,
                "compression": COMPRESSION, "repeats": repeats}
    workdir = Path(tempfile.mkdtemp(prefix="fleet-live-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    cluster = start_cluster(workers=2, cores=slots_per_worker, log_dir=workdir / "cluster")
    rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    try:
        for round_ in range(repeats):
            for arm in rotated(chosen, round_):
                logs = workdir / f"{arm}-{round_}"
                console.print(f"round {round_ + 1}/{repeats}, {arm}; logs in {logs}")
                logs.mkdir()
                try:
                    rows.append({"round": round_, **run_arm(arm, cluster, budget, (broker.port, redis.port), knobs,
                                                            logs)})
                except Exception as exc:  # a failed run is recorded and shown; the others go on
                    console.print(f"[red]{arm} failed[/red]: {exc}")
                    failures.append({"round": round_, "arm": arm, "error": str(exc)})
                write_result(out, settings | {"rows": rows, "failures": failures}, console=console)
    finally:
        cluster.stop()
        broker.stop()
        redis.stop()
    console.print(summary_table(rows, chosen, settings))


if __name__ == "__main__":
    app()
