"""`autoscaler capacity plan`: how many slots a job needs for a rate it has never run (StreamBed).

The testbed is the Spark job itself on this machine (`--live`: `capacity.live_testbed`), or the
evaluation's job model (a job-model file, or one of the built-in jobs whose scaling is known: linear,
usl, knee), so the plan's accuracy can be checked against the truth at scales this machine cannot run.
The report: the measurements, every fitted scaling model with its leave-one-out error, what the two
smallest configurations predict for the others, the recommendation with its interval, a JSON file and
a PNG of the curve.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from capacity.explore import (
    Answer,
    Exploration,
    Measurement,
    Testbed,
    explore,
    from_smallest,
    plausible,
    recommend,
)
from capacity.live_testbed import LIVE_GROWTH, LIVE_SENSIBILITY, LIVE_START, LiveTestbed
from capacity.planned_seed import not_registered, require_registered, seed_planned
from capacity.profile_cli import profiles_command
from capacity.profiles import MIN_PLANNED_ERROR
from capacity.testbed import ModelTestbed, scaling_truths
from evaluation.model_files import JobModelError, load_job_model
from evaluation.report import print_held_out, save_figure

RESULTS = Path("results")
capacity_app = typer.Typer(help="Capacity planning before deployment (StreamBed).", no_args_is_help=True)


def plan_report(testbed: ModelTestbed | LiveTestbed, exploration: Exploration, answer: Answer, rate: float,
                seconds: float) -> dict[str, Any]:
    """Everything the plan found, with the truth beside it where the testbed is a model."""
    model = exploration.model
    checks = sorted({m.slots for m in exploration.measurements} | {16, 32, 64} | ({answer.slots} - {None}))
    return {
        "rate": rate,
        "testbed": "live" if isinstance(testbed, LiveTestbed) else "model",
        "seconds": round(seconds, 1),
        "answer": answer.__dict__,
        "true_mst_at_answer": testbed.truth(answer.slots) if answer.slots else None,
        "model": {"name": model.name, "params": model.params, "loo_error": model.loo_error},
        "models": [{"name": f.name, "params": f.params, "loo_error": f.loo_error, "loo_se": f.loo_se}
                   for f in exploration.fits],
        "measurements": [{**asdict(m), "trace": [{**asdict(step), "sustained": step.sustained} for step in m.trace]}
                         for m in exploration.measurements],
        "from_smallest": from_smallest(exploration.measurements),
        "stopped": exploration.stopped,
        "testbed_slot_hours": exploration.slot_seconds / 3600,
        "predicted_vs_true": [{"slots": n, "predicted": model.at(n), "true": testbed.truth(n)} for n in checks],
    }


def plot_plan(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from capacity.scaling import Fit

    rows = report["predicted_vs_true"]
    top = max(r["slots"] for r in rows)
    n = np.arange(1, top + 1)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, fitted in enumerate(report["models"]):
        fit = Fit(fitted["name"], tuple(fitted["params"]), fitted["loo_error"])
        ax.plot(n, fit.predict(n), lw=2.0 if i == 0 else 0.8, alpha=1.0 if i == 0 else 0.5,
                label=f"{fit.name} (LOO {100 * fit.loo_error:.1f} %)" + (", chosen" if i == 0 else ""))
    known = [r for r in rows if r["true"] is not None]
    if known:
        ax.plot([r["slots"] for r in known], [r["true"] for r in known], "k+", label="true MST (the model's)")
    stable = [m for m in report["measurements"] if m["stable"]]
    ax.plot([m["slots"] for m in stable], [m["mst"] for m in stable], "o", color="tab:red", label="measured MST")
    answer = report["answer"]
    if answer["slots"]:
        ax.axhline(report["rate"] * 1.1, color="grey", ls=":", lw=0.8, label="110 % of the requested rate")
        ax.axvline(answer["slots"], color="grey", ls="--", lw=0.8, label=f"answer: {answer['slots']} slots")
    ax.set_xlabel("slots")
    ax.set_ylabel("maximum sustainable throughput (rec/s)")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


@capacity_app.command("plan")
def plan_command(
    rate: Annotated[float, typer.Option(help="The rate (rec/s) to plan for.")],
    live: Annotated[bool, typer.Option(help="Measure the demo Spark job on this machine (its own broker, the "
                                            "load generator) instead of a job model.")] = False,
    cost_ms: Annotated[float, typer.Option(help="With --live: the demo job's per-record cost.")] = 4.0,
    warm_up_s: Annotated[float, typer.Option(help="With --live: seconds at one slot and --start-rate before the "
                                                  "overload that starts the first search.")] = 60.0,
    job_model: Annotated[Path | None, typer.Option(help="A job-model file as the testbed (default: the demo job's).")]
    = None,
    truth: Annotated[str | None, typer.Option(help="Instead of a file, a built-in job with known scaling: "
                                                    f"{', '.join(scaling_truths())}.")] = None,
    max_slots: Annotated[int, typer.Option(help="The testbed's largest configuration (slots).")] = 8,
    budget_core_hours: Annotated[float | None, typer.Option(help="Testbed time to spend at most (slot-hours).")]
    = None,
    measure_s: Annotated[float | None, typer.Option(
        help="Seconds measured at each injected rate: default 300 after 60 s settling on a job model; live, 15, "
             "between micro-batch starts.")] = None,
    start_rate: Annotated[float, typer.Option(help="Where the first MST search starts (rec/s); it doubles from "
                                                   "there until the job falls behind. Live: the warm-up's rate, "
                                                   "its overload 4 times it.")] = 100.0,
    seed: Annotated[int, typer.Option(help="Seed of the testbed's rate noise.")] = 0,
    job: Annotated[str | None, typer.Option(help="A registered job whose knowledge starts from this plan: its "
                                                 "planner pools the planned capacity with what it measures.")] = None,
    out: Annotated[Path, typer.Option(help="The JSON report; the PNG goes beside it.")] = RESULTS / "capacity.json",
) -> None:
    """Measure the job's maximum sustainable throughput on a small testbed, fit scaling models, and
    answer with the fewest slots for 110 % of RATE (or the best reachable rate)."""
    console = Console()
    if rate <= 0 or not math.isfinite(rate):
        raise typer.BadParameter("the rate must be a positive number", param_hint="--rate")
    if start_rate <= 0 or not math.isfinite(start_rate):
        raise typer.BadParameter("the start rate must be a positive number", param_hint="--start-rate")
    if max_slots < 3:
        raise typer.BadParameter("the testbed needs at least 3 configurations to fit a model", param_hint="--max-slots")
    if measure_s is not None and not (measure_s > 0 and math.isfinite(measure_s)):
        raise typer.BadParameter("the measurement must last a positive number of seconds", param_hint="--measure-s")
    if live and (truth is not None or job_model is not None):
        raise typer.BadParameter("--live measures the Spark job: no --truth or --job-model", param_hint="--live")
    if live and not (cost_ms > 0 and warm_up_s >= 0):
        raise typer.BadParameter("--cost-ms must be > 0 and --warm-up-s >= 0", param_hint="--cost-ms")
    if job is not None:
        require_registered(job)
    budget = math.inf if budget_core_hours is None else budget_core_hours * 3600
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("measuring MST per configuration", total=max_slots)

        def measured(m: Measurement) -> None:
            progress.advance(task)
            progress.console.print(f"{m.slots} slots: MST {m.mst:,.0f} rec/s after {m.steps} steps"
                                   + ("" if m.stable else " (unstable: nothing sustained, twice)")
                                   + f" [{time.perf_counter() - started:.0f} s]")

        def search(testbed: Testbed, first_guess: float, **how: float) -> Exploration:
            return explore(testbed, list(range(1, max_slots + 1)), first_guess=first_guess, budget_slot_s=budget,
                           on_measured=measured, seed=seed, **how)

        testbed: ModelTestbed | LiveTestbed
        if live:
            with LiveTestbed({"cost_ms": str(cost_ms)}, measure_s=measure_s or 15.0) as testbed:
                progress.update(task, description=f"warm-up: {warm_up_s:g} s at {start_rate:g} rec/s, then overload")
                ceiling = testbed.warm_up(start_rate, warm_up_s)
                progress.update(task, description="measuring MST per configuration")
                exploration = search(testbed, LIVE_START * ceiling, growth=LIVE_GROWTH, sensibility=LIVE_SENSIBILITY)
        else:
            testbed = model_testbed(truth, job_model, seed, measure_s or 300.0)
            exploration = search(testbed, start_rate)
    if not exploration.fits:
        console.print(f"[red]no scaling model could be fitted: {len(exploration.stable)} stable measurements "
                      f"({exploration.stopped})[/red]")
        raise typer.Exit(1)
    answer = recommend(exploration.fits, rate)
    report = plan_report(testbed, exploration, answer, rate, time.perf_counter() - started)
    print_plan(console, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    png = plot_plan(report, out.with_suffix(".png"))
    console.print(f"{answer.message}\nwrote {out} and {png.name} in {time.perf_counter() - started:.1f} s")
    if job is not None:
        seeded = seed_planned(job, lambda slots: planned_curve(exploration, slots))
        console.print(f"{job}: planned capacity at 1-{seeded['slots']} slots (error {seeded['error']:.0%}) "
                      "stored in its configuration; `autoscaler capacity show` compares it with what it measures")
    if not answer.reachable:
        raise typer.Exit(2)


def model_testbed(truth: str | None, job_model: Path | None, seed: int, measure_s: float) -> ModelTestbed:
    """The evaluation's job model as the testbed: a built-in truth or a job-model file."""
    if truth is not None:
        truths = scaling_truths()
        if truth not in truths or job_model is not None:
            raise typer.BadParameter(f"choose one of {', '.join(truths)}, without --job-model", param_hint="--truth")
        model, noise = truths[truth], 0.043
    else:
        try:
            loaded = load_job_model(job_model)
        except JobModelError as exc:
            raise typer.BadParameter(str(exc), param_hint="--job-model") from None
        model, noise = loaded.model(), loaded.rate_noise
    return ModelTestbed(model, rate_noise=noise, seed=seed, measure_s=measure_s)


