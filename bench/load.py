"""`python -m bench.load`: many jobs, each reporting every second, against the agents on their own
broker and Redis (`tests.support.load.run`).

    python -m bench.load --jobs 1000 --minutes 10              # real time, 1,000 reports/s
    python -m bench.load --jobs 1000 --minutes 10 --speedup 3  # the same reports in 200 s, 3,000/s
    python -m bench.load --jobs 1000 --workers 3 --kill-at-s 60  # one of three workers killed at 60 s
    python -m bench.load --jobs 1000 --redis-nodes 3           # the knowledge on a Redis Cluster of 3

Prints the samples (lag, worker and Redis memory, decisions, every 10 s) and a summary; writes JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tests.support.load import LoadResult, run

RESULTS = Path(__file__).parent / "results"


def print_table(result: LoadResult, console: Console) -> None:
    windows = "spread" if result.window_spread else "aligned"
    store = f"a Redis Cluster of {result.redis_nodes}" if result.redis_nodes > 1 else "one Redis"
    table = Table(title=f"load: {result.jobs} jobs x 1 report/s, {result.minutes:g} min of metric time at "
                        f"{result.speedup:g}x, {result.workers} workers, windows {windows}, {store}")
    for column in ("t (s)", "reports sent", "lag (records)", "worker RSS (MB)", "Redis (MB)",
                   "Redis dataset (MB)", "decisions"):
        table.add_column(column, justify="right")
    for s in result.samples:
        table.add_row(f"{s.at_s:.0f}", str(s.reports_sent), str(s.lag), " / ".join(f"{r:.0f}" for r in s.worker_rss_mb),
                      f"{s.redis_used_mb:.1f}", f"{s.redis_dataset_mb:.1f}", str(s.decisions))
    console.print(table)
    summary = Table(title="summary")
    summary.add_column("measure")
    summary.add_column("value", justify="right")
    for key, value in result.summary().items():
        summary.add_row(key, str(value))
    console.print(summary)


def main(
    jobs: Annotated[int, typer.Option(min=1)] = 1000,
    minutes: Annotated[float, typer.Option(min=0.5)] = 10.0,
    workers: Annotated[int, typer.Option(min=1)] = 2,
    history_length: Annotated[int, typer.Option(min=10)] = 20,
    speedup: Annotated[float, typer.Option(min=1.0, help="Metric time per wall second.")] = 1.0,
    window_spread: Annotated[bool, typer.Option(help="Each job's windows at a phase of its own (the setting).")] = True,
    drain_limit_s: Annotated[float, typer.Option(min=0, help="How long to wait for the drain after the load.")] = 300.0,
    redis_nodes: Annotated[int, typer.Option(min=1, help="1: a redis-server; more: a Redis Cluster of as many.")] = 1,
    kill_at_s: Annotated[float | None, typer.Option(help="Kill one worker (SIGKILL) this long into the load.")] = None,
    out: Annotated[Path, typer.Option(help="JSON results file.")] = RESULTS / "load.json",
) -> None:
    console = Console()
    result = run(jobs=jobs, minutes=minutes, workers=workers, history_length=history_length, speedup=speedup,
                 window_spread=window_spread, drain_limit_s=drain_limit_s,
                 redis_nodes=redis_nodes, kill_at_s=kill_at_s, console=console)
    print_table(result, console)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**asdict(result), "summary": result.summary()}, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
