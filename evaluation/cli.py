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

from contracts.backends import BackendKind
from evaluation.convergence import experiment
from evaluation.gap import summarize_gaps
from evaluation.html_report import report_page
from evaluation.model_files import WARM_UP_S, JobModelError
from evaluation.report import markdown, plot, print_convergence, print_gap_table, print_held_out, print_table
from evaluation.suite import EVALUATED, EvalSettings, calibration, cases_of, evaluate_all, summarize
from evaluation.traces import (
    DEFAULT_TRACES,
    GAP_FILLS,
    MAX_FILLED_GAP_ROWS,
    REGIMES,
    TRACE_NAMES,
    TraceError,
    read_trace_file,
)
from plan.registry import DEFAULT_POLICY, POLICIES

RESULTS = Path("results")  # relative to where the command runs


def evaluate_command(
    policy: Annotated[list[str] | None, typer.Option(help=f"Policies ({', '.join(POLICIES)}); default all.")] = None,
    trace: Annotated[list[str] | None, typer.Option(
        help=f"Built-in traces ({', '.join(TRACE_NAMES)}); default {', '.join(DEFAULT_TRACES)}.")] = None,
    trace_file: Annotated[list[Path] | None, typer.Option(
        help="Your own trace: CSV with a header `seconds,rate` (seconds since the start, records/s), any "
             "regular sampling. Repeatable.")] = None,
    fill_gaps: Annotated[str, typer.Option(
        help="--trace-file rows missing from the regular sampling (a step of a whole number of rows): none "
             "refuses the file; linear fills them on a straight line between the rows on each side and says how "
             f"many it filled (at most {MAX_FILLED_GAP_ROWS} missing in a row).")] = "none",
    hours: Annotated[float, typer.Option(help="Hours of load replayed per trace.")] = 6.0,
    peak: Annotated[float, typer.Option(help="Each trace is scaled by one factor so that its peak (or mean, "
                                             "see --scaling) is this rate (rec/s).")] = 1400.0,
    scaling: Annotated[str, typer.Option(help="peak, mean, or stretch (the trace's min..max onto 12.5-100 % of "
                                              "--peak: changes the trace's ratios).")] = "peak",
    regime: Annotated[list[str] | None, typer.Option(
        help="compressed (a row lasts at most 25 s) and/or real-time (rows at their own pace, with the trace's "
             "own short-term variation between them). Default both.")] = None,
    max_parallelism: Annotated[int, typer.Option(help="Largest parallelism any policy may use.")] = 12,
    backlog_target_s: Annotated[float, typer.Option(help="Backlog target, in seconds of arrivals.")] = 60.0,
    seeds: Annotated[int, typer.Option(help="Noise seeds per trace and regime.")] = 5,
    first_seed: Annotated[int, typer.Option(help="The first noise seed.")] = 0,
    rate_noise: Annotated[float | None, typer.Option(
        help="Per-window log-sd of the processing rate (0.1: 10 %); default the job model's.")] = None,
    job_model: Annotated[Path | None, typer.Option(
        help="A job-model file written by `autoscaler calibrate`; default the demo job's.")] = None,
    backend: Annotated[str, typer.Option(
        help="How the job is rescaled: restart (from its checkpoint, local mode) or inplace (executors changed on a "
             "standalone cluster: the job model's ramp_up_s and hold_down_s). Every policy and the oracle alike.")
    ] = "restart",
    noise_bound: Annotated[bool, typer.Option(
        help="Also the noise-aware bound: the cheapest schedule that knows the load but not the noise and keeps "
             "the target with the planner's probability (about 7 oracle searches per case).")] = True,
    workers: Annotated[int, typer.Option(help="Processes, one case (trace, regime, seed) each at a time.")] = 2,
    json_out: Annotated[Path, typer.Option("--json", help="Where the JSON goes: per trace x regime x seed x "
                                           "policy, and the oracle's figures.")] = RESULTS / "evaluate.json",
    plots: Annotated[Path | None, typer.Option(help="Folder of the PNG plots; default next to the JSON.")] = None,
    html: Annotated[Path | None, typer.Option(
        help="Also write one self-contained HTML page here: the tables, and per trace and regime a chart of "
             "the first seed's load and every policy's and the oracle's parallelism.")] = None,
    explain_gap: Annotated[bool, typer.Option(
        help="Also print (and write to the markdown and --html) where --gap-policy's cost above the oracle's comes "
             "from, per trace and regime: rescales undone within minutes, measuring holds, early scale-ups, late "
             "scale-downs, safety margin, windows below the oracle (evaluation.gap). Every run's decomposition is "
             "in the JSON either way (its row's gap).")] = False,
    gap_policy: Annotated[str, typer.Option(help="--explain-gap: the policy explained (one of those run).")
    ] = DEFAULT_POLICY,
    fleet: Annotated[int, typer.Option(
        help="Replay this many jobs side by side on one cluster (evaluation.fleet): the fleet step against a "
             "first-come slot quota and against each job alone, with the jobs' oracles as a bound. The traces "
             "(default the shared ones) go to the jobs in turn, each shifted by i/N of a day; the first --policy "
             "and --regime (default compressed). 0: the suite.")] = 0,
    budget: Annotated[int | None, typer.Option(help="--fleet: the cluster's slots; default --budget-share of the "
                                                    "sum of the jobs' peak slots.")] = None,
    budget_share: Annotated[float, typer.Option(help="--fleet: the budget as a share of the jobs' peak slots.")
    ] = 0.6,
    fleet_weight: Annotated[list[float] | None, typer.Option(
        help="--fleet: the jobs' weights, in turn (repeatable; default 1 each).")] = None,
    live: Annotated[bool, typer.Option(help="Replay one trace against the real Spark job through the agents.")] = False,
    live_minutes: Annotated[float, typer.Option(help="--live: minutes of replay.")] = 12.0,
    live_trace_hours: Annotated[float, typer.Option(help="--live: hours of the trace replayed in them.")] = 2.0,
    live_warm_up_s: Annotated[float, typer.Option(
        help="--live: seconds the job runs at the replay's low rate before the replay and the autoscaler start "
             "(Spark's cost per batch falls over a new process's first minutes); 0: none.")] = WARM_UP_S,
) -> None:
    """Run the chosen policies on the chosen traces; print a table, write JSON and PNG plots."""
    console = Console(width=None if sys.stdout.isatty() else 150)
    policies = policy or list(EVALUATED)
    for name in policies:
        if name not in POLICIES:
            raise typer.BadParameter(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    for name in trace or []:
        if name not in TRACE_NAMES:
            raise typer.BadParameter(f"unknown trace {name!r}; choose from {', '.join(TRACE_NAMES)} "
                                     "(or pass your own with --trace-file)")
    if fill_gaps not in ("none", *GAP_FILLS):
        raise typer.BadParameter(f"choose none or {', '.join(GAP_FILLS)}", param_hint="--fill-gaps")
    fill = next((choice for choice in GAP_FILLS if choice == fill_gaps), None)
    files = [str(path) for path in trace_file or []]
    for path in files:
        try:
            series = read_trace_file(path, fill)
        except TraceError as exc:
            raise typer.BadParameter(str(exc), param_hint="--trace-file") from None
        if series.filled:
            console.print(f"{path}: {series.filled} missing rows filled linearly ({len(series.values)} rows of "
                          f"{series.row_s:g} s)")
    traces = [*(trace or []), *files] or list(DEFAULT_TRACES)
    if scaling not in ("peak", "mean", "stretch"):
        raise typer.BadParameter("choose peak, mean or stretch", param_hint="--scaling")
    regimes = tuple(regime or REGIMES)
    for name in regimes:
        if name not in REGIMES:
            raise typer.BadParameter(f"choose from {', '.join(REGIMES)}", param_hint="--regime")
    if explain_gap and gap_policy not in policies:
        raise typer.BadParameter(f"{gap_policy!r} is not among the policies run ({', '.join(policies)})",
                                 param_hint="--gap-policy")
    if seeds < 1:
        raise typer.BadParameter("at least one seed", param_hint="--seeds")
    kinds = {"restart": BackendKind.RESTART, "inplace": BackendKind.IN_PLACE, "in_place": BackendKind.IN_PLACE}
    if backend not in kinds:
        raise typer.BadParameter("choose restart or inplace", param_hint="--backend")
    settings = EvalSettings(hours=hours, peak=peak, scaling=scaling, max_parallelism=max_parallelism,  # type: ignore[arg-type]
                            backlog_target_s=backlog_target_s, seeds=seeds, first_seed=first_seed,
                            rate_noise=rate_noise, regimes=regimes,  # type: ignore[arg-type]
                            job_model=str(job_model) if job_model else None, backend=kinds[backend],
                            fill_gaps=fill, noise_bound=noise_bound)
    try:
        settings.job().model(in_place=settings.backend is BackendKind.IN_PLACE)
    except JobModelError as exc:
        raise typer.BadParameter(str(exc), param_hint="--job-model") from None
    if live and html is not None:
        raise typer.BadParameter("the page reports the simulated suite, not --live", param_hint="--html")
    if live and explain_gap:
        raise typer.BadParameter("the gap is explained for the simulated suite, not --live", param_hint="--explain-gap")
    if fleet:
        from evaluation.fleet import SHARED_TRACES, FleetCase, run_fleet_evaluation

        if any(not 0 < w <= 100 for w in fleet_weight or []):
            raise typer.BadParameter("a weight in (0, 100]", param_hint="--fleet-weight")
        if fleet < 1 or not 0 < budget_share <= 1 or (budget is not None and budget < fleet):
            raise typer.BadParameter("at least one job, a share in (0, 1], a budget of at least a slot per job",
                                     param_hint="--fleet/--budget")
        case = FleetCase(jobs=fleet, budget=budget, budget_share=budget_share,
                         traces=tuple([*(trace or []), *files] or SHARED_TRACES),
                         regime=regimes[0] if regime else "compressed",
                         policy=policies[0] if policy else DEFAULT_POLICY, weights=tuple(fleet_weight or [1.0]))
        run_fleet_evaluation(console, case, settings, workers, json_out)
        return
    if live:
        from evaluation.live import run_live_evaluation

        run_live_evaluation(console, traces[0], policies[0] if policy else DEFAULT_POLICY, settings, live_minutes,
                            json_out, live_trace_hours, live_warm_up_s)
        return
    started = time.perf_counter()
    cases = cases_of(traces, settings)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{len(policies)} policies x {len(cases)} cases (trace, regime, seed)",
                                 total=len(cases))
        results = evaluate_all(traces, policies, settings, workers, on_done=lambda _: progress.advance(task))
    elapsed = time.perf_counter() - started
    summaries = summarize(results)
    print_table(console, summaries)
    gaps = summarize_gaps(results, gap_policy) if explain_gap else []
    print_gap_table(console, gaps)
    plot_dir = plots or json_out.parent / "evaluate"
    paths = [plot(result, plot_dir) for result in results if result["seed"] == first_seed]
    ds2_convergence = experiment()
    print_convergence(console, ds2_convergence)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({
        "settings": {**settings.__dict__, "regimes": list(settings.regimes)}, "policies": policies,
        "traces": traces, "wall_s": round(elapsed, 2), "workers": workers, "calibration": calibration(settings),
        "summaries": summaries, "cases": results, "ds2_convergence": ds2_convergence,
    } | ({"gaps": gaps} if explain_gap else {}), indent=1))
    json_out.with_suffix(".md").write_text(markdown(summaries, ds2_convergence, gaps))
    console.print(f"{len(policies)} policies x {len(cases)} cases, rescaled by {settings.backend.value}, in "
                  f"{elapsed:.1f} s on {workers} workers; wrote "
                  f"{json_out}, {json_out.with_suffix('.md').name} and {len(paths)} plots in {plot_dir}")
    if html is not None:
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(report_page(results, summaries, settings, gaps), encoding="utf-8")
        console.print(f"wrote the report page {html}")


