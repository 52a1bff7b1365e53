"""Capacity model against the demo Spark job: estimates from unsaturated windows vs saturation.

  python -m bench.capacity_model                       # scale-outs 1, 2, 4; cost 4 ms (about 10-11 minutes)
  python -m bench.capacity_model -p 2 --level-seconds 30 --load 0.2 --load 0.6

For each scale-out p, one run of the demo job (`pipeline.demo:build`, in this process, `local[p]`,
1 s trigger and 5 s metric reports, as `autoscaler demo` runs it) on its own Kafka-protocol broker:

1. Learn. Constant loads below saturation, one after the other (`--load`, fractions of
   `--expected-per-slot` x p). The job's MetricReports go through the monitor's windowing
   (`monitor.windows.add_report`, `--window-seconds` windows of metric time), the analyze stage's
   `analyze_window` and `analyze.proactive.learn` (the Daedalus capacity model and the hybrid
   capacity view), but only unsaturated windows are learned from: valid, after the warm-up, with a
   backlog of at most `--backlog-tolerance` seconds of arrivals and a utilization of at most
   `--max-utilization`.
2. Estimate. The regression model's estimate at p (`learned.capacity.estimate(p)`: the decaying
   average of the per-window capacities, each the throughput~utilization line at saturation), and
   DS2's: the true processing rate per slot (records per busy second, over the learned windows)
   times p.
3. Measure. Right after the loads, a backlog of `--drain-seconds` of work at the ideal rate is
   produced at once and the job drains it (the `bench.spark_capacity drain` method): the maximum
   sustainable throughput is records / seconds over the reports that lie wholly inside the drain
   (started after the backlog was written, still a backlog at their end).

Then every scale-out is also estimated from the others only (leave one out: the model's scaling
curve, as it would estimate a scale-out it has not run at). Prints a table and writes JSON.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from analyze.capacity import UnknownCapacity, worker_capacity
from analyze.proactive import Learned, learn, new_learned
from analyze.true_rates import analyze_window
from bench.capacity_windows import (
    Batch,
    batch_capacity,
    batch_of,
    drain_reports,
    error_pct,
    leave_one_out,
    load_rates,
    skip_reason,
    windows_of,
)
from bench.common import code_version, machine_info
from bench.spark_capacity import INPUT, Metrics, job_config, summarize
from pipeline.demo import DEFAULT_BATCH_SECONDS, batch_limit

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "capacity_model.json"
ACCEPTANCE_PCT = 5.0  # the bound on |estimate - measured| / measured
FAST_PRODUCE_RATE = 50_000.0  # records/s when writing the drain backlog

app = typer.Typer(help=__doc__, add_completion=False)
console = Console(width=200)  # the table is wide; a pipe would wrap it at 80


# ---------------------------------------------------------------- one scale-out


@dataclass
class WindowRow:
    start: float
    load: float  # the constant load (records/s) at the window's end
    utilization: float
    throughput: float
    true_rate_per_slot: float
    backlog: int | None
    used: bool
    skipped: str | None = None
    records: int = 0
    busy_s: float = 0.0
    observed_s: float = 0.0
    capacity_after: float | None = None  # the model's average at p after this window
    hybrid: float | None = None
    hybrid_source: str | None = None


@dataclass
class ScaleOutResult:
    parallelism: int
    loads: list[float]
    measured_max: float
    drain: dict[str, Any]
    regression: float | None
    regression_basis: str | None
    line_at_full: float | None  # the final regression line at utilization 1 (no averaging)
    line_at_saturation: float | None  # the final line at the utilization measured while draining
    line: dict[str, float] | None
    ds2_rate_per_slot: float | None
    ds2: float | None
    hybrid: dict[str, Any]
    samples: int
    batch_model: dict[str, float] | None = None
    windows: list[WindowRow] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)  # every non-empty micro-batch seen, for offline analysis
    reports: list[dict[str, Any]] = field(default_factory=list)  # every MetricReport (end, s, records, busy s)
    started_s: float = 0.0
    seconds: float = 0.0
    load_average: list[float] | None = None  # 1, 5, 15 min, at the end of this scale-out's run

    def errors(self) -> dict[str, float | None]:
        return {
            "regression_pct": error_pct(self.regression, self.measured_max),
            "ds2_pct": error_pct(self.ds2, self.measured_max),
            "line_at_full_pct": error_pct(self.line_at_full, self.measured_max),
            "line_at_saturation_pct": error_pct(self.line_at_saturation, self.measured_max),
            "hybrid_pct": error_pct(self.hybrid.get("value"), self.measured_max),
            "batch_model_pct": error_pct(self.batch_model["capacity"] if self.batch_model else None,
                                         self.measured_max),
        }


def check(job: Any) -> None:
    if not job.healthy():
        raise RuntimeError(f"the demo job stopped: {job.failure() or 'no error given'}")


def collect_batches(query: Any, into: dict[int, Batch]) -> None:
    """Add the query's recent micro-batches (Spark keeps the last 100 progress events)."""
    with contextlib.suppress(Exception):  # a diagnostic: never fail the run for it
        for progress in query.recentProgress:
            batch = batch_of(progress)
            if batch is not None:
                into[batch.batch_id] = batch


