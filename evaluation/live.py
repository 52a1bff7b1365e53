"""`autoscaler evaluate --live`: a time-compressed trace against the real Spark demo job, end to
end through the agents, measured as the simulated runs are, beside the simulation of the same replay.

Starts its own broker and Redis, the four agents, the demo job (local Spark) and the load generator
(`stack.live.run_live`). The load generator replays the same rows, mapped onto the same
rates, as the simulator's `load_trace`; the simulator then replays them through the job model, and
the two sets of measures are printed side by side with their relative difference.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from contracts.decisions import EventType
from evaluation.forecasts import forecast_stream
from evaluation.model_files import WARM_UP_S
from evaluation.simulator import WINDOW_S, PolicyRunner, seconds_beyond_target, simulate
from evaluation.suite import EvalSettings, eval_config
from evaluation.traces import LOW_FRACTION, NATIVE_ROW_SECONDS, TRACE_FILES, TRACES, builtin_series, replay
from infra.kafka import topic_partitions
from pipeline.workloads import workload
from plan.registry import make_policy, policy_class
from stack.live import LiveRun, LiveWorkload, run_live
from stack.processes import start_broker, start_redis, stop_pid
from stack.services import isolated_settings

if TYPE_CHECKING:
    from evaluation.traces import Trace

COMPARED = ("slot_seconds", "actions", "peak_backlog", "beyond_target_s", "lag_p95_s")
# Per window in the JSON: enough to follow the job's per-slot rate and batch cost over a long run.
WINDOW_FIELDS = {"window_end", "parallelism", "valid", "arrival_rate", "backlog", "observed_processing_rate",
                 "true_processing_rate", "utilization", "batch_overhead_s", "batch_work_s"}


def live_workload(name: str, options: dict[str, str] | None = None) -> LiveWorkload:
    """What `run_live` needs of the registry's workload `name` (pipeline.workloads), with job `options`;
    KeyError for an unknown name."""
    found = workload(name)
    return LiveWorkload(found.name, found.entry_point, found.records, tuple(sorted((options or {}).items())))


def read_records(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[tuple[float, dict[str, Any]]]:
    """Every JSON record of `topic` from its start, each with when it was written (its Kafka timestamp,
    epoch s): read until every partition reached its end, or `timeout_s`. No consumer group."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    try:
        parts = topic_partitions(consumer, topic)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        pending, out = set(parts), []
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                _, stamp = msg.timestamp()
                out.append((stamp / 1000.0, json.loads(msg.value())))
        return out
    finally:
        consumer.close()


def load_start(run: LiveRun) -> float:
    """When the load's first records were due, as the load generator says (its process starts a few
    seconds after it is launched, at `run.started`)."""
    began = run.load_summary.get("began_at")
    return float(began) if isinstance(began, int | float) and began > 0 else run.started


def measured_since(run: LiveRun) -> float | None:
    """When a run's measures begin: the load's start after a watched warm-up (`LiveRun.watched_s`), whose
    windows and actions are not the load's; None (everything counts) otherwise."""
    return load_start(run) if run.watched_s > 0 else None


def first_window_s(ends: np.ndarray, alone_s: float = WINDOW_S) -> float:
    """How long a live run's first window counts: the median time between its windows (a compressed run
    publishes a window every few seconds), `alone_s` (the run's window) with one window."""
    return float(np.median(np.diff(ends))) if len(ends) > 1 else alone_s