def planned_curve(exploration: Exploration, slots: int) -> tuple[dict[int, float], float]:
    """The capacity to seed a job with at 1..slots, and its relative error: the chosen model's curve,
    or, where plausible models part, the most pessimistic of them at each p; the error is their
    spread at `slots` (the farthest the job may go) or two leave-one-out errors, at least 5 %."""
    n = np.arange(1, slots + 1)
    model = exploration.model
    curves = np.array([model.predict(n), *(f.predict(n) for f in plausible(exploration.fits))])
    curve = curves.min(axis=0)
    far = curves[:, -1]
    error = max(MIN_PLANNED_ERROR, 2 * model.loo_error, float((far.max() - far.min()) / (2 * curve[-1])))
    return {int(p): round(float(c), 1) for p, c in zip(n, curve, strict=True) if c > 0}, error


@capacity_app.command("show")
def show_command(job: Annotated[str, typer.Argument(help="A registered job.")]) -> None:
    """The job's planned capacity against what its planner has measured, per parallelism."""
    from contracts.jobs import parse_planned_capacity
    from contracts.settings import get_settings
    from knowledge import RedisKnowledge, with_knowledge
    from plan.policies.default import PlannerMemory

    async def read(knowledge: RedisKnowledge) -> tuple[dict[int, float], dict[str, Any]]:
        if not await knowledge.job_exists(job):
            raise KeyError(job)
        config = await knowledge.job_config(job)
        state = await knowledge.plan_state(job)
        return parse_planned_capacity(config.planned_capacity), state.policy_state or {}

    console = Console()
    try:
        planned, policy_state = with_knowledge(get_settings(), read)
    except KeyError:
        console.print(f"[red]{not_registered(job)}[/red]")
        raise typer.Exit(2) from None
    memory = PlannerMemory.model_validate(policy_state) if "known" in policy_state else PlannerMemory()
    # What the planner measured is the rate of full micro-batches; it plans with the batch efficiency's
    # share of it, as the testbed's sustained throughput includes it.
    efficiency = memory.batch.efficiency if memory.batch is not None else 1.0
    observed = {int(p): (m.capacity * efficiency, m.n) for p, m in memory.known.items()}
    if not planned and not observed:
        console.print(f"{job}: no planned capacity (autoscaler capacity plan --job {job}) and nothing measured yet")
        return
    table = Table(title=f"{job}: planned against observed capacity (rec/s)", title_justify="left")
    for column in ("slots", "planned", "observed", "windows", "observed / planned"):
        table.add_column(column, justify="right")
    shown = max(max(observed, default=0) + 8, 16)
    for p in sorted(set(observed) | {q for q in planned if q <= shown}):
        seen = observed.get(p)
        ratio = f"{seen[0] / planned[p]:.2f}" if seen is not None and p in planned else "-"
        table.add_row(str(p), f"{planned[p]:,.0f}" if p in planned else "-",
                      f"{seen[0]:,.0f}" if seen else "-", str(seen[1]) if seen else "0", ratio)
    console.print(table)


