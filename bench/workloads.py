"""`python -m bench.workloads`: the workload suite live, per load pattern, under four ways of sizing the job.

Starts a broker and Redis of its own and a standalone cluster from the pyspark wheel (two workers of
`--max-parallelism` / 2 cores each), then, per round (`--repeats`), per workload (`--workload`, default
every one in `pipeline.workloads`), per pattern (`--pattern`: `step`, a step up of the load, and `cosine`,
one period of the load generator's `cosine` shape, from its trough; its rates divided by the workload's
`reads`, so the peak needs as many slots on a join, which reads each record once per side) and per arm
(`--arm`, each round starting one arm later), runs the workload under the pattern with the agents running
(`stack.live.run_live`):

- `inplace`: the default policy, executors changed in place on the cluster;
- `restart`: the default policy, the query restarted from its checkpoint, in local mode;
- `dynamic`: Spark's dynamic allocation on the cluster, the agents in recommend mode (they measure, never act);
- `static`: fixed at the peak's parallelism (the executors that carry the pattern's peak at the target
  utilization, each carrying `--slot-rate` records/s at full use) on the cluster, the agents in recommend mode.

Time is compressed: a pattern lasts minutes, and the job's time constants shrink by COMPRESSION (its
scale-down delay and catch-up duration; the metrics window is two windows). Each run starts after
`--warm-up-s` at the pattern's lowest rate, whose last `--watched-s` the agents watch (the job is
registered): they have measured it at its base load when the pattern begins.

Per run: the event-time latency from event to sink, mean and p95, from the sink's output rows (each row's
newest event time, `tests.support.backends.row_event_time`, against its Kafka record's timestamp, over the
rows written from the load's start), beside the analyses' output lag; slot-seconds (cluster arms: the
cores the master granted, sampled every second; the local arm: its parallelism over time) from the load's
start to the end of the drain (`--drain-s`); our completed rescales (those decided in the warm-up apart)
and the executor changes the master showed; records lost, duplicated, mismatched and unexpected
(`pipeline.workloads.check`, over the windows the watermark closed), checked once the job has read all its
input (up to `--catch-up-s` after the drain, not measured; the records still unread then are shown, and
what they would have written counts as lost); each rescale's predicted against observed recovery time.
Prints a table (median [worst] of the runs) and writes JSON after every run.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from bench.backends_live import CoreSampler
from bench.common import RESULTS, table, write_result
from contracts.decisions import EventType
from evaluation.live import (
    live_measures,
    live_workload,
    load_start,
    measured_since,
    read_records,
    recovery_errors,
)
from pipeline.loadgen import parse_shape, scaled_shape
from pipeline.workloads import WORKLOADS, workload
from pipeline.workloads.check import check
from pipeline.workloads.common import WorkloadOptions
from stack.cluster import StandaloneCluster, start_cluster
from stack.live import LiveRun, run_live
from stack.processes import start_broker, start_redis
from stack.services import isolated_settings
from tests.support.backends import (
    WORKLOAD_ARMS,
    changes,
    event_time_latencies,
    executor_seconds,
    latency_summary,
    parallelism_samples,
    peak_parallelism,
    rotated,
    summarize_cells,
    workload_arm_setup,
)

WINDOW_S = 5.0
COMPRESSION = 10.0
# The job's time constants under COMPRESSION (defaults: 300 s scale-down delay, 300 s catch-up).
JOB_TIMES = {"scale_down_delay_s": f"{300 / COMPRESSION:g}", "catch_up_duration_s": f"{300 / COMPRESSION:g}",
             "metrics_window_s": f"{2 * WINDOW_S:g}"}
TARGET_UTILIZATION = 0.7  # the default job configuration's
PATTERNS = {"step": "steps:100:30,400:90", "cosine": "cosine:240:160:120"}
LOCAL_ARMS = ("restart",)
MEASURES = {"latency_mean_s": ".1f", "latency_p95_s": ".1f", "output_lag_p95_s": ".1f", "slot_seconds": ".0f",
            "lost": ".0f", "duplicated": ".0f", "unread_at_end": ".0f", "recovery_error": ".2f"}
LISTED = ("actions", "warm_up_actions", "executor_changes", "recoveries")
app = typer.Typer(add_completion=False, help=__doc__)


def pattern_load(spec: str) -> tuple[list[str], float, float, float]:
    """A pattern's load arguments, its duration, its lowest and its highest rate (a sine or cosine shape
    lasts one period)."""
    shape = parse_shape(spec)
    duration = shape.duration_s or float(spec.rsplit(":", 1)[1])
    rates = [shape.rate(t / 2) for t in range(int(2 * duration))]
    args = ["--shape", spec] if shape.duration_s else ["--shape", spec, "--duration", f"{duration:g}"]
    return args, duration, min(rates), max(rates)


def closed_before(run: LiveRun, inputs: list[dict[str, Any]], watermark_s: float) -> float | None:
    """Event time before which every window is closed: the watermark the input's newest event implies, or
    the last watermark the analyses saw if that is earlier (a job behind at the end), less a second."""
    times = [float(r["ts"]) for r in inputs if isinstance(r.get("ts"), int | float)]
    if not times:
        return None
    bound = max(times) - watermark_s
    seen = [a.window_end - a.watermark_lag_s for a in run.analyses if a.watermark_lag_s is not None]
    if seen:
        bound = min(bound, max(seen))
    return bound - 1.0


def measure(run: LiveRun, name: str, options: dict[str, str], bootstrap: str, began: float, end: float,
            samples: list[tuple[float, int]] | None, start: int, target_s: float) -> dict[str, Any]:
    """The run's measures (see the module doc); `samples` are the master's cores, None in local mode."""
    inputs = [record for _, record in read_records(bootstrap, run.input_topic)]
    outputs = read_records(bootstrap, run.output_topic)
    watermark_s = WorkloadOptions.parse(options, "in", "out").watermark_s
    bound = closed_before(run, inputs, watermark_s)
    try:
        checked = check(name, inputs, [record for _, record in outputs], options, bound)
        counts = {"expected": checked.expected, "written": checked.written, "lost": checked.lost,
                  "duplicated": checked.duplicated, "mismatched": checked.mismatched, "unexpected": checked.unexpected}
    except (KeyError, TypeError, ValueError) as exc:  # a malformed output is reported, the rest still measured
        counts = {"check_error": repr(exc), "lost": None, "duplicated": None}
    latency = latency_summary(event_time_latencies((t, r) for t, r in outputs if t >= began))
    lags = latency_summary([a.output_lag_s for a in run.analyses
                            if a.output_lag_s is not None and began <= a.window_end <= end])
    since = measured_since(run)  # a watched warm-up's actions are not the pattern's
    switches = [(e.timestamp - (e.downtime_s or 0.0), e.to_parallelism) for e in run.of(EventType.COMPLETED)]
    timeline = samples if samples is not None else parallelism_samples(began, start, switches)
    recoveries = recovery_errors(run.recoveries(since))
    try:
        agents = live_measures(run, target_s, initial_parallelism=start)
    except RuntimeError:
        agents = {}
    return {
        "latency_mean_s": latency["mean_s"], "latency_p95_s": latency["p95_s"], "latency": latency,
        "output_lag_p95_s": lags["p95_s"], "output_lag": lags,
        "slot_seconds": round(executor_seconds(timeline, began, end), 1),
        "slot_source": "master" if samples is not None else "parallelism",
        "max_executors": max((c for t, c in timeline if began <= t <= end), default=start),
        "actions": agents.get("actions"), "failed": agents.get("failed"),  # None: the agents published nothing
        "warm_up_actions": agents.get("warm_up_actions"),  # decided before the load, finished in it or not
        "executor_changes": changes(samples, began, end) if samples is not None else None,
        "input_records": len(inputs), "output_records": len(outputs), "closed_before": bound,
        # Records the job had not read when the run ended: what they would have written counts as lost.
        "unread_at_end": run.backlog_after(run.load_ended) if run.load_ended is not None else None,
        **counts,
        "recovery_error": recoveries["median_error"],
        "recoveries": [(r["predicted_s"], r["observed_s"]) for r in recoveries["rows"]],
        "beyond_target_s": agents.get("beyond_target_s"), "lag_p95_s": agents.get("lag_p95_s"),
        "decisions": run.decision_rows(began), "timeline": run.timeline(),
    }


def run_one(name: str, pattern: str, spec: str, arm: str, cluster: StandaloneCluster, ports: tuple[int, int],
            knobs: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One workload under one pattern in one arm (the pattern's rates divided by the workload's reads); its
    measures."""
    reads = workload(name).reads
    spec = scaled_shape(spec, 1 / reads)
    load_args, load_s, low, peak = pattern_load(spec)
    static = knobs["static_parallelism"] or peak_parallelism(peak, knobs["slot_rate"] / reads, TARGET_UTILIZATION,
                                                             knobs["max_parallelism"])
    args, overrides, start = workload_arm_setup(arm, cluster.url, knobs["max_parallelism"], static)
    run_id = uuid.uuid4().hex[:6]
    settings = isolated_settings(*ports, f"w{run_id}", f"workloads-{run_id}", loop_interval_s=WINDOW_S)
    options = dict(knobs["options"])
    sampler = CoreSampler(cluster) if arm not in LOCAL_ARMS else None
    if sampler is not None:
        sampler.start()
    try:
        run = run_live(settings, workdir, load_args,
                       {**JOB_TIMES, "backlog_target_s": str(knobs["target_s"]), **overrides},
                       max_parallelism=knobs["max_parallelism"], cost_ms=knobs["cost_ms"], drain_s=knobs["drain_s"],
                       catch_up_s=knobs["catch_up_s"],
                       job=f"{name}-{arm}", warm_up_s=knobs["warm_up_s"], warm_up_rate=max(low, 10.0),
                       watched_s=knobs["watched_s"],
                       runner_args=args, parallelism=start, workload=live_workload(name, options))
    finally:
        if sampler is not None:
            sampler.done.set()
            sampler.join(5)
    began = load_start(run)
    end = began + load_s + knobs["drain_s"]
    measured = measure(run, name, options, settings.kafka_bootstrap, began, end,
                       sampler.samples if sampler is not None else None, start, knobs["target_s"])
    return {"workload": name, "pattern": pattern, "arm": arm, "shape": spec, "start_parallelism": start,
            "static_parallelism": static, "load": run.load_summary, **measured}


