"""`python -m bench.inplace_live`: in-place rescales of a running Spark job on a standalone cluster.

Starts a standalone cluster from the pyspark wheel (one worker, `--cores` cores), a broker of its
own and the demo job (records with an I/O-like cost) under the in-place backend
(`pipeline.inplace.InPlaceExecutors`), fed by the project's load generator at a constant rate. It
then changes the job's executors `--rescales` times between 1 and `--max-parallelism`, holding each
for `--hold` seconds, and reports per rescale the time from the request to the executors registered
(or removed), and over the run: query restarts (the query's run id must never change), the longest
pause between two micro-batch starts, and records lost or duplicated (every input id must appear
exactly once in the output). Prints a table and writes JSON.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bench.common import RESULTS, write_result
from capacity.live_testbed import Adjustable
from evaluation.calibrate import background_load, job_config, own_broker
from pipeline.inplace import InPlaceExecutors
from stack.cluster import start_cluster
from tests.support.inplace import drained, ids_once, longest_pause, pauses, watch

SEQUENCE = (3, 1, 4, 2, 4, 1, 2, 3, 1, 4, 2, 3)  # targets in turn, from 1; every step a change
app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    rescales: Annotated[int, typer.Option(help="In-place rescales to make.")] = 10,
    hold: Annotated[float, typer.Option(help="Seconds at each parallelism.")] = 30.0,
    rate: Annotated[float, typer.Option(help="Records/s injected throughout.")] = 200.0,
    cost_ms: Annotated[float, typer.Option(help="Waiting per record (I/O-like cost).")] = 4.0,
    max_parallelism: Annotated[int, typer.Option(help="Executors at most (one core each).")] = 4,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "inplace_live.json",
) -> None:
    console = Console()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pipeline.inplace").setLevel(logging.INFO)
    rows: list[dict[str, Any]] = []
    seen: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, own_broker() as bootstrap:
        cluster = start_cluster(cores=max_parallelism, log_dir=Path(tmp) / "cluster")
        try:
            config = job_config(bootstrap, {"cost_ms": str(cost_ms)}, Path(tmp) / "job", master=cluster.url)
            job = InPlaceExecutors(config, max_parallelism)
            with background_load(bootstrap, Adjustable(rate_per_s=rate), 4, duration_s=7 * 86400):
                started = job.start(1)
                assert job.query is not None
                run_id = str(job.query.runId)
                watch(job, hold, seen)
                for target in (SEQUENCE[i % len(SEQUENCE)] for i in range(rescales)):
                    previous, requested = job.parallelism, time.time()
                    outcome = job.apply(target)
                    rows.append({"at": requested, "from": previous, "to": target, "ok": outcome.ok,
                                 "got": outcome.parallelism, "seconds": outcome.ramp_s,
                                 "held_s": outcome.downtime_s if target < (previous or 0) else 0.0,
                                 "errors": list(outcome.errors)})
                    console.print(f"{previous} -> {target}: {outcome.ramp_s:.1f} s, runs {outcome.parallelism}")
                    watch(job, hold, seen)
                    if str(job.query.runId) != run_id:
                        raise RuntimeError("the query was restarted")
            drained(job, seen)
            restarts = int(str(job.query.runId) != run_id)
            job.stop()
            exactly = ids_once(bootstrap)
        finally:
            cluster.stop()
    spans = list(seen.values())
    ups = sorted(r["seconds"] for r in rows if r["to"] > r["from"]) or [None]
    downs = sorted(r["seconds"] for r in rows if r["to"] < r["from"]) or [None]
    summary = {"rescales": len(rows), "applied": sum(r["ok"] for r in rows), "query_restarts": restarts,
               "start_s": started, "longest_pause_s": longest_pause(spans), "batches": len(seen),
               "median_up_s": statistics.median(ups) if ups[0] is not None else None, "worst_up_s": ups[-1],
               "median_down_s": statistics.median(downs) if downs[0] is not None else None,
               "worst_down_s": downs[-1], "worst_held_s": max((r["held_s"] or 0.0 for r in rows), default=0.0),
               **exactly}
    table = Table(title=f"{len(rows)} in-place rescales between 1 and {max_parallelism} executors, {rate:g} rec/s "
                        f"at {cost_ms:g} ms per record, {hold:g} s each; no time compression", title_justify="left")
    for column in ("applied", "query restarts", "longest pause between batches", "up: to registered, median / worst",
                   "down: to removed, median / worst", "held between batches (down), worst", "lost", "duplicated"):
        table.add_column(column, justify="right")
    table.add_row(f"{summary['applied']} of {len(rows)}", str(restarts), f"{summary['longest_pause_s']:.1f} s",
                  *(f"{summary[f'median_{d}_s']:.1f} / {summary[f'worst_{d}_s']:.1f} s"
                    if summary[f"worst_{d}_s"] is not None else "-" for d in ("up", "down")),
                  f"{summary['worst_held_s']:.2f} s", str(exactly["lost"]), str(exactly["duplicated"]))
    console.print(table)
    write_result(output, {"summary": summary, "rescales": rows,
                          "longest_pauses": sorted(pauses(spans), key=lambda p: -p[1])[:5]}, console=console)


if __name__ == "__main__":
    app()
