"""`python -m bench.fleet_step`: how long the fleet step's allocation takes, and how large a cluster's
fleet state grows, at 10 to 10,000 jobs on one cluster.

Each job bids as a busy job does (`plan.fleet`): 2-12 slots wanted, a need at or below it, a falling
cost curve (random savings per slot, not always convex); the budget lies halfway between the sum of
the needs and the sum of the wants, so the exchange runs. Prints a table and writes JSON; the time is
one allocation (`plan.fleet.allocate`), what every job's window pays on its cluster, and the state's
size is what knowledge reads and writes per window (one JSON value per cluster).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bench.common import RESULTS, summary, table, write_result
from contracts.fleet import FleetBid, FleetState
from plan.fleet import allocate

app = typer.Typer(add_completion=False, help=__doc__)
console = Console()


def bids_of(jobs: int, seed: int) -> dict[str, FleetBid]:
    rng = random.Random(seed)
    out = {}
    for i in range(jobs):
        wants = rng.randint(2, 12)
        costs = [1e5]
        for _ in range(wants - 1):
            costs.append(costs[-1] - rng.uniform(0, 3000))
        out[f"job-{i}"] = FleetBid(job_id=f"job-{i}", holds=2, wants=wants, need=rng.randint(1, wants), minimum=1,
                                   weight=rng.choice([0.5, 1.0, 2.0]), costs=[round(c, 3) for c in costs])
    return out


@app.command()
def main(
    jobs: Annotated[list[int] | None, typer.Option(help="Jobs on the cluster (repeatable).")] = None,
    repeats: Annotated[int, typer.Option(help="Allocations timed per size.")] = 20,
    seed: Annotated[int, typer.Option()] = 0,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "fleet_step.json",
) -> None:
    """Time the allocation and size the fleet state per number of jobs."""
    out = table("the fleet step on one cluster", "jobs", "allocation p50", "p99", "fleet state (JSON)")
    rows = []
    for n in jobs or [10, 100, 1000, 10000]:
        bids = bids_of(n, seed)
        budget = (sum(b.wants for b in bids.values()) + sum(b.need for b in bids.values())) // 2
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            allocate(bids, budget)
            times.append(1000 * (time.perf_counter() - started))
        size = len(FleetState(bids=bids, held={job: 2 for job in bids}).model_dump_json())
        stats = summary(times)
        out.add_row(f"{n:,}", f"{stats['p50']:.1f} ms", f"{stats['p99']:.1f} ms", f"{size / 1024:,.0f} KiB")
        rows.append({"jobs": n, "budget": budget, "allocation_ms": stats, "state_bytes": size})
    console.print(out)
    write_result(output, {"repeats": repeats, "seed": seed, "sizes": rows}, ("plan/fleet.py", "contracts/fleet.py"),
                 console)


if __name__ == "__main__":
    app()
