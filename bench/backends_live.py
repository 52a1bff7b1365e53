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

import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from bench.common import RESULTS, table, write_result
from evaluation.live import live_measures, load_start
from pipeline.loadgen import Steps, parse_shape
from stack.cluster import StandaloneCluster, start_cluster
from stack.live import run_live
from stack.processes import start_broker, start_redis
from stack.services import isolated_settings
from tests.support.backends import ARMS, arm_setup, executor_seconds, rotated, summarize

WINDOW_S = 5.0
DRAIN_S = 40.0
MEASURES = ("executor_seconds", "beyond_target_s", "peak_backlog", "lag_p95_s", "actions", "max_executors")
app = typer.Typer(add_completion=False, help=__doc__)


class CoreSampler(threading.Thread):
    """Samples, every second until stopped, the cores the master has granted: in all (`samples`) and per
    application, by its name (`apps`), from one status read."""

    def __init__(self, cluster: StandaloneCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.samples: list[tuple[float, int]] = []
        self.apps: list[tuple[float, dict[str, int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            status = self.cluster.status()
            if "coresused" in status:
                now = time.time()
                self.samples.append((now, int(status["coresused"])))
                self.apps.append((now, {str(a.get("name")): int(a.get("cores", 0))
                                        for a in status.get("activeapps", [])}))
            self.done.wait(1.0)

    def of(self, app_name: str) -> list[tuple[float, int]]:
        """The cores granted to one application over time (0 while it did not run)."""
        return [(t, cores.get(app_name, 0)) for t, cores in self.apps]


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
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "backends_live.json",
) -> None:
    """Run each arm in turn on one cluster; print the table and write JSON."""
    console = Console(width=150)
    chosen = arms or list(ARMS)
    for arm in chosen:
        arm_setup(arm, "spark://x:1", max_parallelism)  # an unknown arm fails before anything starts
    parsed = parse_shape(shape)
    if not isinstance(parsed, Steps):
        raise typer.BadParameter("a steps:RATE:SECONDS,... shape", param_hint="--shape")
    workdir = Path(tempfile.mkdtemp(prefix="backends-live-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    cluster = start_cluster(workers=1, cores=max_parallelism, log_dir=workdir / "cluster")
    settings = {"shape": shape, "max_parallelism": max_parallelism, "warm_up_s": warm_up_s,
                "backlog_target_s": backlog_target_s, "repeats": repeats, "window_s": WINDOW_S, "drain_s": DRAIN_S}
    rows: list[dict[str, Any]] = []
    try:
        for round_ in range(repeats):
            for arm in rotated(chosen, round_):
                logs = workdir / f"{arm}-{round_}"
                console.print(f"round {round_ + 1}/{repeats}, {arm}: {shape}, {warm_up_s:g} s warm-up; logs in {logs}")
                logs.mkdir()
                rows.append({"round": round_, **run_arm(arm, cluster, broker.port, redis.port, shape,
                                                        parsed.duration_s, max_parallelism, warm_up_s, warm_up_rate,
                                                        backlog_target_s, logs)})
                # After each arm: an arm that fails later does not lose the others.
                write_result(out, settings | {"rows": rows}, console=console)
    finally:
        cluster.stop()
        broker.stop()
        redis.stop()
    result = table(f"one load ({shape}), one cluster (1 worker, {max_parallelism} cores), from 1 executor; "
                   f"median \\[worst] of {repeats} round(s)", "arm", "runs", "executor-s", "beyond target s",
                   "peak backlog", "lag p95 s", "actions", "max executors")
    for arm, summary in summarize(rows).items():
        result.add_row(arm, summary["runs"], *(summary[key] for key in MEASURES))
    console.print(result)


if __name__ == "__main__":
    app()
