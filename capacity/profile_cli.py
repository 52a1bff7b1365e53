"""`autoscaler capacity profiles`: which executor profile (cores and memory) and how many executors a
job needs for a rate (QEScalor), on the job model whose truth is known.

It samples executor profiles on the testbed (dynamic sampling, or a fixed step), fits the random
forest, prints the sampled profiles and the predicted surface against the truth, the answer with its
interval, the cheapest plan the truth allows and fixed profiles beside it; it writes a JSON report and
a PNG of throughput against memory per core count (the forest's prediction, its band, the samples and
the truth).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from capacity.model_profiles import CORE_PRICE, GB_PRICE, UnstableTestbed, parse_sampling, plan_of, profile_plan
from capacity.planned_seed import require_registered, seed_planned
from capacity.profiles import MAX_EXECUTORS, slot_curve
from capacity.testbed import profile_truths
from evaluation.report import save_figure
from pipeline.session import executor_conf

RESULTS = Path("results")


def profiles_command(
    rate: Annotated[float, typer.Option(help="The rate (rec/s) to plan for.")],
    truth: Annotated[str, typer.Option(help=f"The job: one of {', '.join(profile_truths())}.")] = "stateful",
    sampling: Annotated[str, typer.Option(help="'dynamic' (QEScalor's) or 'fixed:N' (every N-th memory size).")]
    = "dynamic",
    core_price: Annotated[float, typer.Option(help="Price of one core per hour.")] = CORE_PRICE,
    gb_price: Annotated[float, typer.Option(help="Price of one GB of memory per hour.")] = GB_PRICE,
    seed: Annotated[int, typer.Option(help="Seed of the testbed's rate noise and of the forest.")] = 0,
    job: Annotated[str | None, typer.Option(help="A registered job whose knowledge starts from this plan: the "
                                                 "planned capacity per slot count of the chosen profile's "
                                                 "executors.")] = None,
    out: Annotated[Path, typer.Option(help="The JSON report; the PNG goes beside it.")]
    = RESULTS / "profiles.json",
) -> None:
    """Sample executor profiles, learn one executor's throughput from them (random forest) and answer
    with the cheapest profile and executor count for 110 % of RATE."""
    console = Console()
    if rate <= 0 or not math.isfinite(rate):
        raise typer.BadParameter("the rate must be a positive number", param_hint="--rate")
    truths = profile_truths()
    if truth not in truths:
        raise typer.BadParameter(f"choose one of {', '.join(truths)}", param_hint="--truth")
    if not (core_price >= 0 and gb_price >= 0 and core_price + gb_price > 0):
        raise typer.BadParameter("prices must be >= 0 and not both 0", param_hint="--core-price")
    try:
        parse_sampling(sampling)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--sampling") from None
    if job is not None:
        require_registered(job)
    try:
        report = profile_plan(rate, sampling, seed, truths[truth], core_price, gb_price)
    except UnstableTestbed as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    print_profiles(console, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    png = plot_profiles(report, out.with_suffix(".png"))
    console.print(f"wrote {out} and {png.name}")
    if report["plan"] is None:
        best = report["best_reachable"]
        console.print(f"[red]out of reach: {report['rate']:,.0f} rec/s (x{report['headroom']:.2f}) needs more than "
                      f"{best['executors']:,} executors of any profile; the most, {best['executors']:,} of "
                      f"{best['profile']}, carry {best['predicted']:,.0f} rec/s predicted, enough for "
                      f"{best['headroom_rate']:,.0f} rec/s[/red]")
        raise typer.Exit(2)
    plan = report["plan"]
    console.print("executor settings for Spark: "
                  + " ".join(f"--conf {k}={v}" for k, v in executor_conf(plan["cores"], plan["memory_gb"]).items()))
    if job is not None:
        seeded = seed_planned(job, lambda slots: slot_curve(plan_of(report), slots))
        console.print(f"{job}: planned capacity at {plan['cores']}-{seeded['slots']} slots (every "
                      f"{plan['cores']}, error {seeded['error']:.0%}) stored in its configuration; "
                      "`autoscaler capacity show` compares it with what it measures")


def print_profiles(console: Console, report: dict[str, Any]) -> None:
    sampled = Table(title=f"{len(report['samples'])} profiles measured ({report['sampling']} sampling, "
                          f"{report['testbed_core_hours']:.1f} core-hours of testbed)", title_justify="left")
    for column in ("cores", "memory (GB)", "MST of one executor", "true", "measured"):
        sampled.add_column(column, justify="right")
    for s in report["samples"]:
        sampled.add_row(str(s["cores"]), f"{s['memory_gb']:g}",
                        f"{s['throughput']:,.0f}" if s["stable"] else "unstable: nothing sustained, twice",
                        f"{s['true']:,.0f}", f"{s['measurements']}x")
    console.print(sampled)
    error = report["model_error"]
    console.print(f"random forest against the truth on all {report['grid_size']} profiles: "
                  f"RMSE {error['rmse_pct']:.1f} %, mean absolute {error['mae_pct']:.1f} %, "
                  f"worst {error['worst_pct']:+.1f} %")
    plans = Table(title=f"plans for {report['rate']:,.0f} rec/s (x{report['headroom']:.2f}), "
                        f"{report['prices']['core']:g} per core-hour, {report['prices']['gb']:g} per GB-hour",
                  title_justify="left")
    for column in ("plan", "profile", "executors", "predicted (rec/s)", "true (rec/s)", "sustains", "per hour"):
        plans.add_column(column, justify="right")
    rows = [("the forest's", report["plan"]), ("the truth's cheapest (oracle)", report["oracle"]),
            *((f"{name}, sized by the truth", row) for name, row in report["fixed"].items())]
    for name, row in rows:
        if row is None:
            plans.add_row(name, f"none within {MAX_EXECUTORS:,} executors", "-", "-", "-", "-", "-")
            continue
        predicted = f"{row['predicted']:,.0f} ({row['low']:,.0f}-{row['high']:,.0f})" if name == "the forest's" else "-"
        plans.add_row(name, row["profile"], str(row["executors"]), predicted, f"{row['true_throughput']:,.0f}",
                      "yes" if row["sustains"] else "no", f"{row['cost_per_hour']:.3f}")
    console.print(plans)


def plot_profiles(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, cores in enumerate(sorted({row["cores"] for row in report["surface"]})):
        rows = [row for row in report["surface"] if row["cores"] == cores]
        memory = [row["memory_gb"] for row in rows]
        color = f"C{i}"
        ax.plot(memory, [row["predicted"] for row in rows], color=color, label=f"{cores} cores: forest")
        ax.fill_between(memory, [row["low"] for row in rows], [row["high"] for row in rows], color=color, alpha=0.15)
        ax.plot(memory, [row["true"] for row in rows], color=color, ls=":", lw=0.8)
        samples = [s for s in report["samples"] if s["cores"] == cores and s["stable"]]
        ax.plot([s["memory_gb"] for s in samples], [s["throughput"] for s in samples], "o", color=color, ms=3)
    ax.set_xlabel("memory per executor (GB); dotted: the truth, dots: samples")
    ax.set_ylabel("MST of one executor (rec/s)")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
