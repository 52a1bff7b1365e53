"""`python -m bench.backends_sim`: the evaluation's traces with the job rescaled by restarts and in place.

Runs the evaluation suite (`evaluation.suite`, what `autoscaler evaluate` runs) twice on the same
traces, regimes and noise seeds: once with every rescale a restart from the checkpoint (the demo job
model's measured downtimes, and the replay), once with its executors changed in place (the model's
measured ramp and hold, nothing replayed). Policies and the oracle get the same backend in a run, so
each run's oracle is the cheapest schedule under that backend. Per trace and regime, for each chosen
policy: its median slot-seconds in place over by restart, and its cost against each run's oracle
(median, worst seed), and the time beyond the target (worst seed). Prints a table and writes JSON.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bench.common import RESULTS, table, write_result
from contracts.backends import BackendKind
from evaluation.suite import EvalSettings, calibration, evaluate_all
from evaluation.traces import DEFAULT_TRACES
from tests.support.backends import compare

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    policy: Annotated[list[str] | None, typer.Option(help="Policies to compare; default the default policy.")] = None,
    trace: Annotated[list[str] | None, typer.Option(help=f"Traces; default {', '.join(DEFAULT_TRACES)}.")] = None,
    seeds: Annotated[int, typer.Option(min=1)] = 5,
    hours: Annotated[float, typer.Option()] = 6.0,
    workers: Annotated[int, typer.Option(min=1)] = 2,
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "backends_sim.json",
) -> None:
    """Both backends on the same cases; print the comparison and write JSON."""
    console = Console(width=160)
    policies = policy or ["default"]
    traces = trace or list(DEFAULT_TRACES)
    base = EvalSettings(hours=hours, seeds=seeds)
    started = time.perf_counter()
    restart, in_place = (evaluate_all(traces, policies, dataclasses.replace(base, backend=kind), workers)
                         for kind in (BackendKind.RESTART, BackendKind.IN_PLACE))
    wall = time.perf_counter() - started
    rows = [row for name in policies for row in compare(restart, in_place, name)]
    result = table(f"restart vs in place: {seeds} seeds, {hours:g} h per trace, the demo job model (medians; worst "
                   "seed in brackets)", "trace", "regime", "policy", "in place / restart", "restart / its oracle",
                   "in place / its oracle", "oracle: in place / restart", "beyond target s (worst) r | ip",
                   "actions r | ip")
    for r in rows:
        result.add_row(r["trace"], r["regime"], r["policy"],
                       *(f"{r[f'{k}_median']:.3f} ({r[f'{k}_worst']:.3f})"
                         for k in ("in_place_over_restart", "restart_vs_oracle", "in_place_vs_oracle")),
                       f"{r['oracle_in_place_over_restart_median']:.3f}",
                       f"{r['restart_beyond_target_s_worst']:.0f} | {r['in_place_beyond_target_s_worst']:.0f}",
                       f"{r['restart_actions_median']:.0f} | {r['in_place_actions_median']:.0f}")
    console.print(result)
    console.print(f"both backends, {len(policies)} policies x {len(restart)} cases each, in {wall:.0f} s on "
                  f"{workers} workers")
    write_result(out, {"policies": policies, "traces": traces, "seeds": seeds, "hours": hours,
                       "wall_s": round(wall, 1), "calibration": calibration(base), "rows": rows}, console=console)


if __name__ == "__main__":
    app()
