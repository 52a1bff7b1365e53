"""`autoscaler evaluate`: every policy on every trace; a table, JSON, markdown and plots.

`autoscaler bench evaluate` is the same command under its former name, kept for one release.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from evaluation.convergence import experiment
from evaluation.report import markdown, plot, print_convergence, print_table
from evaluation.suite import EVALUATED, EvalSettings, calibration, evaluate_all
from evaluation.traces import SHARED_TRACES, TRACE_NAMES
from plan.registry import DEFAULT_POLICY, POLICIES

RESULTS = Path("results")  # relative to where the command runs


def evaluate_command(
    policy: Annotated[list[str] | None, typer.Option(help=f"Policies ({', '.join(POLICIES)}); default all.")] = None,
    trace: Annotated[list[str] | None, typer.Option(
        help=f"Traces ({', '.join(TRACE_NAMES)}); default the five real ones and taylor.")] = None,
    hours: Annotated[float, typer.Option(help="Hours of load replayed per trace.")] = 6.0,
    peak: Annotated[float, typer.Option(help="Every trace's maximum is mapped to this rate (rec/s).")] = 1400.0,
    max_parallelism: Annotated[int, typer.Option(help="Largest parallelism any policy may use.")] = 12,
    backlog_target_s: Annotated[float, typer.Option(help="Backlog target, in seconds of arrivals.")] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed of the rate noise.")] = 0,
    workers: Annotated[int, typer.Option(help="Processes, one trace each at a time.")] = 2,
    json_out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "evaluate.json",
    plots: Annotated[Path | None, typer.Option(help="Folder of the PNG plots; default next to the JSON.")] = None,
    live: Annotated[bool, typer.Option(help="Replay one trace against the real Spark job through the agents.")] = False,
    live_minutes: Annotated[float, typer.Option(help="--live: minutes of replay.")] = 12.0,
    live_trace_hours: Annotated[float, typer.Option(help="--live: hours of the trace replayed in them.")] = 2.0,
) -> None:
    """Run the chosen policies on the chosen traces; print a table, write JSON and PNG plots."""
    console = Console(width=None if sys.stdout.isatty() else 150)
    policies = policy or list(EVALUATED)
    traces = trace or [*SHARED_TRACES, "taylor"]
    for name in policies:
        if name not in POLICIES:
            raise typer.BadParameter(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    for name in traces:
        if name not in TRACE_NAMES:
            raise typer.BadParameter(f"unknown trace {name!r}; choose from {', '.join(TRACE_NAMES)}")
    settings = EvalSettings(hours=hours, peak=peak, max_parallelism=max_parallelism,
                            backlog_target_s=backlog_target_s, seed=seed)
    if live:
        from evaluation.live import run_live_evaluation

        run_live_evaluation(console, traces[0], policies[0] if policy else DEFAULT_POLICY, settings, live_minutes,
                            json_out, live_trace_hours)
        return
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{len(policies)} policies x {len(traces)} traces", total=len(traces))
        results = evaluate_all(traces, policies, settings, workers,
                               on_done=lambda name: progress.advance(task))
    elapsed = time.perf_counter() - started
    print_table(console, results)
    plot_dir = plots or json_out.parent / "evaluate"
    paths = [plot(result, plot_dir) for result in results]
    ds2_convergence = experiment()
    print_convergence(console, ds2_convergence)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({
        "settings": settings.__dict__, "policies": policies, "traces": traces, "wall_s": round(elapsed, 2),
        "calibration": calibration(), "results": results, "ds2_convergence": ds2_convergence,
    }, indent=1))
    json_out.with_suffix(".md").write_text(markdown(results, ds2_convergence))
    console.print(f"{len(policies)} policies x {len(traces)} traces in {elapsed:.1f} s; wrote {json_out}, "
                  f"{json_out.with_suffix('.md').name} and {len(paths)} plots in {plot_dir}")
