"""The demo Spark job under a replayed load, autoscaled live by a chosen policy: rescales, backlog,
and each rescale's predicted recovery time beside the one anomaly detection observed.

Starts its own broker and Redis, then a live run (`stack.live`): the four agents, the job (local Spark)
and the load generator.

  python -m bench.proactive_live --policy hybrid
      steps that force rescales both ways (about 17 minutes); a table of predicted vs observed
      recovery per rescale, the median absolute error, and JSON under bench/results/
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from contracts.decisions import EventType
from stack.live import run_live
from stack.processes import start_broker, start_redis, stop_pid
from stack.services import isolated_settings

RESULTS = Path(__file__).parent / "results"
# Rescales both ways: the demo job carries about 215 rec/s per slot at cost_ms=4. Each level lasts
# longer than a restart plus a recovery, so every rescale's recovery can be observed before the next.
# At most 3 slots: on 2 cores, with the agents, broker and load generator beside it, the job at 4
# slots processes far below its busy-time capacity (see docs/results.md, "Live").
DEFAULT_STEPS = "steps:100:60,350:150,100:150,420:150,150:150,300:150,100:150"


app = typer.Typer(help=__doc__, no_args_is_help=False)


@app.command()
def main(
    policy: Annotated[str, typer.Option(help="ds2, daedalus or hybrid.")] = "hybrid",
    shape: Annotated[str, typer.Option(help="Load shape (see `autoscaler load run --help`).")] = DEFAULT_STEPS,
    cost_ms: Annotated[float, typer.Option(help="The demo job's CPU cost per record.")] = 4.0,
    json_out: Annotated[Path | None, typer.Option(help="Default bench/results/proactive_live-<policy>.json")] = None,
) -> None:
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="proactive-live-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    run_id = uuid.uuid4().hex[:6]
    settings = isolated_settings(broker.port, redis.port, f"b{run_id}", f"bench-{run_id}", loop_interval_s=5.0)
    overrides = {"policy": policy, "restart_time_s": "20", "scale_down_delay_s": "20", "target_recovery_s": "60",
                 "forecast_horizon_s": "60", "forecast_min_points": "20", "checkpoint_interval_s": "5"}
    started = time.time()
    try:
        run = run_live(settings, workdir, ["--shape", shape], overrides, max_parallelism=3, cost_ms=cost_ms)
    finally:
        stop_pid(broker.process.pid, process=broker.process)
        stop_pid(redis.process.pid, process=redis.process)
    rows = run.recoveries()
    table = Table(title=f"Recovery after each live rescale of the demo job (policy {policy}, {shape})")
    for column in ("at s", "rescale", "predicted s", "observed s", "error s"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{r['at_s']:.0f}", f"{r['from']} -> {r['to']}",
                      "-" if r["predicted_s"] is None else f"{r['predicted_s']:.1f}",
                      f"{r['observed_s']:.1f}", "-" if r["error_s"] is None else f"{r['error_s']:+.1f}")
    console.print(table)
    errors = [abs(float(r["error_s"])) for r in rows if r["error_s"] is not None]
    completed = run.of(EventType.COMPLETED)
    summary = {
        "policy": policy, "shape": shape, "cost_ms": cost_ms, "wall_s": round(time.time() - started, 1),
        "rescales_completed": len(completed), "rescales_failed": len(run.of(EventType.FAILED)),
        "recoveries_observed": len(rows), "recoveries_with_prediction": len(errors),
        "median_abs_error_s": statistics.median(errors) if errors else None,
        "max_backlog": max((a.backlog or 0 for a in run.analyses), default=None),
        "downtimes_s": [e.downtime_s for e in completed], "recoveries": rows, "load": run.load_summary,
    }
    console.print(f"rescales completed {len(completed)}, recoveries observed {len(rows)} "
                  f"({len(errors)} with a prediction); median |predicted - observed| "
                  f"{summary['median_abs_error_s']} s; wall {summary['wall_s']} s")
    out = json_out or RESULTS / f"proactive_live-{policy}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    (workdir / "timeline.txt").write_text(run.timeline())
    console.print(f"wrote {out}; timeline in {workdir / 'timeline.txt'}")


if __name__ == "__main__":
    app()