def live_measures(run: LiveRun, backlog_target_s: float, initial_parallelism: int = 1) -> dict[str, Any]:
    """The simulator's measures from what the agents published: windows (arrival, backlog) and the
    completed rescales (the parallelism is paid from the moment the job stopped for it). A watched
    warm-up's (`LiveRun.watched_s`) windows, before the load began, are left out, and so are its actions:
    the rescales started before the load began, even those that finish after it (`warm_up_actions`); they
    still set the parallelism the load began at. Time beyond the target counts each late window
    from the one before it (`seconds_beyond_target`), as the simulator's `as_measured_live` does."""
    load_began, after = load_start(run), measured_since(run)
    since = -math.inf if after is None else after
    windows = sorted((a for a in run.analyses if a.arrival_rate is not None and a.window_end > since),
                     key=lambda a: a.window_end)
    if not windows:
        raise RuntimeError("the live run published no analysis with an arrival rate")
    begin, end = max(windows[0].window_end - WINDOW_S, since), windows[-1].window_end
    switches = sorted((e.timestamp - (e.downtime_s or 0.0), e.to_parallelism)
                      for e in run.of(EventType.COMPLETED))
    paid, t, p = 0.0, begin, initial_parallelism
    for at, to in switches:
        at = min(max(at, begin), end)
        paid += p * (at - t)
        t, p = at, to
    paid += p * (end - t)
    lags = np.array([(a.backlog or 0) / a.arrival_rate if a.arrival_rate else 0.0 for a in windows])
    ends = np.array([a.window_end for a in windows])
    beyond = seconds_beyond_target(ends, np.array([a.arrival_rate for a in windows]),
                                   np.array([a.backlog or 0 for a in windows]), backlog_target_s, first_window_s(ends))
    return {"slot_seconds": paid, "beyond_target_s": beyond, "lag_p95_s": float(np.percentile(lags, 95)),
            "peak_backlog": float(max(a.backlog or 0 for a in windows)),
            "lag_max_s": float(lags.max()), "actions": len(run.rescales(EventType.COMPLETED, after)),
            "warm_up_actions": len(run.rescales(EventType.COMPLETED, after, before=True)),
            "failed": len(run.rescales(EventType.FAILED, after)), "windows": len(windows), "span_s": end - begin,
            "start_s": round(begin - load_began, 1),
            "downtimes_s": [e.downtime_s for e in run.rescales(EventType.COMPLETED, after)]}


def simulated_replay(trace_name: str, policy: str, settings: EvalSettings, minutes: float,
                     trace_hours: float, start_s: float = 0.0) -> tuple[Trace, list[dict[str, Any]]]:
    """The simulator's runs of the replay `run_live_evaluation` sends to the real job, one per noise
    seed of the settings (the job model's rate noise). The live job starts `start_s` after its load
    (Spark's start-up: its first window begins then): so does the simulated one."""
    replay_s = minutes * 60
    rows = math.ceil(trace_hours * 3600 / NATIVE_ROW_SECONDS[trace_name])
    # What the load generator sends: its rows' min..max onto LOW_FRACTION x peak..peak, linear between rows.
    trace = replay(builtin_series(trace_name), hours=replay_s / 3600, rate=settings.peak, scaling="stretch",
                   row_replay_s=replay_s / rows, as_load_generator=True)
    config = eval_config(settings).model_copy(update={"policy": policy})
    # As the live analyze agent forecasts: one point per metric window (the offline evaluation's
    # forecaster sees one a minute), so both fit their first model after as many windows.
    forecasts = forecast_stream(trace, config, step_s=WINDOW_S) if policy_class(policy).needs_forecast else None
    model = settings.job().model()
    runs = []
    for seed in range(settings.first_seed, settings.first_seed + settings.seeds):
        run = simulate(trace, model, PolicyRunner(make_policy(policy), config), config, 1, settings.backlog_target_s,
                       forecasts, seed=seed, rate_noise=settings.noise, start_s=start_s)
        runs.append(run.summary() | {"seed": seed, "recoveries": run.recoveries,
                                     "measured_live": run.as_measured_live(settings.backlog_target_s)})
    return trace, runs


def live_start_s(out: dict[str, Any]) -> float:
    """Seconds from the load's start to the live job's first window's start (recorded as `start_s`;
    for runs recorded before, read from the timeline's first window)."""
    if out["live"].get("start_s") is not None:
        return float(out["live"]["start_s"])
    for line in (out.get("timeline") or "").splitlines():
        if " window " in line:
            return max(0.0, float(line.split()[0]) - WINDOW_S)
    return 0.0


