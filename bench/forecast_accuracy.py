"""Forecast accuracy: arrival-rate forecasts 15 minutes ahead on real and published traces.

Run `python -m bench.forecast_accuracy --help`. Pure computation (analyze/forecast.py; no broker,
Redis or Spark). Rolling origin: auto_arima is fitted on an initial window, then the series is
replayed one point per loop through the forecasting state machine, and at regular origins each
method's forecast of the next 15 minutes is scored by WAPE. See bench/README.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from analyze.arima import (
    ForecastConfig,
    arima_forecast,
    fit_model,
    last_value_forecast,
    linear_trend_forecast,
    load_model,
    update_model,
    wape,
)
from analyze.forecast import ForecastState, install_model, step
from bench.common import code_version, machine_info
from evaluation.traces import NATIVE_ROW_SECONDS, recorded_trace

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "forecast_accuracy.json"
METHODS = ("auto_arima", "linear_trend", "last_value", "ours")
TRACE_NAMES = ("sine", "cos", "avazu", "iot", "wiki", "taylor")

console = Console(width=None if sys.stdout.isatty() else 150)
app = typer.Typer(add_completion=False, help=__doc__)


@dataclass
class Series:
    name: str
    source: str  # a file, or the pmdarima dataset
    sha256: str | None
    values: np.ndarray  # one point per loop step
    row_s: float  # the trace's resolution
    rows_per_point: int  # trace rows averaged into one point (1-s traces); 1 = a row is a point
    compression: str


def load_series(name: str, step_s: float) -> Series:
    """The built-in trace `name` (`evaluation.traces`) as one point per `step_s` of replay."""
    values, source, digest = recorded_trace(name)
    native_s = NATIVE_ROW_SECONDS[name]
    if native_s >= step_s:  # a row is a point: time-compressed
        return Series(name, source, digest, values, native_s, 1,
                      f"1 row of {native_s:g} s = 1 step = {step_s:g} s ({native_s / step_s:g}x compressed)")
    block = max(1, round(step_s / native_s))  # rows averaged into a point: real time
    usable = values.size - values.size % block
    return Series(name, source, digest, values[:usable].reshape(-1, block).mean(axis=1), native_s, block,
                  f"{native_s:g}-s rows averaged over {block * native_s:g}-s blocks: 1 step = "
                  f"{block * native_s:g} s of the trace (real time)")


def horizon_text(series: Series, config: ForecastConfig) -> str:
    covered_s = config.horizon_steps * series.row_s * series.rows_per_point
    return (f"{config.horizon_s / 60:g} min = {config.horizon_steps} steps = "
            f"{covered_s / 3600:g} h of the trace" if covered_s >= 3600 else
            f"{config.horizon_s / 60:g} min = {config.horizon_steps} steps = {covered_s / 60:g} min of the trace")


def evaluate(
    series: Series, config: ForecastConfig, origins: int, loop_points: int, origin_every: int, fit_points: int
) -> dict[str, Any]:
    """Replay `series`, `loop_points` points per loop, from the end of the initial window; every
    `origin_every` loops is an origin where each method's forecast is scored."""
    y = series.values
    h = config.horizon_steps
    every = loop_points * origin_every  # points between origins
    span = (origins - 1) * every + h
    window = min(fit_points, y.size - span)
    if window < config.min_fit_points + loop_points:
        raise typer.BadParameter(f"{series.name} has {y.size} points: too few for {origins} origins")
    s = config.step_s
    started = time.perf_counter()
    # The initial fit sees y[:window - loop_points]; the first loop adds the next loop_points points
    # and forecasts from `window` on, the first origin. Ours and auto_arima share the model (and its
    # every-loop updates) until ours refits; then auto_arima keeps its own, updated at the origins.
    first = window - loop_points
    t = time.perf_counter()
    model: bytes | None = fit_model(y[:first], config)
    fits = [round(time.perf_counter() - t, 2)]
    order = str(load_model(model).order)
    state = ForecastState(history=y[:first].tolist(), last_time=(first - 1) * s)
    baseline: bytes | None = None
    baseline_from = 0  # the baseline model has seen y[:baseline_from]
    scores: dict[str, list[float]] = {m: [] for m in METHODS}
    wins = {"vs_last_value": 0, "vs_linear_trend": 0}
    ours_methods: list[str] = []
    loop_methods: dict[str, int] = {}
    step_times: list[float] = []
    retrains: list[dict[str, Any]] = []
    loops = (origins - 1) * origin_every + 1
    for k in range(loops):
        o = window + k * loop_points  # this loop's points end here; its forecast starts here
        t = time.perf_counter()
        state, decision = step(state, y[o - loop_points:o], (o - 1) * s, config, model)
        step_times.append(time.perf_counter() - t)
        loop_methods[decision.method] = loop_methods.get(decision.method, 0) + 1
        shared = baseline is None
        model = decision.model
        if decision.retrain is not None:
            # A process pool would fit meanwhile; here the fit runs at once and is swapped in before
            # the next loop (a fit takes seconds, a loop is minutes of metric time).
            if shared:
                baseline, baseline_from = model, o
            t = time.perf_counter()
            try:
                fitted: bytes | None = fit_model(decision.retrain.history, config)
            except ValueError:
                fitted = None
            fits.append(round(time.perf_counter() - t, 2))
            state, model = install_model(state, fitted, decision.retrain.request_id, config, current=model)
            retrains.append({"origin": o, "reason": decision.retrain.reason,
                             "order": str(load_model(model).order) if model is not None else None})
        if k % origin_every:
            continue
        actual = y[o:o + h]
        history = y[:o]
        if shared and state.arima_forecast is not None:
            arima = np.asarray(state.arima_forecast.values)
        else:
            if baseline is None:  # ours dropped its model (an error): auto_arima continues from it
                baseline, baseline_from = model, o
            if baseline_from < o:
                baseline = update_model(baseline, y[baseline_from:o], max_points=config.history_points)
                baseline_from = o
            arima = arima_forecast(baseline, h)
        forecasts = {
            "auto_arima": arima,
            "linear_trend": linear_trend_forecast(history, h, config.trend_points),
            "last_value": last_value_forecast(history, h),
            "ours": np.asarray(state.forecast.values),
        }
        origin_scores = {method: wape(actual, values) for method, values in forecasts.items()}
        for method, score in origin_scores.items():
            scores[method].append(score)
        wins["vs_last_value"] += origin_scores["auto_arima"] < origin_scores["last_value"]
        wins["vs_linear_trend"] += origin_scores["auto_arima"] < origin_scores["linear_trend"]
        ours_methods.append(state.forecast.method)
    origin_list = [window + k * every for k in range(origins)]
    worst = np.argsort(scores["auto_arima"])[::-1][:3]
    return {
        "points": int(y.size),
        "fit_points": first,
        "origins": origins,
        "loop_points": loop_points,
        "origin_every_loops": origin_every,
        "first_origin": origin_list[0],
        "last_origin": origin_list[-1],
        "loops": loops,
        "compression": series.compression,
        "horizon": horizon_text(series, config),
        "initial_order": order,
        "mean_wape": {m: round(float(np.mean(v)), 4) for m, v in scores.items()},
        "median_wape": {m: round(float(np.median(v)), 4) for m, v in scores.items()},
        "auto_arima_better_at_origins": wins,
        "auto_arima_worst_origins": [{"origin": origin_list[i], **{m: round(scores[m][i], 4) for m in METHODS}}
                                     for i in worst],
        "ours_method_at_origins": {m: ours_methods.count(m) for m in sorted(set(ours_methods))},
        "ours_method_per_loop": loop_methods,
        "retrains": retrains,
        "fit_s": fits,
        "step_ms_mean": round(1000 * float(np.mean(step_times)), 1),
        "runtime_s": round(time.perf_counter() - started, 2),
        "origins_list": origin_list,
        "wape_per_origin": {m: [round(x, 4) for x in v] for m, v in scores.items()},
        "series": {"min": round(float(y.min()), 1), "mean": round(float(y.mean()), 1), "max": round(float(y.max()), 1)},
    }


