"""Diurnal benchmark: our autoscaling policy against a utilization-threshold autoscaler, simulated.

Run `python -m bench.diurnal --help`. Pure simulation (evaluation/ticks.py): a Spark-like job replays
a real diurnal trace (English Wikipedia page views), time-compressed, under each policy with the
same noise; an oracle gives the lower bound on core-seconds. See bench/README.md.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from bench.ingest import machine_info
from contracts.jobs import JobConfig, parse_assignments
from evaluation.baselines import OurPolicy, ThresholdPolicy
from evaluation.ticks import (
    Policy,
    RunResult,
    SimConfig,
    Workload,
    interpolate_rows,
    make_workload,
    oracle,
    simulate,
    slots_needed,
)

HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "wiki_en_5min.csv"
RESULTS = HERE / "results" / "diurnal.json"
ROW_MINUTES = 5  # the trace's resolution
ROWS_PER_DAY = 24 * 60 // ROW_MINUTES
TIMELINE_STEP_S = 60.0  # the JSON timeline keeps one sample per simulated minute
# Metrics averaged over seeds in the table (and the JSON's "mean").
AVERAGED = ("scale_ups", "scale_downs", "core_seconds", "core_seconds_vs_oracle_pct", "downtime_s", "max_backlog_s",
          "lag_slo_violation_s", "mean_utilization", "ignored_decisions")

# A table of eight columns needs more than the 80 columns rich assumes when output is piped.
console = Console(width=None if sys.stdout.isatty() else 140)
app = typer.Typer(add_completion=False, help=__doc__)


def load_trace(path: Path) -> tuple[list[str], np.ndarray]:
    """(timestamps, messages per second) of a `date,messages` CSV."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise typer.BadParameter(f"{path} has no rows")
    return [r["date"] for r in rows], np.array([float(r["messages"]) for r in rows])


def code_version() -> dict[str, Any]:
    """Which planner produced the numbers: the commit, which of the files involved differ from it,
    and their hashes (the planner changes often; results must say which one they measured)."""
    root = HERE.parent
    files = ["plan/agent.py", "plan/ds2.py", "plan/controls.py", "contracts/jobs.py", "analyze/true_rates.py",
             "monitor/windows.py", "evaluation/ticks.py", "evaluation/baselines.py"]
    info: dict[str, Any] = {"sha256": {f: hashlib.sha256((root / f).read_bytes()).hexdigest()[:16]
                                       for f in files if (root / f).exists()}}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        run: dict[str, Any] = {"cwd": root, "capture_output": True, "text": True, "timeout": 10}
        info["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], **run).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--", *files], **run).stdout
        info["uncommitted"] = [line[3:] for line in status.splitlines()]
    return info


def timeline(result: RunResult, workload: Workload) -> dict[str, list[float]]:
    step = max(1, round(TIMELINE_STEP_S / workload.dt))
    idx = np.arange(0, workload.ticks, step)
    return {
        "t_s": [round(float(i * workload.dt), 1) for i in idx],
        "arrival_rate": [round(float(x), 1) for x in workload.arrival_rates[idx]],
        "parallelism": [int(x) for x in result.parallelism[idx]],
        "backlog": [round(float(x)) for x in result.backlog[idx]],
    }


def run_json(
    result: RunResult, workload: Workload, policy: Policy | None, oracle_core_s: float, with_timeline: bool
) -> dict[str, Any]:
    out: dict[str, Any] = result.metrics.as_dict()
    out["core_seconds_vs_oracle_pct"] = round(100 * result.metrics.core_seconds / oracle_core_s, 2)
    out["parallelism_min_max"] = [int(result.parallelism.min()), int(result.parallelism.max())]
    out["rescales"] = [[r.at_s, r.from_parallelism, r.to_parallelism] for r in result.rescales]
    if policy is not None:
        out["reasons"] = dict(sorted(getattr(policy, "reasons", {}).items()))
    if with_timeline:
        out["timeline"] = timeline(result, workload)
    return out


def mean_of(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: round(float(np.mean([r[k] for r in runs])), 4) for k in AVERAGED}


def table_row(name: str, m: dict[str, float], seeds: int) -> list[str]:
    count = "{:.0f}" if seeds == 1 else "{:.1f}"
    return [
        name,
        f"{count.format(m['scale_ups'])} / {count.format(m['scale_downs'])}",
        f"{m['core_seconds']:,.0f}",
        f"{m['core_seconds_vs_oracle_pct']:.1f} %",
        f"{m['downtime_s']:,.0f}",
        f"{m['max_backlog_s']:.1f}",
        f"{m['lag_slo_violation_s']:,.0f}",
        f"{100 * m['mean_utilization']:.1f} %",
    ]