def compare(console: Console, out: dict[str, Any], settings: EvalSettings) -> dict[str, Any]:
    """The recorded live run `out` against the simulation of its replay under `settings`' job model:
    prints the table and returns `out` with the simulated runs, their medians and the differences."""
    live = out["live"]
    trace, runs = simulated_replay(out["trace"], out["policy"], settings, out["minutes"], out["trace_hours"],
                                   start_s=live_start_s(out))
    table = Table(title=f"{trace.description}: live against simulated (policy {out['policy']}, job model "
                        f"{settings.job().name}, {len(runs)} noise seeds; backlog and lag over the windows the job "
                        "reported in, as live)", title_justify="left")
    for column in ("measure", "live", "simulated median", "simulated range", "difference"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    medians, differences = {}, {}
    for key in COMPARED:
        # Like with like: what the live run cannot see (the backlog while the job is down) is left out of the
        # simulated measures too; the simulated true peak stays in each run's summary.
        values = sorted(float(r.get("measured_live", {}).get(key, r[key])) for r in runs)
        medians[key] = float(np.median(values))
        a = float(live[key])
        differences[key] = None if a == 0 else (medians[key] - a) / a
        shown = "-" if differences[key] is None else f"{100 * differences[key]:+.0f} %"
        table.add_row(key, f"{a:.0f}", f"{medians[key]:.0f}", f"{values[0]:.0f}-{values[-1]:.0f}", shown)
    console.print(table)
    drift = drift_summary(out.get("windows") or [], trace.rates)
    if drift:
        console.print_json(json.dumps(drift))
    recoveries = recovery_errors(out.get("recoveries") or [])
    simulated = recovery_errors([r for run in runs for r in run["recoveries"]])
    console.print(f"recoveries: {recoveries['predicted']} of {recoveries['recoveries']} predicted; median error "
                  f"{recoveries['median_error']} of the observed time (simulated: {simulated['predicted']} of "
                  f"{simulated['recoveries']}, median error {simulated['median_error']})")
    return out | {"job_model": settings.job().name, "simulated": runs, "simulated_median": medians,
                  "relative_difference": differences, "drift": drift, "recovery_errors": recoveries,
                  "simulated_recovery_errors": simulated}


def recovery_errors(recoveries: list[dict[str, Any]]) -> dict[str, Any]:
    """Each observed recovery against the recovery time predicted when its rescale was decided:
    `median_error` is the median of |predicted - observed| / observed over the recoveries that had a
    prediction. The detector times the return between window ends (`analyze.anomaly`), so both are read
    as they are, not on the window grid."""
    rows, ratios = [], []
    for r in recoveries:
        predicted, observed = r.get("predicted_s"), r.get("observed_s")
        if predicted is None or not observed:
            rows.append(r | {"relative_error": None})
            continue
        ratio = abs(predicted - observed) / observed
        ratios.append(ratio)
        rows.append(r | {"relative_error": round(ratio, 3)})
    return {"recoveries": len(recoveries), "predicted": len(ratios),
            "median_error": round(float(np.median(ratios)), 3) if ratios else None,
            "max_error": round(max(ratios), 3) if ratios else None,
            "too_long": sum(1 for r in rows if r["relative_error"] is not None and r["predicted_s"] > r["observed_s"]),
            "rows": rows}


def drift_summary(windows: list[dict[str, Any]], rates: np.ndarray, span_s: float = 600.0,
                  warmup_s: float = 120.0, match: float = 0.1) -> dict[str, Any]:
    """A long run's first `span_s` (after `warmup_s`) against its last: the job's DS2 per-slot rate and
    batch overhead, and the load generator's records (arrival rate x window) against the replay's.

    The per-slot rate depends on the load (a batch's fixed costs weigh more on few records), so the
    drift compares like with like: each window of the last span against the median of the windows of
    the run's first half (after the warm-up) at the same parallelism and an arrival rate within
    `match`; `slot_rate_change` is the median of those ratios less 1. The replay's windows are aligned
    to the run's by the shift of at most 3 windows that matches them best. Empty if the run is shorter
    than two spans and the warm-up."""
    rows = sorted((w for w in windows if w.get("arrival_rate")), key=lambda w: w["window_end"])
    if not rows or (rows[-1]["window_end"] - rows[0]["window_end"]) < 2 * span_s + warmup_s:
        return {}
    arrival = np.array([w["arrival_rate"] for w in rows])
    n = min(len(arrival), len(rates))

    def mismatch(shift: int) -> float:
        a, r = arrival[max(0, shift):n], rates[max(0, -shift):n]
        m = min(len(a), len(r))
        return float(np.abs(a[:m] - r[:m]).mean())

    shift = min(range(-3, 4), key=mismatch)
    t0 = rows[0]["window_end"] - WINDOW_S
    end = rows[-1]["window_end"]

    def measured(begin: float, stop: float) -> list[dict[str, Any]]:
        return [w for w in rows if begin < w["window_end"] <= stop and w["valid"] and w["utilization"] > 0]

    def span(begin: float, stop: float) -> dict[str, Any]:
        # Like with like: only windows the replay has a row for (not the last one, after the load ended).
        idx = [i for i, w in enumerate(rows) if begin < w["window_end"] <= stop and 0 <= i - shift < len(rates)]
        used = measured(begin, stop)
        overheads = [w["batch_overhead_s"] for w in used if w["batch_overhead_s"] is not None]
        replayed = [rates[i - shift] for i in idx]
        produced = sum(rows[i]["arrival_rate"] for i in idx) * WINDOW_S
        return {"from_s": round(begin - t0), "to_s": round(stop - t0), "windows": len(idx),
                "slot_rate": round(float(np.median([w["true_processing_rate"] for w in used])), 1) if used else None,
                "batch_overhead_s": round(float(np.median(overheads)), 3) if overheads else None,
                "produced": round(produced), "replayed": round(sum(replayed) * WINDOW_S),
                "produced_vs_replayed": round(produced / (sum(replayed) * WINDOW_S) - 1, 4) if replayed else None}

    reference = measured(t0 + warmup_s, t0 + (end - t0) / 2)
    ratios = []
    for w in measured(end - span_s, end):
        alike = [r["true_processing_rate"] for r in reference if r["parallelism"] == w["parallelism"]
                 and abs(r["arrival_rate"] / w["arrival_rate"] - 1) <= match]
        if alike:
            ratios.append(w["true_processing_rate"] / float(np.median(alike)))
    return {"first": span(t0 + warmup_s, t0 + warmup_s + span_s), "last": span(end - span_s, end),
            "alignment_windows": shift, "matched_windows": len(ratios),
            "slot_rate_change": round(float(np.median(ratios)) - 1, 4) if ratios else None,
            "slot_rate_change_p10_p90": [round(float(q) - 1, 4) for q in np.percentile(ratios, [10, 90])]
            if ratios else None}


def run_live_evaluation(console: Console, trace_name: str, policy: str, settings: EvalSettings, minutes: float,
                        json_out: Path, trace_hours: float = 2.0, warm_up_s: float = WARM_UP_S) -> dict[str, Any]:
    """Replay `trace_hours` of the trace in `minutes` live, then simulate the same replay. The job runs
    `warm_up_s` at the replay's lowest rate before the replay and the autoscaler start (`run_live`): the
    simulator models a warm job, as a job in production is."""
    if trace_name not in TRACE_FILES:
        raise ValueError(f"--live replays a trace file: one of {', '.join(TRACE_FILES)}")
    replay_s = minutes * 60
    native = NATIVE_ROW_SECONDS[trace_name]
    rows = math.ceil(trace_hours * 3600 / native)
    row_s = replay_s / rows
    peak = settings.peak
    overrides = {"policy": policy,
                 "forecast_min_points": str(eval_config(settings).forecast_min_points)}
    workdir = Path(tempfile.mkdtemp(prefix="evaluate-live-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    run_id = uuid.uuid4().hex[:6]
    live_settings = isolated_settings(broker.port, redis.port, f"e{run_id}", f"evaluate-{run_id}",
                                      loop_interval_s=WINDOW_S)
    load_args = ["--trace", str(TRACES / TRACE_FILES[trace_name]), "--seconds-per-row", f"{row_s:.6f}",
                 "--rows", str(rows), "--low", f"{LOW_FRACTION * peak:.3f}", "--high", f"{peak:.3f}"]
    console.print(f"live: {trace_hours:g} h of {trace_name} in {minutes:g} min ({native / row_s:.0f}x), "
                  f"peak {peak:g} rec/s, policy {policy}; logs in {workdir}")
    started = time.time()
    try:
        run = run_live(live_settings, workdir, load_args, overrides, max_parallelism=settings.max_parallelism,
                       drain_s=30.0, job="evaluate", warm_up_s=warm_up_s, warm_up_rate=LOW_FRACTION * peak)
    finally:
        stop_pid(broker.process.pid, process=broker.process)
        stop_pid(redis.process.pid, process=redis.process)
    out = {"trace": trace_name, "policy": policy, "minutes": minutes, "trace_hours": trace_hours, "peak": peak,
           "warm_up_s": warm_up_s,
           "max_parallelism": settings.max_parallelism, "wall_s": round(time.time() - started, 1),
           "live": live_measures(run, settings.backlog_target_s), "load": run.load_summary,
           "recoveries": run.recoveries(), "decisions": run.decision_rows(load_start(run)),
           "windows": [a.model_dump(mode="json", include=WINDOW_FIELDS) for a in run.analyses],
           "timeline": run.timeline()}
    path = json_out.with_name(json_out.stem + f"-live-{trace_name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))  # the live run is kept even if the simulation fails
    out = compare(console, out, settings)
    path.write_text(json.dumps(out, indent=1))
    console.print(f"wrote {path}")
    return out


def main(
    results: Annotated[list[Path], typer.Argument(help="JSON files written by `autoscaler evaluate --live`.")],
    job_model: Annotated[Path | None, typer.Option(help="A job-model file; default the demo job's.")] = None,
    seeds: Annotated[int, typer.Option(min=1)] = 5,
    max_parallelism: Annotated[int, typer.Option(help="If the result does not say.")] = 4,
    backlog_target_s: Annotated[float, typer.Option()] = 60.0,
    out: Annotated[Path | None, typer.Option(help="Where the comparison goes; default beside RESULT.")] = None,
) -> None:
    """Compare recorded live runs against the simulation of their replay under another job model
    (`python -m evaluation.live RESULT... --job-model FILE`): no need to run them live again. With
    several, their recoveries are also pooled."""
    console = Console(width=150)
    pooled: list[dict[str, Any]] = []
    for result in results:
        recorded = json.loads(result.read_text())
        if "peak_backlog" not in recorded["live"]:  # recorded before it was measured
            recorded["live"]["peak_backlog"] = float(max((w.get("backlog") or 0) for w in recorded["windows"]))
        settings = EvalSettings(peak=recorded["peak"], max_parallelism=recorded.get("max_parallelism", max_parallelism),
                                seeds=seeds, backlog_target_s=backlog_target_s,
                                job_model=str(job_model) if job_model else None)
        compared = compare(console, recorded, settings)
        target = (out if out and len(results) == 1 else None) or \
            result.with_name(f"{result.stem}-vs-{settings.job().name}.json")
        target.write_text(json.dumps(compared, indent=1))
        print(f"wrote {target}")
        pooled += [r | {"run": result.stem} for r in compared["recovery_errors"]["rows"]]
    if len(results) > 1:
        summary = recovery_errors(pooled)
        console.print(f"all runs: {summary['predicted']} of {summary['recoveries']} recoveries predicted; median error "
                      f"{summary['median_error']}, worst {summary['max_error']} of the observed time")
        for row in summary["rows"]:
            console.print(f"  {row['run']}: {row['from']} -> {row['to']}: observed {row['observed_s']} s, predicted "
                          f"{row['predicted_s']} s")


if __name__ == "__main__":
    typer.run(main)
