"""`python -m bench.state_restarts`: restart time against state size, and the planner's prediction of it.

Runs the window-agg workload (`pipeline.workloads.stateful.window_agg`: sliding event-time windows per
key, every record a new key, windows a day long so that none closes during the run and the state only
grows) under the restart backend (`pipeline.restart.RestartFromCheckpoint`) in local mode, fed at a
constant rate (`--rate`) by the project's load generator on a broker of its own, once per state store provider
(`--stores`: RocksDB, Spark's default HDFS-backed one). It restarts the query `--baseline` times right
away, while the state is nearly empty, then `--restarts` times `--hold` seconds apart as the state grows,
alternating between `--low` and `--high` parallelism, with `--fill` seconds more before the first of
those (at `--fill-rate`, to grow the state faster than the job could sustain for long). A micro-batch
reads at most `--batch-records` records, so that a restart's first batch holds the state's load and a
bounded amount of work, not the whole backlog of the downtime.

Per restart: the state's rows and memory before it; the restart as the backend measures it (from the
stop request until the restarted query completed its first micro-batch); its state load, the restart
less the median nearly-empty restart in the same direction (the same restart with no state to load);
the first batch's duration beside the batches' before the stop (its excess, a cross-check of the load)
and, with RocksDB, the store's own load latency in that batch (`rocksdbLoadLatencyMs`);
the restart the planner would have predicted before it from the restarts measured so far
(`Downtimes.at_state(rows).typical(direction, first start)`); the recovery observed (from the stop
until a batch ends with at most `--tolerance-s` of arrivals waiting; the recovery detector's default
tolerance, 10 s, would count a restart shorter than that as recovered at its first batch) and the one predicted
(`plan.recovery.predict_recovery` with the predicted restart and the fastest batch seen so far at the
new parallelism as its capacity). Summary: median and worst relative error over the restarts whose
state load is at least a third of the restart. Prints a table per store and writes JSON.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from bench.common import RESULTS, table, write_result
from capacity.live_testbed import Adjustable
from contracts.jobs import JobConfig
from contracts.plan_state import Direction, Downtimes
from contracts.settings import Settings, Topics
from evaluation.calibrate import own_broker
from pipeline import offsets as off
from pipeline.loadgen import generate_load
from pipeline.metrics import sample_from_progress
from pipeline.restart import RestartFromCheckpoint, SparkJobConfig
from plan.recovery import predict_recovery

INPUT, OUTPUT, METRICS = "state.input", "state.output", "state.metrics"
SHARE_FLOOR = 1 / 3  # the restarts judged: state load at least this share of the restart
# Caught up: at most this many seconds of arrivals waiting (the recovery detector's default tolerance).
TOLERANCE_S = JobConfig.model_fields["backlog_tolerance_s"].default
app = typer.Typer(add_completion=False, help=__doc__)


# ---------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Batch:
    """One micro-batch of the query, from its progress."""

    run: int  # 0 for the first start, i for the query after restart i
    batch_id: int
    end: float  # epoch s
    duration_s: float
    input_rows: int
    backlog: int  # records waiting at its end (log end read at its start, plus arrivals during it)
    state_rows: int
    memory_bytes: int
    load_ms: float | None = None  # RocksDB: the state's load in it, summed over its tasks (rocksdbLoadLatencyMs)
    bytes_copied: int | None = None  # RocksDB: checkpoint bytes copied to the local store (rocksdbBytesCopied)


def rocksdb_metric(progress: Any, name: str) -> float | None:
    """A RocksDB custom metric summed over a progress's state operators; None when none reports it."""
    operators = (progress.get("stateOperators") if isinstance(progress, dict)
                 else getattr(progress, "stateOperators", None)) or []
    found = []
    for op in operators:
        metrics = (op.get("customMetrics") if isinstance(op, dict) else getattr(op, "customMetrics", None)) or {}
        if metrics.get(name) is not None:
            found.append(float(metrics[name]))
    return sum(found) if found else None


