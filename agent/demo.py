"""`autoscaler demo`: the demo Spark job under changing load, autoscaled live on the embedded stack.

Low load, a step up, a drop: the agents scale the job up and back down while the demo prints each
window, decision and rescale. At the end it drains the backlog, reads the job's output and prints a
summary (actions, slot-seconds against provisioning for the peak throughout, peak backlog, records in
and out, exactly once) and writes a PNG of load, capacity, parallelism and backlog over time.
Each run has topics of its own and a job the autoscaler learns anew.

`workload` picks the job from the workload suite (pipeline.workloads): `enrich`, the demo job, by
default; a stateful one keeps as many state partitions as the job's maximum parallelism, and its output is
checked against its input (pipeline.workloads.check) for records lost or duplicated.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError
from rich.console import Console
from rich.table import Table

from agent.watch import consumer, describe_decision, describe_event
from contracts.analyses import Analysis
from contracts.decisions import EventType, ScalingDecision, ScalingEvent
from contracts.settings import Settings
from evaluation.live import live_measures
from evaluation.report import plot_live
from infra.kafka import TopicReader, ensure_topics, written_ids
from pipeline.workloads import DEFAULT_WORKLOAD, Workload, entry_points, workload
from pipeline.workloads.check import check
from stack.cluster import start_cluster
from stack.embedded import Stack, state_dir
from stack.live import LiveRun
from stack.processes import free_port, port_open, stop_pid
from stack.services import register_jobs, start_dashboard, start_job_runner, start_load

JOB = "demo"
# The product's default. The scale-down after the drop does not wait for it (the arrival level has
# shifted); a trim of the scale-up's safe-side estimate on the same level does.
SCALE_DOWN_DELAY_S = 300
DRAIN_S = 90.0  # after the load ends, at most this long for the backlog to empty and a recovery to be timed
# The dashboard's usual port (`autoscaler dashboard`); another when it is taken.
DASHBOARD_PORT = 8050


def run_demo(settings: Settings, shape: str, cost_ms: float, partitions: int, max_parallelism: int,
             console: Console, cluster: str = "local", workload_name: str = DEFAULT_WORKLOAD) -> dict[str, Any]:
    """The demo; `cluster` "standalone" runs the job on a Spark standalone cluster started for it
    (a master and one worker with a core per slot), rescaled in place; "local" in local mode,
    restarted from its checkpoint. `workload_name` names the job (pipeline.workloads)."""
    if cluster not in ("local", "standalone"):
        raise ValueError(f"cluster must be local or standalone, not {cluster!r}")
    job = workload(workload_name)
    stack = Stack(settings)
    started_stack = not all(stack.status().values())
    stack.up(console=console)
    run_id = time.strftime("%Y%m%d-%H%M%S")
    input_topic, output_topic = f"demo.{run_id}.input", f"demo.{run_id}.output"
    ensure_topics(settings, extra=[input_topic, output_topic])
    # On a cluster the job is planned with in-place costs from its first decision (the runner's reports
    # confirm how it rescales, or say it fell back).
    in_place = {"scaling_backend": "in_place"} if cluster == "standalone" else {}
    register_jobs(settings, [JOB], forget=True, max_parallelism=str(max_parallelism), mode="auto",
                  scale_down_delay_s=str(SCALE_DOWN_DELAY_S), **in_place)
    job_dir = state_dir() / "demo"
    shutil.rmtree(job_dir, ignore_errors=True)
    logs = state_dir() / "logs"
    spark = start_cluster(cores=max_parallelism, memory=f"{max_parallelism}g", log_dir=logs / "cluster") \
        if cluster == "standalone" else None
    if spark is not None:
        console.print(f"Spark standalone cluster at {spark.url} ({max_parallelism} cores); executors change in place")
    follow = consumer(settings, [settings.topics.decisions, settings.topics.scaling_events, settings.topics.analyses])
    options, job_args, runner_settings = job_launch(settings, job, max_parallelism)
    runner = start_job_runner(runner_settings, JOB, job_dir, logs / "runner.log", max_parallelism=max_parallelism,
                              options={"cost_ms": str(cost_ms), "input_topic": input_topic,
                                       "output_topic": output_topic, **options},
                              args=[*job_args, *(["--master", spark.url, "--backend", "inplace"]
                                                 if spark is not None else [])] or None)
    load_args = ["--shape", shape, *([] if job.records == "demo" else ["--records", job.records])]
    load = start_load(settings, input_topic, logs / "load.log", load_args, partitions=partitions)
    try:
        dashboard = start_dashboard(settings, logs / "dashboard.log", agents=[f"http://127.0.0.1:{settings.web_port}"],
                                    port=DASHBOARD_PORT if not port_open("127.0.0.1", DASHBOARD_PORT) else free_port())
        console.print(f"dashboard: {dashboard.url}/jobs/{JOB} (the job's charts, live)")
    except RuntimeError as exc:  # the demo runs on without it
        dashboard = None
        console.print(f"[yellow]no dashboard: {exc}[/yellow]")
    run = LiveRun(started=time.time())
    console.print(f"demo job ({job.name}: {job.description}) started (runner pid {runner.pid}); load: {shape}; "
                  f"topics {input_topic} -> {output_topic}; logs in {logs}")
    console.print("decisions, rescales and one status line per window follow; Ctrl-C stops the demo\n")
    summary: dict[str, Any] = {}
    try:
        drain_until: float | None = None
        while drain_until is None or time.time() < drain_until:
            if runner.poll() is not None:
                console.print(f"[red]the job runner exited ({runner.returncode}); see {logs / 'runner.log'}[/red]")
                break
            if drain_until is None and load.poll() is not None:
                console.print("load finished; draining the backlog")
                drain_until = time.time() + DRAIN_S
            last = _follow(follow, run, console)
            # Drained, and the last rescale's recovery timed (for the summary), or out of time.
            if drain_until is not None and last is not None and not last.backlog and not run.recovery_open():
                break
        produced = _produced(logs / "load.log")
        if job.name == DEFAULT_WORKLOAD:
            ids = (written_ids(settings.kafka_bootstrap, output_topic, produced, timeout_s=60.0, late_s=2.0)
                   if produced is not None else [])
            summary = demo_summary(run, produced, ids, SCALE_DOWN_DELAY_S)
        else:
            summary = demo_summary(run, produced, [], SCALE_DOWN_DELAY_S) | _checked(
                settings, job, input_topic, output_topic, produced, options)
        summary |= {"in_place": cluster == "standalone", "workload": job.name}
        _print_summary(console, summary)
        png = _plot(run, logs.parent / f"demo-{run_id}.png")
        png.with_suffix(".json").write_text(json.dumps(summary | {"shape": shape, "timeline": run.timeline()},
                                                       indent=1))
        console.print(f"timeline: {png} (and {png.with_suffix('.json').name})")
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        follow.close()
        if dashboard is not None:
            dashboard.stop()
        for process in (load, runner):
            stop_pid(process.pid, timeout=60, process=process)
        if spark is not None:
            spark.stop()
        if started_stack:
            stack.down(console=console)
    return summary


def job_launch(settings: Settings, job: Workload, max_parallelism: int) -> tuple[dict[str, str], list[str],
                                                                               Settings]:
    """A workload's extra job options, its runner arguments and the settings the runner starts with
    (the suite's entry points allowed); the demo job's are none and the settings as given."""
    if job.name == DEFAULT_WORKLOAD:
        return {}, [], settings
    options = {"statePartitions": str(max_parallelism)} if job.stateful else {}
    allowed = list(dict.fromkeys([*settings.job_entry_points, *entry_points()]))
    return options, ["--entry", job.entry_point], settings.model_copy(update={"job_entry_points": allowed})


def _checked(settings: Settings, job: Workload, input_topic: str, output_topic: str, produced: int | None,
             options: dict[str, str]) -> dict[str, Any]:
    """records_out, duplicates and missing of a workload's run, from its input and output topics: windows
    and sessions the watermark has not closed yet are left out."""
    if produced is None:
        return {"records_out": 0, "duplicates": 0, "missing": None}
    reader = TopicReader(settings.kafka_bootstrap, input_topic)
    try:
        inputs = reader.until(lambda rs: len(rs) >= produced, json.loads, timeout=120)
    finally:
        reader.close()
    reader = TopicReader(settings.kafka_bootstrap, output_topic)
    try:
        outputs = [json.loads(v) for v in reader.poll(10.0)]
    finally:
        reader.close()
    closed_before = max((float(r["ts"]) for r in inputs), default=0.0) - float(options.get("watermark_s", 5.0))
    result = check(job.name, inputs, outputs, options, closed_before)
    return {"records_out": result.written - result.duplicated, "duplicates": result.duplicated,
            "missing": result.lost + result.mismatched}


def _follow(follow: Any, run: LiveRun, console: Console) -> Analysis | None:
    """Print and keep what the agents publish about the demo job; the analysis, if one arrived."""
    msg = follow.poll(0.5)
    if msg is None or (msg.error() and msg.error().code() != KafkaError._PARTITION_EOF) or msg.value() is None:
        return None
    if msg.topic().endswith("analyses"):
        a = Analysis.model_validate_json(msg.value())
        if a.job_id != JOB:
            return None
        run.analyses.append(a)
        overhead = f", batch overhead {a.batch_overhead_s:.2f} s" if a.batch_overhead_s is not None else ""
        console.print(
            f"{time.strftime('%H:%M:%S')} parallelism {a.parallelism}, arrival {a.arrival_rate or 0:.0f} rec/s, "
            f"processed {a.observed_processing_rate:.0f} rec/s, backlog {a.backlog or 0}, utilization "
            f"{a.utilization:.0%}, true rate {a.true_processing_rate:.0f} rec/s per slot{overhead}", style="dim")
        return a
    if msg.topic().endswith("decisions"):
        d = ScalingDecision.model_validate_json(msg.value())
        if d.job_id == JOB:
            run.decisions.append(d)
            if d.action.value != "none":
                console.print(describe_decision(d))
        return None
    e = ScalingEvent.model_validate_json(msg.value())
    if e.job_id == JOB:
        run.events.append(e)
        console.print(describe_event(e))
    return None


def _produced(load_log: Path) -> int | None:
    lines = load_log.read_text().strip().splitlines() if load_log.exists() else []
    try:
        return int(json.loads(lines[-1])["produced"]) if lines else None
    except (ValueError, KeyError, TypeError):
        return None


def demo_summary(run: LiveRun, produced: int | None, ids: list[int], scale_down_delay_s: float) -> dict[str, Any]:
    """What the run shows, from what the agents published and the job wrote; pure."""
    completed = run.of(EventType.COMPLETED)
    measures = live_measures(run, backlog_target_s=60.0) if run.analyses else {}
    top = max([1, *(e.to_parallelism for e in completed)])
    span = float(measures.get("span_s", 0.0))
    distinct = len(set(ids))
    return {
        "scale_ups": sum(e.to_parallelism > e.from_parallelism for e in completed),
        "scale_downs": sum(e.to_parallelism < e.from_parallelism for e in completed),
        "failed": len(run.of(EventType.FAILED)),
        "path": " -> ".join(str(p) for p in [completed[0].from_parallelism if completed else 1,
                                            *(e.to_parallelism for e in completed)]),
        "downtimes_s": [round(e.downtime_s or 0.0, 1) for e in completed],
        "slot_seconds": round(float(measures.get("slot_seconds", 0.0))),
        "peak_slot_seconds": round(top * span),
        "peak_parallelism": top,
        "span_s": round(span),
        "peak_backlog": max((a.backlog or 0 for a in run.analyses), default=0),
        "beyond_target_s": measures.get("beyond_target_s"),
        "records_in": produced,
        "records_out": distinct,
        "duplicates": len(ids) - distinct,
        "missing": None if produced is None else max(0, produced - len(set(ids) & set(range(produced)))),
        "scale_down_delay_s": scale_down_delay_s,
        "recoveries": run.recoveries(),
    }


def _print_summary(console: Console, s: dict[str, Any]) -> None:
    table = Table(title="what the autoscaler did", title_justify="left", show_header=False)
    saved = 1 - s["slot_seconds"] / s["peak_slot_seconds"] if s["peak_slot_seconds"] else 0.0
    exactly_once = s["records_in"] is not None and s["missing"] == 0 and s["duplicates"] == 0
    rows = [
        ("actions", f"{s['scale_ups']} up, {s['scale_downs']} down, {s['failed']} failed: parallelism {s['path']} "
                    f"({'in place, to new executors or held' if s.get('in_place') else 'restarts'} "
                    f"{', '.join(f'{d:g} s' for d in s['downtimes_s']) or 'none'})"),
        ("slot-seconds", f"{s['slot_seconds']:,} over {s['span_s']} s; {s['peak_slot_seconds']:,} at "
                         f"{s['peak_parallelism']} slots throughout ({saved:.0%} saved)"),
        ("peak backlog", f"{s['peak_backlog']:,} records; {s['beyond_target_s'] or 0:.0f} s beyond the "
                         "60-s target"),
        ("records", f"{'?' if s['records_in'] is None else format(s['records_in'], ',')} in, "
                    f"{s['records_out']:,} out"),
        ("exactly once", "unknown: the load generator's count is missing" if s["records_in"] is None
         else "yes" if exactly_once else f"no: {s['missing']} missing, {s['duplicates']} duplicated"),
    ]
    if s.get("recoveries"):
        rows.append(("recoveries", "; ".join(
            f"{r['from']} -> {r['to']}: observed {_seconds(r['observed_s'])}, predicted {_seconds(r['predicted_s'])}"
            for r in s["recoveries"])))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


def _seconds(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def _plot(run: LiveRun, path: Path) -> Path:
    windows = sorted((a for a in run.analyses if a.arrival_rate is not None), key=lambda a: a.window_end)
    t = [a.window_end - run.started for a in windows]
    capacity = [a.parallelism * a.true_processing_rate if a.valid else float("nan") for a in windows]
    return plot_live(t, [a.arrival_rate for a in windows], capacity, [a.backlog or 0 for a in windows],
                     [a.parallelism for a in windows],
                     "demo job: arrival, capacity (parallelism x DS2 true rate), backlog and parallelism", path)