def packages() -> dict[str, str]:
    out = {}
    for name in ("pmdarima", "statsmodels", "scipy", "scikit-learn", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


@app.command()
def main(
    only: Annotated[list[str] | None, typer.Option(help=f"evaluate only these ({', '.join(TRACE_NAMES)})")] = None,
    step_seconds: Annotated[float, typer.Option(help="replay seconds per point (the loop)")] = 60.0,
    horizon_seconds: Annotated[float, typer.Option(help="forecast horizon, replay seconds")] = 900.0,
    origins: Annotated[int, typer.Option(help="forecast origins per trace")] = 40,
    loop_points: Annotated[int, typer.Option(help="points per loop (1: the state machine steps every point)")] = 5,
    origin_every: Annotated[int, typer.Option(help="loops between origins")] = 1,
    fit_points: Annotated[int, typer.Option(help="initial fit window (shrunk when a trace is short)")] = 720,
    wape_threshold: Annotated[float, typer.Option()] = 0.25,
    poor_loops: Annotated[int, typer.Option(help="poor_loops_before_retrain")] = 15,
    trend_window_seconds: Annotated[float, typer.Option(help="the linear trend's window")] = 300.0,
    threads: Annotated[int, typer.Option(help="BLAS/OpenMP threads")] = 1,
    output: Annotated[Path, typer.Option(help="where to write the JSON results")] = RESULTS,
) -> None:
    """Mean WAPE of 15-minute forecasts: auto_arima, the linear trend, the last value and ours."""
    started = dt.datetime.now(dt.UTC)
    wall = time.perf_counter()
    load_at_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    names = list(only) if only else list(TRACE_NAMES)
    unknown = sorted(set(names) - set(TRACE_NAMES))
    if unknown:
        raise typer.BadParameter(f"unknown traces {unknown}; known: {', '.join(TRACE_NAMES)}")
    config = ForecastConfig(
        step_s=step_seconds, horizon_s=horizon_seconds, wape_threshold=wape_threshold,
        poor_loops_before_retrain=poor_loops, trend_window_s=trend_window_seconds, history_points=fit_points,
    )
    loop_s = loop_points * step_seconds
    methodology = (
        f"rolling origin: auto_arima (stepwise, non-seasonal, p,q <= {config.max_p}, d <= {config.max_d}) fitted on "
        f"the first points of each series (up to {fit_points}), then the series is replayed through "
        f"analyze.forecast.step, {loop_points} point(s) of {step_seconds:g} s per loop (a {loop_s:g}-s loop; the "
        f"model updated every loop, windowed to {fit_points} points); every {origin_every} loop(s) ({origins} "
        f"origins) each method forecasts the next {horizon_seconds:g} s ({config.horizon_steps} points), scored by "
        f"WAPE = sum|a-p|/sum|a|; the table shows the mean over origins. auto_arima: the model, never refitted; "
        f"linear_trend: least squares over the last {config.trend_points} points; last_value: the last point; ours: "
        f"the state machine's published forecast (ARIMA unless its previous loop's WAPE over the points that "
        f"arrived > {wape_threshold:g}, then the linear trend; a refit after {poor_loops} poor loops, swapped in "
        f"before the next loop)"
    )
    console.print(f"[bold]forecast accuracy[/bold]: {methodology}")
    results: dict[str, Any] = {}
    import pmdarima  # noqa: F401  (loads scipy's and statsmodels' BLAS first: the thread limit covers loaded ones)

    with threadpool_limits(limits=threads):
        for name in names:
            series = load_series(name, step_seconds)
            result = evaluate(series, config, origins, loop_points, origin_every, fit_points)
            results[name] = {"source": series.source, "sha256": series.sha256, **result}
            m = result["mean_wape"]
            console.print(f"  {name}: {series.compression}; horizon {result['horizon']}; fit on "
                          f"{result['fit_points']} points, {result['initial_order']}; origins "
                          f"{result['first_origin']}..{result['last_origin']}; {result['runtime_s']:.1f} s; "
                          f"WAPE arima {m['auto_arima']:.3f}, ours {m['ours']:.3f}")

    table = Table(title=f"mean WAPE of {horizon_seconds / 60:g}-minute forecasts ({origins} origins per trace; "
                        "lower is better)")
    for column in ("trace", "points", *METHODS, "ARIMA better than last value", "ours: fallback loops", "refits",
                   "ARIMA order", "step ms"):
        table.add_column(column, justify="left" if column == "trace" else "right")
    for name, r in results.items():
        m = r["mean_wape"]
        best = min(m.values())
        cells = [f"[bold]{100 * m[k]:.2f} %[/bold]" if m[k] == best else f"{100 * m[k]:.2f} %" for k in METHODS]
        fallback = r["ours_method_per_loop"].get("linear_trend", 0)
        better = r["auto_arima_better_at_origins"]["vs_last_value"]
        table.add_row(name, str(r["points"]), *cells, f"{better} / {r['origins']}", f"{fallback} / {r['loops']}",
                      str(len(r["retrains"])), r["initial_order"], f"{r['step_ms_mean']:.0f}")
    console.print(table)
    for name, r in results.items():
        m = r["mean_wape"]
        simple = min(("linear_trend", "last_value"), key=lambda k: m[k])
        worse = r["origins"] - r["auto_arima_better_at_origins"]["vs_last_value"]
        verdict = "loses on the mean" if m["auto_arima"] > m[simple] else "wins on the mean"
        console.print(f"  {name}: auto_arima {verdict} ({100 * m['auto_arima']:.2f} % vs {simple} "
                      f"{100 * m[simple]:.2f} %); worse than the last value at {worse} of {r['origins']} origins")

    out: dict[str, Any] = {
        "benchmark": "forecast_accuracy",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - wall, 2),
        "code": code_version(("analyze/arima.py", "analyze/forecast.py", "bench/forecast_accuracy.py")),
        "machine": machine_info() | {"load_average_at_start": load_at_start and [round(x, 2) for x in load_at_start],
                                     "forecast_packages": packages(), "threads": threads},
        "parameters": {
            "step_s": step_seconds, "horizon_s": horizon_seconds, "origins": origins,
            "loop_points": loop_points, "origin_every_loops": origin_every, "fit_points": fit_points,
            "forecast_config": config.model_dump(mode="json"),
        },
        "methodology": methodology,
        "traces": results,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"results written to {output} ({out['duration_s']:.1f} s)")


if __name__ == "__main__":
    app()
