"""The refit-latency benchmark's jobs: their traces, windows and first models (fitted up front)."""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import typer
from threadpoolctl import threadpool_limits

from analyze.arima import ForecastConfig, fit_model, update_model
from analyze.forecast import ForecastState
from bench.forecast_accuracy import load_series

T0 = 1_800_000_000.0  # metric time of every job's first point
TRACE_NAMES = ("sine", "cos", "avazu", "iot", "wiki")
SHIFT_POINTS = 24  # jobs sharing a base window start 4 minutes (10-s windows) apart


@dataclass
class Job:
    id: str
    trace: str
    offset: int  # index of the first history point in the trace's series
    values: np.ndarray  # the trace's whole series, one point per window
    refits: bool  # refits continuously in phase b
    fit_points: int
    base: int  # the window whose fit this job's model is updated from

    def point(self, k: int) -> float:
        """The arrival rate of loop k (k = 0: the first window after the fitted history)."""
        return float(self.values[self.offset + self.fit_points + k])

    def time(self, k: int, step_s: float) -> float:
        return T0 + (self.fit_points + k) * step_s

    def history(self) -> np.ndarray:
        return self.values[self.offset:self.offset + self.fit_points]


@dataclass
class Window:
    phase: str
    loop: int
    position: int  # in the loop's processing order
    job: str
    refit_job: bool
    latency_ms: float  # the loop's windows arriving -> this job's step done
    service_ms: float  # this job's step alone (load, thread, save)
    compute_ms: float  # analyze.forecast.step in the thread, wall
    compute_cpu_ms: float  # ... its thread's CPU time
    install_overlap: bool  # a refit's install_model ran in another thread meanwhile
    method: str | None
    refit_requested: bool
    since_pool_s: float | None  # seconds since the refit pool's process was started (None: not yet)


@dataclass
class Probe:
    """Timing wrappers around what `Forecasting` runs in threads (module globals it looks up per call)."""

    last_compute: tuple[float, float] = (0.0, 0.0)
    installs_running: int = 0
    install_seen: bool = False
    installs: list[dict[str, float]] = field(default_factory=list)

    def wrap_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            self.install_seen = self.installs_running > 0
            try:
                return original(*args, **kwargs)
            finally:
                self.install_seen |= self.installs_running > 0
                self.last_compute = (time.perf_counter() - wall, time.thread_time() - cpu)

        return timed

    def wrap_install(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(state: ForecastState, model: bytes | None, *args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            self.installs_running += 1
            self.install_seen = True
            try:
                return original(state, model, *args, **kwargs)
            finally:
                self.installs_running -= 1
                self.installs.append({"at": time.perf_counter(), "ms": 1000 * (time.perf_counter() - wall),
                                      "cpu_ms": 1000 * (time.thread_time() - cpu), "fitted": model is not None,
                                      "model_kb": len(model) / 1024 if model else 0.0})

        return timed


# ---------------------------------------------------------------- jobs and their first models


def make_jobs(
    count: int, refit_jobs: int, fits: int, step_s: float, fit_points: int, loops: int
) -> list[Job]:
    """`count` jobs over the traces; jobs j, j + T, j + 2T, ... (T traces) share a trace. Each trace
    has `fits / T` base windows spread over it; the jobs of one base window start `SHIFT_POINTS`
    apart, so every job replays its own stretch of the trace."""
    series = {name: load_series(name, step_s) for name in TRACE_NAMES}
    names = list(series)
    groups = max(1, math.ceil(min(fits, count) / len(names)))  # base windows per trace
    every = max(1, count // refit_jobs) if refit_jobs else 0
    jobs = []
    for j in range(count):
        name = names[j % len(names)]
        values = series[name].values
        member = j // len(names)
        group, shift = member % groups, (member // groups) * SHIFT_POINTS
        max_shift = ((math.ceil(count / len(names)) - 1) // groups) * SHIFT_POINTS
        room = values.size - fit_points - loops - max_shift
        if room < 0:
            raise typer.BadParameter(f"{name} has {values.size} points: too few for {fit_points} + {loops}")
        base = group * room // groups
        refits = bool(every) and j % every == 0 and j // every < refit_jobs
        jobs.append(Job(f"job-{j:03d}", name, base + shift, values, refits, fit_points, base))
    return jobs


def first_models(jobs: list[Job], config: ForecastConfig, workers: int) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every job's model (not measured): auto_arima on each base window, then, for a job starting
    later, that model updated with the points in between (`update_model`, as the agent does every
    loop), so each model holds exactly its job's history. One BLAS thread per process."""
    started = time.perf_counter()
    bases = sorted({(job.trace, job.base) for job in jobs})
    by_base = {(job.trace, job.base): job for job in jobs}
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {key: pool.submit(_fit, by_base[key].values[key[1]:key[1] + by_base[key].fit_points], config)
                   for key in bases}
        fitted = {key: future.result() for key, future in futures.items()}
        fit_wall = time.perf_counter() - started
        updates = {}
        for job in jobs:
            model = fitted[(job.trace, job.base)][0]
            end = job.base + job.fit_points
            updates[job.id] = (pool.submit(_update, model, job.values[end:job.offset + job.fit_points], job.fit_points)
                               if job.offset > job.base else None)
        models = {job.id: updates[job.id].result() if updates[job.id] else fitted[(job.trace, job.base)][0]
                  for job in jobs}
    except BaseException:  # interrupted: stop the fits under way instead of waiting for them
        stop_pool(pool)
        raise
    pool.shutdown()
    return models, {"base_fits": len(bases), "fit_wall_s": round(fit_wall, 1),
                    "fit_s": [round(seconds, 2) for _, seconds in fitted.values()],
                    "total_s": round(time.perf_counter() - started, 1)}


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop this benchmark's own pool processes without waiting for the fits under way."""
    processes = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(5)


def _fit(history: np.ndarray, config: ForecastConfig) -> tuple[bytes, float]:
    import pmdarima  # noqa: F401  (loads scipy's and statsmodels' BLAS first: the limit covers loaded ones)

    started = time.perf_counter()
    with threadpool_limits(limits=1):
        return fit_model(history, config), time.perf_counter() - started


def _update(model: bytes, points: np.ndarray, fit_points: int) -> bytes:
    import pmdarima  # noqa: F401

    with threadpool_limits(limits=1):
        return update_model(model, points, max_points=fit_points)
