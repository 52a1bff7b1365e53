"""`python -m bench.capacity_profiles`: executor profiles learned from few samples (QEScalor), against the
truth.

Three jobs whose executor throughput depends on cores and memory in a known way
(`capacity.testbed.profile_truths`: 1 GB of state per core; compute-bound; 2 GB of state per core),
on a grid of 1-4 cores and 0.5-8 GB per executor (64 profiles). Each sampler measures one executor per
profile it picks (StreamBed's dichotomy on the job model: 60 s settling, 300 s measured per injected
rate, log-normal rate noise of 4.3 % per 10-s window, a fresh realisation per seed): QEScalor's dynamic
sampling, and fixed steps of 1 (every profile), 2 and 3 memory sizes (QEScalor's baseline). A random
forest fitted to the samples predicts every profile of the grid (its error against the truth), then
plans each rate: the cheapest profile and executor count at the prices of `capacity.model_profiles`.
Each plan is checked against the truth (does it sustain the rate, by how much is it over it) and its
cost set against the cheapest plan the truth allows on the same grid with the same 110 % headroom (the
oracle), beside two fixed profiles sized by the truth. Medians and worst cases over the seeds; prints
tables and writes JSON.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console

from bench.common import RESULTS, table, write_result
from capacity.model_profiles import FIXED, profile_plan
from capacity.testbed import profile_truths

CODE = ("capacity/profiles.py", "capacity/model_profiles.py", "capacity/testbed.py")
SAMPLINGS = ["dynamic", "fixed:1", "fixed:2", "fixed:3"]
app = typer.Typer(add_completion=False, help=__doc__)


def median_worst(values: list[float]) -> str:
    return f"{np.median(values):+.1f} / {max(values):+.1f}"


@app.command()
def main(
    seeds: Annotated[int, typer.Option(help="Noise seeds per job and sampler.")] = 5,
    rates: Annotated[str, typer.Option(help="Rates to plan (rec/s), comma-separated.")] = "800,3000,10000",
    sampling: Annotated[list[str] | None, typer.Option(help="Samplers to compare ('dynamic', 'fixed:N'); "
                                                           "default: dynamic, fixed:1, fixed:2, fixed:3.")] = None,
    output: Annotated[Path, typer.Option(help="The JSON to write.")] = RESULTS / "capacity_profiles.json",
) -> None:
    console = Console()
    planned = [float(r) for r in rates.split(",")]
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    for name, truth in profile_truths().items():
        out = table(f"{name}: {seeds} seeds, rates {rates} rec/s (median / worst)", "sampling", "profiles measured",
                    "forest error, RMSE %", "plans sustaining", "over the rate, %", "cost over the oracle, %",
                    "profiles chosen")
        for sampler in sampling or SAMPLINGS:
            runs = [profile_plan(rate, sampler, seed, truth) | {"truth": name}
                    for seed in range(seeds) for rate in planned]
            results += [{k: v for k, v in r.items() if k != "surface"} for r in runs]
            plans = [r["plan"] for r in runs]
            out.add_row(
                sampler, f"{np.median([len(r['samples']) for r in runs]):.0f}",
                f"{np.median([r['model_error']['rmse_pct'] for r in runs]):.1f} / "
                f"{max(r['model_error']['rmse_pct'] for r in runs):.1f}",
                f"{sum(p['sustains'] for p in plans)} of {len(plans)}",
                median_worst([100 * p["over_rate"] for p in plans]),
                median_worst([100 * (r["plan"]["cost_per_hour"] / r["oracle"]["cost_per_hour"] - 1) for r in runs]),
                "; ".join(sorted({p["profile"] for p in plans})))
        console.print(out)
        # The oracle and the fixed profiles depend on the truth and the rate only: seed 0's runs hold them.
        first = [r for r in results if r["truth"] == name and r["seed"] == 0][: len(planned)]
        fixed = {label: [100 * (r["fixed"][label]["cost_per_hour"] / r["oracle"]["cost_per_hour"] - 1) for r in first]
                 for label in FIXED}
        console.print(f"  oracle's profile: {first[0]['oracle']['profile']}; fixed profiles sized by the truth, "
                      "cost over the oracle per rate: "
                      + "; ".join(f"{label} {', '.join(f'{c:+.0f} %' for c in costs)}"
                                  for label, costs in fixed.items()))
    seconds = time.perf_counter() - started
    console.print(f"{len(results)} plans in {seconds:.0f} s")
    write_result(output, {"results": results, "seeds": seeds, "rates": planned, "seconds": seconds}, CODE, console)

if __name__ == "__main__":
    app()