@dataclass(frozen=True)
class Restart:
    """One restart as measured; the derived figures come from `judge`."""

    index: int
    baseline: bool  # one of the nearly-empty-state restarts the state load is measured against
    from_p: int
    to_p: int
    rows_before: int
    memory_before: int
    stopped_at: float  # epoch s of the stop request
    restart_s: float  # stop request to the first micro-batch done at the new parallelism
    first_batch_s: float | None  # that batch's own duration
    steady_batch_s: float | None  # the median duration of the last batches before the stop that read records
    backlog_before: int
    recovered_s: float | None  # stop request to the first batch ending caught up
    rate: float
    reported_load_s: float | None = None  # the first batch's state load as the store reports it (RocksDB)
    state_load_s: float | None = None
    predicted_s: float | None = None
    predicted_recovery_s: float | None = None

    @property
    def direction(self) -> Direction:
        return Direction.of(self.from_p, self.to_p)

    @property
    def first_batch_excess_s(self) -> float | None:
        """How much longer the first batch took than the batches before the stop (its state load, mostly)."""
        if self.first_batch_s is None or self.steady_batch_s is None:
            return None
        return self.first_batch_s - self.steady_batch_s

    @property
    def share(self) -> float | None:
        return None if self.state_load_s is None or self.restart_s <= 0 else self.state_load_s / self.restart_s


def relative_error(predicted: float | None, observed: float | None) -> float | None:
    """|predicted - observed| / observed; None when either is missing or observed is not positive."""
    if predicted is None or observed is None or observed <= 0 or not math.isfinite(predicted):
        return None
    return abs(predicted - observed) / observed


def caught_up_at(batches: Sequence[Batch], run: int, caught_up: float) -> float | None:
    """The end of the first batch of `run` with at most `caught_up` records waiting; None if none yet."""
    return next((b.end for b in sorted(batches, key=lambda b: b.end) if b.run == run and b.backlog <= caught_up),
                None)


def capacity_at(batches: Sequence[Batch], parallelism_of: dict[int, int], parallelism: int, before: float,
                full: int, last: int = 3) -> float | None:
    """Records per second at `parallelism` before `before`: the median rate of the `last` batches there that
    read at least `full` records (a batch the per-batch limit filled: the job at capacity), each restart's
    first batch left out (it holds the start-up); None when none ran there."""
    first = {b.run: min(c.batch_id for c in batches if c.run == b.run) for b in batches}
    found = sorted((b for b in batches if parallelism_of.get(b.run) == parallelism and b.end < before
                    and b.batch_id != first[b.run] and b.duration_s > 0 and b.input_rows >= max(1, full)),
                   key=lambda b: b.end)[-last:]
    return statistics.median(b.input_rows / b.duration_s for b in found) if found else None


def steady(batches: Sequence[Batch], run: int, last: int = 3) -> float | None:
    """The median duration of the `last` batches of `run` that read records; None without one."""
    found = sorted((b for b in batches if b.run == run and b.input_rows > 0), key=lambda b: b.batch_id)[-last:]
    return statistics.median(b.duration_s for b in found) if found else None


def judge(restarts: Sequence[Restart], default_s: float, capacity: Sequence[float | None],
          tolerance_s: float = TOLERANCE_S) -> list[Restart]:
    """Each restart with its state load (against the median baseline restart in its direction), the restart
    the planner predicts before it from the ones measured so far, and the recovery predicted with that
    restart and `capacity[i]` (records/s at its new parallelism; None: no recovery prediction)."""
    baseline = {d: statistics.median(r.restart_s for r in restarts if r.baseline and r.direction is d)
                for d in Direction if any(r.baseline and r.direction is d for r in restarts)}
    measured, out = Downtimes(), []
    for r, cap in zip(restarts, capacity, strict=True):
        predicted = measured.at_state(r.rows_before).typical(r.direction, default_s)
        recovery = None
        if cap is not None and r.rate > 0:
            found = predict_recovery(cap, [r.rate], 1.0, float(r.backlog_before), predicted, 0.0,
                                     beyond_horizon_s=3600.0, caught_up_records=tolerance_s * r.rate).seconds
            recovery = found if math.isfinite(found) else None
        base = baseline.get(r.direction)
        load = None if base is None else max(0.0, r.restart_s - base)
        out.append(replace(r, state_load_s=load, predicted_s=predicted, predicted_recovery_s=recovery))
        measured = measured.add(r.direction, r.restart_s, r.rows_before)
    return out


