"""`python -m bench.capacity_live`: the live capacity plan on this machine, repeated.

Each run is what a user runs, in a process of its own (a fresh JVM, a broker of its own):
`autoscaler capacity plan --live --rate R --max-slots 4` on the demo Spark job (records with an I/O-like
cost, `--cost-ms`, so that more slots help on 2 cores). Per run: the MST measured at each slot count and
the steps it took, what the two smallest configurations predict for the larger ones (a power law through
them) against what was then measured there, the recommendation, and the whole plan's wall time. Across
runs: each slot count's spread ((max - min) / median). Prints tables and writes JSON.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from bench.common import RESULTS, table, write_result

CODE = ("capacity/mst.py", "capacity/explore.py", "capacity/scaling.py", "capacity/live_testbed.py",
        "capacity/cli.py", "pipeline/demo.py")
app = typer.Typer(add_completion=False, help=__doc__)


def one_run(rate: float, max_slots: int, cost_ms: float, directory: Path) -> dict[str, Any]:
    out = directory / "capacity.json"
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "agent", "capacity", "plan", "--live", "--rate", str(rate),
                           "--max-slots", str(max_slots), "--cost-ms", str(cost_ms), "--out", str(out)],
                          capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - began
    if done.returncode not in (0, 2) or not out.exists():
        raise RuntimeError(f"the plan failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    report = json.loads(out.read_text())
    return {"wall_s": round(wall, 1), "plan_s": report["seconds"], "answer": report["answer"],
            "model": report["model"], "stopped": report["stopped"],
            "mst": {str(m["slots"]): m["mst"] for m in report["measurements"] if m["stable"]},
            "steps": {str(m["slots"]): m["steps"] for m in report["measurements"]},
            "unstable": [m["slots"] for m in report["measurements"] if not m["stable"]],
            "trace": {str(m["slots"]): [[round(t["injected"], 1), round(t["processed"], 1), t["backlog_growth"],
                                         t["sustained"]] for t in m["trace"]] for m in report["measurements"]},
            "from_smallest": report["from_smallest"]}


@app.command()
def main(
    runs: Annotated[int, typer.Option(help="Plans, one after the other.")] = 3,
    rate: Annotated[float, typer.Option(help="The rate each plan is asked for (rec/s).")] = 2000.0,
    max_slots: Annotated[int, typer.Option(help="The testbed's largest configuration.")] = 4,
    cost_ms: Annotated[float, typer.Option(help="The demo job's per-record cost.")] = 4.0,
    output: Annotated[Path, typer.Option(help="The JSON to write.")] = RESULTS / "capacity_live.json",
) -> None:
    console = Console()
    rows = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            row = one_run(rate, max_slots, cost_ms, Path(tmp))
        rows.append(row)
        console.print(f"run {i + 1}: {row['wall_s']:.0f} s; MST {row['mst']}; steps {row['steps']}")
    out = table(f"live capacity plan, demo job at {cost_ms:g} ms per record, {runs} runs", "run", "wall s",
                *(f"MST at {n}" for n in range(1, max_slots + 1)), "steps",
                *(f"at {r['slots']} from 1-2" for r in rows[0]["from_smallest"]), "answer")
    for i, row in enumerate(rows, 1):
        out.add_row(str(i), f"{row['wall_s']:.0f}",
                      *(f"{row['mst'].get(str(n), 0):,.0f}" for n in range(1, max_slots + 1)),
                      str(sum(row["steps"].values())),
                      *(f"{100 * r['error']:+.1f} %" for r in row["from_smallest"]),
                      f"{row['answer']['slots']} ({row['model']['name']})")
    console.print(out)
    spread = {}
    for n in range(1, max_slots + 1):
        values = [row["mst"][str(n)] for row in rows if str(n) in row["mst"]]
        if len(values) >= 2:
            spread[str(n)] = round((max(values) - min(values)) / statistics.median(values), 4)
    errors = [abs(r["error"]) for row in rows for r in row["from_smallest"]]
    summary = {"mst_spread": spread, "worst_from_smallest_error": max(errors, default=None),
               "wall_s_median": statistics.median(row["wall_s"] for row in rows),
               "wall_s_worst": max(row["wall_s"] for row in rows)}
    console.print("spread of the MST across runs, (max - min) / median: "
                  + ", ".join(f"{n} slots {100 * s:.1f} %" for n, s in spread.items())
                  + f"; worst error from 1-2 slots {100 * (summary['worst_from_smallest_error'] or 0):.1f} %; "
                  f"wall time median {summary['wall_s_median']:.0f} s, worst {summary['wall_s_worst']:.0f} s")
    write_result(output, {"runs": rows, "summary": summary, "rate": rate, "cost_ms": cost_ms, "max_slots": max_slots},
                 CODE, console)

if __name__ == "__main__":
    app()