def calibrate_command(
    parallelism: Annotated[list[int] | None, typer.Option(
        "--parallelism", "-p", help="Parallelisms to measure (repeatable); default 1, 2, 3 and 4.")] = None,
    cost_ms: Annotated[float, typer.Option(help="The demo job's per-record cost.")] = 4.0,
    option: Annotated[list[str] | None, typer.Option(help="More job options, key=value.")] = None,
    work_s: Annotated[float, typer.Option(help="Seconds of work per slot in each drained backlog.")] = 40.0,
    restarts: Annotated[int, typer.Option(help="Rescales measured in each direction.")] = 2,
    warm_up_s: Annotated[float, typer.Option(
        help="Seconds the job runs at one slot before anything is measured (Spark's cost per batch falls "
             "over its first minutes in a process); 0 measures it cold.")] = WARM_UP_S,
    name: Annotated[str, typer.Option(help="The job's name in the model.")] = "demo",
    out: Annotated[Path, typer.Option(help="The job-model file to write.")] = RESULTS / "job-model.json",
) -> None:
    """Measure the demo job on this machine (per-slot rate per parallelism, batch overhead, restart time
    per direction, rate noise) and write a job-model file for `autoscaler evaluate --job-model`."""
    from evaluation.calibrate import calibrate
    from evaluation.model_files import write_job_model

    console = Console()
    options = {"cost_ms": str(cost_ms), **dict(item.split("=", 1) for item in option or [])}
    started = time.perf_counter()
    model, _ = calibrate(parallelism or [1, 2, 3, 4], options, work_s=work_s, nominal_slot_rate=1000.0 / cost_ms,
                         restart_repeat=restarts, name=name, warm_up_s=warm_up_s, say=console.print)
    write_job_model(model, out)
    console.print_json(model.model_dump_json(exclude={"measured"}))
    print_held_out(console, "capacity the planner predicts from the two smallest parallelisms, against what the job "
                   "drained", model.measured.get("unseen_capacity") or [], size="parallelism")
    console.print(f"wrote {out} in {time.perf_counter() - started:.0f} s; replay with "
                  f"`autoscaler evaluate --job-model {out}`")
