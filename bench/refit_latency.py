"""Refit latency: does a forecast refit hold up another job's decision?

Run `python -m bench.refit_latency --help`. It starts its own redis-server on a free port, fits an
ARIMA model per job up front, then replays arrival rates from real traces through
`analyze.forecast_pool.Forecasting.step` the way the analyze agent does (one window per job per loop,
processed one after another as a Faust agent processes its stream), first with no refit under way
and then with refits continuously under way, and compares how long each job's window waits for its
forecast step. See bench/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_info

import analyze.forecast_pool as forecasting_module
from analyze.arima import ForecastConfig, load_model
from analyze.forecast import ForecastState
from analyze.forecast_pool import Forecasting
from analyze.learning import forecast_config
from bench.common import code_version, machine_info, process_cpu_seconds, summary
from bench.forecast_accuracy import packages
from bench.refit_jobs import Job, Probe, Window, first_models, make_jobs, stop_pool
from contracts.settings import Settings
from knowledge import Knowledge, RedisKnowledge
from stack.processes import Service, start_redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "refit_latency.json"
FLOOR_MS = 100.0  # the most a refit may add to another job's decision
TICK_S = 0.010
# Other jobs never ask for a refit of their own; refit jobs ask for one after every scored loop.
NO_REFIT_LOOPS = 10_000
ALWAYS_POOR_WAPE = 1e-9
POOL_SETTLE_S = 5.0  # the refit pool's process imports for a few seconds after it starts

console = Console(width=None if sys.stdout.isatty() else 160)
app = typer.Typer(add_completion=False, help=__doc__)


# ---------------------------------------------------------------- the replay


@dataclass
class Replay:
    knowledge: Knowledge
    forecasting: Forecasting
    probe: Probe
    jobs: list[Job]
    step_s: float
    interval_s: float
    quiet: ForecastConfig  # every job in phase a, the other jobs in phase b
    refitting: ForecastConfig  # the refit jobs in phase b
    windows: list[Window] = field(default_factory=list)
    lags: dict[str, list[float]] = field(default_factory=dict)
    phase: str = "setup"
    refit_requests: list[dict[str, Any]] = field(default_factory=list)
    loop_counter: int = 0
    pool_started_at: float | None = None

    async def ticker(self) -> None:
        """Event-loop lag: how late a 10-ms sleep wakes up."""
        while True:
            before = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.lags.setdefault(self.phase, []).append(1000 * max(0.0, time.perf_counter() - before - TICK_S))

    def config(self, job: Job) -> ForecastConfig:
        return self.refitting if self.phase == "b" and job.refits else self.quiet

    async def process(self, job: Job, k: int, loop: int, position: int, arrived: float) -> None:
        started = time.perf_counter()
        had_pool = self.forecasting._pool is not None
        decision = await self.forecasting.step(job.id, job.point(k), job.time(k, self.step_s), self.config(job))
        done = time.perf_counter()
        if not had_pool and self.forecasting._pool is not None:
            # The refit requested by the previous window started the pool's process during this step.
            self.pool_started_at = started
        if decision.retrain is not None:
            request = {"job": job.id, "phase": self.phase, "requested_at": done, "reason": decision.retrain.reason}
            self.refit_requests.append(request)
            task = self.forecasting.refits.get(job.id)
            if task is not None:
                task.add_done_callback(lambda t, r=request: r.update(done_at=time.perf_counter(),
                                                                      cancelled=t.cancelled()))
        wall, cpu = self.probe.last_compute
        self.windows.append(Window(
            phase=self.phase, loop=loop, position=position, job=job.id, refit_job=job.refits,
            latency_ms=1000 * (done - arrived), service_ms=1000 * (done - started), compute_ms=1000 * wall,
            compute_cpu_ms=1000 * cpu, install_overlap=self.probe.install_seen, method=decision.method,
            refit_requested=decision.retrain is not None,
            since_pool_s=None if self.pool_started_at is None else started - self.pool_started_at,
        ))

    async def run_phase(self, phase: str, loops: int) -> float:
        """`loops` loops; every `interval_s` all jobs' windows arrive together (interval 0: the next
        loop arrives when the previous one is done). One consumer handles them in order."""
        self.phase = phase
        queue: asyncio.Queue[tuple[Job, int, int, int, float] | None] = asyncio.Queue()

        async def consumer() -> None:
            while (item := await queue.get()) is not None:
                await self.process(*item)
                queue.task_done()
            queue.task_done()

        worker = asyncio.create_task(consumer())
        started = time.perf_counter()
        for loop in range(loops):
            if self.interval_s > 0:
                await asyncio.sleep(max(0.0, started + loop * self.interval_s - time.perf_counter()))
            else:
                await queue.join()
            arrived = time.perf_counter()
            k = self.loop_counter
            self.loop_counter += 1
            for position, job in enumerate(self.jobs):
                queue.put_nowait((job, k, loop, position, arrived))
        queue.put_nowait(None)
        await worker
        return time.perf_counter() - started


async def seed(knowledge: Knowledge, jobs: list[Job], models: dict[str, bytes], step_s: float) -> None:
    for job in jobs:
        state = ForecastState(history=job.history().tolist(), last_time=job.time(-1, step_s))
        await knowledge.save_forecast(job.id, state.model_dump_json(), models[job.id])


# ---------------------------------------------------------------- statistics and output


def summarize(windows: list[Window], phase: str, measure: str, refit_job: bool | None) -> dict[str, float]:
    return summary([getattr(w, measure) for w in windows
                  if w.phase == phase and (refit_job is None or w.refit_job == refit_job)])


def position_delay(windows: list[Window]) -> dict[str, float]:
    """Per processing position (other jobs only): mean latency over loops, phase b minus phase a."""
    out: dict[str, Any] = {}
    by: dict[tuple[str, int], list[float]] = {}
    for w in windows:
        if not w.refit_job:
            by.setdefault((w.phase, w.position), []).append(w.latency_ms)
    diffs = {p: float(np.mean(by[("b", p)]) - np.mean(by[("a", p)])) for _, p in by if ("a", p) in by
             and ("b", p) in by}
    if diffs:
        worst = max(diffs, key=lambda p: diffs[p])
        out = {"largest_ms": diffs[worst], "at_position": worst, "last_position_ms": diffs[max(diffs)],
               "per_position_ms": {str(p): round(d, 1) for p, d in sorted(diffs.items())}}
    return out


def per_loop(windows: list[Window], phase: str) -> list[dict[str, float]]:
    loops = sorted({w.loop for w in windows if w.phase == phase})
    rows = []
    for loop in loops:
        other = [w for w in windows if w.phase == phase and w.loop == loop and not w.refit_job]
        mine = [w for w in windows if w.phase == phase and w.loop == loop]
        rows.append({"loop": loop, "last_done_ms": round(max(w.latency_ms for w in mine), 1),
                     "other_latency_max_ms": round(max((w.latency_ms for w in other), default=math.nan), 1),
                     "other_service_max_ms": round(max((w.service_ms for w in other), default=math.nan), 1),
                     "service_sum_ms": round(sum(w.service_ms for w in mine), 1)})
    return rows


def fmt(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.0f}"


def signed(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+,.0f}"


@contextlib.contextmanager
def redis_server(log_dir: Path) -> Iterator[Service]:
    service = start_redis(log_path=log_dir / "redis.log")
    try:
        yield service
    finally:
        service.stop()


@contextlib.contextmanager
def probed(probe: Probe) -> Iterator[None]:
    step, install = forecasting_module.step, forecasting_module.install_model
    forecasting_module.step = probe.wrap_step(step)  # type: ignore[assignment]
    forecasting_module.install_model = probe.wrap_install(install)  # type: ignore[assignment]
    try:
        yield
    finally:
        forecasting_module.step, forecasting_module.install_model = step, install  # type: ignore[assignment]


def pool_pids(forecasting: Forecasting) -> list[int]:
    pool = forecasting._pool
    return list(pool._processes or {}) if pool is not None else []


async def measure(args: dict[str, Any], jobs: list[Job], models: dict[str, bytes], redis: Service) -> dict[str, Any]:
    settings = Settings(redis_url=f"redis://127.0.0.1:{redis.port}/0")
    knowledge = RedisKnowledge(settings, prefix="refitbench")
    forecasting = Forecasting(knowledge, refit_workers=args["refit_workers"])
    probe = Probe()
    quiet = forecast_config(args["step_s"], args["horizon_s"], args["wape_threshold"], NO_REFIT_LOOPS, 60)
    refitting = forecast_config(args["step_s"], args["horizon_s"], ALWAYS_POOR_WAPE, 1, 60)
    replay = Replay(knowledge, forecasting, probe, jobs, args["step_s"], args["interval_s"], quiet, refitting)
    await seed(knowledge, jobs, models, args["step_s"])
    ticker = asyncio.create_task(replay.ticker())
    cpu: dict[str, dict[str, float]] = {}
    durations: dict[str, float] = {}
    try:
        with probed(probe):
            durations["warmup"] = await replay.run_phase("warmup", args["warmup_loops"])
            for phase, loops in (("a", args["loops"]), ("b", args["loops"])):
                before = {"main": time.process_time(), "redis": process_cpu_seconds(redis.pid)}
                durations[phase] = await replay.run_phase(phase, loops)
                pids = pool_pids(forecasting)
                cpu[phase] = {"main_s": round(time.process_time() - before["main"], 2),
                              "redis_s": round(process_cpu_seconds(redis.pid) - before["redis"], 2),
                              "refit_pool_s_since_start": round(sum(process_cpu_seconds(p) for p in pids), 2)}
            blas = [{k: i.get(k) for k in ("internal_api", "num_threads", "filepath")} for i in threadpool_info()]
            outstanding = len(forecasting.refits)
            refit_tasks = list(forecasting.refits.values())
            for task in refit_tasks:
                task.cancel()
            await asyncio.gather(*refit_tasks, return_exceptions=True)
    finally:
        ticker.cancel()
        pool = forecasting._pool
        forecasting.close()
        if pool is not None:
            stop_pool(pool)
        await knowledge.close()
    phase_b_start = min((r["requested_at"] for r in replay.refit_requests if r["phase"] == "b"), default=math.inf)
    return {"windows": replay.windows, "lags": replay.lags, "refit_requests": replay.refit_requests,
            "installs": [i for i in probe.installs if i["at"] >= phase_b_start], "cpu": cpu,
            "durations": durations, "outstanding_at_end": outstanding,
            "blas": blas}


@app.command()
def main(
    jobs: Annotated[int, typer.Option(help="jobs with a forecast")] = 50,
    refit_jobs: Annotated[int, typer.Option(help="of them, jobs that refit continuously in phase b")] = 10,
    rounds: Annotated[int, typer.Option(help="loops per phase (every job gets one window per loop)")] = 12,
    warmup_loops: Annotated[int, typer.Option(help="loops before phase a, not measured")] = 1,
    interval_s: Annotated[float, typer.Option(
        help="wall seconds from one loop's windows to the next's, the agent's loop interval (0: the next loop's "
             "windows arrive when a loop is done)")] = 10.0,
    refit_workers: Annotated[int, typer.Option(help="processes of the refit pool (Forecasting's default: 1)")] = 1,
    step_s: Annotated[float, typer.Option(help="window length, metric seconds (one trace point per window)")] = 10.0,
    horizon_s: Annotated[float, typer.Option(help="forecast horizon, metric seconds")] = 900.0,
    wape_threshold: Annotated[float, typer.Option(help="the other jobs' threshold")] = 0.25,
    fit_points: Annotated[int, typer.Option(help="points each job's first model is fitted on")] = 720,
    fits: Annotated[int, typer.Option(help="distinct auto_arima fits the jobs' first models come from")] = 10,
    fit_workers: Annotated[int, typer.Option(help="processes fitting the first models (before measuring)")] = 0,
    output: Annotated[Path, typer.Option(help="where to write the JSON results")] = RESULTS,
) -> None:
    """Per-window forecast step latency of 50 jobs without and with refits under way."""
    started = dt.datetime.now(dt.UTC)
    wall = time.perf_counter()
    load_at_start = os.getloadavg()
    # Stopped with SIGTERM, still stop redis-server and the refit processes (the finally blocks).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if refit_jobs >= jobs:
        raise typer.BadParameter("--refit-jobs must leave other jobs to measure")
    total_loops = warmup_loops + 2 * rounds
    job_list = make_jobs(jobs, refit_jobs, fits, step_s, fit_points, total_loops)
    config = forecast_config(step_s, horizon_s, wape_threshold, NO_REFIT_LOOPS, 60)
    methodology = (
        f"{jobs} jobs, each replaying a trace ({', '.join(sorted({j.trace for j in job_list}))}; one point per "
        f"{step_s:g}-s window: 5-minute rows {300 / step_s:g}x time-compressed, Daedalus 1-s counts averaged over "
        f"{step_s:g} s), at spread offsets; each job's model fitted up front on {fit_points} points. Then "
        + (f"loops every {interval_s:g} s of wall time" if interval_s > 0 else
           "loops back to back (a loop's windows arrive when the previous loop is done)")
        + ": all jobs' windows arrive together and one consumer runs "
        f"Forecasting.step for each in turn (as the analyze agent's stream). Phase a: {rounds} loops, no refit. "
        f"Phase b: {rounds} loops, {refit_jobs} jobs (every {max(1, jobs // max(1, refit_jobs))}th in the order) ask "
        f"for a refit after every scored loop (wape_threshold {ALWAYS_POOR_WAPE:g}, poor_loops_before_retrain 1), "
        f"at most one outstanding per job, fitted in Forecasting's pool ({refit_workers} process, nice "
        f"+{forecasting_module.REFIT_NICENESS}). Latency: from the loop's windows arriving to the job's step being "
        f"done; only the other jobs count for the floor."
    )
    console.print(f"[bold]refit latency[/bold]: {methodology}")
    fit_workers = fit_workers or os.cpu_count() or 1
    console.print(f"  first models: {min(fits, jobs)} fits on {fit_workers} processes, then updates ...")
    models, first = first_models(job_list, config, fit_workers)
    sizes = [len(m) / 1024 for m in models.values()]
    orders = {job.id: str(load_model(models[job.id]).order) for job in job_list}
    console.print(f"  ready in {first['total_s']:.1f} s (one fit {min(first['fit_s']):.1f}-"
                  f"{max(first['fit_s']):.1f} s); models {min(sizes):.0f}-{max(sizes):.0f} KiB compressed")
    args = {"refit_workers": refit_workers, "step_s": step_s, "horizon_s": horizon_s,
            "wape_threshold": wape_threshold, "interval_s": interval_s, "warmup_loops": warmup_loops,
            "loops": rounds}
    with tempfile.TemporaryDirectory(prefix="refit-latency-") as tmp, redis_server(Path(tmp)) as redis:
        result = asyncio.run(measure(args, job_list, models, redis))
    windows: list[Window] = result["windows"]

    lat = {p: summarize(windows, p, "latency_ms", False) for p in ("a", "b")}
    svc = {p: summarize(windows, p, "service_ms", False) for p in ("a", "b")}
    cmp = {p: summarize(windows, p, "compute_ms", False) for p in ("a", "b")}
    cpu_ms = {p: summarize(windows, p, "compute_cpu_ms", False) for p in ("a", "b")}
    own = {p: summarize(windows, p, "service_ms", True) for p in ("a", "b")}
    lags = {p: summary(result["lags"].get(p, [])) for p in ("a", "b")}
    added = {q: lat["b"][q] - lat["a"][q] for q in ("p50", "p99", "max")}
    settled = summary([w.latency_ms for w in windows if w.phase == "b" and not w.refit_job
                     and w.since_pool_s is not None and w.since_pool_s > POOL_SETTLE_S])
    spawn_windows = [w for w in windows if w.phase == "b" and w.since_pool_s is not None
                     and w.since_pool_s <= POOL_SETTLE_S]
    by_position = position_delay(windows)
    requests_b = [r for r in result["refit_requests"] if r["phase"] == "b"]
    completed = [r for r in requests_b if "done_at" in r and not r.get("cancelled")]
    fitted = [i for i in result["installs"] if i["fitted"]]
    requests_a = [r for r in result["refit_requests"] if r["phase"] in ("warmup", "a")]
    not_arima = sum(1 for w in windows if w.phase in ("a", "b") and not w.refit_job and w.method != "arima")

    table = Table(title=f"forecast step latency per window, other jobs ({jobs - refit_jobs} of {jobs}), ms")
    for column in ("measure", "a: no refit", "b: refits under way", "b - a (refits)"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for name, data in (("latency (windows arrive -> step done)", lat), ("step alone (load, thread, save)", svc),
                       ("  of which forecast.step in the thread", cmp), ("  ... its thread's CPU time", cpu_ms),
                       ("refit jobs' own step", own), ("event-loop lag (10-ms ticker)", lags)):
        for q in ("p50", "p99", "max"):
            table.add_row(f"{name} {q}", fmt(data["a"][q]), fmt(data["b"][q]), signed(data["b"][q] - data["a"][q]))
    table.add_row(f"latency, b: windows > {POOL_SETTLE_S:g} s after the pool's process started, p99 / max", "",
                  f"{fmt(settled['p99'])} / {fmt(settled['max'])}",
                  f"{signed(settled['p99'] - lat['a']['p99'])} / {signed(settled['max'] - lat['a']['max'])}")
    loop_ms = {p: summary([row["last_done_ms"] for row in per_loop(windows, p)]) for p in ("a", "b")}
    for q in ("p50", "max"):
        table.add_row(f"a whole loop ({jobs} jobs' steps) {q}", fmt(loop_ms["a"][q]), fmt(loop_ms["b"][q]),
                      signed(loop_ms["b"][q] - loop_ms["a"][q]))
    table.add_row("windows measured (other jobs)", str(lat["a"]["n"]), str(lat["b"]["n"]), "")
    table.add_row("refits requested / installed / failed", f"{len(requests_a)} / 0 / 0",
                  f"{len(requests_b)} / {len(fitted)} / {len(result['installs']) - len(fitted)}", "")
    table.add_row("steps overlapping an install", str(sum(w.install_overlap for w in windows if w.phase == "a")),
                  str(sum(w.install_overlap for w in windows if w.phase == "b")), "")
    table.add_row("CPU s: agent process / refit pool / redis",
                  f"{result['cpu']['a']['main_s']} / 0 / {result['cpu']['a']['redis_s']}",
                  f"{result['cpu']['b']['main_s']} / {result['cpu']['b']['refit_pool_s_since_start']} / "
                  f"{result['cpu']['b']['redis_s']}", "")
    console.print(table)
    worst_added = max(added.values())
    verdict = "holds" if worst_added <= FLOOR_MS else "FAILS"
    threads = ", ".join(f"{i['internal_api']} {i['num_threads']}" for i in result["blas"])
    console.print(f"  CPUs: {os.cpu_count()}; BLAS/OpenMP threads in the agent process: {threads}; phase wall time "
                  f"a {result['durations']['a']:.1f} s, b "
                  f"{result['durations']['b']:.1f} s; refit request -> installed: "
                  + (f"median {np.median([r['done_at'] - r['requested_at'] for r in completed]):.1f} s"
                     if completed else "none completed"))
    if by_position:
        console.print(f"  added delay by position (mean over loops, b - a): largest "
                      f"{by_position['largest_ms']:+.0f} ms at position {by_position['at_position']}, last other job "
                      f"{by_position['last_position_ms']:+.0f} ms")
    console.print(f"  [bold]floor: refits add at most {FLOOR_MS:g} ms to another job's latency[/bold]: added p50 "
                  f"{added['p50']:+.0f}, p99 {added['p99']:+.0f}, max {added['max']:+.0f} ms -> [bold]{verdict}"
                  "[/bold]")
    if requests_a or not_arima:
        console.print(f"  [yellow]note: {len(requests_a)} refits requested before phase b; {not_arima} other-job "
                      "windows published no ARIMA forecast[/yellow]")

    out: dict[str, Any] = {
        "benchmark": "refit_latency",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - wall, 2),
        "code": code_version(("analyze/arima.py", "analyze/forecast.py", "analyze/forecast_pool.py",
                              "knowledge/redis_jobs.py", "bench/refit_latency.py")),
        "machine": machine_info() | {"load_average_at_start": [round(x, 2) for x in load_at_start],
                                     "forecast_packages": packages()},
        "parameters": {"jobs": jobs, "refit_jobs": refit_jobs, "loops_per_phase": rounds, "warmup_loops": warmup_loops,
                       "loop_interval_s": interval_s, "refit_workers": refit_workers,
                       "fit_points": fit_points,
                       "other_jobs_config": config.model_dump(mode="json"),
                       "refit_jobs_config": forecast_config(step_s, horizon_s, ALWAYS_POOR_WAPE, 1, 60)
                       .model_dump(mode="json")},
        "methodology": methodology,
        "floor_ms": FLOOR_MS,
        "verdict": verdict,
        "added_by_refits_ms": added,
        "added_by_position_ms": by_position,
        "phase_b_after_pool_start": {"settle_s": POOL_SETTLE_S, "other_jobs_latency_ms": settled,
                                     "windows_within_settle": len(spawn_windows)},
        "other_jobs": {"latency_ms": lat, "service_ms": svc, "compute_ms": cmp, "compute_cpu_ms": cpu_ms},
        "refit_jobs_service_ms": own,
        "event_loop_lag_ms": lags,
        "loop_ms": loop_ms,
        "blas_threads": result["blas"],
        "refits": {"requested_before_b": len(requests_a), "requested_b": len(requests_b),
                   "installed_b": len(fitted), "failed_b": len(result["installs"]) - len(fitted),
                   "outstanding_at_end": result["outstanding_at_end"],
                   "request_to_installed_s": [round(r["done_at"] - r["requested_at"], 2) for r in completed],
                   "install_ms": [round(i["ms"], 1) for i in result["installs"]],
                   "install_cpu_ms": [round(i["cpu_ms"], 1) for i in result["installs"]],
                   "installed_model_kib": [round(i["model_kb"]) for i in fitted]},
        "first_models": first | {"model_kib": [round(x) for x in sizes], "orders": orders},
        "cpu_seconds": result["cpu"],
        "phase_wall_s": {k: round(v, 2) for k, v in result["durations"].items()},
        "per_loop": {p: per_loop(windows, p) for p in ("a", "b")},
        "jobs": [{"id": j.id, "trace": j.trace, "offset": j.offset, "refits": j.refits} for j in job_list],
        "windows": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(w).items()}
                    for w in windows],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(out, indent=1, default=float) + "\n")
    console.print(f"results written to {output} ({out['duration_s']:.1f} s)")


if __name__ == "__main__":
    app()