def print_plan(console: Console, report: dict[str, Any]) -> None:
    measured = Table(title=f"testbed measurements ({report['stopped']}; "
                           f"{report['testbed_slot_hours']:.1f} slot-hours)", title_justify="left")
    for column in ("slots", "MST (rec/s)", "steps", "stable"):
        measured.add_column(column, justify="right")
    for m in sorted(report["measurements"], key=lambda m: m["slots"]):
        measured.add_row(str(m["slots"]), f"{m['mst']:,.0f}", str(m["steps"]), "yes" if m["stable"] else "no")
    console.print(measured)
    models = Table(title="scaling models, chosen first", title_justify="left")
    for column in ("model", "leave-one-out error", "at 16", "at 32", "at 64"):
        models.add_column(column, justify="right")
    from capacity.scaling import Fit

    for fitted in report["models"]:
        fit = Fit(fitted["name"], tuple(fitted["params"]), fitted["loo_error"])
        models.add_row(fit.name, f"{100 * fit.loo_error:.1f} %", *(f"{fit.at(n):,.0f}" for n in (16, 32, 64)))
    console.print(models)
    print_held_out(console, "what the two smallest configurations predict (power law), against what was measured",
                   report["from_smallest"])
    rows = [row for row in report["predicted_vs_true"] if row["true"] is not None]
    if rows:
        truth = Table(title="predicted against the testbed's truth", title_justify="left")
        for column in ("slots", "predicted MST", "true MST", "error"):
            truth.add_column(column, justify="right")
        for row in rows:
            truth.add_row(str(row["slots"]), f"{row['predicted']:,.0f}", f"{row['true']:,.0f}",
                          f"{100 * (row['predicted'] / row['true'] - 1):+.1f} %")
        console.print(truth)


capacity_app.command("profiles")(profiles_command)