def load_at(levels: list[tuple[float, float, float]], t: float) -> float:
    for rate, begin, end in levels:
        if begin <= t < end:
            return rate
    return levels[-1][0] if levels else 0.0


def run_scale_out(
    learned: Learned,
    p: int,
    *,
    cost_ms: float,
    rates: list[float],
    level_s: float,
    warmup_s: float,
    drain_s: float,
    window_s: float,
    partitions: int,
    backlog_tolerance_s: float,
    max_utilization: float,
) -> tuple[Learned, ScaleOutResult]:
    from infra.kafka import ensure_topic
    from pipeline.loadgen import Constant, Steps, generate_load
    from pipeline.restart import RestartFromCheckpoint
    from stack.processes import start_broker

    wall = time.monotonic()
    broker = start_broker()
    bootstrap = f"{broker.host}:{broker.port}"
    try:
        ensure_topic(bootstrap, INPUT, partitions)
        metrics = Metrics(bootstrap)
        with tempfile.TemporaryDirectory() as tmp:
            job = RestartFromCheckpoint(job_config(bootstrap, cost_ms, Path(tmp)))  # the demo's 1 s trigger
            started_s = job.start(p)
            try:
                # 1. Constant loads below saturation, the first one longer by the warm-up.
                steps = tuple((rate, level_s + (warmup_s if i == 0 else 0.0)) for i, rate in enumerate(rates))
                began = time.time()
                levels, t = [], began
                for rate, seconds in steps:
                    levels.append((rate, t, t + seconds))
                    t += seconds
                outcome: dict[str, Any] = {}
                load = threading.Thread(
                    target=lambda: outcome.setdefault("load", generate_load(bootstrap, INPUT, Steps(steps))),
                    daemon=True,
                )
                load.start()
                batches: dict[int, Batch] = {}
                while load.is_alive():
                    metrics.poll(1.0)
                    collect_batches(job.query, batches)
                    check(job)
                load.join()
                next_id = outcome["load"].next_id if "load" in outcome else 10_000_000

                # 3. Saturate: a backlog of drain_s seconds of work at the ideal rate, written at once.
                records = int(drain_s * p * 1000.0 / cost_ms)
                backlog_at = time.time()
                generate_load(bootstrap, INPUT, Constant(FAST_PRODUCE_RATE), duration_s=records / FAST_PRODUCE_RATE,
                              start_id=next_id)
                written_at = time.time()
                deadline = written_at + 4 * drain_s + 60
                while time.time() < deadline:
                    metrics.poll(1.0)
                    collect_batches(job.query, batches)
                    check(job)
                    last = metrics.reports[-1] if metrics.reports else None
                    if (last is not None and last.timestamp > written_at + 1 and last.source is not None
                            and last.source.backlog == 0):
                        break
            finally:
                job.stop()
    finally:
        broker.stop()

    steady = [r for r in metrics.reports if r.timestamp <= backlog_at]
    saturated = drain_reports(metrics.reports, written_at)
    drain = summarize(saturated, p) if saturated else {"reports": 0}
    measured = float(drain.get("throughput_per_s", 0.0))

    # 2. Learn from the unsaturated windows only.
    rows = []
    records = busy = 0.0
    for window in windows_of(steady, window_s):
        analysis = analyze_window(window, None)
        reason = skip_reason(window, analysis, learn_from=began + warmup_s, backlog_tolerance_s=backlog_tolerance_s,
                             max_utilization=max_utilization)
        row = WindowRow(start=window.window_start, load=load_at(levels, window.window_end - 1e-6),
                        utilization=round(analysis.utilization, 4),
                        throughput=round(analysis.observed_processing_rate, 2),
                        true_rate_per_slot=round(analysis.true_processing_rate, 2),
                        backlog=window.source.backlog if window.source else None, used=reason is None,
                        skipped=reason, records=window.records_in, busy_s=round(window.busy_time_s, 3),
                        observed_s=round(window.observed_s, 3))
        if reason is None:
            learned, view, _ = learn(learned, window, analysis)
            row.capacity_after = learned.capacity.observed.get(p)
            row.hybrid, row.hybrid_source = view.current, view.source
            records += window.records_in
            busy += window.busy_time_s
        rows.append(row)

    ordered = sorted(batches.values(), key=lambda b: b.batch_id)
    learning_batches = [b for b in ordered if b.start >= began + warmup_s and b.start + b.duration_s <= backlog_at]
    full_batches = [b for b in ordered if b.start >= written_at and b.start + b.duration_s
                    <= max((r.timestamp for r in saturated), default=0.0)]
    batch_model = batch_capacity(learning_batches, batch_limit(cost_ms, p, DEFAULT_BATCH_SECONDS))
    if batch_model is not None and full_batches:
        batch_model["drain_batch_s"] = sum(b.duration_s for b in full_batches) / len(full_batches)
        batch_model["drain_batch_rows"] = sum(b.rows for b in full_batches) / len(full_batches)

    regression = basis = None
    with contextlib.suppress(UnknownCapacity):
        if p in learned.capacity.observed:
            estimate = learned.capacity.estimate(p)
            regression, basis = estimate.value, estimate.basis
    line = line_full = line_sat = None
    samples = 0
    if learned.capacity.parallelism == p and learned.capacity.workers:
        samples = sum(m.count for m in learned.capacity.workers.values())
        with contextlib.suppress(ValueError):
            regs = learned.capacity.workers
            line_full = sum(worker_capacity(m, 1.0)[0] for m in regs.values())
            if drain.get("utilization"):
                line_sat = sum(worker_capacity(m, min(1.0, drain["utilization"]))[0] for m in regs.values())
            if len(regs) == 1:
                (reg,) = regs.values()
                if reg.count >= 2 and reg.m2x > 0:
                    fitted = reg.line()
                    line = {"slope": fitted.slope, "intercept": fitted.intercept, "count": reg.count,
                            "utilization_std": math.sqrt(reg.m2x / reg.count)}
    rate = records / busy if busy > 0 else None
    hybrid = next(({"value": r.hybrid, "source": r.hybrid_source} for r in reversed(rows) if r.used), {})
    result = ScaleOutResult(
        parallelism=p, loads=rates, measured_max=measured, drain=drain, regression=regression,
        regression_basis=basis, line_at_full=line_full, line_at_saturation=line_sat, line=line,
        ds2_rate_per_slot=rate, ds2=rate * p if rate else None, hybrid=hybrid, samples=samples,
        batch_model=batch_model, windows=rows, batches=ordered,
        reports=[{"end": r.timestamp, "interval_s": r.interval_s, "records": r.records_in, "busy_s": r.busy_time_s,
                  "backlog": r.source.backlog if r.source else None} for r in metrics.reports],
        started_s=round(started_s, 1), seconds=round(time.monotonic() - wall, 1),
        load_average=[round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    )
    return learned, result


# ---------------------------------------------------------------- output


def fmt(value: float | None, pattern: str = "{:,.0f}") -> str:
    return "-" if value is None else pattern.format(value)


def fmt_err(pct: float | None) -> str:
    if pct is None:
        return "-"
    colour = "green" if abs(pct) <= ACCEPTANCE_PCT else "red"
    return f"[{colour}]{pct:+.1f} %[/{colour}]"


def render(results: list[ScaleOutResult], unseen: dict[int, dict[str, Any] | None], cost_ms: float) -> None:
    table = Table(title=f"capacity estimates vs measured max throughput, demo job, cost {cost_ms:g} ms (rec/s)")
    for column in ("p", "loads learned", "measured max", "util at max", "regression", "error", "DS2 (rate x p)",
                   "error", "samples", "hybrid view", "final line at u=1", "line at util at max", "batch model"):
        table.add_column(column, justify="right")
    for r in results:
        e = r.errors()
        table.add_row(
            str(r.parallelism), " / ".join(f"{x:,.0f}" for x in r.loads), fmt(r.measured_max),
            fmt(r.drain.get("utilization"), "{:.2f}"),
            fmt(r.regression), fmt_err(e["regression_pct"]), fmt(r.ds2), fmt_err(e["ds2_pct"]), str(r.samples),
            f"{fmt(r.hybrid.get('value'))} {r.hybrid.get('source') or ''} ({fmt(e['hybrid_pct'], '{:+.1f} %')})",
            f"{fmt(r.line_at_full)} ({fmt(e['line_at_full_pct'], '{:+.1f} %')})",
            f"{fmt(r.line_at_saturation)} ({fmt(e['line_at_saturation_pct'], '{:+.1f} %')})",
            f"{fmt(r.batch_model and r.batch_model['capacity'])} ({fmt(e['batch_model_pct'], '{:+.1f} %')})",
        )
    console.print(table)
    console.print(
        "  regression: the model's estimate at p (learned.capacity.estimate: its decaying average of each learned "
        "window's capacity, the throughput~utilization line at utilization 1); DS2: records per busy second over the "
        "learned windows x p;\n"
        "  hybrid view: the CapacityView's current capacity after the last learned window (DS2: that window's true "
        "rate x p, when busy time is reported);\n"
        "  final line at u=1: the regression line after the last window, not averaged; line at util at max: that "
        "line at the utilization measured while draining; batch model (diagnostic): batch duration~size line, full "
        "batches back to back"
    )
    if any(v is not None for v in unseen.values()):
        measured = {r.parallelism: r.measured_max for r in results}
        side = Table(title="scale-outs the model has not run at (leave one out: its scaling curve)")
        for column in ("p", "from scale-outs", "basis", "exponent k", "estimate", "measured max", "error"):
            side.add_column(column, justify="right")
        for p, est in unseen.items():
            if est is None:
                continue
            side.add_row(str(p), ", ".join(map(str, est["from"])), est["basis"], fmt(est["exponent"], "{:.2f}"),
                         fmt(est["value"]), fmt(measured[p]), fmt_err(error_pct(est["value"], measured[p])))
        console.print(side)


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@app.command()
def main(
    parallelism: Annotated[list[int] | None, typer.Option("--parallelism", "-p", help="Scale-outs (default 1 2 4).")]
    = None,
    cost_ms: Annotated[float, typer.Option("--cost-ms", help="The demo job's per-record wait.")] = 4.0,
    load: Annotated[list[float] | None, typer.Option(
        "--load", help="Learning loads, fractions of --expected-per-slot x p (default 0.3 0.5 0.7).")] = None,
    expected_per_slot: Annotated[float | None, typer.Option(
        help="Expected max records/s per slot (default 0.85 x 1000 / cost-ms, about the measured drain rate).")]
    = None,
    level_seconds: Annotated[float, typer.Option(help="Seconds of each learning load.")] = 40.0,
    warmup_seconds: Annotated[float, typer.Option(help="Added to the first load; its windows are not learned.")]
    = 20.0,
    drain_seconds: Annotated[float, typer.Option(help="Backlog to drain, in seconds of work at the ideal rate.")]
    = 40.0,
    window_seconds: Annotated[float, typer.Option(help="Window of metric time (AUTOSCALER_LOOP_INTERVAL_S).")]
    = 10.0,
    backlog_tolerance: Annotated[float, typer.Option(
        help="A window with more backlog than this many seconds of arrivals is saturated.")] = 3.0,
    max_utilization: Annotated[float, typer.Option(help="A window busier than this is saturated.")] = 0.9,
    partitions: Annotated[int, typer.Option(help="Partitions of the input topic.")] = 4,
    json_out: Annotated[Path, typer.Option("--json-out", help="Where the JSON results go.")] = RESULTS,
) -> None:
    """Learn the capacity model from unsaturated windows, then saturate the job and compare."""
    signal.signal(signal.SIGTERM, interrupted)  # so the job, its Spark session and the broker are stopped
    scale_outs = parallelism or [1, 2, 4]
    fractions = load or [0.3, 0.5, 0.7]
    per_slot = expected_per_slot or 0.85 * 1000.0 / cost_ms
    started, wall = dt.datetime.now(dt.UTC), time.monotonic()
    load_at_start = None
    with contextlib.suppress(OSError):
        load_at_start = [round(x, 2) for x in os.getloadavg()]
    learned = new_learned()
    results = []
    for p in scale_outs:
        rates = load_rates(p, per_slot, fractions)
        console.print(f"p={p}: learning at {', '.join(f'{r:g}' for r in rates)} rec/s for {level_seconds:g} s each, "
                      f"then draining {drain_seconds:g} s of work")
        learned, result = run_scale_out(
            learned, p, cost_ms=cost_ms, rates=rates, level_s=level_seconds, warmup_s=warmup_seconds,
            drain_s=drain_seconds, window_s=window_seconds, partitions=partitions,
            backlog_tolerance_s=backlog_tolerance, max_utilization=max_utilization,
        )
        e = result.errors()
        console.print(f"  measured max {result.measured_max:,.1f} rec/s ({result.drain.get('reports', 0)} reports, "
                      f"utilization {result.drain.get('utilization', 0):.2f}); regression "
                      f"{fmt(result.regression, '{:,.1f}')} ({fmt(e['regression_pct'], '{:+.1f} %')}), DS2 "
                      f"{fmt(result.ds2, '{:,.1f}')} ({fmt(e['ds2_pct'], '{:+.1f} %')}); {result.samples} samples; "
                      f"{result.seconds:.0f} s, load average {result.load_average}")
        results.append(result)
    observed = dict(learned.capacity.observed)
    unseen = {r.parallelism: leave_one_out(observed, r.parallelism) for r in results} if len(observed) > 1 else {}
    render(results, unseen, cost_ms)
    within = [r.parallelism for r in results
              if (err := r.errors()["regression_pct"]) is not None and abs(err) <= ACCEPTANCE_PCT]
    console.print(f"regression estimate within {ACCEPTANCE_PCT:g} % of the measured max at "
                  f"{len(within)} of {len(results)} scale-outs ({', '.join(map(str, within)) or 'none'})")

    out = {
        "benchmark": "capacity_model",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - wall, 1),
        "code": code_version(("bench/capacity_model.py", "bench/spark_capacity.py", "analyze/capacity.py",
                              "analyze/proactive.py", "analyze/true_rates.py", "monitor/windows.py",
                              "pipeline/metrics.py", "pipeline/demo.py")),
        "machine": machine_info() | {"load_average_at_start": load_at_start},
        "parameters": {
            "parallelism": scale_outs, "cost_ms": cost_ms, "load_fractions": fractions,
            "expected_per_slot": per_slot, "level_seconds": level_seconds, "warmup_seconds": warmup_seconds,
            "drain_seconds": drain_seconds, "window_seconds": window_seconds, "report_interval_s": 5.0,
            "trigger_interval_s": 1.0, "backlog_tolerance_s": backlog_tolerance, "max_utilization": max_utilization,
            "partitions": partitions, "acceptance_pct": ACCEPTANCE_PCT,
        },
        "model": learned.capacity.to_dict(),
        "scale_outs": [asdict(r) | {"errors": r.errors()} for r in results],
        "unseen": {str(p): v for p, v in unseen.items()},
        "within_acceptance": within,
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(rounded(out), indent=2) + "\n")
    console.print(f"results written to {json_out} ({out['duration_s']:.0f} s)")


if __name__ == "__main__":
    app()
