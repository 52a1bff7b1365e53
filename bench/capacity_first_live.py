"""`python -m bench.capacity_first_live --plan results/capacity.json`: a new job's first live
decision at a step to 4x its load, without and with a capacity plan.

The plan is one `autoscaler capacity plan --live` wrote (its JSON report); its curve is what `--job`
would store (`evaluation.capacity_cli.planned_curve`). Each run starts its own broker and Redis, then a
live run (`stack.live`): the four agents with the defaults a user gets, the demo Spark job warmed up
before it is registered (so the job is new to the agents), and the load: `--base` rec/s, then 4 times
it. Counted after the step: the scale-ups, the first one's target, the parallelism held at the end,
the peak backlog and when it drained (at most 2 s of the stepped load waiting). The two runs,
without then with the plan, are on the same machine one after the other.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from evaluation.capacity_cli import planned_curve
from plan.capacity.explore import Exploration
from plan.capacity.scaling import Fit
from rich.console import Console
from rich.table import Table

from bench.common import code_version, machine_info
from contracts.decisions import Action
from contracts.jobs import format_planned_capacity
from stack.live import run_live
from stack.processes import start_broker, start_redis, stop_pid
from stack.services import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results" / "capacity_first_live.json"
CODE = ("plan/policies/default.py", "plan/capacity/explore.py", "evaluation/capacity_cli.py", "contracts/jobs.py")
app = typer.Typer(add_completion=False, help=__doc__)


def planned_from_report(path: Path, max_parallelism: int) -> tuple[str, float]:
    """The planned capacity (`planned_capacity` setting) and its error from a plan's JSON report."""
    report = json.loads(path.read_text())
    fits = [Fit(m["name"], tuple(m["params"]), m["loo_error"], m.get("loo_se", 0.0)) for m in report["models"]]
    curve, error = planned_curve(Exploration(fits=fits), max_parallelism)
    return format_planned_capacity(curve), error


def one_run(overrides: dict[str, str], base: float, base_s: float, step_s: float, max_parallelism: int,
            cost_ms: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="capacity-first-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    run_id = uuid.uuid4().hex[:6]
    settings = isolated_settings(broker.port, redis.port, f"c{run_id}", f"bench-{run_id}", loop_interval_s=5.0)
    shape = f"steps:{base:g}:{base_s:g},{4 * base:g}:{step_s:g}"
    try:
        run = run_live(settings, workdir, ["--shape", shape], overrides, max_parallelism=max_parallelism,
                       cost_ms=cost_ms, warm_up_s=60.0, warm_up_rate=base)
    finally:
        stop_pid(broker.process.pid, process=broker.process)
        stop_pid(redis.process.pid, process=redis.process)
    step_at = run.started + base_s
    ups = [d for d in sorted(run.decisions, key=lambda d: d.window_end)
           if d.action is Action.SCALE_UP and d.window_end >= step_at]
    before = [d for d in run.decisions if d.action is not Action.NONE and d.window_end < step_at]
    analyses = sorted(run.analyses, key=lambda a: a.window_end)
    held = [a.parallelism for a in analyses if step_at <= a.window_end <= step_at + step_s]
    # Drained: the first window after the first scale-up with at most 2 s of the stepped load waiting.
    drained = next((a.window_end - step_at for a in analyses if ups and a.window_end > ups[0].window_end
                    and a.backlog is not None and a.backlog <= 2 * 4 * base), None)
    (workdir / "timeline.txt").write_text(run.timeline())
    return {"scale_ups_after_step": len(ups), "targets": [d.to_parallelism for d in ups],
            "first_target": ups[0].to_parallelism if ups else None,
            "first_up_s_after_step": round(ups[0].window_end - step_at, 1) if ups else None,
            "actions_before_step": len(before), "held_at_end": held[-1] if held else None,
            "peak_backlog_after_step": max((a.backlog or 0 for a in run.analyses if a.window_end >= step_at),
                                           default=None),
            "drained_s_after_step": None if drained is None else round(drained, 1),
            "reasons": [d.reason.message for d in ups], "timeline": str(workdir / "timeline.txt")}


@app.command()
def main(
    plan: Annotated[Path, typer.Option(help="A plan's JSON report (autoscaler capacity plan --live --out FILE).")],
    base: Annotated[float, typer.Option(help="The load before the step (rec/s); after it, 4 times this.")] = 150.0,
    base_s: Annotated[float, typer.Option(help="Seconds at the base load.")] = 150.0,
    step_s: Annotated[float, typer.Option(help="Seconds at 4 times the base load.")] = 240.0,
    max_parallelism: Annotated[int, typer.Option(help="The job's largest parallelism.")] = 4,
    cost_ms: Annotated[float, typer.Option(help="The demo job's per-record cost.")] = 4.0,
    repeat: Annotated[int, typer.Option(help="Pairs of runs (without, then with the plan).")] = 1,
    output: Annotated[Path, typer.Option(help="The JSON to write.")] = RESULTS,
) -> None:
    console = Console()
    planned, error = planned_from_report(plan, max_parallelism)
    common = {"restart_time_s": "20", "checkpoint_interval_s": "5"}
    rows: dict[str, dict[str, Any]] = {}
    for pair in range(1, repeat + 1):
        for name, overrides in (("without a plan", common),
                                ("with the plan", {**common, "planned_capacity": planned,
                                                   "planned_capacity_error": f"{error:.3f}"})):
            started = time.perf_counter()
            key = name if repeat == 1 else f"{name}, pair {pair}"
            rows[key] = one_run(overrides, base, base_s, step_s, max_parallelism, cost_ms) | {
                "wall_s": round(time.perf_counter() - started, 1)}
            console.print(f"{key}: {rows[key]}")
            write(output, rows, planned, error, base, plan)
    table = Table(title=f"a new job's first decisions at a step {base:g} -> {4 * base:g} rec/s (demo job, "
                        f"{cost_ms:g} ms per record, at most {max_parallelism} slots)", title_justify="left")
    for column in ("run", "scale-ups after the step", "targets", "first, s after the step", "held at the end",
                   "peak backlog", "drained, s after the step"):
        table.add_column(column, justify="right")
    for name, row in rows.items():
        table.add_row(name, str(row["scale_ups_after_step"]), str(row["targets"]), str(row["first_up_s_after_step"]),
                      str(row["held_at_end"]), str(row["peak_backlog_after_step"]),
                      f"not within {step_s:g}" if row["drained_s_after_step"] is None
                      else str(row["drained_s_after_step"]))
    console.print(table)
    console.print(f"wrote {output}")


def write(output: Path, rows: dict[str, dict[str, Any]], planned: str, error: float, base: float,
          plan: Path) -> None:
    """The runs so far (written after each, so a long repeat leaves its results if stopped)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"runs": rows, "planned_capacity": planned, "planned_error": error, "base": base,
                                  "plan": plan.name, "code": code_version(CODE), "machine": machine_info()},
                                 indent=1, default=str))


if __name__ == "__main__":
    app()
