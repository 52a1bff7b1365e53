"""`autoscaler capacity plan`: how many slots a job needs for a rate it has never run (StreamBed).

The testbed is the evaluation's job model (a job-model file, or one of the built-in jobs whose scaling
is known: linear, usl, knee), so the plan's accuracy can be checked against the truth at scales this
machine cannot run. The report: the measurements, every fitted scaling model with its leave-one-out
error, the recommendation with its interval, a JSON file and a PNG of the curve.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from evaluation.job_models import JobModelError, load_job_model
from evaluation.testbed import ModelTestbed, scaling_truths
from plan.capacity.explore import Answer, Exploration, explore, recommend

RESULTS = Path("results")
capacity_app = typer.Typer(help="Capacity planning before deployment (StreamBed).", no_args_is_help=True)


def plan_report(testbed: ModelTestbed, exploration: Exploration, answer: Answer, rate: float) -> dict[str, Any]:
    """Everything the plan found, with the truth beside it (the testbed is a model)."""
    model = exploration.model
    checks = sorted({m.slots for m in exploration.measurements} | {16, 32, 64} | ({answer.slots} - {None}))
    return {
        "rate": rate,
        "answer": answer.__dict__,
        "true_mst_at_answer": testbed.truth(answer.slots) if answer.slots else None,
        "model": {"name": model.name, "params": model.params, "loo_error": model.loo_error},
        "models": [{"name": f.name, "params": f.params, "loo_error": f.loo_error, "loo_se": f.loo_se}
                   for f in exploration.fits],
        "measurements": [m.__dict__ for m in exploration.measurements],
        "stopped": exploration.stopped,
        "testbed_slot_hours": exploration.slot_seconds / 3600,
        "predicted_vs_true": [{"slots": n, "predicted": model.at(n), "true": testbed.truth(n)} for n in checks],
    }


def plot_plan(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from plan.capacity.scaling import Fit

    rows = report["predicted_vs_true"]
    top = max(r["slots"] for r in rows)
    n = np.arange(1, top + 1)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, fitted in enumerate(report["models"]):
        fit = Fit(fitted["name"], tuple(fitted["params"]), fitted["loo_error"])
        ax.plot(n, fit.predict(n), lw=2.0 if i == 0 else 0.8, alpha=1.0 if i == 0 else 0.5,
                label=f"{fit.name} (LOO {100 * fit.loo_error:.1f} %)" + (", chosen" if i == 0 else ""))
    ax.plot([r["slots"] for r in rows], [r["true"] for r in rows], "k+", label="true MST (the model's)")
    stable = [m for m in report["measurements"] if m["stable"]]
    ax.plot([m["slots"] for m in stable], [m["mst"] for m in stable], "o", color="tab:red", label="measured MST")
    answer = report["answer"]
    if answer["slots"]:
        ax.axhline(report["rate"] * 1.1, color="grey", ls=":", lw=0.8, label="110 % of the requested rate")
        ax.axvline(answer["slots"], color="grey", ls="--", lw=0.8, label=f"answer: {answer['slots']} slots")
    ax.set_xlabel("slots")
    ax.set_ylabel("maximum sustainable throughput (rec/s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


@capacity_app.command("plan")
def plan_command(
    rate: Annotated[float, typer.Option(help="The rate (rec/s) to plan for.")],
    job_model: Annotated[Path | None, typer.Option(help="A job-model file as the testbed (default: the demo job's).")]
    = None,
    truth: Annotated[str | None, typer.Option(help="Instead of a file, a built-in job with known scaling: "
                                                    f"{', '.join(scaling_truths())}.")] = None,
    max_slots: Annotated[int, typer.Option(help="The testbed's largest configuration (slots).")] = 8,
    budget_core_hours: Annotated[float | None, typer.Option(help="Testbed time to spend at most (slot-hours).")]
    = None,
    measure_s: Annotated[float, typer.Option(help="Seconds measured at each injected rate, after 60 s settling.")]
    = 300.0,
    start_rate: Annotated[float, typer.Option(help="Where the first MST search starts (rec/s); it doubles from "
                                                   "there until the job falls behind.")] = 100.0,
    seed: Annotated[int, typer.Option(help="Seed of the testbed's rate noise.")] = 0,
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
    testbed = ModelTestbed(model, rate_noise=noise, seed=seed, measure_s=measure_s)
    budget = math.inf if budget_core_hours is None else budget_core_hours * 3600
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("measuring MST per configuration", total=max_slots)
        exploration = explore(testbed, list(range(1, max_slots + 1)), first_guess=start_rate,
                              budget_slot_s=budget, on_measured=lambda _: progress.advance(task), seed=seed)
    if not exploration.fits:
        console.print(f"[red]no scaling model could be fitted: {len(exploration.stable)} stable measurements "
                      f"({exploration.stopped})[/red]")
        raise typer.Exit(1)
    answer = recommend(exploration.fits, rate)
    report = plan_report(testbed, exploration, answer, rate)
    print_plan(console, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    png = plot_plan(report, out.with_suffix(".png"))
    console.print(f"{answer.message}\nwrote {out} and {png.name} in {time.perf_counter() - started:.1f} s")
    if not answer.reachable:
        raise typer.Exit(2)


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
    from plan.capacity.scaling import Fit

    for fitted in report["models"]:
        fit = Fit(fitted["name"], tuple(fitted["params"]), fitted["loo_error"])
        models.add_row(fit.name, f"{100 * fit.loo_error:.1f} %", *(f"{fit.at(n):,.0f}" for n in (16, 32, 64)))
    console.print(models)
    truth = Table(title="predicted against the testbed's truth", title_justify="left")
    for column in ("slots", "predicted MST", "true MST", "error"):
        truth.add_column(column, justify="right")
    for row in report["predicted_vs_true"]:
        truth.add_row(str(row["slots"]), f"{row['predicted']:,.0f}", f"{row['true']:,.0f}",
                      f"{100 * (row['predicted'] / row['true'] - 1):+.1f} %")
    console.print(truth)
