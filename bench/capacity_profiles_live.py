"""`python -m bench.capacity_profiles_live`: executor profiles measured live on a Spark standalone
cluster (QEScalor's dynamic sampling, StreamBed's MST per profile), the forest fitted to them, and a plan.

A cluster of one worker (4 cores, 8 GB offered) is started from the pyspark wheel; for each profile the
sampler picks, the demo job runs on its own broker with exactly one executor of that profile
(`evaluation.live_profiles`), warms up and has its MST found by the live dichotomy. The demo job's
records wait (`--cost-ms` per record, I/O-like) rather than compute, and it holds no state: its
throughput should follow its cores, not its memory, and the sampler should stride over the memory
sizes. Nothing of the truth is known; what the run shows is how many profiles were measured, what each
sustained, how long it took, and what the forest plans for `--rate`. Prints tables and writes JSON.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bench.common import code_version, machine_info
from evaluation.live_profiles import ClusterProfileTestbed
from evaluation.profile_plan import CORE_PRICE, GB_PRICE
from pipeline.session import executor_conf
from plan.capacity.profiles import HEADROOM, Profile, dynamic_sampling, plan_from_samples

RESULTS = Path(__file__).resolve().parent / "results" / "capacity_profiles_live.json"
CODE = ("plan/capacity/profiles.py", "evaluation/live_profiles.py", "evaluation/live_testbed.py")
app = typer.Typer(add_completion=False, help=__doc__)


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


@app.command()
def main(
    rate: Annotated[float, typer.Option(help="The rate (rec/s) to plan for.")] = 1000.0,
    cores: Annotated[str, typer.Option(help="Core counts per executor, comma-separated.")] = "1,2",
    memory_gb: Annotated[str, typer.Option(help="Memory sizes per executor (GB), comma-separated.")] = "0.5,1,1.5,2",
    cost_ms: Annotated[float, typer.Option(help="The demo job's wait per record.")] = 4.0,
    warm_up_s: Annotated[float, typer.Option(help="Seconds at a low rate before the overload.")] = 20.0,
    measure_s: Annotated[float, typer.Option(help="Seconds measured per step, between micro-batch starts.")] = 15.0,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS,
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "faust", "aiokafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    console = Console(width=max(120, Console().width))
    core_counts, sizes = [int(c) for c in floats(cores)], floats(memory_gb)
    started = time.perf_counter()
    with ClusterProfileTestbed({"cost_ms": str(cost_ms)}, warm_up_s=warm_up_s, measure_s=measure_s,
                               log_dir=Path(".autoscaler/capacity-profiles-live-cluster")) as testbed:
        samples = dynamic_sampling(testbed.measure, core_counts, sizes)
        runs = testbed.measured
    seconds = time.perf_counter() - started
    measured = Table(title=f"{len(runs)} profile runs on the cluster ({len(samples)} profiles, dynamic sampling "
                           f"over {len(core_counts) * len(sizes)}), the demo job at {cost_ms:g} ms per record",
                     title_justify="left")
    for column in ("profile", "Spark settings", "MST (rec/s)", "per core", "steps", "minutes"):
        measured.add_column(column, justify="right")
    for profile, found, took in runs:
        conf = executor_conf(profile.cores, profile.memory_gb)
        measured.add_row(str(profile), f"cores={conf['spark.executor.cores']}, memory={conf['spark.executor.memory']}",
                         f"{found.mst:,.0f}" if found.stable else "unstable",
                         f"{found.mst / profile.cores:,.0f}" if found.stable else "-", str(found.steps),
                         f"{took / 60:.1f}")
    console.print(measured)
    stable = [s for s in samples if s.stable]
    plan = None
    surface: list[dict[str, float]] = []
    if len(stable) >= 2:
        forest = plan_from_samples(stable, [Profile(c, m) for c in core_counts for m in sizes], rate, CORE_PRICE,
                                   GB_PRICE)
        surface = [{"cores": p.cores, "memory_gb": p.memory_gb, "predicted": mean, "low": low, "high": high}
                   for p, (mean, low, high) in forest.predicted.items()]
        plan = forest.plan.row() if forest.plan else None
        console.print(f"plan for {rate:,.0f} rec/s (x{HEADROOM:.2f}): "
                      + (forest.plan.message if forest.plan else "out of reach of every profile"))
    else:
        console.print(f"[red]only {len(stable)} profiles sustained a rate: no model to fit[/red]")
    console.print(f"{len(runs)} profiles measured in {seconds / 60:.1f} min")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "settings": {"rate": rate, "cores": core_counts, "memory_gb": sizes, "cost_ms": cost_ms,
                     "warm_up_s": warm_up_s, "measure_s": measure_s},
        "runs": [{"cores": p.cores, "memory_gb": p.memory_gb, "mst": f.mst, "stable": f.stable, "steps": f.steps,
                  "seconds": took, "trace": [{"injected": s.injected, "processed": s.processed,
                                              "backlog_growth": s.backlog_growth} for s in f.trace]}
                 for p, f, took in runs],
        "samples": [{"cores": s.profile.cores, "memory_gb": s.profile.memory_gb, "throughput": s.throughput,
                     "measurements": s.measurements, "stable": s.stable} for s in samples],
        "surface": surface, "plan": plan, "seconds": seconds,
        "code": code_version(CODE), "machine": machine_info()}, indent=1))
    console.print(f"wrote {output}")


if __name__ == "__main__":
    app()
