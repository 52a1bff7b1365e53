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
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from contracts.messages import EventType
from evaluation.forecasts import forecast_stream
from evaluation.simulator import WINDOW_S, PolicyRunner, simulate
from evaluation.suite import eval_config
from evaluation.traces import LOW_FRACTION, NATIVE_ROW_SECONDS, TRACE_FILES, TRACES, builtin_series, replay
from plan.registry import make_policy, policy_class
from stack.live import LiveRun, run_live
from stack.processes import start_broker, start_redis, stop_pid
from stack.services import isolated_settings

if TYPE_CHECKING:
    from evaluation.suite import EvalSettings
    from evaluation.traces import Trace

COMPARED = ("slot_seconds", "beyond_target_s", "lag_p95_s", "actions")
# Per window in the JSON: enough to follow the job's per-slot rate and batch cost over a long run.
WINDOW_FIELDS = {"window_end", "parallelism", "valid", "arrival_rate", "backlog", "observed_processing_rate",
                 "true_processing_rate", "utilization", "batch_overhead_s", "batch_work_s"}


def live_measures(run: LiveRun, backlog_target_s: float, initial_parallelism: int = 1) -> dict[str, Any]:
    """The simulator's measures from what the agents published: windows (arrival, backlog) and the
    completed rescales (the parallelism is paid from the moment the job stopped for it)."""
    windows = sorted((a for a in run.analyses if a.arrival_rate is not None), key=lambda a: a.window_end)
    if not windows:
        raise RuntimeError("the live run published no analysis with an arrival rate")
    begin, end = windows[0].window_end - WINDOW_S, windows[-1].window_end
    switches = sorted((e.timestamp - (e.downtime_s or 0.0), e.to_parallelism)
                      for e in run.of(EventType.COMPLETED))
    paid, t, p = 0.0, begin, initial_parallelism
    for at, to in switches:
        at = min(max(at, begin), end)
        paid += p * (at - t)
        t, p = at, to
    paid += p * (end - t)
    lags = np.array([(a.backlog or 0) / a.arrival_rate if a.arrival_rate else 0.0 for a in windows])
    beyond = sum(WINDOW_S for a in windows if (a.backlog or 0) > backlog_target_s * (a.arrival_rate or 0.0))
    return {"slot_seconds": paid, "beyond_target_s": beyond, "lag_p95_s": float(np.percentile(lags, 95)),
            "lag_max_s": float(lags.max()), "actions": len(run.of(EventType.COMPLETED)),
            "failed": len(run.of(EventType.FAILED)), "windows": len(windows), "span_s": end - begin,
            "downtimes_s": [e.downtime_s for e in run.of(EventType.COMPLETED)]}


def simulated_replay(trace_name: str, policy: str, settings: EvalSettings, minutes: float,
                     trace_hours: float) -> tuple[Trace, dict[str, Any]]:
    """The simulator's run of the replay `run_live_evaluation` sends to the real job."""
    replay_s = minutes * 60
    rows = math.ceil(trace_hours * 3600 / NATIVE_ROW_SECONDS[trace_name])
    # The load generator maps the trace's min..max onto LOW_FRACTION x peak..peak: so does this replay.
    trace = replay(builtin_series(trace_name), hours=replay_s / 3600, rate=settings.peak, scaling="stretch",
                   row_replay_s=replay_s / rows)
    config = eval_config(settings).model_copy(update={"policy": policy})
    forecasts = forecast_stream(trace, config) if policy_class(policy).needs_forecast else None
    run = simulate(trace, settings.job().model(), PolicyRunner(make_policy(policy), config), config, 1,
                   settings.backlog_target_s, forecasts, rate_noise=settings.noise)
    return trace, run.summary()


def run_live_evaluation(console: Console, trace_name: str, policy: str, settings: EvalSettings, minutes: float,
                        json_out: Path, trace_hours: float = 2.0) -> dict[str, Any]:
    """Replay `trace_hours` of the trace in `minutes` live, then simulate the same replay."""
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
                       drain_s=30.0, job="evaluate")
    finally:
        stop_pid(broker.process.pid, process=broker.process)
        stop_pid(redis.process.pid, process=redis.process)
    live = live_measures(run, settings.backlog_target_s)
    trace, simulated = simulated_replay(trace_name, policy, settings, minutes, trace_hours)

    table = Table(title=f"{trace.description}: live against simulated (policy {policy})", title_justify="left")
    for column in ("measure", "live", "simulated", "difference"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    differences = {}
    for key in COMPARED:
        a, b = float(live[key]), float(simulated[key])
        differences[key] = None if a == 0 else (b - a) / a
        shown = "-" if differences[key] is None else f"{100 * differences[key]:+.0f} %"
        table.add_row(key, f"{a:.0f}", f"{b:.0f}", shown)
    console.print(table)
    out = {"trace": trace_name, "description": trace.description, "policy": policy, "minutes": minutes,
           "trace_hours": trace_hours, "peak": peak, "wall_s": round(time.time() - started, 1), "live": live,
           "simulated": simulated, "relative_difference": differences,
           "load": run.load_summary, "recoveries": run.recoveries(),
           "windows": [a.model_dump(mode="json", include=WINDOW_FIELDS) for a in run.analyses],
           "timeline": run.timeline()}
    path = json_out.with_name(json_out.stem + f"-live-{trace_name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    console.print(f"wrote {path}")
    return out