def summarize(restarts: Sequence[Restart], floor: float = SHARE_FLOOR) -> dict[str, Any]:
    """Median and worst relative error of the predicted restart and recovery, over the restarts (not the
    baseline ones) whose state load is at least `floor` of the restart."""
    judged = [r for r in restarts if not r.baseline and r.share is not None and r.share >= floor]

    def errors(pairs: list[tuple[float | None, float | None]]) -> dict[str, Any]:
        found = [e for e in (relative_error(p, o) for p, o in pairs) if e is not None]
        return {"n": len(found), "median": statistics.median(found) if found else None,
                "worst": max(found, default=None)}

    shares = [r.share for r in restarts if not r.baseline and r.share is not None]
    return {"restarts": sum(not r.baseline for r in restarts), "judged": len(judged),
            "share_median": statistics.median(shares) if shares else None, "share_max": max(shares, default=None),
            "restart": errors([(r.predicted_s, r.restart_s) for r in judged]),
            "recovery": errors([(r.predicted_recovery_s, r.recovered_s) for r in judged])}


def targets(count: int, low: int, high: int, start: int) -> list[int]:
    """`count` parallelisms alternating between `high` and `low`, the first a change from `start`."""
    first_high = start != high
    return [(high if (i % 2 == 0) == first_high else low) for i in range(count)]


# ---------------------------------------------------------------- the live shell


def batches_of(job: RestartFromCheckpoint, run: int, rate: float) -> list[Batch]:
    """The query's recent batches (those that read something or reported a backlog)."""
    assert job.query is not None
    out = []
    for progress in job.query.recentProgress:
        sample = sample_from_progress(progress)
        batch_id = int(progress["batchId"] if isinstance(progress, dict) else progress.batchId)
        waiting = off.backlog(sample.log_end, sample.processed) + round(rate * sample.duration_s)
        copied = rocksdb_metric(progress, "rocksdbBytesCopied")
        out.append(Batch(run, batch_id, sample.end, sample.duration_s, sample.input_rows, waiting,
                         sum(s.rows for s in sample.state), sum(s.memory_bytes for s in sample.state),
                         rocksdb_metric(progress, "rocksdbLoadLatencyMs"), None if copied is None else int(copied)))
    return out


