"""`python -m bench.backends_live`: one load, one standalone cluster, three ways of sizing the job.

Starts a broker and Redis of its own and a standalone cluster from the pyspark wheel (one worker,
`--max-parallelism` cores), then runs the demo job (4 ms of waiting per record) under the same load
in turn (`--repeats` rounds, each starting one arm later), each from one executor, each with the
agents running (`stack.live.run_live`):

- `inplace`: our default policy, executors changed in place (`autoscaler job run --backend inplace`);
- `restart`: our default policy, the query restarted from its checkpoint at each rescale;
- `dynamic`: Spark's own dynamic allocation (shuffle tracking, Spark's default timeouts, 1 to
  `--max-parallelism` executors) and no autoscaler of ours: the agents run in `recommend` mode, so
  they measure the job the same way but never act.

For each: executor-seconds (the cores the master granted, one-core executors, sampled every second
from the load's start to the end of the drain), the peak backlog and the time beyond the backlog
target as the agents measured them (`evaluation.live.live_measures`), and the actions. Prints a table
and writes JSON.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bench.common import code_version, machine_info
from evaluation.live import live_measures, load_start
from pipeline.loadgen import Steps, parse_shape
from stack.cluster import StandaloneCluster, start_cluster
from stack.live import run_live
from stack.processes import start_broker, start_redis, stop_pid
from stack.services import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results" / "backends_live.json"
ARMS = ("inplace", "restart", "dynamic")
WINDOW_S = 5.0
DRAIN_S = 40.0
app = typer.Typer(add_completion=False, help=__doc__)


def arm_setup(arm: str, master: str, max_parallelism: int) -> tuple[list[str], dict[str, str], int]:
    """The job runner's arguments, the job's registration and the parallelism it starts at, per arm."""
    base = ["--master", master]
    if arm == "inplace":
        return [*base, "--backend", "inplace"], {"scaling_backend": "in_place"}, 1
    if arm == "restart":
        return [*base, "--backend", "restart"], {}, 1
    if arm == "dynamic":
        # The application may grow to the maximum (spark.cores.max); dynamic allocation decides how many
        # executors it holds, from one. Spark's defaults otherwise (1 s backlog timeout, 60 s idle timeout).
        conf = {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
                "spark.dynamicAllocation.minExecutors": "1", "spark.dynamicAllocation.initialExecutors": "1",
                "spark.dynamicAllocation.maxExecutors": str(max_parallelism),
                "spark.scheduler.minRegisteredResourcesRatio": "0"}
        return [*base, "--backend", "restart", *(x for k, v in conf.items() for x in ("--conf", f"{k}={v}"))], \
            {"mode": "recommend"}, max_parallelism
    raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")


def executor_seconds(samples: list[tuple[float, int]], begin: float, end: float) -> float:
    """The integral of the cores in use over [begin, end], each sample holding until the next."""
    total = 0.0
    ordered = sorted(samples)
    for (t, cores), (t_next, _) in zip(ordered, [*ordered[1:], (end, 0)][:len(ordered)], strict=True):
        lo, hi = max(t, begin), min(t_next, end)
        if hi > lo:
            total += cores * (hi - lo)
    return total


class CoreSampler(threading.Thread):
    """Samples the cores the master has granted, every second, until stopped."""

    def __init__(self, cluster: StandaloneCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            cores = self.cluster.cores_in_use()
            if cores is not None:
                self.samples.append((time.time(), cores))
            self.done.wait(1.0)


def run_arm(arm: str, cluster: StandaloneCluster, broker_port: int, redis_port: int, shape: str, load_s: float,
            max_parallelism: int, warm_up_s: float, warm_up_rate: float, target_s: float, workdir: Path
            ) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    settings = isolated_settings(broker_port, redis_port, f"b{run_id}", f"backends-{run_id}", loop_interval_s=WINDOW_S)
    args, overrides, start = arm_setup(arm, cluster.url, max_parallelism)
    sampler = CoreSampler(cluster)
    sampler.start()
    try:
        run = run_live(settings, workdir, ["--shape", shape], {"backlog_target_s": str(target_s), **overrides},
                       max_parallelism=max_parallelism, drain_s=DRAIN_S, job=f"backends-{arm}", warm_up_s=warm_up_s,
                       warm_up_rate=warm_up_rate, runner_args=args, parallelism=start)
    finally:
        sampler.done.set()
        sampler.join(5)
    began = load_start(run)
    end = began + load_s + DRAIN_S
    measured = live_measures(run, target_s, initial_parallelism=start)
    return {"arm": arm, "executor_seconds": round(executor_seconds(sampler.samples, began, end), 1),
            "span_s": round(end - began, 1), "beyond_target_s": measured["beyond_target_s"],
            "peak_backlog": measured["peak_backlog"], "lag_p95_s": round(measured["lag_p95_s"], 1),
            "actions": measured["actions"], "failed": measured["failed"],
            "max_executors": max((c for t, c in sampler.samples if began <= t <= end), default=None),
            "cores": [(round(t - began, 1), c) for t, c in sampler.samples], "load": run.load_summary,
            "timeline": run.timeline()}


def rotated(arms: list[str], round_: int) -> list[str]:
    """The arms in the order round `round_` runs them: each round starts one arm later, so that no arm is
    always first on a fresh cluster."""
    k = round_ % len(arms)
    return [*arms[k:], *arms[:k]]


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per arm: the number of runs and, for each measure, the median with the worst run in brackets (the
    highest: every measure here is better lower); actions and executors as the list over the runs."""
    out: dict[str, dict[str, str]] = {}
    for arm in dict.fromkeys(row["arm"] for row in rows):
        runs = [row for row in rows if row["arm"] == arm]
        summary = {"runs": str(len(runs)), "actions": ", ".join(str(r["actions"]) for r in runs),
                   "max_executors": ", ".join(str(r["max_executors"]) for r in runs)}
        for key, fmt in (("executor_seconds", ".0f"), ("beyond_target_s", ".0f"), ("peak_backlog", ".0f"),
                         ("lag_p95_s", ".1f")):
            values = [float(r[key]) for r in runs]
            summary[key] = f"{statistics.median(values):{fmt}} [{max(values):{fmt}}]"
        out[arm] = summary
    return out