def end_by(text: str | None) -> float | None:
    """'HH:MM' (UTC, today) as epoch seconds; None for None."""
    if not text:
        return None
    hour, minute = (int(x) for x in text.split(":"))
    now = dt.datetime.now(dt.UTC)
    return now.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()


@app.command()
def main(
    workloads: Annotated[list[str] | None, typer.Option("--workload", help="Which; default every registered one.")]
    = None,
    patterns: Annotated[list[str] | None, typer.Option("--pattern", help=f"{' | '.join(PATTERNS)}; default both.")]
    = None,
    arms: Annotated[list[str] | None, typer.Option("--arm", help=f"{', '.join(WORKLOAD_ARMS)}; default all.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Rounds; each round starts one arm later.")] = 1,
    step: Annotated[str, typer.Option(help="The step pattern's load (a steps: shape), "
                                          "for a workload that reads each record once.")] = PATTERNS["step"],
    cosine: Annotated[str, typer.Option(help="The cosine pattern's load (cosine:MEAN:AMP:PERIOD, one period from "
                                        "its trough).")]
    = PATTERNS["cosine"],
    max_parallelism: Annotated[int, typer.Option(help="Executors at most (the cluster's cores).")] = 4,
    static_parallelism: Annotated[int, typer.Option(help="The static arm's; 0: the peak's (--slot-rate).")] = 0,
    slot_rate: Annotated[float, typer.Option(help="Records/s one executor carries at full use, to size the static "
                                             "arm at the peak (divided by a workload's reads).")] = 210.0,
    cost_ms: Annotated[float, typer.Option(help="Waiting per record (the job's cost_ms).")] = 4.0,
    option: Annotated[list[str] | None, typer.Option("--option", help="Job option key=value (repeatable).")] = None,
    warm_up_s: Annotated[float, typer.Option(help="Seconds at the pattern's lowest rate before it.")] = 45.0,
    watched_s: Annotated[float, typer.Option(min=0, help="The last seconds of the warm-up, with the agents watching "
                                             "the job (a job in production is measured before its load changes).")]
    = 30.0,
    drain_s: Annotated[float, typer.Option(help="Seconds after the load (measured).")] = 20.0,
    catch_up_s: Annotated[float, typer.Option(min=0, help="Seconds more, at most, until the job has read all its "
                                              "input, before its output is checked (not measured).")] = 120.0,
    backlog_target_s: Annotated[float, typer.Option(help="The job's backlog target, seconds of arrivals.")] = 20.0,
    stop_by: Annotated[str | None, typer.Option(help="HH:MM UTC: no run starts that would end after it.")] = None,
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "workloads.json",
    summarize: Annotated[list[Path] | None, typer.Option(
        "--summarize", help="Run nothing: the table of the runs in these JSON files (repeatable), written to --out.")]
    = None,
) -> None:
    """Run every (workload, pattern, arm) in turn on one cluster; print the table and write JSON."""
    console = Console(width=200)
    if summarize:
        import json

        files = [json.loads(path.read_text()) for path in summarize]
        rows = [row for result in files for row in result["rows"]]
        write_result(out, {"from": [str(p) for p in summarize], "settings": [
            {k: v for k, v in f.items() if k not in ("rows", "machine", "code")} for f in files], "rows": rows},
            console=console)
        print_table(console, rows, max(f["repeats"] for f in files))
        return
    names = workloads or list(WORKLOADS)
    chosen_arms = arms or list(WORKLOAD_ARMS)
    specs = {"step": step, "cosine": cosine}
    chosen_patterns = patterns or list(PATTERNS)
    options = dict(pair.split("=", 1) for pair in option or [])
    if watched_s > warm_up_s:
        raise typer.BadParameter(f"at most --warm-up-s ({warm_up_s:g})", param_hint="--watched-s")
    for arm in chosen_arms:
        workload_arm_setup(arm, "spark://x:1", max_parallelism, 1)  # an unknown arm fails before anything starts
    for name in names:
        live_workload(name)
    for pattern in chosen_patterns:
        if pattern not in PATTERNS:
            raise typer.BadParameter(f"one of {', '.join(PATTERNS)}", param_hint="--pattern")
        pattern_load(specs[pattern])
    knobs = {"max_parallelism": max_parallelism, "static_parallelism": static_parallelism, "slot_rate": slot_rate,
             "cost_ms": cost_ms,
             "options": options, "warm_up_s": warm_up_s, "watched_s": watched_s, "drain_s": drain_s,
             "catch_up_s": catch_up_s,
             "target_s": backlog_target_s}
    deadline = end_by(stop_by)
    workdir = Path(tempfile.mkdtemp(prefix="workloads-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    cluster = start_cluster(workers=2, cores=max(1, max_parallelism // 2), memory="3g", log_dir=workdir / "cluster")
    header = {"workloads": names, "patterns": {p: specs[p] for p in chosen_patterns}, "arms": chosen_arms,
              "repeats": repeats, "compression": COMPRESSION, "job_times": JOB_TIMES, "window_s": WINDOW_S,
              "cluster": {"workers": 2, "cores_each": max(1, max_parallelism // 2)}} | knobs
    rows: list[dict[str, Any]] = []
    try:
        for round_ in range(repeats):
            for name in names:
                for pattern in chosen_patterns:
                    for arm in rotated(chosen_arms, round_):
                        _, load_s, _, _ = pattern_load(specs[pattern])
                        if deadline and time.time() + warm_up_s + load_s + drain_s + 75 > deadline:
                            console.print(f"skipped {name} {pattern} {arm} (round {round_ + 1}): would end after "
                                          f"{stop_by} UTC")
                            continue
                        logs = workdir / f"{name}-{pattern}-{arm}-{round_}"
                        logs.mkdir()
                        console.print(f"round {round_ + 1}/{repeats}: {name}, {pattern}, {arm}; logs in {logs}")
                        started = time.time()
                        try:
                            row = run_one(name, pattern, specs[pattern], arm, cluster, (broker.port, redis.port),
                                          knobs, logs)
                        except Exception as exc:  # one failed run is recorded; the others still run
                            row = {"workload": name, "pattern": pattern, "arm": arm, "error": repr(exc)}
                            console.print(f"[red]failed: {exc!r}[/red]")
                        rows.append({"round": round_, "wall_s": round(time.time() - started, 1), **row})
                        write_result(out, header | {"rows": rows}, console=console)
    finally:
        cluster.stop()
        broker.stop()
        redis.stop()
    print_table(console, rows, repeats)


def print_table(console: Console, rows: list[dict[str, Any]], repeats: int) -> None:
    result = table(f"workloads live: median \\[worst] of the runs ({repeats} round(s) asked)", "workload", "pattern",
                   "arm", "runs", "latency mean s", "latency p95 s", "output lag p95 s", "slot-s", "lost",
                   "duplicated", "unread at end", "recovery error", "actions", "warm-up actions", "executor changes",
                   "recoveries (predicted, observed)")
    done = [r for r in rows if "error" not in r]
    cells = summarize_cells(done, ("workload", "pattern", "arm"), MEASURES, LISTED)
    for s in cells:
        result.add_row(s["workload"], s["pattern"], s["arm"], s["runs"], *(s[k] for k in MEASURES),
                       *(s[k] for k in LISTED))
    console.print(result)
    columns = [c.header for c in result.columns]
    console.print("\n".join(["| " + " | ".join(str(c) for c in columns) + " |",
                             "|" + "---|" * len(columns)] +
                            ["| " + " | ".join([s["workload"], s["pattern"], s["arm"], s["runs"],
                                                *(s[k] for k in MEASURES), *(s[k] for k in LISTED)]) + " |"
                             for s in cells]), markup=False, soft_wrap=True)
    for r in rows:
        if "error" in r:
            console.print(f"failed: {r['workload']} {r['pattern']} {r['arm']} (round {r['round'] + 1}): {r['error']}")


if __name__ == "__main__":
    app()