def watch(job: RestartFromCheckpoint, run: int, rate: float, seconds: float, seen: dict[tuple[int, int], Batch]
          ) -> None:
    """Collect the query's batches for `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        for b in batches_of(job, run, rate):
            seen[(b.run, b.batch_id)] = b
        if time.monotonic() >= deadline:
            return
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


@contextmanager
def load(bootstrap: str, shape: Adjustable, partitions: int) -> Iterator[None]:
    """Demo records at `shape`'s rate (set while it runs), every one a key of its own, from a thread until
    the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=generate_load, args=(bootstrap, INPUT, shape),
                              kwargs={"duration_s": 7 * 86400, "stop_event": stop, "partitions": partitions,
                                      "keys": 10**12}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def run_store(store: str, opts: dict[str, Any], console: Console, partial: Path) -> dict[str, Any]:
    """One store's run: the restarts measured and judged, its batches and first start; what is measured so
    far goes to `partial` after each restart."""
    from pipeline.workloads.stateful import window_agg

    rate = opts["rate"]
    shape = Adjustable(rate_per_s=opts["fill_rate"] or rate)
    options = {"input_topic": INPUT, "output_topic": OUTPUT, "cost_ms": "0", "stateStore": store,
               "window_s": str(opts["window_s"]), "slide_s": str(opts["slide_s"]), "watermark_s": "5",
               "statePartitions": str(opts["partitions"]),
               "maxRecordsPerTrigger": str(opts["batch_records"])}
    seen: dict[tuple[int, int], Batch] = {}
    measured: list[Restart] = []
    parallelism_of = {0: opts["low"]}
    with tempfile.TemporaryDirectory() as tmp, own_broker() as bootstrap:
        settings = Settings(kafka_bootstrap=bootstrap, topic_partitions=1, topics=Topics(metrics=METRICS))
        config = SparkJobConfig(job_id=f"state-{store}", entry_point="pipeline.workloads.stateful:window_agg",
                                checkpoint_dir=Path(tmp) / "job", bootstrap=bootstrap, options=options,
                                spark_conf={"spark.driver.memory": opts["driver_memory"]},
                                trigger_interval_s=1.0, report_interval_s=5.0, settings=settings)
        job = RestartFromCheckpoint(config, build=window_agg)
        with load(bootstrap, shape, opts["topic_partitions"]):
            started_s = job.start(opts["low"])
            watch(job, 0, shape.rate_per_s, opts["settle"], seen)
            plan = targets(opts["baseline"] + opts["restarts"], opts["low"], opts["high"], opts["low"])
            for index, target in enumerate(plan, start=1):
                baseline = index <= opts["baseline"]
                if index == opts["baseline"] + 1:  # the fill, at its own rate; then the measured restarts' rate
                    watch(job, index - 1, shape.rate_per_s, opts["fill"], seen)
                    shape.rate_per_s = rate
                watch(job, index - 1, shape.rate_per_s, 5.0 if baseline else opts["hold"], seen)
                before = max((b for b in seen.values() if b.run == index - 1), key=lambda b: b.batch_id)
                before_s = steady(list(seen.values()), index - 1)
                previous = job.parallelism or opts["low"]
                stopped_at = time.time()
                outcome = job.apply(target)
                if not outcome.ok:
                    raise RuntimeError(f"restart {index} to {target} failed: {outcome.errors}")
                parallelism_of[index] = target
                watch(job, index, shape.rate_per_s, 0.0, seen)
                run = sorted((b for b in seen.values() if b.run == index), key=lambda b: b.batch_id)
                reported = run[0].load_ms / 1000 if run and run[0].load_ms is not None else None
                measured.append(Restart(index, baseline, previous, target, before.state_rows, before.memory_bytes,
                                        stopped_at, outcome.downtime_s or math.nan,
                                        run[0].duration_s if run else None, before_s, before.backlog, None,
                                        shape.rate_per_s, reported))
                console.print(f"restart {index} {previous}->{target}: {outcome.downtime_s:.1f} s at "
                              f"{before.state_rows:,} rows ({before.memory_bytes / 2**20:.0f} MiB), first batch "
                              f"{run[0].duration_s if run else math.nan:.1f} s")
                partial.write_text(json.dumps({"restarts": [asdict(r) for r in measured],
                                               "batches": [asdict(b) for b in seen.values()]}))
            watch(job, len(plan), shape.rate_per_s, 10.0, seen)
            job.stop()
    batches = list(seen.values())
    with_recovery = []
    for r in measured:
        until = caught_up_at(batches, r.index, opts["tolerance_s"] * r.rate)
        with_recovery.append(replace(r, recovered_s=None if until is None else until - r.stopped_at))
    full = opts["batch_records"] // 2
    capacity = [capacity_at(batches, parallelism_of, r.to_p, r.stopped_at, full) for r in with_recovery]
    judged = judge(with_recovery, started_s, capacity, opts["tolerance_s"])
    return {"store": store, "started_s": started_s, "summary": summarize(judged),
            "restarts": [asdict(r) | {"direction": r.direction.value, "share": r.share,
                                      "first_batch_excess_s": r.first_batch_excess_s,
                                      "restart_error": relative_error(r.predicted_s, r.restart_s),
                                      "recovery_error": relative_error(r.predicted_recovery_s, r.recovered_s)}
                         for r in judged],
            "batches": [asdict(b) for b in sorted(batches, key=lambda b: (b.run, b.batch_id))]}


