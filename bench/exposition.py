"""`python -m bench.exposition`: what a worker's per-job Prometheus series cost, at 1,000 to 10,000 jobs.

A worker keeps, for each job whose windows it handled, the series a steady job leaves in
`contracts.metrics`: every metric labelled by the job alone (its rates, parallelism, backlog, windows
and reports) and one decisions counter (one action, one reason code). Rejections, rescales and
suppressions add series only when they happen and are left out. Per number of jobs it measures one
scrape of /metrics (`generate_latest`, what the worker's web server runs in a thread while holding
Python's lock for most of it): its time (the fastest and the median of `--repeats`), its size and
lines, and the memory the series hold (tracemalloc, Python's allocations). Each size is measured as
served (no `_created` samples: `contracts.metrics`) and with them, Prometheus's client default.
The garbage collector runs as in a worker (`agent.cli.tune_collector`). Prints a table and writes JSON.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Annotated

import prometheus_client
import typer
from prometheus_client import Counter, Gauge, generate_latest
from rich.console import Console

from agent.cli import tune_collector
from bench.common import RESULTS, table, write_result
from contracts import metrics

app = typer.Typer(add_completion=False, help=__doc__)
console = Console()


def per_job_metrics() -> list[Counter | Gauge]:
    """The metrics labelled by the job alone."""
    return [m for m in vars(metrics).values()
            if isinstance(m, Counter | Gauge) and tuple(m._labelnames) == ("job",)]


def populate(jobs: int) -> int:
    """Give `jobs` jobs their series; returns the bytes Python allocated for them."""
    clear()
    per_job = per_job_metrics()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(jobs):
        job = f"job-{i:05d}"
        for metric in per_job:
            if isinstance(metric, Counter):
                metric.labels(job).inc()
            else:
                metric.labels(job).set(1.5)
        metrics.DECISIONS.labels(job, "none", "hold").inc()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held


def clear() -> None:
    for metric in [*per_job_metrics(), metrics.DECISIONS]:
        metric.clear()


def scrape(repeats: int) -> tuple[list[float], bytes]:
    times, body = [], b""
    for _ in range(repeats):
        started = time.perf_counter()
        body = generate_latest(metrics.REGISTRY)
        times.append(1000 * (time.perf_counter() - started))
    return times, body


@app.command()
def main(
    jobs: Annotated[list[int] | None, typer.Option(help="Jobs with series in one worker (repeatable).")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Scrapes timed per size.")] = 9,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "exposition.json",
) -> None:
    """Time a scrape and size the series per number of jobs."""
    tune_collector()  # as in a worker
    out = table("one /metrics scrape of a worker's per-job series", "jobs", "_created", "scrape, fastest",
                "median", "size", "lines", "memory of the series")
    rows = []
    for n in jobs or [1000, 3000, 5000, 10000]:
        held = populate(n)
        for created in (False, True):
            if created:
                prometheus_client.enable_created_metrics()
            try:
                times, body = scrape(repeats)
            finally:
                prometheus_client.disable_created_metrics()
            row = {"jobs": n, "created": created, "scrape_ms_min": min(times),
                   "scrape_ms_median": statistics.median(times), "bytes": len(body), "lines": body.count(b"\n"),
                   "series_memory_bytes": held}
            rows.append(row)
            out.add_row(f"{n:,}", "with" if created else "without (served)", f"{row['scrape_ms_min']:.0f} ms",
                        f"{row['scrape_ms_median']:.0f} ms", f"{len(body) / 2**20:.2f} MiB", f"{row['lines']:,}",
                        f"{held / 2**20:.1f} MiB")
    clear()
    console.print(out)
    write_result(output, {"repeats": repeats, "per_job_metrics": [m._name for m in per_job_metrics()],
                          "sizes": rows}, ("contracts/metrics.py",), console)


if __name__ == "__main__":
    app()
