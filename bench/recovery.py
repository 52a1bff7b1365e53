"""`python -m bench.recovery`: how well the default policy predicts its rescales' recovery times, simulated.

Each trace is replayed as `autoscaler evaluate --live` replays it to the real job (15 minutes at the
demo's scale: peak 450 rec/s, at most 4 slots; 6 h of the synthetic sine and cos, 24 h of the recorded
traces), through the one simulator with the job model given (the demo job's by default), once per
noise seed (`evaluation.live.simulated_replay`). Every rescale's predicted recovery time is set
against the one the recovery detector observed: the median and worst |predicted - observed| /
observed per trace and pooled, and how many predictions were too long. Prints a table and writes
JSON. The live figure comes from `autoscaler evaluate --live` runs (`python -m evaluation.live`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from bench.common import RESULTS, table, write_result
from evaluation.live import recovery_errors, simulated_replay
from evaluation.suite import EvalSettings

SYNTHETIC_HOURS = {"sine": 6.0, "cos": 6.0}  # the live runs' replays; the recorded traces replay 24 h
RECORDED_HOURS = 24.0
app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    traces: Annotated[str, typer.Option(help="Comma-separated trace names.")] = "cos,sine,wiki,avazu,iot,taylor",
    seeds: Annotated[int, typer.Option(min=1)] = 5,
    job_model: Annotated[Path | None, typer.Option(help="A job-model file; default the demo job's.")] = None,
    minutes: Annotated[float, typer.Option(min=1.0, help="Length of each replay.")] = 15.0,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "recovery.json",
) -> None:
    console = Console()
    settings = EvalSettings(peak=450, max_parallelism=4, seeds=seeds, job_model=str(job_model) if job_model else None)
    out = table(f"recovery predictions of the default policy, simulated ({settings.job().name} job model, {seeds} "
                f"noise seeds, {minutes:g}-min replays)", "trace", "recoveries predicted", "median error",
                "worst error", "too long")
    per_trace: dict[str, Any] = {}
    pooled: list[dict[str, Any]] = []
    for name in [t.strip() for t in traces.split(",") if t.strip()]:
        hours = SYNTHETIC_HOURS.get(name, RECORDED_HOURS)
        _, runs = simulated_replay(name, "default", settings, minutes, hours, start_s=3.0)
        recoveries = [r | {"trace": name, "seed": run["seed"]} for run in runs for r in run["recoveries"]]
        errors = recovery_errors(recoveries)
        per_trace[name] = {k: v for k, v in errors.items() if k != "rows"} | {"trace_hours": hours}
        out.add_row(name, f"{errors['predicted']} of {errors['recoveries']}", str(errors["median_error"]),
                      str(errors["max_error"]), str(errors["too_long"]))
        pooled += recoveries
    total = recovery_errors(pooled)
    out.add_row("pooled", f"{total['predicted']} of {total['recoveries']}", str(total["median_error"]),
                  str(total["max_error"]), str(total["too_long"]), style="bold")
    console.print(out)
    write_result(output, {
        "settings": {"traces": traces, "seeds": seeds, "job_model": settings.job().name, "minutes": minutes,
                     "peak": settings.peak, "max_parallelism": settings.max_parallelism},
        "per_trace": per_trace, "pooled": {k: v for k, v in total.items() if k != "rows"}, "rows": total["rows"],
    }, console=console)

if __name__ == "__main__":
    app()