def show(result: dict[str, Any], console: Console) -> None:
    def num(value: float | None, fmt: str = ".1f") -> str:
        return "-" if value is None else format(value, fmt)

    out = table(f"{result['store']}: restarts against state", "restart", "p", "state rows", "MiB", "restart s",
                "1st batch s", "excess s", "reported load s", "state load s", "share", "predicted s", "error",
                "recovery s", "predicted", "error")
    for r in result["restarts"]:
        out.add_row(f"{r['index']}{' (baseline)' if r['baseline'] else ''}", f"{r['from_p']}->{r['to_p']}",
                    f"{r['rows_before']:,}", f"{r['memory_before'] / 2**20:.0f}", num(r["restart_s"]),
                    num(r["first_batch_s"]), num(r["first_batch_excess_s"]), num(r["reported_load_s"]),
                    num(r["state_load_s"]),
                    num(r["share"], ".0%"), num(r["predicted_s"]), num(r["restart_error"], ".0%"),
                    num(r["recovered_s"]), num(r["predicted_recovery_s"]), num(r["recovery_error"], ".0%"))
    console.print(out)
    s = result["summary"]
    console.print(f"{s['judged']} of {s['restarts']} restarts with state load >= a third; restart error median "
                  f"{num(s['restart']['median'], '.0%')} worst {num(s['restart']['worst'], '.0%')}; recovery error "
                  f"median {num(s['recovery']['median'], '.0%')} worst {num(s['recovery']['worst'], '.0%')}")


@app.command()
def main(
    stores: Annotated[str, typer.Option(help="State store providers, comma-separated: hdfs, rocksdb.")]
    = "hdfs,rocksdb",
    restarts: Annotated[int, typer.Option(help="Restarts as the state grows.")] = 14,
    baseline: Annotated[int, typer.Option(help="Restarts at a nearly empty state first.")] = 4,
    hold: Annotated[float, typer.Option(help="Seconds between two restarts.")] = 40.0,
    fill: Annotated[float, typer.Option(help="Seconds added before the first restart after the baseline.")] = 180.0,
    settle: Annotated[float, typer.Option(help="Seconds after the first start.")] = 10.0,
    rate: Annotated[float, typer.Option(help="Records/s, each a new key.")] = 300.0,
    fill_rate: Annotated[float | None, typer.Option(help="Records/s until the fill ends (default: --rate).")] = None,
    batch_records: Annotated[int, typer.Option(help="Records per micro-batch at most (maxRecordsPerTrigger).")]
    = 2000,
    window_s: Annotated[float, typer.Option(help="Window length (s); none closes within a run.")] = 86400.0,
    slide_s: Annotated[float, typer.Option(help="Window slide (s): window_s / slide_s state rows per record.")]
    = 1800.0,
    partitions: Annotated[int, typer.Option(help="State partitions.")] = 8,
    topic_partitions: Annotated[int, typer.Option(help="Input topic partitions.")] = 4,
    low: Annotated[int, typer.Option(help="Parallelism of the scale-downs.")] = 1,
    high: Annotated[int, typer.Option(help="Parallelism of the scale-ups.")] = 2,
    tolerance_s: Annotated[float, typer.Option(help="Caught up: at most this many seconds of arrivals waiting.")]
    = 2.0,
    driver_memory: Annotated[str, typer.Option(help="Spark driver memory (local mode: the state's heap).")] = "12g",
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "state_restarts.json",
) -> None:
    console = Console(width=200)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    opts = {"restarts": restarts, "baseline": baseline, "hold": hold, "fill": fill, "settle": settle, "rate": rate,
            "fill_rate": fill_rate,
            "batch_records": batch_records,
            "window_s": window_s, "slide_s": slide_s, "partitions": partitions, "topic_partitions": topic_partitions,
            "low": low, "high": high, "driver_memory": driver_memory, "tolerance_s": tolerance_s}
    results = []
    for store in (s.strip().lower() for s in stores.split(",") if s.strip()):
        try:
            result = run_store(store, opts, console, output.with_suffix(f".{store}.partial.json"))
        except Exception as exc:  # one store failing (e.g. out of memory) leaves the others' runs
            console.print(f"[red]{store}: {type(exc).__name__}: {exc}")
            results.append({"store": store, "error": f"{type(exc).__name__}: {exc}"})
            continue
        show(result, console)
        results.append(result)
        write_result(output, {"parameters": opts, "stores": results}, console=console)


if __name__ == "__main__":
    app()
