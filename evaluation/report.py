"""What the evaluation prints and writes: the table per trace, the markdown of docs/results.md, plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from plan.registry import policy_class


def print_table(console: Console, results: list[dict[str, Any]]) -> None:
    for result in results:
        table = Table(title=f"{result['trace']}: {result['description']}; peak {result['peak_rate']:.0f} rec/s, "
                      f"static {result['static_parallelism']} slots, oracle "
                      f"{result['oracle']['vs_static_pct']:.0f} % of static", title_justify="left")
        wape = (result["forecast"] or {}).get("mean_wape")
        for column in ("policy", "slot-s vs static", "vs oracle", "beyond target", "lag p95", "lag max",
                       "actions", "capacity err", "forecast WAPE"):
            table.add_column(column, justify="right" if column != "policy" else "left")
        for row in result["runs"]:
            table.add_row(
                row["policy"], f"{row['vs_static_pct']:.0f} %", f"{row['vs_oracle_pct']:.0f} %",
                f"{row['beyond_target_s'] / 60:.1f} min", f"{row['lag_p95_s']:.0f} s", f"{row['lag_max_s']:.0f} s",
                str(row["actions"]),
                "-" if row["capacity_error_pct"] is None else f"{row['capacity_error_pct']:.1f} %",
                f"{100 * wape:.1f} %" if wape is not None and policy_class(row["policy"]).needs_forecast else "-",
            )
        console.print(table)


def markdown(results: list[dict[str, Any]], convergence: list[dict[str, Any]]) -> str:
    """The tables of docs/results.md, as the command printed them."""
    lines: list[str] = []
    for result in results:
        oracle = result["oracle"]
        wape = (result["forecast"] or {}).get("mean_wape")
        lines += [f"**{result['trace']}**: {result['description']}; peak {result['peak_rate']:.0f} rec/s, mean "
                  f"{result['mean_rate']:.0f}; static {result['static_parallelism']} slots; oracle "
                  f"{oracle['vs_static_pct']:.0f} % of static with {oracle['rescales']} rescales"
                  + (" (proven optimal)" if oracle.get("certified_optimal") else "")
                  + ("" if wape is None else f"; forecast WAPE {100 * wape:.1f} %"), "",
                  "| policy | slot-s vs static | vs oracle | beyond target | lag p95 | lag max | actions | "
                  "capacity error |", "|---|---|---|---|---|---|---|---|"]
        for row in result["runs"]:
            error = "-" if row["capacity_error_pct"] is None else f"{row['capacity_error_pct']:.1f} %"
            lines.append(f"| {row['policy']} | {row['vs_static_pct']:.0f} % | {row['vs_oracle_pct']:.0f} % | "
                         f"{row['beyond_target_s'] / 60:.1f} min | {row['lag_p95_s']:.0f} s | "
                         f"{row['lag_max_s']:.0f} s | {row['actions']} | {error} |")
        lines.append("")
    if convergence:
        lines += ["| pipeline | start | from | optimal | steps (parallelism after each) | reached |",
                  "|---|---|---|---|---|---|"]
        for row in convergence:
            path = " -> ".join(str(tuple(p)) for p in row["path"]) or "(holds)"
            lines.append(f"| {row['pipeline']} | {row['start']} | {tuple(row['from'])} | {tuple(row['optimal'])} | "
                         f"{row['steps']}: {path} | {'yes' if row['reached'] else 'no'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timelines = {k: v for k, v in result["timelines"].items() if k != "oracle"}
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.2 * len(timelines)), sharex=True, squeeze=False)
    oracle = result["timelines"]["oracle"]
    for ax, (name, tl) in zip(axes[:, 0], timelines.items(), strict=True):
        hours = np.asarray(tl["t"]) / 3600
        ax.plot(hours, tl["arrival"], color="black", lw=0.8, label="arrival rate")
        ax.plot(hours, tl["capacity"], color="tab:blue", lw=0.8, label="capacity")
        ax.fill_between(hours, 0, np.asarray(tl["backlog"]) / 60, color="tab:red", alpha=0.3,
                        label="backlog / 60 (records)")
        ax.set_ylabel("records/s")
        right = ax.twinx()
        right.step(hours, tl["parallelism"], where="post", color="tab:orange", lw=1.0, label="parallelism")
        right.step(np.asarray(oracle["t"]) / 3600, oracle["parallelism"], where="post", color="tab:green", lw=0.6,
                   alpha=0.7, label="oracle parallelism")
        right.set_ylabel("slots")
        ax.set_title(name, loc="left", fontsize=9)
    handles = [*axes[0, 0].get_legend_handles_labels()[0], *axes[0, 0].figure.axes[-1].get_legend_handles_labels()[0]]
    axes[0, 0].legend(handles=handles, loc="upper right", fontsize=7, ncol=5)
    axes[-1, 0].set_xlabel("hours of replay")
    fig.suptitle(f"{result['trace']}: {result['description']}", fontsize=9)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['trace']}.png"
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def print_convergence(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="DS2 convergence on a 3-operator pipeline at a steady 3,000 rec/s (evaluation.convergence)",
                  title_justify="left")
    for column in ("pipeline", "start", "from", "optimal", "steps", "path", "reached"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["pipeline"], row["start"], str(tuple(row["from"])), str(tuple(row["optimal"])),
                      str(row["steps"]), " -> ".join(str(tuple(p)) for p in row["path"]) or "(holds)",
                      "yes" if row["reached"] else "no")
    console.print(table)
