"""What the evaluation prints and writes: the table per trace, the markdown of docs/results.md, plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from evaluation.gap import HORIZON_S, UNDONE_WITHIN_S


def _ratio(median: float, worst: float) -> str:
    return f"{median:.2f} ({worst:.2f})"


def _cheapest(summary: dict[str, Any]) -> str:
    return min(summary["rows"], key=lambda r: r["vs_oracle_median"])["policy"]


def bound_note(summary: dict[str, Any]) -> str:
    """The noise-aware bound's cost against the oracle, when the run computed it."""
    ratio = summary.get("noise_bound_vs_oracle_median")
    return "" if ratio is None else f"; noise-aware bound {ratio:.2f}x the oracle"


def _has_bound(summary: dict[str, Any]) -> bool:
    return summary.get("noise_bound_vs_oracle_median") is not None


def columns(summary: dict[str, Any]) -> tuple[str, ...]:
    """The columns of a trace's table (the bound's where the run computed it), in every form it is shown."""
    return ("policy", "cost / oracle", *(("cost / bound",) if _has_bound(summary) else ()), "cost / static",
            "beyond target s", "actions", "peak backlog")


def cells(summary: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """A policy's row of `columns`, after its name: the median (worst) over the seeds."""
    bound = [_ratio(row["vs_noise_bound_median"], row["vs_noise_bound_worst"])] if _has_bound(summary) else []
    return [_ratio(row["vs_oracle_median"], row["vs_oracle_worst"]), *bound, f"{row['vs_static_median']:.2f}",
            f"{row['beyond_target_s_median']:.0f} ({row['beyond_target_s_worst']:.0f})",
            f"{row['actions_median']:g} ({row['actions_worst']})", f"{row['peak_backlog_worst']:,.0f}"]


def print_table(console: Console, summaries: list[dict[str, Any]]) -> None:
    """Per trace and regime: each policy's cost against the oracle (and the noise-aware bound) and static,
    time beyond the backlog target and actions, as the median (worst) over the seeds."""
    for summary in summaries:
        table = Table(title=f"{summary['trace']} ({summary['regime']}): {summary['description']}; "
                      f"{len(summary['seeds'])} seeds; start {summary['start_parallelism']} slots, static "
                      f"{summary['static_parallelism']}; oracle {100 * summary['oracle_vs_static_median']:.0f} % of "
                      f"static, {summary['oracle_actions_median']:g} actions{bound_note(summary)}",
                      title_justify="left")
        for column in columns(summary):
            table.add_column(column, justify="right" if column != "policy" else "left")
        cheapest = _cheapest(summary)
        for row in summary["rows"]:
            table.add_row(row["policy"] + (" *" if row["policy"] == cheapest else ""), *cells(summary, row))
        console.print(table)
    console.print("median (worst) over the seeds; * the cheapest policy by median cost; bound: the noise-aware "
                  "bound (evaluation.noise_bound)")


GAP_COLUMNS = {"gap": "gap", "undone": "undone", "measuring": "measuring", "oracle_dip": "dips",
               "early_scale_up": "early up", "late_scale_down": "late down", "margin": "margin", "below": "below",
               "timing": "timing"}
GAP_NOTE = ("the policy's slot-seconds above the oracle's (gap) and its parts (`evaluation.gap`) in % of the oracle's "
            "cost, median over the seeds (so the parts need not sum to the median gap); dips, early up, late down: "
            f"the oracle at the policy's level within {HORIZON_S:g} s ahead and behind, ahead, behind; rescales "
            f"undone: levels left again the other way within {UNDONE_WITHIN_S:g} s; counts: the policy's (the "
            "oracle's), median")


def _percent(share: float) -> str:
    return f"{100 * share:+.1f}" if abs(share) >= 5e-4 else "0"


def gap_cells(row: dict[str, Any]) -> list[str]:
    """One trace and regime of `evaluation.gap.summarize_gaps`: the cells after its name, as every table shows
    them (the parts in %, then the rescales undone and the actions, the policy's and the oracle's)."""
    return [*(_percent(row["shares"][key]) for key in GAP_COLUMNS),
            f"{row['undone_rescales']:g} ({row['oracle_undone_rescales']:g})",
            f"{row['actions']:g} ({row['oracle_actions']:g})"]


def gap_headers() -> list[str]:
    return ["trace (regime)", *GAP_COLUMNS.values(), "rescales undone", "actions"]


def print_gap_table(console: Console, gaps: list[dict[str, Any]]) -> None:
    """`autoscaler evaluate --explain-gap`: per trace and regime, where one policy's cost above the oracle's
    comes from."""
    if not gaps:
        return
    table = Table(title=f"Where {gaps[0]['policy']}'s cost above the oracle's comes from (% of the oracle's cost)",
                  title_justify="left")
    for i, column in enumerate(gap_headers()):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in gaps:
        table.add_row(f"{row['trace']} ({row['regime']})", *gap_cells(row))
    console.print(table)
    console.print(GAP_NOTE)


def gap_markdown(gaps: list[dict[str, Any]]) -> list[str]:
    """The `--explain-gap` table as markdown lines (none without rows)."""
    if not gaps:
        return []
    headers = gap_headers()
    return [f"**Where {gaps[0]['policy']}'s cost above the oracle's comes from**: {GAP_NOTE}", "",
            "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *(f"| {row['trace']} ({row['regime']}) | " + " | ".join(gap_cells(row)) + " |" for row in gaps), ""]


def markdown(summaries: list[dict[str, Any]], convergence: list[dict[str, Any]],
             gaps: list[dict[str, Any]] | None = None) -> str:
    """The tables of docs/results.md, as the command printed them (with `gaps`, the `--explain-gap` table
    after the policies')."""
    lines: list[str] = []
    for summary in summaries:
        header = [c.replace("beyond target s", "beyond target (s)") for c in columns(summary)]
        lines += [f"**{summary['trace']}, {summary['regime']}**: {summary['description']}; "
                  f"{len(summary['seeds'])} seeds; start {summary['start_parallelism']} slots, static "
                  f"{summary['static_parallelism']}; oracle {100 * summary['oracle_vs_static_median']:.0f} % of "
                  f"static with {summary['oracle_actions_median']:g} actions (median)"
                  + (", every run proven optimal" if summary["oracle_all_certified"] else "") + bound_note(summary), "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        cheapest = _cheapest(summary)
        for row in summary["rows"]:
            name = f"**{row['policy']}**" if row["policy"] == cheapest else row["policy"]
            lines.append("| " + " | ".join([name, *cells(summary, row)]) + " |")
        lines.append("")
    lines += gap_markdown(gaps or [])
    if convergence:
        lines += ["| pipeline | start | from | optimal | steps (parallelism after each) | reached |",
                  "|---|---|---|---|---|---|"]
        for row in convergence:
            path = " -> ".join(str(tuple(p)) for p in row["path"]) or "(holds)"
            lines.append(f"| {row['pipeline']} | {row['start']} | {tuple(row['from'])} | {tuple(row['optimal'])} | "
                         f"{row['steps']}: {path} | {'yes' if row['reached'] else 'no'} |")
    return "\n".join(lines) + "\n"


def save_figure(fig: Any, path: Path, dpi: int = 80) -> Path:
    """Lay out, write `path` as a PNG (creating its folder) and free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def draw_timeline(ax: Any, t: Any, arrival: Any, capacity: Any, backlog: Any, parallelism: Any) -> Any:
    """Arrival rate, capacity and backlog / 60 on `ax`, the parallelism on a right axis (returned)."""
    ax.plot(t, arrival, color="black", lw=0.8, label="arrival rate")
    ax.plot(t, capacity, color="tab:blue", lw=0.8, label="capacity")
    ax.fill_between(t, 0, np.asarray(backlog, dtype=float) / 60, color="tab:red", alpha=0.3,
                    label="backlog / 60 (records)")
    ax.set_ylabel("records/s")
    right = ax.twinx()
    right.step(t, parallelism, where="post", color="tab:orange", lw=1.0, label="parallelism")
    right.set_ylabel("slots")
    right.set_ylim(bottom=0)
    return right


def plot_live(t: Any, arrival: Any, capacity: Any, backlog: Any, parallelism: Any, title: str, path: Path) -> Path:
    """One live run's timeline (seconds since its start) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.6))
    right = draw_timeline(ax, t, arrival, capacity, backlog, parallelism)
    ax.set_xlabel("seconds since the load started")
    handles = [*ax.get_legend_handles_labels()[0], *right.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, loc="upper left", fontsize=7, ncol=4)
    ax.set_title(title, loc="left", fontsize=9)
    return save_figure(fig, path)


def plot(result: dict[str, Any], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timelines = {k: v for k, v in result["timelines"].items() if k != "oracle"}
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.2 * len(timelines)), sharex=True, squeeze=False)
    oracle = result["timelines"]["oracle"]
    for ax, (name, tl) in zip(axes[:, 0], timelines.items(), strict=True):
        right = draw_timeline(ax, np.asarray(tl["t"]) / 3600, tl["arrival"], tl["capacity"], tl["backlog"],
                              tl["parallelism"])
        right.step(np.asarray(oracle["t"]) / 3600, oracle["parallelism"], where="post", color="tab:green", lw=0.6,
                   alpha=0.7, label="oracle parallelism")
        ax.set_title(name, loc="left", fontsize=9)
    handles = [*axes[0, 0].get_legend_handles_labels()[0], *axes[0, 0].figure.axes[-1].get_legend_handles_labels()[0]]
    axes[0, 0].legend(handles=handles, loc="upper right", fontsize=7, ncol=5)
    axes[-1, 0].set_xlabel("hours of replay")
    fig.suptitle(f"{result['trace']} ({result['regime']}, seed {result['seed']}): {result['description']}",
                 fontsize=9)
    return save_figure(fig, out_dir / f"{Path(result['trace']).stem}-{result['regime']}.png", dpi=72)


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


def print_held_out(console: Console, title: str, rows: list[dict[str, Any]], size: str = "slots") -> None:
    """Capacities predicted from the smallest configurations against what was measured at the others
    (`capacity.explore.from_smallest`, `evaluation.calibrate.unseen_capacities`): one table."""
    if not rows:
        return
    table = Table(title=title, title_justify="left")
    for column in (size, "predicted (rec/s)", "measured (rec/s)", "error"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row[size]), f"{row['predicted']:,.0f}", f"{row['measured']:,.0f}",
                      f"{100 * row['error']:+.1f} %")
    console.print(table)
