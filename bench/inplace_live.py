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

import itertools
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bench.common import code_version, machine_info
from evaluation.calibrate import INPUT, OUTPUT, background_load, job_config, own_broker
from evaluation.live_testbed import Adjustable
from infra.kafka import TopicReader, written_ids
from pipeline.inplace import InPlaceExecutors
from stack.cluster import start_cluster

RESULTS = Path(__file__).resolve().parent / "results" / "inplace_live.json"
SEQUENCE = (3, 1, 4, 2, 4, 1, 2, 3, 1, 4, 2, 3)  # targets in turn, from 1; every step a change
app = typer.Typer(add_completion=False, help=__doc__)


def batch_spans(progress: list[Any], seen: dict[int, tuple[float, float]]) -> None:
    """Each micro-batch's (start, end) in epoch seconds by batch id, from the query's recent progress."""
    from pipeline.metrics import sample_from_progress

    for item in progress:
        batch = item["batchId"] if isinstance(item, dict) else item.batchId
        sample = sample_from_progress(item)
        if sample.input_rows > 0:  # an idle progress event (no data) is no batch
            seen[int(batch)] = (sample.trigger_start, sample.trigger_start + sample.duration_s)


def pauses(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each time with no micro-batch running, (from, seconds): one batch's end to the next one's start."""
    ordered = sorted(spans)
    return [(a[1], b[0] - a[1]) for a, b in itertools.pairwise(ordered)]


def longest_pause(spans: list[tuple[float, float]]) -> float:
    return max((seconds for _, seconds in pauses(spans)), default=0.0)


def watch(job: InPlaceExecutors, seconds: float, seen: dict[int, tuple[float, float]]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert job.query is not None
        batch_spans(list(job.query.recentProgress), seen)
        time.sleep(1.0)


def drained(job: InPlaceExecutors, seen: dict[int, tuple[float, float]], timeout_s: float = 300.0) -> bool:
    """Wait (the load stopped) until the job admitted everything in its input, noting its batches."""
    from pipeline import offsets as off
    from pipeline.metrics import sample_from_progress

    after = time.time() + 3.0  # the load generator's last records reach the broker
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert job.query is not None
        batch_spans(list(job.query.recentProgress), seen)
        last = job.query.lastProgress
        if last is not None:
            sample = sample_from_progress(last)
            if sample.trigger_start > after and sample.log_end and off.backlog(sample.log_end, sample.processed) == 0:
                return True
        time.sleep(1.0)
    return False


def ids_once(bootstrap: str, timeout_s: float = 180.0) -> dict[str, int]:
    """Input ids against output ids: how many were lost, how many duplicated."""
    source = TopicReader(bootstrap, INPUT)
    while True:  # until a second brings nothing new
        before = len(source.values)
        if len(source.poll(1.0)) == before:
            break
    produced = {json.loads(v)["id"] for v in source.values}
    source.close()
    out = written_ids(bootstrap, OUTPUT, produced, timeout_s)
    lost = sorted(produced - set(out))
    return {"input": len(produced), "output": len(out), "lost": len(lost), "lost_ids": lost[:5] + lost[-5:],
            "duplicated": len(out) - len(set(out)), "unexpected": len(set(out) - produced)}


@app.command()
def main(
    rescales: Annotated[int, typer.Option(help="In-place rescales to make.")] = 10,
    hold: Annotated[float, typer.Option(help="Seconds at each parallelism.")] = 30.0,
    rate: Annotated[float, typer.Option(help="Records/s injected throughout.")] = 200.0,
    cost_ms: Annotated[float, typer.Option(help="Waiting per record (I/O-like cost).")] = 4.0,
    max_parallelism: Annotated[int, typer.Option(help="Executors at most (one core each).")] = 4,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS,
) -> None:
    console = Console()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pipeline.inplace").setLevel(logging.INFO)
    targets = [SEQUENCE[i % len(SEQUENCE)] for i in range(rescales)]
    rows: list[dict[str, Any]] = []
    seen: dict[int, tuple[float, float]] = {}
    load = Adjustable(rate_per_s=rate)
    with tempfile.TemporaryDirectory() as tmp, own_broker() as bootstrap:
        cluster = start_cluster(cores=max_parallelism, log_dir=Path(tmp) / "cluster")
        try:
            config = job_config(bootstrap, {"cost_ms": str(cost_ms)}, Path(tmp) / "job", master=cluster.url)
            job = InPlaceExecutors(config, max_parallelism)
            with background_load(bootstrap, load, 4, duration_s=7 * 86400):
                started = job.start(1)
                assert job.query is not None
                run_id = str(job.query.runId)
                watch(job, hold, seen)
                for target in targets:
                    previous = job.parallelism
                    requested = time.time()
                    outcome = job.apply(target)
                    rows.append({"at": requested, "from": previous, "to": target, "ok": outcome.ok,
                                 "got": outcome.parallelism,
                                 "seconds": outcome.ramp_s,
                                 "held_s": outcome.downtime_s if target < (previous or 0) else 0.0,
                                 "errors": list(outcome.errors)})
                    console.print(f"{previous} -> {target}: {rows[-1]['seconds']:.1f} s, runs {outcome.parallelism}")
                    watch(job, hold, seen)
                    if str(job.query.runId) != run_id:
                        raise RuntimeError("the query was restarted")
            drained(job, seen)
            restarts = int(str(job.query.runId) != run_id)
            job.stop()
            pause = longest_pause(list(seen.values()))
            worst = sorted(pauses(list(seen.values())), key=lambda p: -p[1])[:5]
            exactly = ids_once(bootstrap)
        finally:
            cluster.stop()
    ups = sorted(r["seconds"] for r in rows if r["to"] > r["from"])
    downs = sorted(r["seconds"] for r in rows if r["to"] < r["from"])
    summary = {"rescales": len(rows), "applied": sum(r["ok"] for r in rows), "query_restarts": restarts,
               "start_s": started, "longest_pause_s": pause, "batches": len(seen),
               "median_up_s": statistics.median(ups) if ups else None, "worst_up_s": ups[-1] if ups else None,
               "median_down_s": statistics.median(downs) if downs else None,
               "worst_down_s": downs[-1] if downs else None,
               "worst_held_s": max((r["held_s"] or 0.0 for r in rows), default=0.0), **exactly}
    table = Table(title=f"{len(rows)} in-place rescales between 1 and {max_parallelism} executors, {rate:g} rec/s "
                        f"at {cost_ms:g} ms per record, {hold:g} s each; no time compression", title_justify="left")
    for column in ("applied", "query restarts", "longest pause between batches", "up: to registered, median / worst",
                   "down: to removed, median / worst", "held between batches (down), worst", "lost", "duplicated"):
        table.add_column(column, justify="right")
    table.add_row(f"{summary['applied']} of {len(rows)}", str(restarts), f"{summary['longest_pause_s']:.1f} s",
                  f"{summary['median_up_s']:.1f} / {summary['worst_up_s']:.1f} s" if ups else "-",
                  f"{summary['median_down_s']:.1f} / {summary['worst_down_s']:.1f} s" if downs else "-",
                  f"{summary['worst_held_s']:.2f} s",
                  str(exactly["lost"]), str(exactly["duplicated"]))
    console.print(table)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"summary": summary, "rescales": rows, "longest_pauses": worst,
                                  "machine": machine_info(), "code": code_version()}, indent=2))
    console.print(f"wrote {output}")


if __name__ == "__main__":
    app()