@app.command()
def main(
    trace: Annotated[Path, typer.Option(help="`date,messages` CSV at 5-minute resolution")] = TRACE,
    days: Annotated[float, typer.Option(help="days of the trace to replay, from its start")] = 7.0,
    row_seconds: Annotated[float, typer.Option(help="simulated seconds per 5-minute trace row")] = 60.0,
    peak_slots: Annotated[int, typer.Option(help="slots the trace's peak needs at the target utilization")] = 16,
    per_slot_rate: Annotated[float, typer.Option(help="records/s one slot processes at 100 % busy")] = 230.0,
    rate_noise: Annotated[float, typer.Option(help="sigma of the per-tick log-normal per-slot rate noise")] = 0.1,
    restart_downtime: Annotated[float, typer.Option(help="seconds without processing per rescale")] = 20.0,
    window: Annotated[float, typer.Option(help="analysis window (loop interval), s")] = 10.0,
    lag_slo: Annotated[float, typer.Option(help="SLO: backlog at most this many seconds of arrivals")] = 10.0,
    target_utilization: Annotated[float, typer.Option(help="our policy's target; also sizes --peak-slots")] = 0.7,
    min_parallelism: Annotated[int, typer.Option()] = 1,
    max_parallelism: Annotated[int, typer.Option()] = 32,
    catch_up: Annotated[float, typer.Option(help="our policy's catch_up_duration_s")] = 300.0,
    initial_parallelism: Annotated[
        int | None, typer.Option(help="default: the slots the first tick needs at the target utilization")
    ] = None,
    config: Annotated[
        list[str] | None, typer.Option("--set", help="more JobConfig fields of our policy, key=value (repeatable)")
    ] = None,
    seed: Annotated[int, typer.Option(help="noise seed (the same for every policy)")] = 0,
    seeds: Annotated[int, typer.Option(help="run seeds seed .. seed+N-1 and report the mean")] = 1,
    output: Annotated[Path, typer.Option(help="where to write the JSON results")] = RESULTS,
) -> None:
    """Compare our policy with a utilization-threshold autoscaler on a time-compressed diurnal trace."""
    started = dt.datetime.now(dt.UTC)
    wall = time.perf_counter()
    load_at_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    if seeds < 1:
        raise typer.BadParameter("--seeds must be >= 1")
    stamps, raw = load_trace(trace)
    rows = round(days * ROWS_PER_DAY)
    if not 2 <= rows <= len(raw):
        raise typer.BadParameter(f"--days {days} needs {rows} rows; the trace has {len(raw)}")
    raw, stamps = raw[:rows], stamps[:rows]
    # Keep the shape, size the rate to the job: the peak needs `peak_slots` at the target utilization.
    scale = peak_slots * target_utilization * per_slot_rate / float(raw.max())
    rates = interpolate_rows(raw * scale, row_seconds)
    duration_s = len(rates) * 1.0
    p0 = initial_parallelism or min(max(slots_needed(float(rates[0]), per_slot_rate, target_utilization),
                                        min_parallelism), max_parallelism)
    sim = SimConfig(initial_parallelism=p0, restart_downtime_s=restart_downtime, window_s=window, lag_slo_s=lag_slo)
    job_config = JobConfig.model_validate({
        "target_utilization": target_utilization, "min_parallelism": min_parallelism,
        "max_parallelism": max_parallelism, "catch_up_duration_s": catch_up, **parse_assignments(config or []),
    })
    compression = (
        f"1 trace row ({ROW_MINUTES} min) = {row_seconds:g} s simulated ({ROW_MINUTES * 60 / row_seconds:g}x faster); "
        f"{days:g} days ({rows} rows, {stamps[0]} to {stamps[-1]}) = {duration_s:,.0f} s "
        f"({duration_s / 3600:.1f} h); rates x {scale:.5f} so the peak ({raw.max():,.0f}/s raw -> "
        f"{raw.max() * scale:,.0f} rec/s) needs {peak_slots} slots at {target_utilization:.0%} of "
        f"{per_slot_rate:g} rec/s per slot"
    )
    seed_text = f"seed {seed}" if seeds == 1 else f"seeds {seed}..{seed + seeds - 1} (mean)"
    console.print(f"[bold]diurnal[/bold]: {trace.name}; {compression}")
    console.print(f"  job: restart {restart_downtime:g} s, per-slot noise sigma {rate_noise:g}, {seed_text}, "
                  f"window {window:g} s, start at {p0} slots, lag SLO {lag_slo:g} s of arrivals")

    at_target = f"oracle at {target_utilization:.0%}"
    factories: dict[str, Callable[[], Policy]] = {
        "ours": lambda: OurPolicy(job_config),
        "threshold": lambda: ThresholdPolicy(min_parallelism=min_parallelism, max_parallelism=max_parallelism),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in [*factories, "oracle", at_target]}
    for s in range(seed, seed + seeds):
        workload = make_workload(rates, per_slot_rate, rate_noise, s)
        bound = oracle(workload)
        oracle_core_s = bound.metrics.core_seconds
        first = s == seed  # one timeline (the first seed's) keeps the JSON small
        for name, factory in factories.items():
            policy = factory()
            t = time.perf_counter()
            result = simulate(workload, policy, sim)
            runs[name].append({"seed": s, "runtime_s": round(time.perf_counter() - t, 3)}
                              | run_json(result, workload, policy, oracle_core_s, first))
        runs["oracle"].append({"seed": s} | run_json(bound, workload, None, oracle_core_s, first))
        # The same oracle held to the target utilization: what the headroom alone costs, with no policy error.
        runs[at_target].append({"seed": s} | run_json(oracle(workload, target_utilization), workload, None,
                                                      oracle_core_s, first))
    means = {name: mean_of(per_seed) for name, per_seed in runs.items()}

    table = Table(title=f"diurnal autoscaling, {days:g} days of {trace.name}, {duration_s:,.0f} s simulated, "
                        f"{seed_text}")
    for column in ("policy", "actions up/down", "core-seconds", "vs oracle", "downtime s", "max backlog s",
                   f"s over lag SLO ({lag_slo:g} s)", "mean utilization"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, m in means.items():
        table.add_row(*table_row(name, m, seeds))
    console.print(table)
    for name in factories:
        if means[name]["ignored_decisions"]:
            console.print(f"[red]{name} asked for a rescale while one was in progress (ignored)[/red]")
        reasons: dict[str, int] = {}
        for run in runs[name]:
            for code, n in run.get("reasons", {}).items():
                reasons[code] = reasons.get(code, 0) + n
        top = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))
        console.print(f"  {name} window verdicts: {top}")
    console.print("  oracle: the fewest slots that keep up at 100 % each second, free and instant rescales "
                  f"(a lower bound; no backlog, no actions); {at_target}: the same at the target utilization")

    out: dict[str, Any] = {
        "benchmark": "diurnal",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - wall, 2),
        "code": code_version(),
        "machine": machine_info() | {"load_average_at_start": load_at_start and [round(x, 2) for x in load_at_start]},
        "parameters": {
            "per_slot_rate": per_slot_rate, "rate_noise": rate_noise, "restart_downtime_s": restart_downtime,
            "window_s": window, "dt_s": 1.0, "lag_slo_s": lag_slo, "seeds": list(range(seed, seed + seeds)),
            "initial_parallelism": p0, "peak_slots": peak_slots,
            "our_config": job_config.model_dump(mode="json"),
            "threshold": {k: getattr(factories["threshold"](), k) for k in
                          ("high", "low", "target", "stabilization_s", "min_parallelism", "max_parallelism")},
        },
        "trace": {
            "file": str(trace.relative_to(HERE.parent) if trace.is_relative_to(HERE.parent) else trace),
            "sha256": hashlib.sha256(trace.read_bytes()).hexdigest(),
            "rows": rows, "days": days, "first": stamps[0], "last": stamps[-1],
            "raw_messages_per_s": {"min": round(float(raw.min()), 1), "mean": round(float(raw.mean()), 1),
                                   "max": round(float(raw.max()), 1)},
        },
        "compression": {
            "row_minutes": ROW_MINUTES, "row_seconds": row_seconds, "speedup": ROW_MINUTES * 60 / row_seconds,
            "simulated_s": duration_s, "rate_scale": scale,
            "simulated_rate_rec_per_s": {"min": round(float(rates.min()), 1), "mean": round(float(rates.mean()), 1),
                                         "max": round(float(rates.max()), 1)},
            "description": compression,
        },
        "policies": {name: {"mean": means[name], "runs": runs[name]} for name in runs},
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"results written to {output} ({out['duration_s']:.1f} s)")


if __name__ == "__main__":
    app()