@app.command()
def main(
    arms: Annotated[list[str] | None, typer.Option("--arm", help=f"Which ({', '.join(ARMS)}); default all.")] = None,
    shape: Annotated[str, typer.Option(help="The load (the load generator's --shape).")] =
        "steps:150:90,600:180,150:150",
    max_parallelism: Annotated[int, typer.Option(help="Executors at most (the worker's cores).")] = 4,
    warm_up_s: Annotated[float, typer.Option(help="Seconds at --warm-up-rate before the load and the agents.")] = 60.0,
    warm_up_rate: Annotated[float, typer.Option()] = 150.0,
    backlog_target_s: Annotated[float, typer.Option(help="The job's backlog target, seconds of arrivals.")] = 60.0,
    repeats: Annotated[int, typer.Option(min=1, help="Rounds of every arm; each round starts one arm later.")] = 1,
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS,
) -> None:
    """Run each arm in turn on one cluster; print the table and write JSON."""
    console = Console(width=150)
    chosen = arms or list(ARMS)
    for arm in chosen:
        arm_setup(arm, "spark://x:1", max_parallelism)  # an unknown arm fails before anything starts
    parsed = parse_shape(shape)
    if not isinstance(parsed, Steps):
        raise typer.BadParameter("a steps:RATE:SECONDS,... shape", param_hint="--shape")
    load_s = parsed.duration_s
    workdir = Path(tempfile.mkdtemp(prefix="backends-live-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    cluster = start_cluster(workers=1, cores=max_parallelism, log_dir=workdir / "cluster")
    rows: list[dict[str, Any]] = []

    def write() -> None:  # after each arm: an arm that fails later does not lose the others
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"shape": shape, "max_parallelism": max_parallelism, "warm_up_s": warm_up_s,
                                   "backlog_target_s": backlog_target_s, "repeats": repeats, "window_s": WINDOW_S,
                                   "drain_s": DRAIN_S, "machine": machine_info(), "code": code_version(),
                                   "rows": rows}, indent=1))

    try:
        for round_ in range(repeats):
            for arm in rotated(chosen, round_):
                logs = workdir / f"{arm}-{round_}"
                console.print(f"round {round_ + 1}/{repeats}, {arm}: {shape}, {warm_up_s:g} s warm-up; logs in {logs}")
                logs.mkdir()
                row = run_arm(arm, cluster, broker.port, redis.port, shape, load_s, max_parallelism, warm_up_s,
                              warm_up_rate, backlog_target_s, logs)
                rows.append({"round": round_, **row})
                write()
    finally:
        cluster.stop()
        for service in (broker, redis):
            stop_pid(service.process.pid, process=service.process)
    table = Table(title=f"one load ({shape}), one cluster (1 worker, {max_parallelism} cores), from 1 executor; "
                        f"median [worst] of {repeats} round(s)")
    for column in ("arm", "runs", "executor-s", "beyond target s", "peak backlog", "lag p95 s", "actions",
                   "max executors"):
        table.add_column(column)
    for arm, summary in summarize(rows).items():
        table.add_row(arm, str(summary["runs"]), *(summary[key] for key in
                      ("executor_seconds", "beyond_target_s", "peak_backlog", "lag_p95_s", "actions", "max_executors")))
    console.print(table)
    console.print(f"wrote {out}")


if __name__ == "__main__":
    app()
