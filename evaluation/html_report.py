"""`autoscaler evaluate --html`: one self-contained page with the policy tables and a chart per trace.

The tables carry the figures `evaluation.report.print_table` prints. The charts draw, for the first
seed of each trace and regime, the series `evaluation.report.plot` draws from the same results
(`evaluation.suite.evaluate_case`'s `timelines`): the arrival rate, each policy's parallelism and the
oracle's. uPlot (vendored, `infra.web`) and the data are inlined, so the page loads nothing from the
network. After drawing, the page sets `window.report` (what each chart holds) for browser tests.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

from evaluation.report import GAP_NOTE, _cheapest, bound_note, cells, columns, gap_cells, gap_headers
from evaluation.suite import EvalSettings
from infra.web import UPLOT_VERSION, uplot_css, uplot_js

ARRIVAL = "arrival rate"
ORACLE = "oracle"


def _finite(value: Any) -> float | None:
    """A number for JSON: NaN and infinities (which JSON cannot hold) become null."""
    value = float(value)
    return value if math.isfinite(value) else None


def chart_data(case: dict[str, Any]) -> dict[str, Any]:
    """One case's timelines on one time axis (hours of replay): the arrival rate, each policy's
    parallelism and the oracle's. The policies' timelines keep every third window and the oracle's
    every window, so the axis is the union of their times; a series is null where it has no point."""
    timelines = case["timelines"]
    policies = [name for name in timelines if name != ORACLE]
    grid = sorted({round(float(t), 3) for timeline in timelines.values() for t in timeline["t"]})
    index = {t: i for i, t in enumerate(grid)}

    def aligned(timeline: dict[str, list[float]], values: list[float]) -> list[float | None]:
        out: list[float | None] = [None] * len(grid)
        for t, value in zip(timeline["t"], values, strict=True):
            out[index[round(float(t), 3)]] = _finite(value)
        return out

    first = timelines[policies[0]]
    series = {ARRIVAL: aligned(first, first["arrival"])}
    series |= {name: aligned(timelines[name], timelines[name]["parallelism"]) for name in policies}
    if ORACLE in timelines:
        series[ORACLE] = aligned(timelines[ORACLE], timelines[ORACLE]["parallelism"])
    return {"trace": case["trace"], "regime": case["regime"], "seed": case["seed"],
            "description": case["description"], "hours": [round(t / 3600, 5) for t in grid], "series": series}


def first_seeds(cases: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per trace and regime (in the order of the cases), the case of its first (lowest) seed."""
    firsts: dict[tuple[str, str], dict[str, Any]] = {}
    for case in cases:
        key = (case["trace"], case["regime"])
        if key not in firsts or case["seed"] < firsts[key]["seed"]:
            firsts[key] = case
    return firsts


