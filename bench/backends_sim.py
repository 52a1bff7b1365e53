"""`python -m bench.backends_sim`: the evaluation's traces with the job rescaled by restarts and in place.

Runs the evaluation suite (`evaluation.suite`, what `autoscaler evaluate` runs) twice on the same
traces, regimes and noise seeds: once with every rescale a restart from the checkpoint (the demo job
model's measured downtimes, and the replay), once with its executors changed in place (the model's
measured ramp and hold, nothing replayed). Policies and the oracle get the same backend in a run, so
each run's oracle is the cheapest schedule under that backend. Per trace and regime, for each chosen
policy: its median slot-seconds in place over by restart, and its cost against each run's oracle
(median, worst seed), and the time beyond the target (worst seed). Prints a table and writes JSON.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from bench.common import code_version, machine_info
from contracts.backends import BackendKind
from evaluation.suite import EvalSettings, calibration, evaluate_all
from evaluation.traces import SHARED_TRACES

RESULTS = Path(__file__).resolve().parent / "results" / "backends_sim.json"
app = typer.Typer(add_completion=False, help=__doc__)


def compare(restart: list[dict[str, Any]], in_place: list[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """Per (trace, regime): the policy's figures under both backends, over the seeds both ran."""
    def rows(cases: list[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]]:
        out: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        for case in cases:
            run = next(r for r in case["runs"] if r["policy"] == policy)
            out.setdefault((case["trace"], case["regime"]), []).append((run, case["oracle"]))
        return out

    by_restart, by_in_place = rows(restart), rows(in_place)
    table = []
    for key, restarted in by_restart.items():
        changed = by_in_place[key]
        ratios = [b[0]["slot_seconds"] / a[0]["slot_seconds"] for a, b in zip(restarted, changed, strict=True)]
        table.append({
            "trace": key[0], "regime": key[1], "policy": policy, "seeds": len(ratios),
            "in_place_over_restart_median": round(float(np.median(ratios)), 4),
            "in_place_over_restart_worst": round(max(ratios), 4),
            "restart_vs_oracle_median": round(float(np.median([r["vs_oracle"] for r, _ in restarted])), 4),
            "restart_vs_oracle_worst": max(r["vs_oracle"] for r, _ in restarted),
            "in_place_vs_oracle_median": round(float(np.median([r["vs_oracle"] for r, _ in changed])), 4),
            "in_place_vs_oracle_worst": max(r["vs_oracle"] for r, _ in changed),
            "oracle_in_place_over_restart_median": round(float(np.median(
                [b[1]["slot_seconds"] / a[1]["slot_seconds"] for a, b in zip(restarted, changed, strict=True)])), 4),
            "restart_beyond_target_s_worst": max(r["seconds_beyond_target"] for r, _ in restarted),
            "in_place_beyond_target_s_worst": max(r["seconds_beyond_target"] for r, _ in changed),
            "restart_actions_median": float(np.median([r["actions"] for r, _ in restarted])),
            "in_place_actions_median": float(np.median([r["actions"] for r, _ in changed])),
        })
    return table


@app.command()
def main(
    policy: Annotated[list[str] | None, typer.Option(help="Policies to compare; default the default policy.")] = None,
    trace: Annotated[list[str] | None, typer.Option(help="Traces; default the five real ones, step-up and drop.")]
        = None,
    seeds: Annotated[int, typer.Option(min=1)] = 5,
    hours: Annotated[float, typer.Option()] = 6.0,
    workers: Annotated[int, typer.Option(min=1)] = 2,
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS,
) -> None:
    """Both backends on the same cases; print the comparison and write JSON."""
    console = Console(width=160)
    policies = policy or ["default"]
    traces = trace or [*SHARED_TRACES, "step-up", "drop"]
    base = EvalSettings(hours=hours, seeds=seeds)
    started = time.perf_counter()
    cases = {kind: evaluate_all(traces, policies, dataclasses.replace(base, backend=kind), workers)
             for kind in (BackendKind.RESTART, BackendKind.IN_PLACE)}
    wall = time.perf_counter() - started
    rows = [row for name in policies
            for row in compare(cases[BackendKind.RESTART], cases[BackendKind.IN_PLACE], name)]
    table = Table(title=f"restart vs in place: {seeds} seeds, {hours:g} h per trace, the demo job model "
                        "(medians; worst seed in brackets)")
    for column in ("trace", "regime", "policy", "in place / restart", "restart / its oracle",
                   "in place / its oracle", "oracle: in place / restart", "beyond target s (worst) r | ip",
                   "actions r | ip"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["trace"], r["regime"], r["policy"],
                      f"{r['in_place_over_restart_median']:.3f} ({r['in_place_over_restart_worst']:.3f})",
                      f"{r['restart_vs_oracle_median']:.3f} ({r['restart_vs_oracle_worst']:.3f})",
                      f"{r['in_place_vs_oracle_median']:.3f} ({r['in_place_vs_oracle_worst']:.3f})",
                      f"{r['oracle_in_place_over_restart_median']:.3f}",
                      f"{r['restart_beyond_target_s_worst']:.0f} | {r['in_place_beyond_target_s_worst']:.0f}",
                      f"{r['restart_actions_median']:.0f} | {r['in_place_actions_median']:.0f}")
    console.print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"policies": policies, "traces": traces, "seeds": seeds, "hours": hours,
                               "wall_s": round(wall, 1), "calibration": calibration(base), "rows": rows,
                               "machine": machine_info(), "code": code_version()}, indent=1))
    console.print(f"both backends, {len(policies)} policies x {len(cases[BackendKind.RESTART])} cases each, in "
                  f"{wall:.0f} s on {workers} workers; wrote {out}")


if __name__ == "__main__":
    app()