def embed_json(data: Any) -> str:
    """JSON safe inside a <script> element: `<`, `>` and `&` as \\u escapes, so no `</script>` (or any
    `</`) and no `<!--` can end or change the element."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table(summary: dict[str, Any]) -> str:
    """One trace and regime: the caption and rows `print_table` prints, as an HTML table."""
    e = html.escape
    caption = (f"{summary['description']}; {len(summary['seeds'])} seeds; start {summary['start_parallelism']} "
               f"slots, static {summary['static_parallelism']}; oracle "
               f"{100 * summary['oracle_vs_static_median']:.0f} % of static, "
               f"{summary['oracle_actions_median']:g} actions{bound_note(summary)}")
    cheapest = _cheapest(summary)
    rows = []
    for row in summary["rows"]:
        name = e(row["policy"]) + (" *" if row["policy"] == cheapest else "")
        attrs = ' class="cheapest"' if row["policy"] == cheapest else ""
        rows.append(f'<tr{attrs} data-policy="{e(row["policy"])}"><td>{name}</td>'
                    + "".join(f"<td>{e(cell)}</td>" for cell in cells(summary, row)) + "</tr>")
    head = "".join(f"<th>{e(column)}</th>" for column in columns(summary))
    return (f'<table class="policies" data-trace="{e(summary["trace"])}" data-regime="{e(summary["regime"])}">'
            f"<caption>{e(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _gap_section(gaps: list[dict[str, Any]]) -> str:
    """The `--explain-gap` table (`evaluation.report.print_gap_table`'s rows); empty without rows."""
    if not gaps:
        return ""
    e = html.escape
    head = "".join(f"<th>{e(column)}</th>" for column in gap_headers())
    rows = "".join(f'<tr data-trace="{e(row["trace"])}" data-regime="{e(row["regime"])}">'
                   + "".join(f"<td>{e(cell)}</td>" for cell in [f"{row['trace']} ({row['regime']})", *gap_cells(row)])
                   + "</tr>" for row in gaps)
    return (f'<section><h2>Where {e(gaps[0]["policy"])}\'s cost above the oracle\'s comes from</h2>'
            f'<table class="policies gap"><caption>{e(GAP_NOTE)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></section>")


def _header(cases: list[dict[str, Any]], summaries: list[dict[str, Any]], settings: EvalSettings) -> str:
    """What was run, from the run's settings."""
    regimes: dict[str, list[str]] = {}
    for case in cases:
        if case["regime"] not in regimes.setdefault(case["trace"], []):
            regimes[case["trace"]].append(case["regime"])
    traces = [f"{trace} ({', '.join(names)})" for trace, names in regimes.items()]
    policies = [row["policy"] for row in summaries[0]["rows"]] if summaries else []
    last_seed = settings.first_seed + settings.seeds - 1
    seeds = f"{settings.seeds} ({settings.first_seed}" + (f"-{last_seed})" if settings.seeds > 1 else ")")
    noise = f"{settings.noise:g} (log-sd of the processing rate per window" + (
        ", the job model's)" if settings.rate_noise is None else ")")
    items = [
        ("traces (regimes)", ", ".join(traces)), ("policies", ", ".join(policies)),
        ("seeds", seeds), ("hours per trace", f"{settings.hours:g}"),
        ("load", f"scaled to a {settings.scaling} of {settings.peak:,g} rec/s"), ("noise", noise),
        ("backlog target", f"{settings.backlog_target_s:g} s of arrivals"),
        ("backend", f"{settings.backend.value} (every policy and the oracle)"),
        ("max parallelism", str(settings.max_parallelism)),
        ("job model", settings.job_model or "built-in demo"),
    ]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f'<table class="settings">{rows}</table>'


def report_page(cases: list[dict[str, Any]], summaries: list[dict[str, Any]], settings: EvalSettings,
                gaps: list[dict[str, Any]] | None = None) -> str:
    """The page: `cases` as `evaluation.suite.evaluate_all` returns them, `summaries` as `summarize`
    makes them from those cases, `settings` the run's, `gaps` as `evaluation.gap.summarize_gaps` makes
    them (`--explain-gap`: a table after the policies' sections). Returns the HTML text."""
    firsts = first_seeds(cases)
    charts = [chart_data(case) for case in firsts.values()]
    positions = {(chart["trace"], chart["regime"]): i for i, chart in enumerate(charts)}
    sections = []
    for summary in summaries:
        key = (summary["trace"], summary["regime"])
        title = html.escape(f"{summary['trace']} ({summary['regime']})")
        chart = ""
        if key in positions:
            i = positions[key]
            chart = (f'<p class="note">Seed {charts[i]["seed"]} (the first): the arrival rate (left axis) and '
                     f'each policy\'s and the oracle\'s parallelism (right axis) over the replay.</p>'
                     f'<div class="chart" id="chart-{i}"></div>')
        sections.append(f'<section><h2>{title}</h2>{_table(summary)}{chart}</section>')
    data = {"charts": charts, "policies": [row["policy"] for row in summaries[0]["rows"]] if summaries else []}
    parts = {"uplot_css": uplot_css(), "uplot_version": UPLOT_VERSION, "header": _header(cases, summaries, settings),
             "sections": "".join(sections) + _gap_section(gaps or []), "data": embed_json(data), "uplot_js": uplot_js()}
    # One pass: text put in is never searched for placeholders.
    return re.sub(r"\{\{(\w+)\}\}", lambda match: parts[match.group(1)], PAGE)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Evaluation report</title>
<style>{{uplot_css}}</style>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 0.2em 0.7em; border-bottom: 1px solid #ddd; }
table.policies td { text-align: right; } table.policies td:first-child { text-align: left; }
table.policies caption { text-align: left; padding-bottom: 0.3em; color: #444; }
table.settings th { text-align: left; font-weight: 600; }
tr.cheapest td { font-weight: 600; }
.note { color: #555; margin: 0.8em 0 0.3em; }
.chart { width: 100%; }
</style>
</head>
<body>
<h1>Evaluation report (<code>autoscaler evaluate</code>)</h1>
{{header}}
<p class="note">Tables: median (worst) over the seeds; cost is slot-seconds, against the clairvoyant oracle's
and static provisioning's; * the cheapest policy by median cost. Charts drawn with uPlot {{uplot_version}}.</p>
{{sections}}
<script type="application/json" id="data">{{data}}</script>
<script>{{uplot_js}}</script>
<script>
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("data").textContent);
  const palette = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
                   "#d62728", "#aec7e8"];
  const HEIGHT = 320;
  const stepped = uPlot.paths.stepped({align: 1});
  const lastValue = (values) => {
    for (let i = values.length - 1; i >= 0; i--) { if (values[i] !== null) return values[i]; }
    return null;
  };
  const drawn = [];
  data.charts.forEach((chart, i) => {
    const element = document.getElementById("chart-" + i);
    if (!element) return;
    const names = Object.keys(chart.series);
    let k = 0;
    const series = [{label: "hours"}].concat(names.map((name) => {
      if (name === "arrival rate") {
        return {label: name, scale: "rate", stroke: "#000", width: 1, spanGaps: true};
      }
      if (name === "oracle") {
        return {label: name, scale: "slots", stroke: "#2ca02c", width: 2, dash: [6, 3], spanGaps: true,
                paths: stepped};
      }
      return {label: name, scale: "slots", stroke: palette[k++ % palette.length], width: 1.5, spanGaps: true,
              paths: stepped};
    }));
    const options = {
      title: chart.trace + " (" + chart.regime + "), seed " + chart.seed,
      width: element.clientWidth || 1200, height: HEIGHT,
      scales: {
        x: {time: false},
        rate: {range: (u, min, max) => [0, Math.max(1, max) * 1.05]},
        slots: {range: (u, min, max) => [0, Math.max(1, max) + 1]},
      },
      axes: [
        {label: "hours of replay"},
        {scale: "rate", label: "records/s"},
        {scale: "slots", side: 1, label: "parallelism (slots)", grid: {show: false},
         values: (u, ticks) => ticks.map((v) => (Number.isInteger(v) ? v : ""))},
      ],
      series: series,
    };
    const plot = new uPlot(options, [chart.hours].concat(names.map((name) => chart.series[name])), element);
    drawn.push({chart: chart, plot: plot, element: element});
  });
  window.addEventListener("resize", () => {
    drawn.forEach((d) => d.plot.setSize({width: d.element.clientWidth, height: HEIGHT}));
  });
  window.report = {
    policies: data.policies,
    charts: drawn.map((d) => {
      const names = Object.keys(d.chart.series);
      const series = {};
      const last = {};
      names.forEach((name, j) => {
        series[name] = d.plot.data[j + 1].length;
        last[name] = lastValue(d.plot.data[j + 1]);
      });
      return {trace: d.chart.trace, regime: d.chart.regime, seed: d.chart.seed, points: d.plot.data[0].length,
              series: series, last: last};
    }),
  };
})();
</script>
</body>
</html>
"""
